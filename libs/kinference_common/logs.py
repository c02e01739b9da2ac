"""structlog set-up shared by every service: JSON lines in pods, readable
console lines in development (``--log-format console``, or a TTY).

Never pass prompts, completions or API keys to a logger: request-path lines
carry ``decision_id`` instead (bind it with ``structlog.contextvars``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog (and the stdlib root logger it renders through)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False) if fmt == "console" else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` for a service's command line."""
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="least severe level logged (default info)")
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"],
                        help="json lines, or console for people; auto: console on a terminal, else json")
