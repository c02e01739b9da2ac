"""Entry point of ``kinfctl``.

Each command is a module of this package with two functions:

- ``register(subparsers)`` adds its ``argparse`` sub-parser (with ``--help``
  text) and calls ``set_defaults(run=run)``;
- ``run(args) -> int`` does the work and returns the exit code.

Commands are listed explicitly in :data:`COMMANDS`, in ``--help`` order.
Errors reach the operator as one line on stderr (``kinfctl: ...``), never as
a traceback; usage errors exit 1 ("the input is invalid"), because exit 2 is
reserved by ``lint --strict`` for "valid, but with warnings".
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: module names under ``kinfctl``, in the order ``--help`` lists them
COMMANDS = ["lint", "get", "explain", "classify", "events", "audit", "replay"]

EXIT_OK = 0
EXIT_INVALID = 1


class CommandError(Exception):
    """An error to print as one line and exit with ``code``."""

    def __init__(self, message: str, code: int = EXIT_INVALID) -> None:
        super().__init__(message)
        self.code = code


def split_pool(text: str | None) -> tuple[str, str]:
    """``--pool NS/NAME`` (``NAME`` alone: ``default/NAME``), as every kinfctl command reads it."""
    ns, sep, name = (text or "").partition("/")
    if not sep:
        ns, name = "default", ns
    if not ns or not name or "/" in name:
        raise CommandError(f"--pool must be NAMESPACE/NAME (or NAME in namespace default), not {text!r}")
    return ns, name


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_INVALID)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kinfctl",
        description=(
            "Operate Kinference: lint and inspect InferencePolicy/InferencePool manifests "
            "offline, explain routing decisions, classify prompts, follow decision events."
        ),
        epilog="Run `kinfctl COMMAND --help` for a command's options.",
    )
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"kinfctl.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_INVALID
    try:
        return int(run(args))
    except CommandError as exc:
        print(f"kinfctl: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
