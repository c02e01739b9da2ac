"""``kinference-policy-compiler``: compile Kinference manifests and publish them."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from kinference_common import bus, logs, natsauth
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.tasks import unless_stopped
from kinference_policy_compiler.service import PolicyCompilerService, Settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kinference-policy-compiler",
        description=(
            "Watch a directory of Kinference manifests, or with --source kubernetes a cluster's resources "
            "(InferencePolicy, InferencePool, InferenceWorkerSet, "
            "InferenceProvider, ReferenceGrant, HTTPRoute, InferenceObjective, InferenceModelRewrite), "
            "compile them, publish compiled pools on NATS (KV bucket kinference-config and subjects "
            "kinference.config.<ns>.<pool>), and write every object's status to a directory (or, in "
            "Kubernetes mode, to the status subresources, with Events). A document that breaks is reported "
            "and skipped; its last good version stays in force."
        ),
    )
    p.add_argument("--source", choices=("directory", "kubernetes"), default="directory",
                   help="read manifests from a directory (default) or watch a Kubernetes API server")
    p.add_argument("--manifests", type=Path, metavar="DIR",
                   help="directory of YAML/JSON manifests (--source directory)")
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                   help="NATS server, or every server of a cluster comma-separated (env NATS_URL; "
                        "default nats://127.0.0.1:4222)")
    bus.add_kv_replicas_argument(p)
    p.add_argument("--status-dir", type=Path, metavar="DIR",
                   help="write <Kind>/<namespace>/<name>.yaml status files and errors.yaml here")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between directory polls (default 0.5)")
    p.add_argument("--resync", type=float, default=30.0, help="recompile at least this often, seconds (default 30)")
    p.add_argument("--http-host", default="127.0.0.1", help="address of /healthz, /readyz, /metrics (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=8090, help="/healthz, /readyz, /metrics (default 8090)")
    p.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                   help="only these namespaces (repeat; default: all)")
    p.add_argument("--in-process-classifier", action="append", dest="in_process", default=[], metavar="NAME",
                   choices=sorted(BUILTIN_CLASSIFIERS),
                   help="routers run this classifier in their own process instead of asking the classifier "
                        "service over NATS (no prompt on the bus; repeat; default: none). The policies' status "
                        "shows the path and deadline that apply")
    natsauth.add_arguments(p, default_user=natsauth.COMPILER)
    k = p.add_argument_group("Kubernetes mode (--source kubernetes)")
    k.add_argument("--kubeconfig", metavar="FILE",
                   help="kubeconfig file (default: in-cluster service account, then ~/.kube/config)")
    k.add_argument("--namespaces", dest="namespaces_list", metavar="A,B",
                   help="watch only these namespaces, comma-separated (default: all)")
    k.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="elect one writer among replicas with a Lease (default: on)")
    k.add_argument("--lease-name", default="kinference-policy-compiler", help="the Lease replicas elect a leader with (default kinference-policy-compiler)")
    k.add_argument("--lease-namespace", metavar="NS",
                   help="namespace of the Lease (default: $POD_NAMESPACE, else kinference-system)")
    k.add_argument("--identity", metavar="ID", help="this replica's name in the Lease (default: $POD_NAME, "
                   "else hostname-pid)")
    k.add_argument("--lease-duration", type=float, default=15.0, metavar="SECONDS",
                   help="a standby takes over after the Lease went unrenewed this long (default 15)")
    logs.add_arguments(p)
    args = p.parse_args(argv)
    if args.source == "directory" and args.manifests is None:
        p.error("--manifests DIR is required with --source directory")
    if args.source == "kubernetes" and args.manifests is not None:
        p.error("--manifests is for --source directory; with --source kubernetes the cluster is the source")
    args.namespaces = list(args.namespaces or []) or None
    if args.namespaces_list:
        extra = [n.strip() for n in args.namespaces_list.split(",") if n.strip()]
        if not extra:
            p.error("--namespaces: give at least one namespace name")
        args.namespaces = sorted(set((args.namespaces or []) + extra))
    if args.lease_duration < 3:
        p.error("--lease-duration: at least 3 seconds")
    return args


async def run(args: argparse.Namespace) -> int:
    try:
        nats_options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        print(f"kinference-policy-compiler: {exc}", file=sys.stderr)
        return 1
    settings = Settings(
        manifests=args.manifests or Path("."), nats_url=args.nats_url, status_dir=args.status_dir,
        interval=args.interval, resync=args.resync, http_host=args.http_host, http_port=args.http_port,
        watched_namespaces=args.namespaces, in_process_classifiers=args.in_process, nats_options=nats_options,
        kv_replicas=args.kv_replicas,
    )
    if args.source == "kubernetes":
        return await run_kubernetes(args, settings)
    service = PolicyCompilerService(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, service.wake)
    # Starting waits for NATS (it retries forever, logging); a signal while
    # waiting still stops the process cleanly.
    starting = await unless_stopped(service.start(), stop)
    if starting is None:
        return 0
    if (exc := starting.exception()) is not None:  # e.g. the HTTP port is taken
        print(f"kinference-policy-compiler: cannot start: {exc}", file=sys.stderr)
        await service.stop()
        return 1
    await stop.wait()
    await service.stop()
    return 0


async def run_kubernetes(args: argparse.Namespace, settings: Settings) -> int:
    from kinference_common.kube.config import KubeConfigError
    from kinference_policy_compiler.kube_mode import KubeSettings, KubernetesMode

    duration = args.lease_duration
    mode = KubernetesMode(settings, KubeSettings(
        kubeconfig=args.kubeconfig, namespaces=args.namespaces, leader_elect=args.leader_elect,
        lease_name=args.lease_name, lease_namespace=args.lease_namespace, identity=args.identity,
        lease_duration=duration, renew_deadline=duration * 2 / 3, retry_period=duration / 7.5,
    ))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    starting = await unless_stopped(mode.start(), stop)
    if starting is None:
        await mode.stop()
        return 0
    if (exc := starting.exception()) is not None:
        what = str(exc) if isinstance(exc, KubeConfigError) else f"{type(exc).__name__}: {exc}"
        print(f"kinference-policy-compiler: cannot start: {what}", file=sys.stderr)
        await mode.stop()
        return 1
    loop.add_signal_handler(signal.SIGHUP, starting.result().wake)
    await stop.wait()
    await mode.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.nats_url = bus.check_url(args.nats_url)
    except bus.NatsUrlError as exc:  # a configuration error: one line, exit 1, never retried
        print(f"kinference-policy-compiler: {exc}", file=sys.stderr)
        return 1
    logs.configure(args.log_level, args.log_format)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
