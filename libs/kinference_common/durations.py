"""Durations as Kubernetes and Go write them: ``800ms``, ``2s``, ``1m30s``, ``1.5s``.

Parsed to seconds (float). A bare number is not a duration: the manifests'
schema says ``string``, and ``0.8`` would be ambiguous between seconds and
milliseconds, so it is rejected with a message that says what to write.
"""

from __future__ import annotations

import re

_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_WHOLE = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")


class DurationError(ValueError):
    """A string that is not a duration."""


def parse_duration(text: object) -> float:
    """Return ``text`` as seconds; raise :class:`DurationError` naming what is wrong."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise DurationError(
            f"expected a duration string such as '800ms' or '2s', got {text!r}"
        )
    s = text.strip()
    if s == "0":
        return 0.0
    if not s or not _WHOLE.fullmatch(s):
        raise DurationError(
            f"{text!r} is not a duration: write a number with a unit, "
            "such as '800ms', '2s' or '1m30s' (units: ns, us, ms, s, m, h)"
        )
    return sum(float(num) * _UNIT_SECONDS[unit] for num, unit in _PART.findall(s))


def format_duration(seconds: float) -> str:
    """Render seconds compactly: ``0.025 -> '25ms'``, ``2.0 -> '2s'``, ``0 -> '0s'``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}us"
    if seconds < 1:
        return f"{round(seconds * 1e3, 3):g}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:g}s" if rest else f"{int(minutes)}m"
