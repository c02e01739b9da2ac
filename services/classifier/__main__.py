"""``kinference-classifier``: run the classifier service until SIGTERM.

SIGTERM or SIGINT sets an event; the service then drains its subscriptions
(requests already delivered are answered), closes NATS and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence

import structlog
from kinference_common.classifiers import DEFAULT_MAX_CHARS
from kinference_common import bus, logs, natsauth
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.tasks import unless_stopped


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kinference-classifier",
        description=(
            "Answer kinference.classify.<classifier> requests over NATS (queue group "
            "kinference-classifier) with PII and prompt-injection tags; serves /healthz, "
            "/readyz and /metrics."
        ),
    )
    p.add_argument(
        "--nats-url",
        default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS server URL, or every server of a cluster comma-separated (env NATS_URL; default nats://127.0.0.1:4222)",
    )
    p.add_argument("--health-host", default="0.0.0.0", help="health/metrics bind address")
    p.add_argument(
        "--health-port",
        type=int,
        default=int(os.environ.get("HEALTH_PORT", "8083")),
        help="health/metrics port (env HEALTH_PORT; default 8083; 0 = any free port)",
    )
    p.add_argument(
        "--classifier",
        action="append",
        choices=sorted(BUILTIN_CLASSIFIERS),
        help="serve only this classifier (repeatable; default: all)",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "hyperscan", "re"),
        default=os.environ.get("KINFERENCE_CLASSIFIER_ENGINE", "auto"),
        help="candidate engine: hyperscan, the pure-Python re fallback, or auto (default)",
    )
    p.add_argument(
        "--max-chars",
        type=int,
        default=DEFAULT_MAX_CHARS,
        help="size cap in characters; larger requests get the failure tag (default %(default)s)",
    )
    natsauth.add_arguments(p, default_user=natsauth.CLASSIFIER)
    logs.add_arguments(p)
    return p


async def serve(args: argparse.Namespace) -> int:
    from kinference_classifier.service import ClassifierService

    service = ClassifierService(
        nats_url=args.nats_url,
        nats_options=natsauth.connect_options(args),
        health_host=args.health_host,
        health_port=args.health_port,
        names=args.classifier,
        engine=args.engine,
        max_chars=args.max_chars,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Until NATS answers, start() keeps retrying; a signal must still end the process.
    try:
        starting = await unless_stopped(service.start(), stop)
        if starting is not None:
            starting.result()  # raise a start error
            await stop.wait()
    finally:
        await service.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.nats_url = bus.check_url(args.nats_url)
    except bus.NatsUrlError as exc:  # a configuration error: one line, exit 1, never retried
        print(f"kinference-classifier: {exc}", file=sys.stderr)
        return 1
    logs.configure(args.log_level, args.log_format)
    try:
        import uvloop

        return int(uvloop.run(serve(args)))
    except ImportError:
        pass
    except Exception as exc:  # NATS unreachable, port in use
        structlog.get_logger("kinference.classifier").error(
            "classifier could not start", error=f"{type(exc).__name__}: {exc}"
        )
        return 1
    try:
        return asyncio.run(serve(args))
    except Exception as exc:
        structlog.get_logger("kinference.classifier").error(
            "classifier could not start", error=f"{type(exc).__name__}: {exc}"
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
