"""EstimatedTTFT of a provider: observed, not predicted (POLICY.md section 5).

A time-decayed exponentially weighted mean of observed TTFTs on the log
scale (TELEMETRY.md, "Providers"): TTFTs are skewed, and a geometric mean is
not dragged by one slow answer the way an arithmetic one is. Each sample's
weight halves every ``half_life_seconds``; a timeout counts as a sample at
the timeout; with no sample for ``stale_after_seconds`` the estimate is gone
(None: the provider is unobserved again, eligible and sorted last).

Pure and clock-free: callers pass times. The telemetry collector owns one per
provider and publishes :meth:`ProviderTTFTEstimate.value` as
``ProviderState.estimated_ttft_seconds``; the engine only reads that.
"""

from __future__ import annotations

import math


class ProviderTTFTEstimate:
    """Recency-weighted geometric mean of a provider's observed TTFTs."""

    __slots__ = ("half_life", "stale_after", "_log_mean", "_weight", "_last")

    def __init__(self, half_life_seconds: float = 60.0, stale_after_seconds: float = 3600.0) -> None:
        self.half_life = half_life_seconds
        self.stale_after = stale_after_seconds
        self._log_mean = 0.0
        self._weight = 0.0
        self._last: float | None = None

    def observe(self, ttft_seconds: float, at: float) -> None:
        """Add one observation (a timeout: pass the timeout)."""
        ttft = max(ttft_seconds, 1e-4)
        if self._last is not None and at > self._last:
            self._weight *= 0.5 ** ((at - self._last) / self.half_life)
        self._last = at if self._last is None else max(self._last, at)
        w = self._weight + 1.0
        self._log_mean += (math.log(ttft) - self._log_mean) / w
        self._weight = w

    def value(self, now: float) -> float | None:
        """The estimate in seconds, or None when never observed or stale."""
        if self._last is None or now - self._last > self.stale_after:
            return None
        return math.exp(self._log_mean)
