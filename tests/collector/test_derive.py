"""Derivation on synthetic counter/histogram sequences, with an explicit clock."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kinference_collector import pages
from kinference_collector.derive import (
    DeriveConfig,
    EndpointTracker,
    GpuStats,
    gpu_stats_by_pod,
)
from kinference_collector.discovery import Target
from kinference_collector.promparse import GpuSample, VllmSample, parse_vllm

T = Target(namespace="ns", worker_set="llama", pod="llama-0", address="127.0.0.1:1", model="m")


def sample(**kw: float) -> VllmSample:
    base = {"running": 0.0, "waiting": 0.0}
    base.update(kw)
    return VllmSample(**base)  # type: ignore[arg-type]


def cumulative(requests: float, prompt: float = 1000, hit: float = 0.5, ttft: float = 0.3,
               queue: float = 0.1, prefill: float = 0.15, preemptions: float = 0) -> VllmSample:
    """A page after ``requests`` identical requests."""
    return sample(
        prefix_queries=requests * prompt, prefix_hits=requests * prompt * hit,
        prompt_tokens=requests * prompt, kv_computed_sum=requests * prompt * (1 - hit),
        ttft_sum=requests * ttft, ttft_count=requests, queue_sum=requests * queue,
        queue_count=requests, prefill_sum=requests * prefill, prefill_count=requests,
        preemptions=preemptions,
    )


def test_gauges_pass_through() -> None:
    tr = EndpointTracker(T)
    tr.observe(sample(running=4, waiting=2, kv_cache_usage=0.7, kv_capacity_tokens=1600, block_size=16), 100.0)
    st = tr.state(100.0)
    assert (st.queued, st.running, st.kv_cache_usage, st.kv_capacity_tokens, st.block_size) == (2, 4, 0.7, 1600, 16)
    assert st.ready and st.scraped_at == 100.0 and st.scrape_errors == 0
    assert (st.namespace, st.worker_set, st.pod, st.model) == ("ns", "llama", "llama-0", "m")
    # one snapshot: no window yet
    assert st.prefix_cache_hit_rate is None and st.mean_ttft_seconds is None


def test_window_deltas() -> None:
    tr = EndpointTracker(T, DeriveConfig(window=10.0))
    tr.observe(cumulative(100, hit=0.0, ttft=9.9), 0.0)  # history before the window is ignored
    tr.observe(cumulative(110, hit=0.0, ttft=9.9), 1.0)
    st = tr.state(1.0)
    assert st.prefix_cache_hit_rate == 0.0
    assert st.mean_ttft_seconds == pytest.approx(9.9)
    # 10 requests: 1000 prompt tokens, 0 hits, 0.15 s prefill each, all
    # ended within 1 s: they overlapped, so the engine prefilled the 10,000
    # tokens in at most the window plus one mean prefill (not 1.5 s)
    assert st.prefill_tokens_per_second == pytest.approx(10 * 1000 / (1.0 + 0.15))
    assert st.fixed_overhead_seconds == pytest.approx(9.9 - 0.1 - 0.15)
    assert st.preemptions == 0


def test_hit_rate_throughput_and_overhead_from_deltas() -> None:
    tr = EndpointTracker(T, DeriveConfig(window=5.0))
    seq = [cumulative(0)]
    # 20 requests/s of 2000 tokens, 75 % hits, prefill 0.05 s, TTFT 0.4 s, queue 0.2 s
    reqs = 0.0
    for i in range(1, 11):
        reqs += 20
        seq.append(cumulative(reqs, prompt=2000, hit=0.75, ttft=0.4, queue=0.2, prefill=0.05, preemptions=i))
    for i, s in enumerate(seq):
        tr.observe(s, float(i))
    st = tr.state(10.0)
    assert st.prefix_cache_hit_rate == pytest.approx(0.75)
    assert st.prefill_tokens_per_second == pytest.approx(500 / 0.05)
    assert st.fixed_overhead_seconds == pytest.approx(0.4 - 0.2 - 0.05)
    assert st.mean_ttft_seconds == pytest.approx(0.4)
    assert st.preemptions == 5  # over the 5 s window only


def test_learned_values_survive_idle_windows() -> None:
    tr = EndpointTracker(T, DeriveConfig(window=2.0))
    tr.observe(cumulative(0), 0.0)
    tr.observe(cumulative(10, prompt=1000, hit=0.0, prefill=0.1, ttft=0.5, queue=0.1), 1.0)
    learned = tr.state(1.0).prefill_tokens_per_second
    assert learned == pytest.approx(10_000)
    for t in range(2, 8):  # idle: counters flat
        tr.observe(cumulative(10, prompt=1000, hit=0.0, prefill=0.1, ttft=0.5, queue=0.1), float(t))
    st = tr.state(7.0)
    assert st.prefill_tokens_per_second == learned
    assert st.fixed_overhead_seconds == pytest.approx(0.3)
    assert st.mean_ttft_seconds is None  # no request in the window
    assert st.prefix_cache_hit_rate is None


def test_throughput_fallbacks_without_kv_computed_histogram() -> None:
    tr = EndpointTracker(T)
    tr.observe(sample(prompt_local_compute=0, prefill_sum=0), 0.0)
    tr.observe(sample(prompt_local_compute=3000, prefill_sum=0.5), 1.0)
    assert tr.state(1.0).prefill_tokens_per_second == pytest.approx(6000)
    tr2 = EndpointTracker(T)
    tr2.observe(sample(prompt_tokens=0, prefix_hits=0, prefix_queries=0, prefill_sum=0), 0.0)
    tr2.observe(sample(prompt_tokens=4000, prefix_hits=1000, prefix_queries=4000, prefill_sum=1.0), 1.0)
    assert tr2.state(1.0).prefill_tokens_per_second == pytest.approx(3000)


def test_counter_reset_counts_from_zero() -> None:
    tr = EndpointTracker(T, DeriveConfig(window=100.0))
    tr.observe(sample(prefix_queries=1000, prefix_hits=500, preemptions=7), 0.0)
    tr.observe(sample(prefix_queries=1100, prefix_hits=550, preemptions=9), 1.0)
    # the engine restarted: counters start again from zero
    tr.observe(sample(prefix_queries=40, prefix_hits=40, preemptions=1), 2.0)
    st = tr.state(2.0)
    assert st.preemptions == 2 + 1
    assert st.prefix_cache_hit_rate == pytest.approx((50 + 40) / (100 + 40))


def test_failures_keep_values_then_not_ready() -> None:
    tr = EndpointTracker(T, DeriveConfig(stale_after=1.0))
    assert not tr.state(0.0).ready  # never scraped
    tr.observe(sample(running=3, waiting=1), 10.0)
    tr.fail("timeout", 10.3)
    tr.fail("ClientConnectorError: refused", 10.6)
    st = tr.state(10.6)
    assert st.ready and st.scrape_errors == 2 and st.last_error == "ClientConnectorError: refused"
    assert st.running == 3 and st.scraped_at == 10.0
    assert tr.health(10.6) == "stale"
    tr.fail("timeout", 11.2)
    st = tr.state(11.2)
    assert not st.ready and st.scrape_errors == 3 and st.running == 3
    assert tr.health(11.2) == "not_ready"
    tr.observe(sample(running=0, waiting=0), 11.3)
    st = tr.state(11.3)
    assert st.ready and st.scrape_errors == 0 and st.last_error is None


def test_discovery_readiness_wins() -> None:
    tr = EndpointTracker(Target(namespace="ns", worker_set="w", pod="p", address="a", ready=False))
    tr.observe(sample(), 1.0)
    assert not tr.state(1.0).ready


def test_context_window_refresh_schedule() -> None:
    tr = EndpointTracker(T, DeriveConfig(models_interval=300))
    assert tr.models_due == 0.0
    tr.set_context_window(None, 5.0)
    assert tr.models_due == 35.0 and tr.context_window is None
    tr.set_context_window(8192, 40.0)
    assert tr.models_due == 340.0 and tr.state(40.0).context_window == 8192


def test_gpu_stats_attach() -> None:
    gpus = [
        GpuSample("h/a/", "ns", "llama-0", "h", util_percent=30, fb_used=10, fb_free=90, fb_reserved=0, xid=0),
        GpuSample("h/b/", "ns", "llama-0", "h", util_percent=80, fb_used=60, fb_free=30, fb_reserved=10, xid=48),
        GpuSample("h/c/", "", "", "h", util_percent=100),
        GpuSample("h/d/", "other", "llama-0", "h", util_percent=None),
    ]
    by_pod = gpu_stats_by_pod(gpus)
    assert set(by_pod) == {("ns", "llama-0"), ("other", "llama-0")}
    g = by_pod[("ns", "llama-0")]
    assert g == GpuStats(utilization=0.8, memory_usage=0.6, xid_error=48, gpus=2)
    assert by_pod[("other", "llama-0")].utilization is None
    tr = EndpointTracker(T)
    tr.observe(sample(), 1.0)
    st = tr.state(1.0, g)
    assert (st.gpu_utilization, st.gpu_memory_usage, st.xid_error) == (0.8, 0.6, 48)


def test_rendered_pages_through_parser_and_derivation() -> None:
    p = pages.VllmPage(engines=2, running=5, waiting=2, kv_usage=0.5)
    tr = EndpointTracker(T, DeriveConfig(window=10.0))
    for t in range(5):
        p.advance(10, prompt=1000, hit=0.5, ttft=0.25, queue=0.05, prefill=0.1)
        tr.observe(parse_vllm(pages.render_vllm(p).encode()), float(t))
    st = tr.state(4.0)
    assert st.prefix_cache_hit_rate == pytest.approx(0.5)
    assert st.prefill_tokens_per_second == pytest.approx(500 / 0.1)
    assert st.mean_ttft_seconds == pytest.approx(0.25)
    assert st.fixed_overhead_seconds == pytest.approx(0.1)
    assert st.kv_capacity_tokens == 2 * 8192 * 16


_opt = st.one_of(st.none(), st.floats(min_value=0, max_value=1e12, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=100, allow_nan=False),
                          st.builds(VllmSample, running=_opt, waiting=st.one_of(st.none(), st.floats(-10, 10)),
                                    kv_cache_usage=st.one_of(st.none(), st.floats(-1, 2)),
                                    prefix_queries=_opt, prefix_hits=_opt, preemptions=_opt,
                                    ttft_sum=_opt, ttft_count=_opt, queue_sum=_opt, queue_count=_opt,
                                    prefill_sum=_opt, prefill_count=_opt, kv_computed_sum=_opt)),
                max_size=30))
# found by hypothesis: a subnormal prefilled-token count made the rate underflow to 0.0
@example([(0.0, VllmSample(prefill_sum=0.0, prefill_count=0.0, kv_computed_sum=0.0)),
          (1.0, VllmSample(prefill_sum=10.0, prefill_count=1.0, kv_computed_sum=5e-324))])
def test_any_sequence_derives_bounded_state(seq: list[tuple[float, VllmSample]]) -> None:
    tr = EndpointTracker(T, DeriveConfig(window=10.0))
    for t, s in sorted(seq, key=lambda x: x[0]):
        tr.observe(s, t)
        st_ = tr.state(t)
        assert st_.kv_cache_usage is None or 0.0 <= st_.kv_cache_usage <= 1.0
        assert st_.prefix_cache_hit_rate is None or 0.0 <= st_.prefix_cache_hit_rate <= 1.0
        assert st_.preemptions is None or st_.preemptions >= 0
        assert st_.fixed_overhead_seconds is None or st_.fixed_overhead_seconds >= 0
        assert st_.prefill_tokens_per_second is None or st_.prefill_tokens_per_second > 0
        assert st_.mean_ttft_seconds is None or st_.mean_ttft_seconds >= 0
        assert st_.queued is None or st_.queued >= 0
