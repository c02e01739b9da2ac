"""From parsed pages to :class:`EndpointState`: pure, clock passed in.

One :class:`EndpointTracker` per vLLM endpoint keeps what the derivation needs
between scrapes: the last sample, counters adjusted for resets, and a window
of snapshots of them. Every windowed signal is a difference between the
newest snapshot and the newest one at least ``window`` seconds older, so it
covers the whole window once the tracker is that old.

Derived per endpoint (TELEMETRY.md, "Predicting TTFT"):

- queued / running: ``num_requests_waiting`` / ``num_requests_running``,
  summed over engines; KV use averaged over engines; KV capacity =
  ``num_gpu_blocks * block_size`` from ``cache_config_info``, summed.
- prefix-cache hit rate: delta hits / delta queries over the window.
- prefill throughput (Theta), the *engine's* prefill tokens/s: delta of
  ``request_prefill_kv_computed_tokens_sum`` (else
  ``prompt_tokens_by_source{source=local_compute}``, else prompt tokens minus
  prefix hits) over the time the engine can have spent prefilling them, then
  the largest such window estimate of the last ``theta_horizon`` seconds
  (see :func:`window_prefill_rate`). Learned: the last value is kept through
  windows without prefills.
- fixed overhead (T0): mean TTFT - mean queue time - mean prefill time over
  the window, at least 0; learned the same way.
- mean TTFT over the window; preemptions counted over the window.

Counter resets (an engine restart) follow Prometheus' ``increase()``: a
counter that went down restarted from zero, so its increase is its value.

GPU signals come from DCGM pages: :func:`gpu_stats_by_pod` folds a page's GPUs
into one :class:`GpuStats` per (namespace, pod).
"""

from __future__ import annotations

import math

from collections import deque
from dataclasses import dataclass

from kinference_common.messages import EndpointState

from .discovery import Target
from .promparse import GpuSample, VllmReader, VllmSample

# Counters tracked for window deltas, in this order.
_COUNTERS = (
    "prefix_queries", "prefix_hits", "preemptions", "prompt_tokens", "prompt_local_compute",
    "ttft_sum", "ttft_count", "queue_sum", "queue_count", "prefill_sum", "prefill_count",
    "kv_computed_sum",
)
(_PQ, _PH, _PRE, _PROMPT, _LOCAL, _TTFT_S, _TTFT_C, _Q_S, _Q_C, _PF_S, _PF_C, _KVC_S) = range(
    len(_COUNTERS)
)


@dataclass(frozen=True, slots=True)
class DeriveConfig:
    #: seconds covered by windowed signals (hit rate, mean TTFT, preemptions, Theta)
    window: float = 10.0
    #: an endpoint with no successful scrape for this long is not ready
    stale_after: float = 1.0
    #: re-read /v1/models this often (and after a failure, a tenth of it)
    models_interval: float = 300.0
    #: Theta is the largest window estimate of this many seconds (an envelope:
    #: each estimate is a lower bound of the engine's rate)
    theta_horizon: float = 60.0


@dataclass(frozen=True, slots=True)
class GpuStats:
    """DCGM's view of one pod's GPUs."""

    utilization: float | None = None  # max over GPUs, 0..1
    memory_usage: float | None = None  # max over GPUs, 0..1
    xid_error: int | None = None  # last (largest) XID on any GPU; 0 = none
    gpus: int = 0


def gpu_stats_by_pod(gpus: list[GpuSample]) -> dict[tuple[str, str], GpuStats]:
    """Fold a DCGM page's GPUs into stats per (namespace, pod); unassigned GPUs are dropped."""
    acc: dict[tuple[str, str], list[GpuSample]] = {}
    for g in gpus:
        if g.pod:
            acc.setdefault((g.namespace, g.pod), []).append(g)
    out: dict[tuple[str, str], GpuStats] = {}
    for key, gs in acc.items():
        utils = [min(1.0, max(0.0, g.util_percent / 100.0)) for g in gs if g.util_percent is not None]
        mems = [m for g in gs if (m := g.memory_usage) is not None]
        xids = [g.xid for g in gs if g.xid is not None]
        out[key] = GpuStats(
            utilization=max(utils) if utils else None,
            memory_usage=max(mems) if mems else None,
            xid_error=max(xids) if xids else None,
            gpus=len(gs),
        )
    return out


def merge_gpu_stats(a: GpuStats, b: GpuStats) -> GpuStats:
    """One pod's GPUs reported by two exporters (should not happen; be safe)."""

    def mx(x: float | int | None, y: float | int | None) -> float | int | None:
        return y if x is None else x if y is None else max(x, y)

    return GpuStats(mx(a.utilization, b.utilization), mx(a.memory_usage, b.memory_usage),  # type: ignore[arg-type]
                    mx(a.xid_error, b.xid_error), a.gpus + b.gpus)  # type: ignore[arg-type]


def window_prefill_rate(
    tokens: float | None, prefill_seconds: float | None, prefills: float | None, wall_seconds: float
) -> float | None:
    """The engine's prefill tokens/s seen in one window, or None.

    ``tokens`` prefill tokens were computed for the ``prefills`` requests
    whose prefill ended in a window of ``wall_seconds``; their per-request
    prefill times add up to ``prefill_seconds``. A batched engine prefills
    several requests in the same steps (they share each step's token
    budget), so per-request times overlap and ``tokens / prefill_seconds``
    is a per-request rate: with ``n`` prefills at once, ``1/n`` of the
    engine's. What the engine did is ``tokens`` in the time it was busy
    prefilling, which is at most ``prefill_seconds`` (no overlap) and at
    most the window's wall time (plus one mean prefill, for a prefill that
    began before the window and ended in it). Dividing by the smaller of
    the two gives the tighter lower bound of the engine's rate: exact when
    prefills do not overlap (light load) or the engine prefilled all window
    long (saturation).
    """
    if tokens is None or prefill_seconds is None or not (tokens > 0) or not (prefill_seconds > 1e-9):
        return None
    busy = prefill_seconds
    if prefills is not None and prefills >= 1:
        busy = min(busy, wall_seconds + prefill_seconds / prefills)
    if not (busy > 1e-9):
        return None
    rate = tokens / busy
    # a subnormal token count underflows to 0: no estimate
    return rate if 0.0 < rate < math.inf else None


class EndpointTracker:
    """Derivation state of one vLLM endpoint. Not thread-safe; no I/O."""

    __slots__ = (
        "target", "config", "last", "last_success", "scrape_errors", "last_error",
        "context_window", "models_due", "_raw", "_adj", "_snaps", "prefill_tps",
        "fixed_overhead", "mean_ttft", "hit_rate", "preemptions", "_theta", "reader",
    )

    def __init__(self, target: Target, config: DeriveConfig | None = None,
                 reader: VllmReader | None = None) -> None:
        self.target = target
        self.config = config or DeriveConfig()
        self.last: VllmSample | None = None
        self.last_success: float | None = None
        self.scrape_errors = 0
        self.last_error: str | None = None
        self.context_window: int | None = None
        #: when /v1/models should be read next (0 = at once)
        self.models_due = 0.0
        n = len(_COUNTERS)
        self._raw: list[float | None] = [None] * n
        self._adj: list[float | None] = [None] * n
        self._snaps: deque[tuple[float, tuple[float | None, ...]]] = deque()
        self.prefill_tps: float | None = None
        #: (time, window estimate), decreasing estimates: the front is the
        #: largest of the last ``theta_horizon`` seconds (a sliding maximum)
        self._theta: deque[tuple[float, float]] = deque()
        self.fixed_overhead: float | None = None
        self.mean_ttft: float | None = None
        self.hit_rate: float | None = None
        self.preemptions: int | None = None
        #: reads this endpoint's pages, which keep their shape from scrape to scrape
        self.reader = reader or VllmReader()

    # ---------------------------------------------------------------- events

    def observe(self, sample: VllmSample, now: float) -> None:
        """A successful scrape at ``now``."""
        self.last = sample
        self.last_success = now
        self.scrape_errors = 0
        self.last_error = None
        raw, adj = self._raw, self._adj
        for i, name in enumerate(_COUNTERS):
            cur = getattr(sample, name)
            if cur is None:
                continue
            prev = raw[i]
            if prev is None or adj[i] is None:
                adj[i] = 0.0
            elif cur >= prev:
                adj[i] += cur - prev  # type: ignore[operator]
            else:  # reset: the counter restarted from zero
                adj[i] += cur  # type: ignore[operator]
            raw[i] = cur
        snaps = self._snaps
        if snaps and now < snaps[-1][0]:  # the clock went back: start the window again
            snaps.clear()
            self._theta.clear()
        snaps.append((now, tuple(adj)))
        horizon = now - self.config.window
        while len(snaps) > 1 and snaps[1][0] <= horizon:
            snaps.popleft()
        self._derive()

    def fail(self, error: str, now: float) -> None:
        """A failed scrape: keep the last values, count the failure."""
        self.scrape_errors += 1
        self.last_error = error

    def set_context_window(self, value: int | None, now: float) -> None:
        if value is not None:
            self.context_window = value
            self.models_due = now + self.config.models_interval
        else:
            self.models_due = now + self.config.models_interval / 10

    # -------------------------------------------------------------- derived

    def _derive(self) -> None:
        snaps = self._snaps
        if len(snaps) < 2:
            return
        (t_a, a), (t_b, b) = snaps[0], snaps[-1]

        def d(i: int) -> float | None:
            x, y = a[i], b[i]
            return None if x is None or y is None else y - x

        dq, dh = d(_PQ), d(_PH)
        self.hit_rate = min(1.0, max(0.0, dh / dq)) if dq and dh is not None and dq > 0 else None
        dp = d(_PRE)
        self.preemptions = int(round(dp)) if dp is not None else None
        ts, tc = d(_TTFT_S), d(_TTFT_C)
        self.mean_ttft = ts / tc if ts is not None and tc and tc > 0 else None
        # Theta: prefill tokens computed / time the engine spent prefilling
        pf_s, pc = d(_PF_S), d(_PF_C)
        tokens = d(_KVC_S)
        if tokens is None:
            tokens = d(_LOCAL)
        if tokens is None:
            dpr = d(_PROMPT)
            if dpr is not None:
                tokens = max(0.0, dpr - (dh or 0.0))
        rate = window_prefill_rate(tokens, pf_s, pc, t_b - t_a)
        theta = self._theta
        if rate is not None:
            while theta and theta[-1][1] <= rate:
                theta.pop()
            theta.append((t_b, rate))
        while len(theta) > 1 and theta[0][0] < t_b - self.config.theta_horizon:
            theta.popleft()
        if theta:
            self.prefill_tps = theta[0][1]
        # T0: TTFT not explained by queueing and prefill
        qs, qc = d(_Q_S), d(_Q_C)
        if self.mean_ttft is not None and qs is not None and qc and pf_s is not None and pc:
            self.fixed_overhead = max(0.0, self.mean_ttft - qs / qc - pf_s / pc)

    def ready(self, now: float) -> bool:
        return (
            self.target.ready
            and self.last_success is not None
            and now - self.last_success <= self.config.stale_after
        )

    def state(self, now: float, gpu: GpuStats | None = None) -> EndpointState:
        """The endpoint as published at ``now``."""
        t, s = self.target, self.last
        st = EndpointState(
            namespace=t.namespace,
            worker_set=t.worker_set,
            pod=t.pod,
            address=t.address,
            model=t.model,
            ready=self.ready(now),
            scraped_at=self.last_success or 0.0,
            context_window=self.context_window,
            scrape_errors=self.scrape_errors,
            last_error=self.last_error,
        )
        if s is not None:
            st.queued = max(0, int(s.waiting)) if s.waiting is not None else None
            st.running = max(0, int(s.running)) if s.running is not None else None
            st.kv_cache_usage = (
                min(1.0, max(0.0, s.kv_cache_usage)) if s.kv_cache_usage is not None else None
            )
            st.kv_capacity_tokens = s.kv_capacity_tokens
            st.block_size = s.block_size
            st.prefix_cache_hit_rate = self.hit_rate
            st.prefill_tokens_per_second = self.prefill_tps
            st.fixed_overhead_seconds = self.fixed_overhead
            st.mean_ttft_seconds = self.mean_ttft
            st.preemptions = self.preemptions
        if gpu is not None:
            st.gpu_utilization = gpu.utilization
            st.gpu_memory_usage = gpu.memory_usage
            st.xid_error = gpu.xid_error
        return st

    def health(self, now: float) -> str:
        """``ready``, ``stale`` (ready, but the last scrapes failed) or ``not_ready``."""
        if not self.ready(now):
            return "not_ready"
        return "stale" if self.scrape_errors else "ready"
