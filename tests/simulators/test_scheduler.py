"""The scheduler core, without HTTP and without sleeping: exact, simulated time.

These are the "vLLM shape" tests of issue 4: under rising load TTFT grows
with the prefill tokens queued ahead, KV use rises, preemptions appear when
KV is short, and a shared prefix lowers TTFT (with the hits counted).
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from kinference_simulators import offline, tokens
from kinference_simulators.offline import Arrival
from kinference_simulators.profiles import SpeedProfile, get_profile
from kinference_simulators.scheduler import Scheduler, SchedulerConfig

#: round numbers so timings can be checked exactly
EXACT = dataclasses.replace(
    get_profile("fast"),
    step_overhead_s=0.01,
    prefill_token_s=0.001,
    decode_seq_s=0.001,
    context_token_s=0.0,
)
A10G = get_profile("a10g")


def text(n_tokens: int, seed: int | str = 0) -> str:
    return offline.random_text(random.Random(seed), n_tokens)


def config(**kw: int | bool) -> SchedulerConfig:
    base: dict[str, int | bool] = {
        "num_gpu_blocks": 1024,
        "block_size": 16,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 2048,
        "max_model_len": 8192,
    }
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def add(s: Scheduler, rid: str, prompt: str, out: int, now: float = 0.0) -> None:
    s.add_request(
        rid,
        tokens.count_tokens(prompt),
        tokens.block_hashes(prompt, s.config.block_size),
        out,
        "length",
        now,
    )


# ------------------------------------------------------------ step mechanics


def test_prefill_then_one_token_per_decode_step_exact_times() -> None:
    s = Scheduler(config(), EXACT)
    add(s, "a", text(100), 3)
    r1 = s.step(0.0)
    assert r1.prefill_tokens == 100 and r1.decode_seqs == 0
    assert r1.duration == pytest.approx(0.01 + 0.1)
    assert [(t.index, t.latency) for t in r1.tokens] == [(0, pytest.approx(0.11))]
    r2 = s.step(r1.end)
    assert r2.decode_seqs == 1 and r2.prefill_tokens == 0
    assert r2.duration == pytest.approx(0.011)
    r3 = s.step(r2.end)
    assert r3.tokens[0].finish_reason == "length"
    (f,) = r3.finished
    assert f.output_tokens == 3
    assert f.ttft == pytest.approx(0.11)
    assert f.e2e == pytest.approx(0.11 + 2 * 0.011)
    assert s.counters.generation_tokens == 3 and s.counters.prompt_tokens == 100
    assert s.kv_usage() == 0.0 and not s.has_work()


def test_chunked_prefill_shares_the_budget_with_running_decodes() -> None:
    s = Scheduler(config(max_num_batched_tokens=1000), EXACT)
    add(s, "decoder", text(10, "d"), 100)
    s.step(0.0)  # decoder prefilled, now decoding
    add(s, "long", text(2500, "l"), 1, 0.0)
    chunks = []
    while True:
        r = s.step(0.0)
        chunks.append((r.prefill_tokens, r.decode_seqs))
        if any(t.request_id == "long" for t in r.tokens):
            break
    # the decode goes first (1 token), the prefill gets the rest of the budget
    assert chunks == [(999, 1), (999, 1), (502, 1)]


def test_sequence_cap_bounds_the_running_batch() -> None:
    s = Scheduler(config(max_num_seqs=3), EXACT)
    for i in range(10):
        add(s, f"r{i}", text(20, i), 5)
    peak = 0
    now = 0.0
    while s.has_work():
        r = s.step(now)
        now = r.end
        peak = max(peak, s.num_running)
    assert peak == 3


def test_token_budget_caps_each_step() -> None:
    s = Scheduler(config(max_num_batched_tokens=512), EXACT)
    for i in range(6):
        add(s, f"r{i}", text(300, i), 2)
    r = s.step(0.0)
    assert r.prefill_tokens == 512
    assert r.admitted == ["r0", "r1"]


# ------------------------------------------------------------- TTFT vs queue


def test_ttft_grows_with_prefill_tokens_queued_ahead() -> None:
    prompts = [text(1000, i) for i in range(12)]
    res = offline.run(config(), EXACT, offline.burst(prompts, output_len=4))
    ttfts = [f.ttft for f in res.per_request]
    queued = [res.queued_at_arrival[f.request_id] for f in res.per_request]
    assert queued == [1000 * i for i in range(12)]
    assert all(b >= a for a, b in itertools.pairwise(ttfts))
    assert ttfts[-1] > 5 * ttfts[0]
    # about one prefill token's cost per queued token (the first step also
    # carries a chunk of the third request; later steps carry decodes)
    slope = (ttfts[-1] - ttfts[0]) / (queued[-1] - queued[0])
    assert 0.8 * EXACT.prefill_token_s <= slope < 1.5 * EXACT.prefill_token_s


def _poisson(rate: float, shared: int = 0, seed: int = 7) -> list[Arrival]:
    return offline.poisson_workload(
        random.Random(seed),
        rate=rate,
        duration=60,
        prompt_tokens=1024,
        output_tokens=128,
        shared_prefix_tokens=shared,
    )


def test_rising_load_raises_ttft_and_kv_use() -> None:
    cfg = config(num_gpu_blocks=2700, max_num_seqs=256, max_model_len=4096)
    runs = [offline.run(cfg, A10G, _poisson(rate)) for rate in (0.5, 1.0, 2.0, 3.0)]
    ttft = [r.mean_ttft() for r in runs]
    kv = [r.mean_kv_usage() for r in runs]
    assert ttft == sorted(ttft) and ttft[-1] > 5 * ttft[0]
    assert kv == sorted(kv) and kv[-1] > 3 * kv[0]
    assert all(
        len(r.per_request) == len(_poisson(rate))
        for r, rate in zip(runs, (0.5, 1.0, 2.0, 3.0), strict=True)
    )


def test_preemptions_appear_only_when_kv_is_short() -> None:
    work = _poisson(2.0)
    ample = offline.run(
        config(num_gpu_blocks=20000, max_num_seqs=256, max_model_len=4096), A10G, work
    )
    short = offline.run(
        config(num_gpu_blocks=400, max_num_seqs=256, max_model_len=4096), A10G, work
    )
    assert ample.preemptions == 0
    assert short.preemptions > 0
    assert short.max_kv_usage() == 1.0
    # preempted requests are recomputed, and still finish with all their tokens
    assert sum(f.preemptions for f in short.per_request) == short.preemptions
    assert [f.output_tokens for f in short.per_request] == [128] * len(work)
    assert short.mean_ttft() > ample.mean_ttft()


def test_newest_running_request_is_the_one_preempted() -> None:
    # 6 blocks of 4 tokens: three 7-token prompts take 2 blocks each; the first
    # decode that needs a third block must evict the newest request.
    s = Scheduler(config(num_gpu_blocks=6, block_size=4, max_model_len=24), EXACT)
    for i in range(3):
        add(s, f"r{i}", "abcdefghijklmnopqrstuvwxyz01"[: 7 * 4], 6)
    r = s.step(0.0)
    assert r.admitted == ["r0", "r1", "r2"] and s.kv_usage() == 1.0
    r = s.step(r.end)  # r0 grows to 8 tokens: fits; r1... until a block is needed
    now = r.end
    preempted: list[str] = []
    while not preempted:
        r = s.step(now)
        now = r.end
        preempted = r.preempted
    assert preempted == ["r2"]
    assert s.waiting[0].request_id == "r2" and s.counters.preemptions == 1


def test_shared_prefix_lowers_ttft_and_counts_hits() -> None:
    cfg = config(num_gpu_blocks=2700, max_num_seqs=256, max_model_len=4096)
    unique = offline.run(cfg, A10G, _poisson(2.0))
    shared = offline.run(cfg, A10G, _poisson(2.0, shared=768))
    # unique prompts never hit on arrival (only a preempted request re-hits its own blocks)
    assert all(f.cached_tokens == 0 for f in unique.per_request)
    assert all(f.cached_tokens >= 752 for f in shared.per_request[1:])
    assert shared.prefix_cache_hits > 0
    assert shared.hit_rate > 0.6
    assert shared.mean_ttft() < unique.mean_ttft() / 2


def test_repeat_prompt_hits_all_but_the_last_block() -> None:
    s = Scheduler(config(), EXACT)
    prompt = text(1000)
    add(s, "a", prompt, 1)
    first = s.step(0.0)
    add(s, "b", prompt, 1, first.end)
    second = s.step(first.end)
    (fa,), (fb,) = first.finished, second.finished
    assert fa.cached_tokens == 0
    assert fb.cached_tokens == (1000 - 1) // 16 * 16 == 992
    assert second.prefill_tokens == 8
    assert fb.ttft < fa.ttft / 10
    assert s.counters.prefix_cache_hits == 992
    assert s.counters.prefix_cache_queries == 2000
    assert s.counters.prompt_tokens_cached == 992


def test_no_prefix_caching_means_no_hits() -> None:
    s = Scheduler(config(enable_prefix_caching=False), EXACT)
    prompt = text(500)
    add(s, "a", prompt, 1)
    s.step(0.0)
    add(s, "b", prompt, 1)
    r = s.step(1.0)
    assert r.prefill_tokens == 500 and s.counters.prefix_cache_hits == 0


# ------------------------------------------------------------------- misc


def test_abort_frees_kv_and_reports_abort() -> None:
    s = Scheduler(config(), EXACT)
    add(s, "a", text(400), 50)
    add(s, "b", text(400, 1), 50)
    s.step(0.0)
    assert s.kv_usage() > 0
    fa = s.abort("a", 1.0)
    fb = s.abort("b", 1.0)
    assert fa is not None and fa.finish_reason == "abort" and fa.output_tokens == 1
    assert fb is not None
    assert s.abort("a", 1.0) is None
    assert s.kv_usage() == 0.0 and not s.has_work()


def test_same_inputs_same_run() -> None:
    cfg = config(num_gpu_blocks=500, max_model_len=4096)
    a = offline.run(cfg, A10G, _poisson(2.0, shared=256))
    b = offline.run(cfg, A10G, _poisson(2.0, shared=256))
    assert a.per_request == b.per_request
    assert a.samples == b.samples


def test_config_and_request_validation() -> None:
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        SchedulerConfig(num_gpu_blocks=10, block_size=16, max_model_len=1000)
    s = Scheduler(config(max_model_len=100, num_gpu_blocks=10), EXACT)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request("x", 90, (), 20, "length", 0.0)
    s.add_request("y", 10, (), 5, "length", 0.0)
    with pytest.raises(ValueError, match="duplicate"):
        s.add_request("y", 10, (), 5, "length", 0.0)


def test_profile_step_cost_is_linear() -> None:
    p: SpeedProfile = EXACT
    assert p.step_seconds(0, 0) == 0.0
    assert p.step_seconds(100, 10) == pytest.approx(0.01 + 0.1 + 0.01)
