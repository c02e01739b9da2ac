"""The learned prefill throughput (Theta) is the engine's rate, at any load.

The project's vLLM V1 scheduler model (chunked prefill, token budget) runs
in simulated time; its counters and histogram sums are scraped every 100 ms
as a Prometheus page would show them (vLLM observes a request's queue and
prefill times when it finishes) and fed to the collector's derivation. The
truth is what the engine did: prefill tokens computed over the seconds of
the steps that computed them.
"""

from __future__ import annotations

import random

import pytest

from kinference_collector.derive import DeriveConfig, EndpointTracker, window_prefill_rate
from kinference_collector.discovery import Target
from kinference_collector.promparse import VllmSample
from kinference_simulators.profiles import get_profile
from kinference_simulators.scheduler import Scheduler, SchedulerConfig

T = Target(namespace="ns", worker_set="llama", pod="llama-0", address="127.0.0.1:1", model="m")
SCRAPE = 0.1


def run(load: float, seconds: float = 60.0, seed: int = 7) -> tuple[float | None, float, float]:
    """(learned Theta, true engine prefill rate, per-request rate) after ``seconds`` at ``load``
    (offered prefill tokens / the engine's prefill capacity)."""
    profile = get_profile("h100")
    sched = Scheduler(SchedulerConfig(num_gpu_blocks=4000, block_size=16, max_num_seqs=profile.max_num_seqs,
                                      max_num_batched_tokens=profile.max_num_batched_tokens,
                                      max_model_len=8192), profile)
    capacity = 1.0 / profile.prefill_token_s
    rng = random.Random(seed)
    mean_prompt = 2000
    arrivals, t = [], 0.0
    while t < seconds:
        t += rng.expovariate(load * capacity / mean_prompt)
        arrivals.append((t, rng.randint(500, 3500)))
    tracker = EndpointTracker(T, DeriveConfig(window=10.0))
    sums = {"ttft": 0.0, "queue": 0.0, "prefill": 0.0, "computed": 0.0, "n": 0.0}
    truth_tokens = truth_seconds = 0.0
    now, i, next_scrape = 0.0, 0, 0.0

    def scrape(at: float) -> None:
        c = sched.counters
        tracker.observe(VllmSample(
            running=float(sched.num_running), waiting=float(sched.num_waiting),
            prompt_tokens=float(c.prompt_tokens), prefix_queries=float(c.prefix_cache_queries),
            prefix_hits=float(c.prefix_cache_hits), ttft_sum=sums["ttft"], ttft_count=sums["n"],
            queue_sum=sums["queue"], queue_count=sums["n"], prefill_sum=sums["prefill"],
            prefill_count=sums["n"], kv_computed_sum=sums["computed"], kv_computed_count=sums["n"],
        ), at)

    while now < seconds:
        while i < len(arrivals) and arrivals[i][0] <= now:
            at, prompt = arrivals[i]
            sched.add_request(f"r{i}", prompt, [f"{i}/{b}".encode() for b in range(prompt // 16)], 2,
                              "length", at)
            i += 1
        if sched.has_work():
            step = sched.step(now)
            end = step.end
            if step.prefill_tokens:
                truth_tokens += step.prefill_tokens
                truth_seconds += step.duration
            for f in step.finished:
                sums["ttft"] += f.first_token - f.arrival
                sums["queue"] += f.first_scheduled - f.arrival
                sums["prefill"] += f.first_token - f.first_scheduled
                sums["computed"] += f.prompt_tokens - f.cached_tokens
                sums["n"] += 1
        else:
            end = arrivals[i][0] if i < len(arrivals) else seconds
        while next_scrape <= end and next_scrape < seconds:
            scrape(next_scrape)
            next_scrape += SCRAPE
        now = max(end, now)
    per_request = sums["computed"] / sums["prefill"]
    return tracker.prefill_tps, truth_tokens / truth_seconds, per_request


@pytest.mark.parametrize("load", [0.1, 0.5, 0.9, 1.3])
def test_theta_is_the_engines_rate_at_low_and_high_load(load: float) -> None:
    theta, truth, per_request = run(load)
    assert theta is not None
    assert theta == pytest.approx(truth, rel=0.15), (theta, truth, per_request)


def test_per_request_rate_falls_with_load_where_theta_does_not() -> None:
    """What the old estimator learned: prefills sharing a step each count the whole step."""
    theta_lo, truth_lo, per_request_lo = run(0.1)
    theta_hi, truth_hi, per_request_hi = run(1.3)
    assert per_request_hi < 0.6 * truth_hi  # the batch overlap this test is about exists
    assert per_request_lo == pytest.approx(truth_lo, rel=0.15)
    assert theta_hi == pytest.approx(theta_lo, rel=0.15)  # type: ignore[arg-type]


def test_window_rate_bounds() -> None:
    # no overlap (light load): the per-request time is the engine's
    assert window_prefill_rate(1000.0, 0.1, 1.0, 10.0) == pytest.approx(10_000)
    # 40 prefills of 0.5 s ended in a 10 s window: the engine was busy at most 10.5 s
    assert window_prefill_rate(40 * 4000.0, 20.0, 40.0, 10.0) == pytest.approx(160_000 / 10.5)
    # without a prefill count only the per-request bound is known
    assert window_prefill_rate(160_000.0, 20.0, None, 10.0) == pytest.approx(8000)
    for nothing in [(None, 1.0, 1.0, 1.0), (0.0, 1.0, 1.0, 1.0), (10.0, 0.0, 1.0, 1.0), (10.0, None, 1.0, 1.0),
                    (5e-324, 10.0, 1.0, 1.0)]:
        assert window_prefill_rate(*nothing) is None


def test_theta_envelope_forgets_after_the_horizon() -> None:
    def page(tokens: float, seconds: float, n: float) -> VllmSample:
        return VllmSample(kv_computed_sum=tokens, prefill_sum=seconds, prefill_count=n)

    tr = EndpointTracker(T, DeriveConfig(window=1.0, theta_horizon=5.0))
    tr.observe(page(0, 0, 0), 0.0)
    tr.observe(page(10_000, 0.5, 1), 1.0)  # 20k tokens/s
    tokens, secs, n = 10_000.0, 0.5, 1.0
    for t in range(2, 5):  # slower windows within the horizon: the envelope keeps 20k
        tokens, secs, n = tokens + 1000, secs + 0.1, n + 1
        tr.observe(page(tokens, secs, n), float(t))
        assert tr.prefill_tps == pytest.approx(20_000)
    for t in range(5, 12):  # the fast window leaves the horizon: the slower rate is learned
        tokens, secs, n = tokens + 1000, secs + 0.1, n + 1
        tr.observe(page(tokens, secs, n), float(t))
    assert tr.prefill_tps == pytest.approx(10_000)
    for t in range(12, 30):  # idle: the learned value stays
        tr.observe(page(tokens, secs, n), float(t))
    assert tr.prefill_tps == pytest.approx(10_000)
