"""How full of prefixes in use an endpoint's cache is (PrefixIndex.pressure),
and the prefix stickiness it raises: a second copy of a prefix is not put on
a pod whose cache the other prefixes in use already fill
(docs/routing-benchmark.md, "The hot working set")."""

from __future__ import annotations

from kinference_common.engine import InFlightLedger, PrefixIndex, TTFTModel, decide
from kinference_common.engine.tokens import block_hashes

from .helpers import ep, pool, req, rule, snap, tier, ws

QWEN = ws("qwen", "qwen-2.5")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _index(window: float = 2.0) -> tuple[PrefixIndex, Clock]:
    clock = Clock()
    return PrefixIndex(hot_window=window, clock=clock), clock


def test_the_hot_fraction_counts_the_distinct_blocks_sent_in_a_window() -> None:
    index, clock = _index()
    system = block_hashes("the group's system prompt " * 100)  # its blocks
    a = block_hashes("the group's system prompt " * 100 + "question one " * 30)
    b = block_hashes("the group's system prompt " * 100 + "another question " * 30)
    shared = len(set(a) & set(b))
    assert shared >= len(system) - 1 and len(a) > shared and len(b) > shared
    index.record("k", a, max_blocks=1000)
    assert index.hot_fraction("k") == len(a) / 1000
    index.record("k", a, max_blocks=1000)  # the same prompt again: nothing new in use
    assert index.hot_fraction("k") == len(a) / 1000
    index.record("k", b, max_blocks=1000)  # only the blocks after the shared prefix are new
    assert index.hot_fraction("k") == len(set(a) | set(b)) / 1000
    assert index.hot_fraction("other") == 0.0


def test_a_window_counts_until_the_next_one_has_passed() -> None:
    index, clock = _index(window=2.0)
    big = block_hashes("one prompt " * 400)
    small = block_hashes("a short one " * 40)
    index.record("k", big, max_blocks=len(big))
    assert index.hot_fraction("k") == 1.0
    clock.now += 2.0  # the next window: the last one's count still holds
    index.record("k", small, max_blocks=len(big))
    assert index.hot_fraction("k") == 1.0
    clock.now += 2.0  # the big prompt was not sent in the last full window any more
    assert index.hot_fraction("k") == len(small) / len(big)
    clock.now += 2.0  # nothing sent for a whole window
    assert index.hot_fraction("k") == 0.0
    # a block counted two windows ago counts again when it comes back
    index.record("k", big, max_blocks=len(big))
    assert index.hot_fraction("k") == 1.0


def test_pressure_lists_the_endpoints_over_half_full_in_steps_and_ages_them_out() -> None:
    index, clock = _index(window=2.0)
    p = block_hashes("a prompt of some length " * 200)
    n = len(p)
    index.record("full", p, max_blocks=n)
    index.record("roomy", p, max_blocks=4 * n)
    v = index.pressure_version
    assert index.pressure() == {"full": 1.0}
    index.record("full", p, max_blocks=n)  # no change: the version stays
    assert index.pressure_version == v
    cap = round(n / 0.7)
    index.record("half", p, max_blocks=cap)
    f = index.pressure()["half"]
    assert f == int(n / cap * 64) / 64 and 0.6 < f < n / cap
    assert index.pressure_version > v
    clock.now += 4.0  # two windows without a send: nobody is pressed any more
    assert index.pressure() == {}
    index.record("full", p, max_blocks=n)
    index.forget("full")
    assert index.pressure() == {} and index.hot_fraction("full") == 0.0


def test_a_peers_records_count_as_this_routers_own() -> None:
    index, _ = _index()
    p = block_hashes("a prompt of some length " * 200)
    index.record_peer("k", p, len(p))
    assert index.pressure() == {"k": 1.0}


def _pool():
    return pool([QWEN], [rule("r", [tier("Local", minimize="PredictedTTFT")], tie_break=["PrefixAffinity"])])


def _world():
    """h holds the prompt's prefix with 15,000 prefill tokens queued; o is
    idle, its KV mostly free (20% used) and room for the prompt, with a cache
    of 100 prompt blocks."""
    eps = [ep("qwen", "h", theta=10_000.0, overhead=0.0, kv=0.2, kv_capacity_tokens=10_000_000),
           ep("qwen", "o", theta=10_000.0, overhead=0.0, kv=0.2, kv_capacity_tokens=6_400)]
    index, clock = _index()
    hashes = block_hashes("shared system prompt " * 500)
    index.record("default/qwen/h", hashes)
    ledger = InFlightLedger()
    ledger.sent("default/qwen/h", 15_000, 0.0)
    return eps, hashes, index, clock, ledger


def test_a_holder_does_not_yield_to_a_pod_whose_cache_is_full_of_prefixes_in_use() -> None:
    eps, hashes, index, clock, ledger = _world()
    s = snap(_pool(), eps)
    assert s.candidates[1].cache_blocks == 100
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    # o's KV is 20% used and nothing was sent there lately: the copy goes to o
    assert decide(s, r, ledger=ledger, prefix=index).endpoint == "o"
    # the same KV use, but o's cache is 95% full of blocks sent there in the
    # last seconds: a copy there evicts a prefix in use, so h keeps it
    others = block_hashes("other groups' prompts " * 1300)[:95]
    index.record("default/qwen/o", others, 100)
    assert index.pressure() == {"default/qwen/o": 0.9375}  # 95 of 100, in steps of 1/64
    d = decide(s, r, ledger=ledger, prefix=index)
    assert d.endpoint == "h"
    # the pick's PredictedTTFT is still its own, without the charge
    assert abs(d.context.predicted_ttft(d.candidate) - 1.5) < 1e-9
    # once those prefixes are no longer in use, o takes the copy again
    clock.now += 4.0
    assert decide(s, r, ledger=ledger, prefix=index).endpoint == "o"


def test_the_raised_charges_are_built_once_per_snapshot_and_pressure() -> None:
    eps, hashes, index, clock, ledger = _world()
    s = snap(_pool(), eps)
    index.record("default/qwen/o", block_hashes("other groups' prompts " * 1300)[:95], 100)
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    decide(s, r, ledger=ledger, prefix=index)
    first = s.pressed_s
    assert first is not None and first[2][s.candidates[1].index] == 12.0
    # the snapshot's own unchanged (nothing waits on o at its scrape: TTFTModel.prefix_stickiness_unqueued)
    assert first[2] is not s.ttft_s and s.ttft_s[s.candidates[1].index] == TTFTModel().prefix_stickiness_unqueued
    decide(s, r, ledger=ledger, prefix=index)
    assert s.pressed_s is first
    index.record("default/qwen/o", block_hashes("yet another prompt " * 300)[:3], 100)  # 95 -> 98 of 100
    decide(s, r, ledger=ledger, prefix=index)
    assert s.pressed_s is not first


def test_a_record_of_the_decision_keeps_the_pressure_and_replays_to_the_same_pick() -> None:
    """`kinfctl replay` must take the decision again from what it read."""
    from kinference_common.engine.trace import OutcomeTrace
    from kinference_common.recording import DecisionRecord, RecordedRequest, decode, encode
    from kinference_router.recording import Recorder
    from kinfctl.replay import _decide

    eps, hashes, index, clock, ledger = _world()
    s = snap(_pool(), eps)
    index.record("default/qwen/o", block_hashes("other groups' prompts " * 1300)[:95], 100)
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    d = decide(s, r, ledger=ledger, prefix=index)
    assert d.endpoint == "h"
    Recorder.capture(d)
    assert d.inputs.pressure == {"default/qwen/o": 0.9375}
    rec = decode(encode(DecisionRecord(
        decision_id="d1", at=0.0, router="r", snapshot=1, namespace="default", pool="p",
        request=RecordedRequest(model="qwen-2.5", prompt_tokens=2_600, block_hashes=list(hashes)),
        loads=d.inputs.loads, matches=d.inputs.matches, held=d.inputs.held, pressure=d.inputs.pressure,
        outcome=OutcomeTrace(type="Routed", endpoint="h"))))
    again, _ = _decide(s, rec, r)
    assert again.endpoint == "h"
    # without the pressure the record would replay to o: the field is what keeps it
    again, _ = _decide(s, msgspec_replace(rec, pressure={}), r)
    assert again.endpoint == "o"


def msgspec_replace(rec, **changes):  # noqa: ANN001, ANN003, ANN201
    import msgspec

    return msgspec.structs.replace(rec, **changes)
