"""PredictedTTFT, the in-flight ledger and the prefix index."""

from __future__ import annotations

import pytest
from kinference_common.engine import InFlightLedger, PrefixIndex, TTFTModel, decide
from kinference_common.engine.signals import DecisionContext
from kinference_common.engine.tokens import BLOCK_CHARS, block_hashes

from .helpers import NOW, ep, pool, prov, pstate, req, snap, ws

QWEN = ws("qwen", "qwen-2.5")
KEY0, KEY1 = "default/qwen/q0", "default/qwen/q1"


def _ctx(ledger=None, prompt_tokens=1000, hashes=(), prefix=None, model=TTFTModel()):
    return DecisionContext(ledger.loads if ledger else {}, prompt_tokens, hashes, prefix, model)


def test_predicted_ttft_follows_the_documented_model() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=2, running=64, theta=8000, overhead=0.05)])
    c = s.candidates[0]
    m = TTFTModel()
    expected = 0.05 + (2 * m.queued_prompt_tokens + 1000) / 8000 * (1 + m.running_slowdown * 64)
    assert _ctx(prompt_tokens=1000).predicted_ttft(c) == pytest.approx(expected)


def test_defaults_when_throughput_is_unknown() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", theta=None, overhead=None, queued=0, running=0),
                            ep("qwen", "q1", theta=2000, queued=0, running=0)])
    q0 = s.by_id["Local/qwen/q0"]
    assert q0.theta == 2000  # the worker set's median
    s2 = snap(pool([QWEN]), [ep("qwen", "q0", theta=None, overhead=None, queued=0, running=0)])
    m = TTFTModel()
    assert _ctx(prompt_tokens=400).predicted_ttft(s2.candidates[0]) == pytest.approx(
        m.default_overhead_seconds + 400 / m.default_prefill_tps)


def test_kv_wait_when_the_request_does_not_fit() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", kv=0.99, kv_capacity_tokens=100_000, theta=10000, overhead=0.0),
                            ep("qwen", "q1", kv=0.10, kv_capacity_tokens=100_000, theta=10000, overhead=0.0)])
    full, free = s.by_id["Local/qwen/q0"], s.by_id["Local/qwen/q1"]
    ctx = _ctx(prompt_tokens=5000)
    assert ctx.predicted_ttft(full) > ctx.predicted_ttft(free)
    assert ctx.predicted_ttft(free) == pytest.approx(0.5)
    assert ctx.predicted_ttft(full) == pytest.approx(0.5 + 4000 / 10000)


def test_own_unseen_sends_count_in_queue_and_ttft() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=1, running=0, theta=1000, overhead=0.0)])
    c = s.candidates[0]
    ledger = InFlightLedger()
    send = ledger.sent(KEY0, 2000, NOW + 1)  # after the scrape: the engine cannot know it
    ctx = _ctx(ledger, prompt_tokens=0)
    assert ctx.queued(c) == 2
    assert ctx.queue_tokens(c) == pytest.approx(1 * TTFTModel().queued_prompt_tokens + 2000)
    ledger.observed(KEY0, NOW + 2)  # the next scrape includes it: counted once, with its real size
    ctx = _ctx(ledger, prompt_tokens=0)
    assert ctx.queued(c) == 1  # the engine's count (which now includes ours)
    assert ctx.queue_tokens(c) == pytest.approx(2000)
    ledger.first_token(send)
    assert ledger.in_flight(KEY0) == 1 and ledger.loads[KEY0].pending_count == 0
    ledger.finished(send)
    assert ledger.loads[KEY0].drained_count == 1  # the last scrape still counts it waiting
    ledger.observed(KEY0, NOW + 3)
    assert KEY0 not in ledger.loads


def test_a_burst_is_spread_before_telemetry_catches_up() -> None:
    p = pool([QWEN], None)
    s = snap(p, [ep("qwen", f"q{i}", queued=0, running=0) for i in range(4)])
    ledger = InFlightLedger()
    picks = []
    for _ in range(8):
        d = decide(s, req("qwen-2.5", prompt_tokens=2000), ledger=ledger)
        picks.append(d.endpoint)
        ledger.sent(d.candidate.ledger_key, 2000, NOW + 1)
    assert sorted(picks) == ["q0", "q0", "q1", "q1", "q2", "q2", "q3", "q3"]


def test_stale_endpoint_queue_comes_from_the_ledger_only() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=50, age=120)], stale_after=10)
    c = s.candidates[0]
    assert c.stale and c.queued is None
    ledger = InFlightLedger()
    ledger.sent(KEY0, 300, NOW - 200)
    ctx = _ctx(ledger)
    assert ctx.queued(c) == 1 and ctx.queue_tokens(c) == 300


def test_ledger_is_idempotent_and_sparse() -> None:
    ledger = InFlightLedger()
    a = ledger.sent(KEY0, 10, 1.0)
    b = ledger.sent(KEY1, 20, 1.0)
    ledger.finished(a)
    ledger.finished(a)
    ledger.first_token(b)
    ledger.first_token(b)
    assert KEY0 not in ledger.loads
    assert ledger.loads[KEY1].in_flight == 1 and ledger.loads[KEY1].pending_count == 0
    ledger.finished(b)
    assert ledger.loads == {}


# ------------------------------------------------------------- prefix index


def test_prefix_index_matches_leading_blocks_only() -> None:
    base = "a" * BLOCK_CHARS + "b" * BLOCK_CHARS + "c" * BLOCK_CHARS
    index = PrefixIndex()
    index.record(KEY0, block_hashes(base))
    assert index.match(block_hashes(base)) == {KEY0: 3}
    assert index.match(block_hashes(base[: 2 * BLOCK_CHARS] + "z" * BLOCK_CHARS)) == {KEY0: 2}
    # same second block after a different first block is not a prefix match
    assert index.match(block_hashes("z" * BLOCK_CHARS + "b" * BLOCK_CHARS)) == {}


def test_prefix_index_memory_is_bounded_and_keeps_prefixes_longest() -> None:
    index = PrefixIndex(max_blocks_per_endpoint=8)
    first = block_hashes("".join(chr(65 + i) * BLOCK_CHARS for i in range(6)))
    index.record(KEY0, first)
    second = block_hashes("".join(chr(97 + i) * BLOCK_CHARS for i in range(6)))
    index.record(KEY0, second)
    assert index.blocks(KEY0) == 8
    # the second prompt is intact; the first lost its tail, not its head
    assert index.match(second) == {KEY0: 6}
    assert index.match(first) == {KEY0: 2}
    index.forget(KEY0)
    assert index.match(second) == {} and index.blocks(KEY0) == 0


def test_prefix_hits_shorten_predicted_ttft_and_win() -> None:
    p = pool([QWEN], None)
    s = snap(p, [ep("qwen", "q0", queued=1), ep("qwen", "q1", queued=2)])
    prompt = "system prompt, long and shared. " * 200
    hashes = block_hashes(prompt)
    index = PrefixIndex()
    index.record(KEY1, hashes)
    r = req("qwen-2.5", prompt_tokens=1600, block_hashes=hashes)
    assert decide(s, r).endpoint == "q0"
    d = decide(s, r, prefix=index)
    assert d.endpoint == "q1"
    scores = {x.candidate: x for x in d.trace().rules[0].scores}
    assert scores["Local/qwen/q1"].prefix_blocks == len(hashes)
    assert scores["Local/qwen/q1"].predicted_ttft_ms < scores["Local/qwen/q0"].predicted_ttft_ms


def test_hit_rate_is_used_without_block_hashes() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", hit_rate=0.5, queued=0, running=0, theta=1000, overhead=0.0)])
    assert _ctx(prompt_tokens=1000).predicted_ttft(s.candidates[0]) == pytest.approx(0.5)


def test_provider_estimated_ttft_goes_unknown_when_old() -> None:
    db = prov("databricks", {"qwen-2.5": "x"})
    st = pstate("databricks", 0.4)
    s = snap(pool([db]), [], [st], now=st.updated_at + 7200, provider_stale_after=3600)
    assert s.candidates[0].est_ttft is None
    s2 = snap(pool([db]), [], [st])
    assert s2.candidates[0].est_ttft == 0.4


def test_prefix_holders_per_block_are_capped() -> None:
    index = PrefixIndex(max_holders_per_block=3)
    hashes = block_hashes("shared " * 200)
    for i in range(10):
        index.record(f"default/qwen/p{i}", hashes)
    assert set(index.match(hashes)) == {"default/qwen/p7", "default/qwen/p8", "default/qwen/p9"}


def test_fast_ranking_agrees_with_the_exact_model() -> None:
    """The precomputed per-endpoint lines give exactly DecisionContext.predicted_ttft."""
    import random as _random

    from kinference_common.engine.decide import _rank_predicted_ttft

    rng = _random.Random(3)
    eps = [ep("qwen", f"q{i}", queued=rng.randint(0, 9), running=rng.randint(0, 99), kv=rng.random(),
              kv_capacity_tokens=rng.choice([None, 20_000, 200_000]), hit_rate=rng.choice([None, 0.3]),
              theta=rng.choice([None, 3000.0, 12000.0]), age=rng.choice([0.1, 60.0]))
           for i in range(40)]
    s = snap(pool([QWEN]), eps, ttft_model=TTFTModel(calibration=1.3))
    ledger = InFlightLedger()
    for c in s.candidates[:10]:
        ledger.sent(c.ledger_key, rng.randint(1, 3000), NOW + rng.choice([-1, 1]))
    index = PrefixIndex()
    hashes = block_hashes("prefix " * 400)
    for c in s.candidates[5:15]:
        index.record(c.ledger_key, hashes[: rng.randint(1, len(hashes))])
    busy = InFlightLedger()  # the same, plus another pool's endpoints: more keys than candidates
    for key, load in ledger.loads.items():
        busy.loads[key] = load
    for i in range(100):
        busy.sent(f"other/ws/p{i}", 100, NOW)
    for hs, led in (((), ledger), (hashes, ledger), ((), busy), (hashes, busy)):
        for p_tokens in (10, 3000, 30000):
            ctx = _ctx(led, prompt_tokens=p_tokens, hashes=hs, prefix=index, model=s.ttft_model)
            tied, best = _rank_predicted_ttft(s, s.candidates, ctx)
            exact = {c.index: _ctx(led, p_tokens, hs, index, s.ttft_model).predicted_ttft(c)
                     for c in s.candidates}
            assert best == pytest.approx(min(exact.values()))
            assert {c.index for c in tied} == {i for i, v in exact.items() if v == pytest.approx(best)}



@pytest.mark.parametrize("workload", [("h100", 10.0, 1000, 0), ("h100", 10.0, 2000, 1500), ("a10g", 3.0, 500, 0)])
def test_predicted_ttft_beats_the_run_mean_on_the_simulated_engine(workload) -> None:
    """PredictedTTFT vs the simulator's measured TTFT (tests/engine/ttft_accuracy.py):
    its error must be well under that of the run's mean TTFT (which knows the future)."""
    from .ttft_accuracy import evaluate

    r = evaluate(*workload, duration=30.0)
    assert r["requests"] > 50
    assert r["mae_ms"] < 0.8 * r["naive_mae_ms"], r
