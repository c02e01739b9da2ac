"""What the simulators' command lines share: logging flags and serving an aiohttp app.

Logging is :mod:`kinference_common.logs` (JSON lines on stderr unless a TTY).
The ``listening`` line carries the bound port, so ``--port 0`` works for tests
and launchers. Prompts and completions are never logged.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Callable

import structlog
from aiohttp import web
from kinference_common import logs

log = structlog.get_logger("kinference_simulators")


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    logs.add_arguments(parser)


async def serve(app: web.Application, host: str, port: int, name: str) -> None:
    """Serve ``app`` until SIGINT/SIGTERM, then shut down cleanly."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = [a for a in runner.addresses if isinstance(a, tuple)]
        actual_port = bound[0][1] if bound else port
        log.info("listening", simulator=name, host=host, port=actual_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping", simulator=name)
    finally:
        await runner.cleanup()


def run(app_factory: Callable[[], web.Application], args: argparse.Namespace, name: str) -> None:
    """Configure logging from ``args`` and serve ``app_factory()`` on ``args.host:args.port``."""
    logs.configure(args.log_level, args.log_format)

    async def main() -> None:
        await serve(app_factory(), args.host, args.port, name)

    asyncio.run(main())
