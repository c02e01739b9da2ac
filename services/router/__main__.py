"""``kinference-router``: the OpenAI-compatible data plane."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from pathlib import Path
from typing import Any

import structlog

from kinference_common import bus, logs, recording
from kinference_common import natsauth
from kinference_common.tasks import unless_stopped
from kinference_router import provider_request, replica_sync
from kinference_router.classification import Classification
from kinference_router.classification import configure as configure_classification
from kinference_router.app import Router, RouterSettings
from kinference_router.http_server import HttpLimits
from kinference_router.pools import MultiPoolRouter
from kinference_router.recording import RecordSettings
from kinference_router.tenants import Authenticator, TenantsFileError
from kinference_router.upstream import SecretFiles


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kinference-router",
        description=(
            "Serve one InferencePool over an OpenAI-compatible API (POST /v1/chat/completions, "
            "POST /v1/completions, GET /v1/models): authenticate, classify when a rule needs it, decide with "
            "the pool's InferencePolicy on the live snapshot from NATS, and proxy (streaming) to the pick. "
            "The admin port serves POST /debug/explain."
        ),
    )
    p.add_argument("--pool", metavar="NS/NAME",
                   help="serve this pool only (default with --source files: default/inference-all; with "
                        "--source kubernetes: every pool, each request to the pool its HTTPRoute names)")
    p.add_argument("--source", choices=["files", "kubernetes"], default="files",
                   help="files: keys from --tenants-file and --secrets-dir (default); kubernetes: from "
                        "Secrets, watched")
    p.add_argument("--kubeconfig", help="kubernetes: kubeconfig file (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--secret-namespaces", "--namespaces", dest="secret_namespaces", metavar="NS[,NS...]",
                   help="kubernetes: the namespaces whose Secrets are watched (provider keys, tenant keys), "
                        "each needing a RoleBinding of the ClusterRole kinference-router-secrets; default: "
                        "the router's own namespace ($POD_NAMESPACE). '*' watches every namespace and needs a "
                        "ClusterRoleBinding instead. A provider whose Secret lies elsewhere is reported "
                        "(its status: Ready=False, SecretNotWatched)")
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
                   help="NATS server, or every server of a cluster comma-separated (env NATS_URL; "
                        "default nats://127.0.0.1:4222)")
    p.add_argument("--host", default="127.0.0.1", help="data port address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="data port (default 8080)")
    p.add_argument("--admin-host", default="127.0.0.1", help="admin port address (default 127.0.0.1)")
    p.add_argument("--admin-port", type=int, default=8081, help="admin port (default 8081)")
    p.add_argument("--auth", choices=["none", "header", "apiKey"],
                   help="none: tenant 'anonymous' (default with --source files); header: trust "
                        "x-kinference-tenant; apiKey: Bearer keys (default with --source kubernetes)")
    p.add_argument("--tenants-file", type=Path,
                   help="apiKey mode: YAML {tenants: [{name, apiKeys: [...]}]}, read once at start-up and "
                        "strictly: an unknown field, a wrong type, a tenant without keys or a key of two "
                        "tenants stops the router with the file, tenant and field named")
    p.add_argument("--secrets-dir", type=Path,
                   help="provider API keys as files: <dir>/<namespace>/<secret>/<key> (the provider's "
                        "namespace, its spec.auth.secretRef name and key; the file holds the key alone), "
                        "else <dir>/<secret>/<key> (one Secret volume mounted at <dir>/<secret>). "
                        "Files are re-read when they change")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024,
                   help="largest request body; larger gets 413 (default 4 MiB)")
    p.add_argument("--connect-timeout", type=float, default=2.0, help="seconds (providers may set their own)")
    p.add_argument("--first-byte-timeout", type=float, default=120.0, help="seconds (providers may set their own)")
    p.add_argument("--metrics-on-data-port", action="store_true",
                   help="serve /metrics on the data port too (default: the admin port only); for clusters "
                        "whose network policy closes the admin port and lets Prometheus scrape the data port")
    p.add_argument("--stale-after", type=float, default=2.0,
                   help="telemetry older than this is stale, seconds (default 2: two missed heartbeats of the collector)")
    p.add_argument("--provider-header", action="append", default=[], metavar="NAME",
                   help="a client header a provider may receive (repeatable; none by default; cookies, "
                        "credentials, X-Forwarded-*, X-User-* are refused)")
    d = HttpLimits()
    p.add_argument("--max-connections", type=int, default=d.max_connections,
                   help=f"open client connections per port; one more gets 503 (default {d.max_connections})")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout,
                   help=f"seconds for a request's line and headers to arrive, else 408 (default {d.header_timeout:g})")
    p.add_argument("--body-timeout", type=float, default=d.body_timeout,
                   help=f"seconds for a request's body to arrive after its headers, else 408 "
                        f"(default {d.body_timeout:g})")
    p.add_argument("--max-pending-body-bytes", type=int, default=d.max_pending_body_bytes,
                   help="bytes of unfinished request bodies held across connections; past it 503 "
                        f"(default {d.max_pending_body_bytes})")
    p.add_argument("--max-headers", type=int, default=d.max_headers,
                   help=f"header lines per request, else 431 (default {d.max_headers})")
    p.add_argument("--max-header-bytes", type=int, default=d.max_head_bytes,
                   help=f"bytes of a request's line and headers, else 431 (default {d.max_head_bytes})")
    p.add_argument("--keepalive-timeout", type=float, default=d.keepalive_timeout,
                   help=f"seconds an idle client connection stays open (default {d.keepalive_timeout:g})")
    p.add_argument("--no-replica-sync", dest="replica_sync", action="store_false",
                   help="do not share in-flight sends and prefix picks with the other router replicas over NATS "
                        "(kinference.router.<ns>.<pool>.sync; on by default)")
    p.add_argument("--epp-port", type=int, metavar="N",
                   help="also serve the Endpoint Picker (Envoy ext_proc gRPC, plaintext HTTP/2) on N for a "
                        "gateway of the Gateway API Inference Extension (default: off; needs --pool)")
    p.add_argument("--epp-host", default="127.0.0.1", help="Endpoint Picker address (default 127.0.0.1)")
    p.add_argument("--epp-conformance-hooks", action="store_true",
                   help="honour the Inference Extension conformance suite's test headers (off by default)")
    p.add_argument("--epp-fallbacks", type=int, default=0, metavar="N",
                   help="endpoints named after the pick in x-gateway-destination-endpoint, which a gateway's "
                        "retries walk (default 0: the pick alone, what an ORIGINAL_DST cluster accepts; a list "
                        "needs the gateway's override_host load balancing)")
    p.add_argument("--egress-port", type=int, metavar="N",
                   help="serve the provider egress on N (HTTP): carries out the Endpoint Picker's Provider "
                        "decisions, only with their token (default: off; needs --pool)")
    p.add_argument("--egress-host", default=None,
                   help="egress listener address (default: --epp-host's)")
    p.add_argument("--egress-address", metavar="IP:PORT",
                   help="what the Endpoint Picker names as destination of a Provider decision (default "
                        "$POD_IP:<egress-port>, else 127.0.0.1:<egress-port>)")
    p.add_argument("--egress-key-file", type=Path,
                   help="the egress tokens' key, the same file on every replica (default: derived from the "
                        "router's NATS password)")
    p.add_argument("--no-uvloop", action="store_true", help="use asyncio's own event loop")
    p.add_argument("--no-record", dest="record", action="store_false",
                   help="do not record decisions for `kinfctl replay` and `kinfctl audit --since` (default: "
                        f"recorded on the JetStream stream {recording.STREAM}, without prompts)")
    p.add_argument("--record-max-bytes", type=_size, default=recording.DEFAULT_MAX_BYTES, metavar="SIZE",
                   help="the records stream's size limit, bytes or a size such as 512MiB, 2GiB; the oldest "
                        "records go first (default 1GiB)")
    p.add_argument("--record-max-age", type=_duration, default=recording.DEFAULT_MAX_AGE_SECONDS, metavar="AGE",
                   help="how long records are kept, seconds or a duration such as 90m, 24h (default 24h)")
    bus.add_kv_replicas_argument(p)
    p.add_argument("--record-keyframe-interval", type=_duration, default=recording.DEFAULT_KEYFRAME_SECONDS,
                   metavar="AGE", help="a complete snapshot record at least this often, deltas in between; "
                                       "a replay from any time finds one within this; at most 5m (default 60s)")
    natsauth.add_arguments(p, default_user=natsauth.ROUTER)
    p.add_argument("--no-classify-batching", dest="classify_batching", action="store_false",
                   help="send one classify request per request instead of one batch per event-loop turn")
    p.add_argument("--classify-max-in-flight", type=int, default=256, metavar="N",
                   help="classify requests in flight per classifier at most; the limit adapts down while "
                        "answers miss their deadline (default %(default)s)")
    logs.add_arguments(p)
    return p.parse_args(argv)


_SIZES = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def _size(text: str) -> int:
    """Bytes: a whole number with an optional unit (KB, MB, GB, KiB, MiB, GiB)."""
    t = text.strip().lower()
    digits = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(digits):]
    try:
        n = float(digits) * _SIZES[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 512MiB, 2GiB)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a size must be positive, not {text!r}")
    return int(n)


def _duration(text: str) -> float:
    from kinference_common.durations import DurationError, parse_duration

    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parse_duration(text)
        except DurationError:
            raise argparse.ArgumentTypeError(f"not a duration: {text!r} (seconds, or e.g. 90m, 24h)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be positive, not {text!r}")
    return seconds


def limits(args: argparse.Namespace) -> tuple[frozenset[str], HttpLimits]:
    """The provider header allowlist and the HTTP limits of the command line;
    ValueError naming the flag that is wrong."""
    try:
        provider_headers = provider_request.check_allowlist(args.provider_header)
        http = HttpLimits(max_connections=args.max_connections, header_timeout=args.header_timeout,
                          body_timeout=args.body_timeout, max_pending_body_bytes=args.max_pending_body_bytes,
                          max_headers=args.max_headers, max_head_bytes=args.max_header_bytes,
                          keepalive_timeout=args.keepalive_timeout)
    except ValueError as exc:
        msg = str(exc)
        name = msg.split(" ", 1)[0]
        if name in vars(HttpLimits):  # a limit: name its flag
            msg = "--" + {"max_head_bytes": "max_header_bytes"}.get(name, name).replace("_", "-") + msg[len(name):]
        raise ValueError(msg) from None
    return provider_headers, http


def raise_fd_limit(want: int) -> None:
    """Raise the soft limit on open files towards ``want`` (client connections
    on both ports, as many upstream connections, NATS and files), within the
    hard limit; say so when it stays lower, since accept() would then fail
    before --max-connections is reached."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            if new < want:
                print(f"kinference-router: open-file limit {new} is below the {want} that --max-connections "
                      "needs; lower it or raise the hard limit", file=sys.stderr)
    except (ImportError, OSError, ValueError):
        pass


def tune_gc() -> None:
    """Fewer, cheaper garbage collections on the request path: everything
    alive after start-up (modules, the first snapshot) moves to the permanent
    generation, so full collections no longer walk it, and the youngest
    generation is collected every 20,000 allocations instead of 700. Measured
    at concurrency 64: p99 latency 20-24 ms -> 9-14 ms, CPU per request
    unchanged (the load test checks that memory stays flat)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


async def run(args: argparse.Namespace) -> int:
    kube = args.source == "kubernetes"
    pool_arg = args.pool or ("" if kube else "default/inference-all")
    namespace, _, pool = pool_arg.partition("/")
    if pool_arg and (not namespace or not pool):
        print("kinference-router: --pool must be NAMESPACE/NAME", file=sys.stderr)
        return 1
    try:
        limits(args)
    except ValueError as exc:
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    if args.record_keyframe_interval > 300:  # kinfctl replay reads snapshots from 5 minutes before --since
        print("kinference-router: --record-keyframe-interval must be at most 5m", file=sys.stderr)
        return 1
    if (args.epp_port is not None or args.egress_port is not None) and not pool:
        print("kinference-router: --epp-port and --egress-port need --pool NS/NAME (an Endpoint Picker "
              "serves exactly one pool)", file=sys.stderr)
        return 1
    mode = args.auth or ("apiKey" if kube else "none")
    secrets: Any = SecretFiles(args.secrets_dir)
    kube_api = None
    try:
        if kube and args.tenants_file is None:
            auth = Authenticator(mode)  # keys from Secrets (kube_secrets.py)
        else:
            auth = Authenticator.from_file(mode, args.tenants_file)
        if kube:
            kube_api, secrets = await kube_secrets_source(args, auth if args.tenants_file is None else None)
    except (TenantsFileError, KubeSetupError) as exc:
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    try:
        return await serve(args, namespace, pool, auth, secrets)
    finally:
        if kube_api is not None:
            await secrets.stop()
            await kube_api.close()


class KubeSetupError(Exception):
    pass


async def kube_secrets_source(args: argparse.Namespace, auth: Authenticator | None) -> tuple[Any, Any]:
    """The API client and the watched Secrets (synced, or given up on after 30 s with a warning)."""
    from kinference_common.kube.client import ResourceClient
    from kinference_common.kube.config import KubeConfigError, api_client
    from kinference_router.kube_secrets import KubeSecrets, secret_namespaces

    try:
        api = await api_client(args.kubeconfig, "kinference-router")
    except KubeConfigError as exc:
        raise KubeSetupError(str(exc)) from None
    try:
        namespaces = secret_namespaces(args.secret_namespaces)
    except ValueError as exc:
        await api.close()
        raise KubeSetupError(str(exc)) from None
    secrets = KubeSecrets(ResourceClient(api), auth, namespaces=namespaces)
    structlog.get_logger("router").info("watching Secrets", namespaces=",".join(namespaces or ["*"]))
    secrets.start()
    try:
        await secrets.wait_synced(30.0)
    except TimeoutError:
        structlog.get_logger("router").warning("secrets not listed yet; serving, keys arrive when they do")
    return api, secrets


async def serve(args: argparse.Namespace, namespace: str, pool: str, auth: Authenticator, secrets: Any) -> int:
    provider_headers, http = limits(args)  # checked by run()
    raise_fd_limit(2 * http.max_connections + 1024)
    settings = RouterSettings(namespace=namespace, pool=pool, max_body_bytes=args.max_body_bytes,
                              connect_timeout=args.connect_timeout, first_byte_timeout=args.first_byte_timeout,
                              stale_after=args.stale_after, provider_headers=provider_headers,
                              http=http, metrics_on_data_port=args.metrics_on_data_port,
                              replica_sync=args.replica_sync,
                              record=RecordSettings(max_bytes=args.record_max_bytes,
                                                    max_age_seconds=args.record_max_age,
                                                    keyframe_seconds=args.record_keyframe_interval,
                                                    replicas=args.kv_replicas)
                              if args.record else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    router: Any = None

    async def reconnected() -> None:
        if router is not None:  # until the buckets answer (a cluster may be electing their leaders)
            router.keeper.resync_soon()

    try:
        nats_options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    if settings.replica_sync:  # every replica holds the router's password, no other NATS user does
        settings.prefix_key = replica_sync.hash_key(nats_options.get("password"))
    connecting = await unless_stopped(bus.connect(args.nats_url, name="kinference-router", on_reconnect=reconnected,
                                                  **nats_options), stop)
    if connecting is None:
        return 0
    nc = connecting.result()
    router = Router(settings, auth, secrets, nc=nc) if pool else MultiPoolRouter(settings, auth, secrets, nc=nc)
    configure_classification(Classification.shared(router.metrics, nc), batching=args.classify_batching,
                             max_in_flight=args.classify_max_in_flight)
    await router.start()
    tune_gc()
    servers = []
    try:
        for server, host, port in ((router.data_server(), args.host, args.port),
                                   (router.admin_server(), args.admin_host, args.admin_port)):
            await server.start(host, port)
            servers.append(server)
    except OSError as exc:
        print(f"kinference-router: cannot listen: {exc}", file=sys.stderr)
        for server in servers:
            await server.close()
        await router.stop()
        await nc.close()
        return 1
    try:
        async for server, what in gateway_servers(args, router, nats_options.get("password")):
            servers.append(server)
            print(f"kinference-router: {what}", file=sys.stderr, flush=True)
    except (OSError, ValueError) as exc:
        print(f"kinference-router: cannot serve the Endpoint Picker or egress: {exc}", file=sys.stderr)
        for server in servers:
            await server.close()
        await router.stop()
        await nc.close()
        return 1
    reporter = None
    if args.source == "kubernetes":  # the providers' keys it cannot read, for their status
        from kinference_router.key_report import KeyReporter

        reporter = KeyReporter(nc, lambda: served_pools(router), secrets, replica_sync.default_replica_id())
        reporter.start()
    print(f"kinference-router: serving {namespace + '/' + pool if pool else 'every pool, by route'} on http://{args.host}:{args.port} "
          f"(admin http://{args.admin_host}:{args.admin_port})", file=sys.stderr, flush=True)
    await stop.wait()
    if reporter is not None:
        await reporter.stop()
    # requests under way get a few seconds to finish; new ones are refused
    await asyncio.gather(*(server.close() for server in servers))
    await router.stop()
    await bus.close(nc)  # bounded: NATS may be gone too (Ctrl-C on make run)
    return 0


def served_pools(router: Any) -> list[Any]:
    """The compiled pools a router (one pool) or a MultiPoolRouter (every pool) serves now."""
    pools = getattr(router.keeper, "pools", None)
    if pools is not None:
        return list(pools.values())
    return [router.keeper.pool] if router.keeper.pool is not None else []


class _Started:
    """A started server (HttpServer or the EPP's gRPC server) behind HttpServer's ``close(grace)``."""

    def __init__(self, server: Any) -> None:
        self.server = server

    async def close(self, grace: float = 5.0) -> None:
        await self.server.close(grace)


async def gateway_servers(args: argparse.Namespace, router: Any, nats_password: str | None) -> Any:
    """Start the Endpoint Picker and the egress the flags ask for, yielding
    (server, what it serves) as each listens."""
    import os

    from kinference_router import egress
    from kinference_router.epp import EppServer, EppSettings

    if args.epp_port is None and args.egress_port is None:
        return
    key = egress.key_from_file(args.egress_key_file) if args.egress_key_file else egress.derive_key(nats_password)
    tokens = egress.EgressTokens(key)
    address = None
    if args.egress_port is not None:
        address = args.egress_address or f"{os.environ.get('POD_IP') or '127.0.0.1'}:{args.egress_port}"
        host = args.egress_host or args.epp_host
        server = egress.Egress(router, tokens, address).server()
        await server.start(host, args.egress_port)
        yield server, f"provider egress on http://{host}:{args.egress_port} (named {address})"
    elif args.egress_address:
        address = args.egress_address  # another replica's egress (same key)
    if args.epp_port is not None:
        settings = EppSettings(conformance_hooks=args.epp_conformance_hooks, fallbacks=args.epp_fallbacks,
                               egress_address=address, egress=tokens if address else None)
        epp = EppServer(router, settings)
        await epp.start(args.epp_host, args.epp_port)
        yield _Started(epp), f"Endpoint Picker (ext_proc gRPC) on {args.epp_host}:{epp.port}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        args.nats_url = bus.check_url(args.nats_url)
    except bus.NatsUrlError as exc:  # a configuration error: one line, exit 1, never retried
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    logs.configure(args.log_level, args.log_format)
    if not args.no_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(run(args))
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
