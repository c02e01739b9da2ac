"""``kinference-telemetry-collector``: scrape engines and DCGM, publish state on NATS."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable

import structlog

from kinference_common import bus, logs, natsauth

from .derive import DeriveConfig
from .discovery import StaticDiscovery
from .providers import ProviderConfig
from .service import CollectorConfig, ServiceConfig, run_service


def _positive(text: str) -> float:
    v = float(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return v


def _above_zero(text: str) -> float:
    """A period or a timeout: 0 would scrape (or beat) in a tight loop."""
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return v


def _whole_at_least(least: int) -> Callable[[str], int]:
    """A count of ``least`` or more."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"{text!r} must be {least} or more")
        return v
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kinference-telemetry-collector",
        description="Scrape vLLM /metrics and DCGM exporters, derive per-endpoint state, "
        "aggregate provider observations, and publish it all on NATS (subjects and KV).",
    )
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                   help="NATS server, or every server of a cluster comma-separated (env NATS_URL; default nats://127.0.0.1:4222)")
    p.add_argument("--source", choices=["files", "kubernetes"], default="files",
                   help="files: --endpoints-file and --dcgm (default); kubernetes: worker sets' pods and DCGM "
                        "exporter pods from the API server, statuses written back")
    p.add_argument("--kubeconfig", help="kubernetes: kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--namespaces", help="kubernetes: comma-separated namespaces to watch (default: all)")
    p.add_argument("--dcgm-selector", default="app=nvidia-dcgm-exporter",
                   help="kubernetes: labels of DCGM exporter pods, k=v[,k=v] (default %(default)s; '' = none)")
    p.add_argument("--dcgm-port", type=int, default=9400, help="kubernetes: DCGM exporters' port (default 9400)")
    p.add_argument("--last-scrape-granularity", type=_positive, default=30.0,
                   help="kubernetes: status endpoints[].lastScrape is rounded down to this many seconds, so "
                        "scrapes do not rewrite the status each time (default 30)")
    p.add_argument("--endpoints-file", help="YAML/JSON endpoint list (re-read when it changes)")
    p.add_argument("--dcgm", action="append", default=[], metavar="HOST:PORT",
                   help="a DCGM exporter to scrape (repeatable)")
    p.add_argument("--interval", type=_above_zero, default=0.1, help="seconds between scrapes of an endpoint (default 0.1)")
    p.add_argument("--timeout", type=_above_zero, default=0.5, help="per-scrape timeout, seconds (default 0.5)")
    p.add_argument("--stale-after", type=_positive, default=1.0,
                   help="an endpoint with no successful scrape for this long is not ready (default 1.0)")
    p.add_argument("--window", type=_positive, default=10.0,
                   help="seconds covered by windowed signals: hit rate, mean TTFT, prefill throughput (default 10)")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest page accepted (default 8 MiB)")
    p.add_argument("--scrape-batch", type=_whole_at_least(1), default=16,
                   help="endpoints of a kind scraped together at one wake-up: their slots share a grid of "
                   "interval x N / endpoints held, so a replica wakes about endpoints / N times an interval "
                   "(each wake-up costs CPU of its own); 1 spreads every scrape over the interval (default 16)")
    p.add_argument("--dcgm-interval", type=_above_zero, default=1.0, help="seconds between DCGM scrapes (default 1)")
    p.add_argument("--min-publish-interval", type=_positive, default=1.0,
                   help="republish unchanged state at least this often, seconds (default 1)")
    p.add_argument("--models-interval", type=_positive, default=300.0,
                   help="re-read /v1/models (context window) this often, seconds (default 300)")
    p.add_argument("--provider-tau", type=_positive, default=60.0,
                   help="decay time constant of providers' EstimatedTTFT, seconds (default 60)")
    p.add_argument("--replica-id", default="",
                   help="this replica's name among the collectors sharing the fleet (default: $POD_NAME, "
                        "else host-pid); replicas find each other in the NATS KV bucket kinference-collectors")
    p.add_argument("--heartbeat", type=_above_zero, default=None,
                   help="seconds between a replica's heartbeats, at most half of --member-ttl (default: a third of "
                        "--member-ttl, 0.5 with its default; each beat is read by every replica)")
    p.add_argument("--member-ttl", type=_above_zero, default=1.5,
                   help="a replica silent this long is dead and its share is taken over; each replica's "
                        "beats say its own, and the others wait the longer of theirs and it (default 1.5)")
    p.add_argument("--probe-misses", type=_whole_at_least(0), default=2,
                   help="each replica probes the next one every --interval; a replica that leaves this many "
                        "probes in a row unanswered while NATS still holds its connection (a node gone, a "
                        "process frozen) is taken for dead and its share taken over (one slow for that long "
                        "is scraped twice until its next heartbeat); 0: a frozen replica is found only by "
                        "--member-ttl, a killed one still at the next probe (default 2)")
    p.add_argument("--kv-replicas", type=int, default=int(os.environ.get("KINFERENCE_KV_REPLICAS", "1")),
                   help="replicas of the KV buckets this service creates: 3 on a three-server NATS cluster "
                        "(default: $KINFERENCE_KV_REPLICAS or 1)")
    p.add_argument("--http-host", default="0.0.0.0", help="address of /metrics and /healthz (default 0.0.0.0)")
    p.add_argument("--http-port", type=int, default=9090, help="/metrics and /healthz; 0 = off (default 9090)")
    natsauth.add_arguments(p, default_user=natsauth.COLLECTOR)
    logs.add_arguments(p)
    return p


async def run_kubernetes(config: ServiceConfig, args: argparse.Namespace) -> int:
    """``--source kubernetes``: discovery from the API server (:mod:`.kube_discovery`)."""
    from kinference_common.kube.client import ResourceClient
    from kinference_common.kube.config import KubeConfigError, api_client

    from .kube_discovery import KubeDiscovery

    try:
        api = await api_client(args.kubeconfig, "kinference-telemetry-collector")
    except KubeConfigError as exc:
        print(f"kinference-telemetry-collector: {exc}", file=sys.stderr)
        return 1
    namespaces = [n.strip() for n in args.namespaces.split(",") if n.strip()] if args.namespaces else None
    try:
        discovery = KubeDiscovery(ResourceClient(api), namespaces=namespaces, dcgm_selector=args.dcgm_selector,
                                  dcgm_port=args.dcgm_port, scrape_granularity=args.last_scrape_granularity)
        return await run_service(config, discovery)
    finally:
        await api.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with what one flag's default takes from another's."""
    ap = parser()
    args = ap.parse_args(argv)
    if args.heartbeat is None:
        args.heartbeat = args.member_ttl / 3
    elif args.heartbeat > args.member_ttl / 2:
        ap.error(f"--heartbeat {args.heartbeat:g} must be at most half of --member-ttl {args.member_ttl:g} (with "
                 "one beat a TTL, a single late beat has the others take this replica for dead; a third of it, "
                 "the default, lets two be late)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.nats_url = bus.check_url(args.nats_url)
    except bus.NatsUrlError as exc:  # a configuration error: one line, exit 1, never retried
        print(f"kinference-telemetry-collector: {exc}", file=sys.stderr)
        return 1
    logs.configure(args.log_level, args.log_format)
    if args.source == "files" and not args.endpoints_file and not args.dcgm:
        structlog.get_logger("kinference.collector").warning("no_targets",
                                                             hint="pass --endpoints-file and/or --dcgm")
    try:
        nats_options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        print(f"kinference-telemetry-collector: {exc}", file=sys.stderr)
        return 1
    config = ServiceConfig(
        nats_url=args.nats_url,
        nats_options=nats_options,
        http_host=args.http_host,
        http_port=args.http_port,
        replica_id=args.replica_id,
        heartbeat=args.heartbeat,
        member_ttl=args.member_ttl,
        probe_misses=args.probe_misses,
        kv_replicas=args.kv_replicas,
        collector=CollectorConfig(
            interval=args.interval,
            timeout=args.timeout,
            max_body_bytes=args.max_body_bytes,
            dcgm_interval=args.dcgm_interval,
            scrape_batch=args.scrape_batch,
            min_publish_interval=args.min_publish_interval,
            derive=DeriveConfig(window=args.window, stale_after=args.stale_after,
                                models_interval=args.models_interval),
            providers=ProviderConfig(tau=args.provider_tau),
        ),
    )
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        runner = asyncio.run
    if args.source == "kubernetes":
        from .kube_discovery import parse_label_selector

        try:
            parse_label_selector(args.dcgm_selector)
        except ValueError as exc:
            print(f"kinference-telemetry-collector: --dcgm-selector: {exc}", file=sys.stderr)
            return 2
        main_coro = run_kubernetes(config, args)
    else:
        main_coro = run_service(config, StaticDiscovery(args.endpoints_file, args.dcgm))
    try:
        return runner(main_coro)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
