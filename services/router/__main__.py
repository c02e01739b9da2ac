"""``kinference-router``: the OpenAI-compatible data plane."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from pathlib import Path

from kinference_common import bus, logs
from kinference_common import natsauth
from kinference_router.classification import configure as configure_classification
from kinference_router.app import Router, RouterSettings
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
    p.add_argument("--pool", default="default/inference-all", metavar="NS/NAME", help="the pool to serve")
    p.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="data port (default 8080)")
    p.add_argument("--admin-host", default="127.0.0.1")
    p.add_argument("--admin-port", type=int, default=8081, help="admin port (default 8081)")
    p.add_argument("--auth", choices=["none", "header", "apiKey"], default="none",
                   help="none: tenant 'anonymous'; header: trust x-kinference-tenant; apiKey: Bearer keys")
    p.add_argument("--tenants-file", type=Path, help="apiKey mode: YAML {tenants: [{name, apiKeys: [...]}]}")
    p.add_argument("--secrets-dir", type=Path,
                   help="provider API keys as files <dir>/<secret>/<key> (a Secret volume's layout)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    p.add_argument("--connect-timeout", type=float, default=2.0, help="seconds (providers may set their own)")
    p.add_argument("--first-byte-timeout", type=float, default=120.0, help="seconds (providers may set their own)")
    p.add_argument("--stale-after", type=float, default=5.0, help="telemetry older than this is stale, seconds")
    p.add_argument("--no-uvloop", action="store_true", help="use asyncio's own event loop")
    natsauth.add_arguments(p, default_user=natsauth.ROUTER)
    p.add_argument("--no-classify-batching", dest="classify_batching", action="store_false",
                   help="send one classify request per request instead of one batch per event-loop turn")
    p.add_argument("--classify-max-in-flight", type=int, default=256, metavar="N",
                   help="classify requests in flight per classifier at most; the limit adapts down while "
                        "answers miss their deadline (default %(default)s)")
    logs.add_arguments(p)
    return p.parse_args(argv)


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
    namespace, _, pool = args.pool.partition("/")
    if not pool:
        print("kinference-router: --pool must be NAMESPACE/NAME", file=sys.stderr)
        return 1
    try:
        auth = Authenticator.from_file(args.auth, args.tenants_file)
    except TenantsFileError as exc:
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    settings = RouterSettings(namespace=namespace, pool=pool, max_body_bytes=args.max_body_bytes,
                              connect_timeout=args.connect_timeout, first_byte_timeout=args.first_byte_timeout,
                              stale_after=args.stale_after)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    router: Router | None = None

    async def reconnected() -> None:
        if router is not None:
            await router.keeper.resync()

    try:
        nats_options = natsauth.connect_options(args)
    except natsauth.CredentialsError as exc:
        print(f"kinference-router: {exc}", file=sys.stderr)
        return 1
    connecting = asyncio.create_task(bus.connect(args.nats_url, name="kinference-router", on_reconnect=reconnected,
                                                 **nats_options))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        return 0
    nc = connecting.result()
    router = Router(settings, auth, SecretFiles(args.secrets_dir), nc=nc)
    configure_classification(router.classification, batching=args.classify_batching,
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
    print(f"kinference-router: serving {args.pool} on http://{args.host}:{args.port} "
          f"(admin http://{args.admin_host}:{args.admin_port})", file=sys.stderr, flush=True)
    await stop.wait()
    # requests under way get a few seconds to finish; new ones are refused
    await asyncio.gather(*(server.close() for server in servers))
    await router.stop()
    try:
        await nc.drain()
    except Exception:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
