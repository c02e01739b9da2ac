"""Upstream bookkeeping the router does per destination, outside the pure
decision: ejection after connection failures, provider cooldowns after a
429, provider limits, and provider API keys.

- **Ejection** (POLICY.md section 2): after ``threshold`` consecutive
  connection failures an endpoint is ejected for a backoff that doubles while
  it keeps failing (``base`` up to ``cap`` seconds); one success resets it.
  Telemetry that scraped the endpoint successfully after it was ejected
  ends the ejection early (the pod is back: a restarted pod is used again
  within a scrape, not after a backoff that grew while it was down); the
  backoff is kept, so one that fails again is ejected for longer.
- **Cooldown**: a provider that answers 429 is not a candidate until its
  ``Retry-After`` (seconds or an HTTP date; default ``default_cooldown``).
- **Limits**: ``maxConcurrency`` (requests open at once) and
  ``requestsPerMinute`` (a sliding minute) per provider; at a limit the
  request is refused as ``rate_limited`` (429).
- **API keys**: read from the Secret the provider names. In local mode
  secrets are files ``<secrets-dir>/<secret name>/<key>`` (the layout of a
  Kubernetes Secret volume), re-read when they change; never logged.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Protocol

from kinference_common.compiled import ProviderSettings, SecretRef


@dataclass
class _Health:
    failures: int = 0
    backoff: float = 0.0
    until: float = 0.0
    ejected_at: float = 0.0  # wall clock, comparable with telemetry's scrapedAt


@dataclass
class UpstreamHealth:
    threshold: int = 3
    base: float = 1.0
    cap: float = 30.0
    default_cooldown: float = 5.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _health: dict[str, _Health] = field(default_factory=dict)
    _cooldown: dict[str, float] = field(default_factory=dict)

    def connect_failed(self, key: str) -> bool:
        """Count a connection failure; True when this ejects the endpoint."""
        h = self._health.setdefault(key, _Health())
        h.failures += 1
        if h.failures >= self.threshold:
            h.backoff = min(self.cap, h.backoff * 2 if h.backoff else self.base)
            h.until = self.clock() + h.backoff
            h.ejected_at = self.wall()
            h.failures = 0
            return True
        return False

    def seen_healthy(self, key: str, scraped_at: float) -> None:
        """Telemetry scraped ``key`` successfully at ``scraped_at`` (wall
        clock): an ejection that began before that scrape ends now."""
        h = self._health.get(key)
        if h is not None and h.until and scraped_at > h.ejected_at:
            h.until = 0.0

    def succeeded(self, key: str) -> None:
        self._health.pop(key, None)

    def cool_down(self, key: str, retry_after: str | None) -> float:
        seconds = parse_retry_after(retry_after, self.default_cooldown)
        self._cooldown[key] = self.clock() + seconds
        return seconds

    def excluded(self) -> set[str]:
        """Keys that are not candidates now (ejected endpoints, cooling providers)."""
        now = self.clock()
        out = {k for k, h in self._health.items() if h.until > now}
        out |= {k for k, until in self._cooldown.items() if until > now}
        return out


def parse_retry_after(value: str | None, default: float) -> float:
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return default


@dataclass
class ProviderLimiter:
    clock: Callable[[], float] = time.monotonic
    _open: dict[str, int] = field(default_factory=dict)
    _recent: dict[str, deque[float]] = field(default_factory=dict)

    def acquire(self, key: str, settings: ProviderSettings) -> bool:
        """Take a slot, or say no (the caller answers 429)."""
        now = self.clock()
        if settings.max_concurrency is not None and self._open.get(key, 0) >= settings.max_concurrency:
            return False
        if settings.requests_per_minute is not None:
            recent = self._recent.setdefault(key, deque())
            while recent and recent[0] <= now - 60.0:
                recent.popleft()
            if len(recent) >= settings.requests_per_minute:
                return False
            recent.append(now)
        self._open[key] = self._open.get(key, 0) + 1
        return True

    def release(self, key: str) -> None:
        self._open[key] = max(0, self._open.get(key, 0) - 1)


class SecretError(LookupError):
    pass


class SecretNotWatched(SecretError):
    """The Secret lies in a namespace whose Secrets this router does not watch."""


class ProviderKeys(Protocol):
    """Where provider API keys come from: :class:`SecretFiles` (files) or
    :class:`kinference_router.kube_secrets.KubeSecrets` (watched Secrets).
    ``read`` is called for every request to a provider (a rotated key is used
    at once) and raises :class:`SecretError` naming what is missing, never a value."""

    def read(self, namespace: str, ref: SecretRef) -> str: ...


@dataclass
class SecretFiles:
    root: Path | None
    _cache: dict[tuple[str, str, str], tuple[int, str]] = field(default_factory=dict)

    def read(self, namespace: str, ref: SecretRef) -> str:
        if self.root is None:
            raise SecretError("no secrets directory configured")
        candidates = [self.root / namespace / ref.name / ref.key, self.root / ref.name / ref.key]
        for path in candidates:
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                continue
            cached = self._cache.get((namespace, ref.name, ref.key))
            if cached and cached[0] == mtime:
                return cached[1]
            value = path.read_text(encoding="utf-8").strip()
            self._cache[(namespace, ref.name, ref.key)] = (mtime, value)
            return value
        raise SecretError(f"secret {namespace}/{ref.name} key {ref.key} not found")
