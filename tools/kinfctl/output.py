"""Printing helpers shared by kinfctl commands: tables with kubectl's look,
kubectl's AGE format, JSON through msgspec."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import msgspec


def print_json(value: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # at call time: redirect_stdout and the like apply
    out.write(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())
    out.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """Columns padded to their widest cell with three spaces between, as kubectl prints."""
    out = out or sys.stdout
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    for row in [headers, *rows]:
        out.write("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def age(created: str | None, now: datetime | None = None) -> str:
    """kubectl's human-readable age (apimachinery's HumanDuration)."""
    if not created:
        return "<unknown>"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = int(((now or datetime.now(UTC)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"
