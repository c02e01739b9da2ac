"""``kinference-policy-compiler``: compile Kinference manifests and publish them."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from kinference_common import logs, natsauth
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_policy_compiler.service import PolicyCompilerService, Settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kinference-policy-compiler",
        description=(
            "Watch a directory of Kinference manifests (InferencePolicy, InferencePool, InferenceWorkerSet, "
            "InferenceProvider, ReferenceGrant, HTTPRoute, InferenceObjective, InferenceModelRewrite), "
            "compile them, publish compiled pools on NATS (KV bucket kinference-config and subjects "
            "kinference.config.<ns>.<pool>), and write every object's status to a directory. A file that "
            "breaks is reported and skipped; its last good version stays in force."
        ),
    )
    p.add_argument("--manifests", type=Path, required=True, metavar="DIR", help="directory of YAML/JSON manifests")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--status-dir", type=Path, metavar="DIR",
                   help="write <Kind>/<namespace>/<name>.yaml status files and errors.yaml here")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between directory polls (default 0.5)")
    p.add_argument("--resync", type=float, default=30.0, help="recompile at least this often, seconds (default 30)")
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=8090, help="/healthz, /readyz, /metrics (default 8090)")
    p.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                   help="only these namespaces (repeat; default: all)")
    p.add_argument("--in-process-classifier", action="append", dest="in_process", default=[], metavar="NAME",
                   choices=sorted(BUILTIN_CLASSIFIERS),
                   help="routers run this classifier in their own process instead of asking the classifier "
                        "service over NATS (no prompt on the bus; repeat; default: none). The policies' status "
                        "shows the path and deadline that apply")
    natsauth.add_arguments(p, default_user=natsauth.COMPILER)
    logs.add_arguments(p)
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    try:
        nats_options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        print(f"kinference-policy-compiler: {exc}", file=sys.stderr)
        return 1
    service = PolicyCompilerService(Settings(
        manifests=args.manifests, nats_url=args.nats_url, status_dir=args.status_dir, interval=args.interval,
        resync=args.resync, http_host=args.http_host, http_port=args.http_port,
        watched_namespaces=args.namespaces, in_process_classifiers=args.in_process, nats_options=nats_options,
    ))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, service.wake)
    # Starting waits for NATS (it retries forever, logging); a signal while
    # waiting still stops the process cleanly.
    starting = asyncio.create_task(service.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        return 0
    stopping.cancel()
    if (exc := starting.exception()) is not None:  # e.g. the HTTP port is taken
        print(f"kinference-policy-compiler: cannot start: {exc}", file=sys.stderr)
        await service.stop()
        return 1
    await stop.wait()
    await service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
