"""Provider state from routers' observations: pure, clock passed in.

EstimatedTTFT (POLICY.md section 5; TELEMETRY.md "Providers"): a time-decayed
mean of ``log(ttft)``, so one slow outlier moves it by a factor, not by its
size::

    S <- S * exp(-dt / tau) + log(x);  W <- W * exp(-dt / tau) + 1;  est = exp(S / W)

A timeout is a sample at the timeout (``ttft_seconds`` if the router set it,
else ``timeout_seconds``, else the configured default). No sample for
``max_age`` (an hour) = no estimate.

errorRate: failed / (ok + failed) over the last ``error_window`` (a minute),
where failed = ``error``, ``timeout``, ``rate_limited``; ``cancelled`` is the
client's doing and counts for neither. ``observations`` is the number of
requests in that window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kinference_common.messages import Observation, ProviderKeyReport, ProviderState

_FAILED = frozenset({"error", "timeout", "rate_limited"})


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    #: decay time constant of the TTFT estimate, seconds
    tau: float = 60.0
    #: no sample for this long = no estimate
    max_age: float = 3600.0
    error_window: float = 60.0
    #: a timeout with no duration counts as this many seconds
    default_timeout: float = 30.0
    #: bound on per-provider window memory (observations kept for errorRate)
    max_window_entries: int = 100_000


@dataclass(slots=True)
class _Provider:
    s: float = 0.0
    w: float = 0.0
    last_sample: float | None = None
    outcomes: deque[tuple[float, bool]] = field(default_factory=deque)
    failed: int = 0
    last_seen: float | None = None


class ProviderAggregator:
    """Every provider's running estimates, keyed by (namespace, name)."""

    def __init__(self, config: ProviderConfig | None = None) -> None:
        self.config = config or ProviderConfig()
        self._p: dict[tuple[str, str], _Provider] = {}

    def keys(self) -> list[tuple[str, str]]:
        return list(self._p)

    def observe(self, obs: Observation, now: float) -> tuple[str, str] | None:
        """Account one observation; returns the provider's key (None if not a provider's)."""
        if obs.backend_type != "Provider" or not obs.backend_name:
            return None
        key = (obs.namespace, obs.backend_name)
        p = self._p.get(key)
        if p is None:
            p = self._p[key] = _Provider()
        self._prune(p, now)
        p.last_seen = now
        if obs.outcome != "cancelled":
            failed = obs.outcome in _FAILED
            p.outcomes.append((now, failed))
            p.failed += failed
            if len(p.outcomes) > self.config.max_window_entries:
                _, f = p.outcomes.popleft()
                p.failed -= f
        sample: float | None = None
        if obs.outcome == "timeout":
            sample = obs.ttft_seconds or obs.timeout_seconds or self.config.default_timeout
        elif obs.ttft_seconds is not None and obs.outcome in ("ok", "cancelled"):
            sample = obs.ttft_seconds
        if sample is not None and math.isfinite(sample) and sample > 0:
            if p.last_sample is not None and now > p.last_sample:
                decay = math.exp(-(now - p.last_sample) / self.config.tau)
                p.s *= decay
                p.w *= decay
            p.s += math.log(sample)
            p.w += 1.0
            p.last_sample = now if p.last_sample is None else max(now, p.last_sample)
        return key

    def prune(self, now: float) -> list[tuple[str, str]]:
        """Forget providers with no observation for twice ``max_age`` (their
        last published state already says "no estimate"); bounds memory when
        observations name many providers."""
        horizon = now - 2 * self.config.max_age
        gone = [k for k, p in self._p.items()
                if (p.last_seen if p.last_seen is not None else now) < horizon]
        for k in gone:
            del self._p[k]
        return gone

    def _prune(self, p: _Provider, now: float) -> None:
        horizon = now - self.config.error_window
        q = p.outcomes
        while q and q[0][0] < horizon:
            _, f = q.popleft()
            p.failed -= f

    def state(self, key: tuple[str, str], now: float) -> ProviderState:
        p = self._p[key]
        self._prune(p, now)
        est: float | None = None
        if p.last_sample is not None and now - p.last_sample <= self.config.max_age and p.w > 0:
            est = math.exp(p.s / p.w)
        n = len(p.outcomes)
        return ProviderState(
            namespace=key[0],
            name=key[1],
            estimated_ttft_seconds=est,
            error_rate=p.failed / n if n else None,
            observations=n,
            updated_at=now,
        )


class ProviderKeyReports:
    """The routers' latest reports of the providers' API keys they cannot read
    (:class:`~kinference_common.messages.ProviderKeyReport`), one per router
    replica: each report replaces that replica's previous one, and a replica
    not heard from for three of its periods no longer counts (pure, clock passed in)."""

    def __init__(self) -> None:
        self._by_router: dict[str, tuple[float, ProviderKeyReport]] = {}

    def receive(self, report: ProviderKeyReport, now: float) -> None:
        self._by_router[report.router] = (now, report)

    def problem(self, namespace: str, name: str, now: float) -> tuple[str, str] | None:
        """``(reason, message)`` when a live router cannot read the provider's key;
        with several, the first by router name, the message saying how many."""
        found: list[tuple[str, str, str]] = []
        for router, (at, report) in sorted(self._by_router.items()):
            if now - at > 3 * max(report.interval, 1.0):
                continue
            for k in report.providers:
                if k.namespace == namespace and k.name == name and k.problem:
                    found.append((router, k.problem, k.message))
        if not found:
            return None
        router, reason, message = found[0]
        more = f" (and {len(found) - 1} other router replica(s))" if len(found) > 1 else ""
        return reason, f"router {router}{more}: {message}"

    def prune(self, now: float) -> None:
        self._by_router = {r: v for r, v in self._by_router.items() if now - v[0] <= 3 * max(v[1].interval, 1.0)}
