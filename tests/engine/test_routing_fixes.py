"""The engine fixes the fleet benchmark found (docs/routing-benchmark.md,
"What the benchmark found in the engine, and what changed"), one or more
tests each: PredictedTTFT's ties for the rule's ``tieBreak``, the prefix
index's bound and fill, the charge on a prefix's second copy, the learned
rates of endpoints that served little, and the spread to a pod with an
empty cache."""

from __future__ import annotations

import msgspec
import pytest

from kinference_common.engine import InFlightLedger, PrefixIndex, TTFTModel, decide
from kinference_common.engine.tokens import block_hashes

from .helpers import ep, pool, req, rule, snap, tier, ws

QWEN = ws("qwen", "qwen-2.5")


def _pool(tie_break: list[str] | None):
    return pool([QWEN], [rule("r", [tier("Local", minimize="PredictedTTFT")], tie_break=tie_break)])


def test_near_equal_predictions_are_ties_for_the_tie_breakers() -> None:
    # three idle endpoints whose learned Theta differs by a few percent
    eps = [ep("qwen", "a", theta=10_000.0), ep("qwen", "b", theta=10_300.0), ep("qwen", "c", theta=10_200.0)]
    s = snap(_pool(["LeastInFlight"]), eps)
    ledger = InFlightLedger()
    picks = []
    for _ in range(3):
        d = decide(s, req("qwen-2.5", prompt_tokens=4000), ledger=ledger)
        picks.append(d.endpoint)
        ledger.sent(d.candidate.ledger_key, d.prefill_tokens, 0.0)
    # without the tolerance every one would go to "b" (the highest Theta) until
    # its own queue showed; with it, LeastInFlight spreads them
    assert sorted(picks) == ["a", "b", "c"]
    assert picks[0] == "b"  # the best prediction first among the tied


def test_tolerance_zero_keeps_the_exact_minimum() -> None:
    eps = [ep("qwen", "a", theta=10_000.0), ep("qwen", "b", theta=10_300.0)]
    s = snap(_pool(["LeastInFlight"]), eps, ttft_model=TTFTModel(tie_tolerance=0.0, tie_tolerance_seconds=0.0))
    ledger = InFlightLedger()
    ledger.sent("default/qwen/b", 1, 0.0)  # b has one in flight, but no queued prefill worth a tie
    ledger.first_token(ledger.sent("default/qwen/b", 0, 0.0))
    d = decide(s, req("qwen-2.5", prompt_tokens=4000), ledger=ledger)
    assert d.endpoint == "b"


def test_without_a_tie_break_the_lowest_prediction_wins() -> None:
    eps = [ep("qwen", "a", theta=10_000.0), ep("qwen", "b", theta=10_300.0)]
    d = decide(snap(_pool(None), eps), req("qwen-2.5", prompt_tokens=4000))
    assert d.endpoint == "b"


def test_a_clearly_better_endpoint_is_not_a_tie() -> None:
    eps = [ep("qwen", "a", theta=10_000.0), ep("qwen", "b", theta=13_000.0)]
    s = snap(_pool(["LeastInFlight"]), eps)
    ledger = InFlightLedger()
    for _ in range(2):
        d = decide(s, req("qwen-2.5", prompt_tokens=4000), ledger=ledger)
        assert d.endpoint == "b"
        # b's prediction rises with what this router queued there; one 4,000-token
        # prompt is enough for a to be near-equal, then LeastInFlight goes to a
        ledger.sent(d.candidate.ledger_key, 0, 0.0)


def test_a_prefix_match_still_wins_over_near_equal_cold_endpoints() -> None:
    eps = [ep("qwen", "a"), ep("qwen", "b"), ep("qwen", "c")]
    s = snap(_pool(["PrefixAffinity", "LeastInFlight"]), eps)
    hashes = block_hashes("system prompt " * 600)
    index = PrefixIndex()
    index.record("default/qwen/c", hashes)
    d = decide(s, req("qwen-2.5", prompt_tokens=2200, block_hashes=hashes), prefix=index)
    assert d.endpoint == "c"


def test_candidates_know_their_cache_size_in_prompt_blocks() -> None:
    s = snap(_pool(None), [ep("qwen", "a", kv_capacity_tokens=19_200), ep("qwen", "b")])
    a, b = s.candidates
    assert a.cache_blocks == 300  # 19,200 tokens / 64 tokens a block
    assert b.cache_blocks is None


def test_the_index_forgets_what_the_cache_cannot_hold() -> None:
    index = PrefixIndex()
    first = block_hashes("first system prompt " * 200)  # ~15 blocks
    second = block_hashes("another system prompt " * 200)
    index.record("k", first, max_blocks=20)
    assert index.match(first) == {"k": len(first)}
    index.record("k", second, max_blocks=20)
    assert index.blocks("k") == 20  # all sent in the last seconds: in use, kept up to the whole cache
    # the older prompt lost its tail (its head was touched last, so it stays longest)
    assert index.match(first).get("k", 0) < len(first)
    assert index.match(second) == {"k": len(second)}


def _aged(fill: float, old: int, new: int, later: float, *, peer: bool = False) -> PrefixIndex:
    """An index of a 100-block cache sent ``old`` blocks of one prompt at
    t = 0, then ``new`` blocks of another at ``later`` (a peer's record
    with ``peer``)."""
    now = [0.0]
    index = PrefixIndex(clock=lambda: now[0], kv_fill=fill)
    record = index.record_peer if peer else index.record
    record("k", tuple(range(1000, 1000 + old)), 100)
    now[0] = later
    record("k", tuple(range(2000, 2000 + new)), 100)
    return index


def test_the_index_keeps_less_than_the_kv_cache_holds_of_what_is_not_in_use() -> None:
    """The engine's cache also holds the tokens it generated, which the
    index never sees: while its least recent block was sent before the last
    hot window (no longer in use), the index trims to ``kv_fill`` of the
    cache's size (fix 11 of docs/routing-benchmark.md). A prefix sent, then
    90 blocks of other prompts 10 s later: the engine no longer holds the
    prefix, nor does the index."""
    prefix = tuple(range(1000, 1010))
    assert PrefixIndex().kv_fill == PrefixIndex.KV_FILL < 1.0
    assert _aged(1.0, 10, 90, 10.0).match(prefix) == {"k": 10}
    for peer in (False, True):  # a peer's record (replica sync) is trimmed the same way
        index = _aged(PrefixIndex.KV_FILL, 10, 90, 10.0, peer=peer)
        assert index.match(prefix) == {} and index.blocks("k") == 90
        assert index.hot_fraction("k") == 0.9  # measured against the whole cache
    # trimmed to the fill, not further: 40 old + 50 new blocks keep 35 of the old (its first ones)
    index = _aged(PrefixIndex.KV_FILL, 40, 50, 10.0)
    assert index.blocks("k") == 85 and index.match(tuple(range(1000, 1040))) == {"k": 35}


def test_blocks_sent_in_the_last_hot_window_are_kept_up_to_the_whole_cache() -> None:
    """A running request's blocks the engine cannot evict: blocks sent in
    this hot window or the one before are kept up to the whole cache (with
    the fill on every block, ``trial`` past saturation lost the copies its
    running requests used); two windows later they are trimmed."""
    prefix = tuple(range(1000, 1010))
    window = PrefixIndex().hot_window
    for later, kept in ((0.5 * window, 10), (1.5 * window, 10), (2.5 * window, 0)):
        index = _aged(PrefixIndex.KV_FILL, 10, 90, later)
        assert index.match(prefix).get("k", 0) == kept, later
    assert _aged(PrefixIndex.KV_FILL, 10, 95, 0.0).blocks("k") == 100  # never more than the cache


def test_the_fill_applies_to_the_cache_the_index_can_hold() -> None:
    """A cache larger than the index's own bound is trimmed to the fill of
    that bound, not kept whole; a fill outside (0, 1] is refused."""
    now = [0.0]
    index = PrefixIndex(max_blocks_per_endpoint=100, clock=lambda: now[0])
    index.record("k", tuple(range(100)), 10**6)
    now[0] = 10.0
    index.record("k", tuple(range(1000, 1001)), 10**6)
    assert index.blocks("k") == int(100 * PrefixIndex.KV_FILL)
    for bad in (0.0, 1.2, -1.0):
        with pytest.raises(ValueError, match="kv_fill"):
            PrefixIndex(kv_fill=bad)


def _answers(index: PrefixIndex, key: str, prefill: int, output: int, n: int = 200) -> None:
    for _ in range(n):
        index.observe_output(key, prefill, output)


def test_the_fill_is_the_kv_usage_plus_the_rest_at_the_prompt_share() -> None:
    """Fix 13: the part of an endpoint's cache the index keeps is what
    running requests hold (the scraped KV usage, prompts) plus the rest at
    the share of prompt tokens in what the endpoint computed (each answer's
    usage), between MIN_FILL and KV_FILL; KV_FILL while the usage is not known."""
    index = PrefixIndex()
    assert index.fill("k") == PrefixIndex.KV_FILL  # nothing known of k
    index.record("k", (1, 2), 100, kv_usage=0.4)
    prior = 0.4 + 0.6 * PrefixIndex.PROMPT_SHARE
    assert index.fill("k") == pytest.approx(prior)  # no answer yet: the prior
    for bad in ((-1, 10), (10, -1), (0, 0), (float("nan"), 10)):  # not an answer: no change
        index.observe_output("k", *bad)
    assert index.fill("k") == pytest.approx(prior)
    index.observe_output("k", 0, 100)  # one answer moves the share by SHARE_WEIGHT of the way to its own
    w = PrefixIndex.SHARE_WEIGHT
    assert index.fill("k") == pytest.approx(0.4 + 0.6 * PrefixIndex.PROMPT_SHARE * (1 - w))
    _answers(index, "k", 384, 192)  # a conversation's turn: 384 new prompt tokens, 192 generated
    assert index.fill("k") == pytest.approx(0.4 + 0.6 * 384 / 576, abs=1e-3)
    for unknown in (None, float("nan"), 1.5, -0.1):  # a record without a usable KV usage keeps the last one
        index.record("k", (1, 2), 100, kv_usage=unknown)
        assert index.fill("k") == pytest.approx(0.4 + 0.6 * 384 / 576, abs=1e-3)
    index.record("k", (1, 2), 100, kv_usage=0.9)  # a busy cache is mostly prompts: at most KV_FILL
    assert index.fill("k") == PrefixIndex.KV_FILL
    index.record("k", (1, 2), 100, kv_usage=0.0)
    _answers(index, "k", 10, 1000)  # answers a hundred times their prompts: never under MIN_FILL
    assert index.fill("k") == PrefixIndex.MIN_FILL
    assert index.fill("other") == PrefixIndex.KV_FILL  # per endpoint
    index.forget("k")  # a restarted endpoint starts again from what is known of it: nothing
    assert index.fill("k") == PrefixIndex.KV_FILL
    index.record("k", (1, 2), 100, kv_usage=0.4)  # its share too starts again from the prior
    assert index.fill("k") == pytest.approx(prior)
    assert PrefixIndex(kv_fill=0.3).fill("k") == 0.3  # a lower bound given is kept
    low = PrefixIndex(kv_fill=0.3)
    low.record("k", (1,), 100, kv_usage=0.0)
    _answers(low, "k", 10, 1000)
    assert low.fill("k") == 0.3


def test_the_prompt_share_counts_the_prompt_in_the_engines_tokens() -> None:
    """Fix 14: the prefill (the router's estimate) is scaled into the
    engine's tokens, the unit of the tokens generated: by the answer's own
    count of its prompt where its usage gives one, else by the endpoint's
    engine tokens per estimated token learned from answers that did."""
    w = PrefixIndex.SHARE_WEIGHT

    def answer_share(index: PrefixIndex, *answer: float) -> float:
        """The share of ``answer`` (observe_output's arguments after the key)."""
        before = index.prompt_share("k")
        index.observe_output("k", *answer)
        return (index.prompt_share("k") - before * (1 - w)) / w

    index = PrefixIndex()
    assert index.tokens_per_estimated("k") == 1.0
    assert answer_share(index, 100, 50) == pytest.approx(100 / 150)  # nothing known: the estimate as it is
    # 100 of an estimated 400 to compute, the engine counts the prompt 800: 200 of its tokens
    assert answer_share(index, 100, 50, 400, 800) == pytest.approx(200 / 250)
    assert index.tokens_per_estimated("k") == pytest.approx(2.0)  # the first count is the ratio
    assert answer_share(index, 100, 50) == pytest.approx(200 / 250)  # no count: scaled by what was learned
    assert answer_share(index, 100, 50, 400, 400) == pytest.approx(100 / 150)  # a count is this answer's own
    assert index.tokens_per_estimated("k") == pytest.approx(2.0 * (1 - w) + w * 1.0)  # about the last 20
    for no_count in ((100, 50, 0, 800), (100, 50, 400, 0), (100, 50, 400, None)):  # nothing to learn from
        answer_share(index, *no_count)
        assert index.tokens_per_estimated("k") == pytest.approx(2.0 * (1 - w) + w * 1.0)
    assert index.tokens_per_estimated("other") == 1.0  # per endpoint
    index.forget("k")
    assert index.tokens_per_estimated("k") == 1.0


def test_a_conversation_evicted_by_generated_tokens_is_not_promised() -> None:
    """Fix 13: a pod running few requests whose answers are long against the
    new part of their prompts (a conversation's turns) holds fewer prompts
    than KV_FILL of its cache: 40 blocks of a conversation, then 50 of
    others 10 s later, on a 100-block cache 40% in use whose answers
    generated two tokens for every three prompt tokens computed. The index
    keeps 76 blocks (0.4 + 0.6 x 0.6), 26 of the conversation's first ones,
    where KV_FILL kept 35; with the pod busy (KV 90% used) it keeps 35 again."""
    def aged(usage: float | None, *, peer: bool = False) -> PrefixIndex:
        """With ``peer``, the later record is a peer's, which brings no KV usage."""
        now = [0.0]
        index = PrefixIndex(clock=lambda: now[0])
        _answers(index, "k", 600, 400)
        index.record("k", tuple(range(1000, 1040)), 100, kv_usage=usage)
        now[0] = 10.0
        if peer:
            index.record_peer("k", tuple(range(2000, 2050)), 100)
        else:
            index.record("k", tuple(range(2000, 2050)), 100, kv_usage=usage)
        return index

    conversation = tuple(range(1000, 1040))
    assert aged(None).match(conversation) == {"k": 35}  # the usage unknown: KV_FILL, as before
    quiet = aged(0.4)
    assert quiet.blocks("k") == 76 and quiet.match(conversation) == {"k": 26}
    assert aged(0.9).match(conversation) == {"k": 35}
    assert aged(0.0).match(conversation) == {"k": 25}  # 0.6 would be under MIN_FILL: 75 blocks
    # a peer's record of the endpoint trims to the fill this replica knows of it
    assert aged(0.4, peer=True).match(conversation) == {"k": 26}


def test_the_index_without_a_capacity_keeps_its_own_bound() -> None:
    index = PrefixIndex(max_blocks_per_endpoint=100)
    first = block_hashes("first system prompt " * 200)
    second = block_hashes("another system prompt " * 200)
    index.record("k", first)
    index.record("k", second)
    assert index.match(first) == {"k": len(first)}
    index.record("k", second, max_blocks=10**9)  # never above the index's own bound
    assert index.blocks("k") <= 100


def _holder_world(queue_at_holder: int):
    """Two idle-ish endpoints; "h" holds the prompt's prefix and has this
    router's ``queue_at_holder`` prefill tokens pending."""
    eps = [ep("qwen", "h", theta=10_000.0, overhead=0.0), ep("qwen", "o", theta=10_000.0, overhead=0.0)]
    hashes = block_hashes("shared system prompt " * 500)  # 10,500 characters: 41 blocks
    index = PrefixIndex()
    index.record("default/qwen/h", hashes)
    ledger = InFlightLedger()
    if queue_at_holder:
        ledger.sent("default/qwen/h", queue_at_holder, 0.0)
    return eps, hashes, index, ledger


def test_a_prefix_holder_is_kept_until_its_queue_outweighs_a_second_copy() -> None:
    # 2,600-token prompt, 2,500 of them cached at h: o would prefill 2,500 more
    eps, hashes, index, ledger = _holder_world(queue_at_holder=4_000)
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    sticky = decide(snap(_pool(["PrefixAffinity"]), eps), r, ledger=ledger, prefix=index)
    greedy = decide(snap(_pool(["PrefixAffinity"]), eps, ttft_model=TTFTModel(prefix_stickiness=0.0)), r,
                    ledger=ledger, prefix=index)
    # by this request's TTFT alone, o (2,600 tokens) beats h (4,000 queued + ~60)
    assert greedy.endpoint == "o"
    # charged for the copy (3 x the extra 2,540 tokens), h is still cheaper
    assert sticky.endpoint == "h"


def test_a_saturated_holder_still_yields() -> None:
    eps, hashes, index, ledger = _holder_world(queue_at_holder=20_000)
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    d = decide(snap(_pool(["PrefixAffinity"]), eps), r, ledger=ledger, prefix=index)
    assert d.endpoint == "o"


def test_stickiness_needs_a_tie_break_rule_as_the_tolerance_does() -> None:
    eps, hashes, index, ledger = _holder_world(queue_at_holder=4_000)
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=hashes)
    d = decide(snap(_pool(None), eps), r, ledger=ledger, prefix=index)
    assert d.endpoint == "o"  # a rule without tieBreak ranks by PredictedTTFT alone, as before


def test_stickiness_rises_with_the_kv_use_of_the_endpoint_that_would_take_the_copy() -> None:
    m = TTFTModel()  # 3 up to busy_kv 0.5, 12 from full_kv 0.9, linear between
    assert m.stickiness(None) == m.stickiness(0.1) == m.stickiness(0.5) == 3.0
    assert abs(m.stickiness(0.7) - 7.5) < 1e-9
    assert m.stickiness(0.9) == m.stickiness(1.0) == 12.0
    assert TTFTModel(prefix_stickiness_full_kv=2.0).stickiness(0.95) == 3.0  # never below the base


def _yield_world(other_kv: float):
    """h holds the prefix with 15,000 prefill tokens queued; o is idle, with
    KV use ``other_kv`` but room for the prompt (its KV wait plays no part)."""
    eps = [ep("qwen", "h", theta=10_000.0, overhead=0.0, kv=0.2, kv_capacity_tokens=10_000_000),
           ep("qwen", "o", theta=10_000.0, overhead=0.0, kv=other_kv, kv_capacity_tokens=10_000_000)]
    hashes = block_hashes("shared system prompt " * 500)
    index = PrefixIndex()
    index.record("default/qwen/h", hashes)
    ledger = InFlightLedger()
    ledger.sent("default/qwen/h", 15_000, 0.0)
    return eps, hashes, index, ledger


def test_a_holder_yields_to_a_pod_with_kv_room_but_not_to_one_whose_kv_is_full() -> None:
    r = req("qwen-2.5", prompt_tokens=2_600, block_hashes=block_hashes("shared system prompt " * 500))
    # o prefills 2,600 + 3 x 2,540 = ~10,200 token-equivalents against h's 15,000 queued: yield
    eps, hashes, index, ledger = _yield_world(other_kv=0.2)
    assert decide(snap(_pool(["PrefixAffinity"]), eps), r, ledger=ledger, prefix=index).endpoint == "o"
    # o's KV is full: a copy there would evict another prefix; 2,600 + 12 x 2,540 > 15,000: stay
    eps, hashes, index, ledger = _yield_world(other_kv=0.95)
    d = decide(snap(_pool(["PrefixAffinity"]), eps), r, ledger=ledger, prefix=index)
    assert d.endpoint == "h"
    # h's PredictedTTFT is the request's own (its queue; the prompt is all cached), no charge in it
    assert abs(d.context.predicted_ttft(d.candidate) - 1.5) < 1e-9


#: the spread (TTFTModel.spread_fraction) off, for the worlds that test the charges alone
NO_SPREAD = TTFTModel(spread_fraction=0.0)


def _idle_world(other: dict, queue_at_holder: int = 7_000):
    """h holds the whole prompt (all 41 of its blocks) with ``queue_at_holder``
    prefill tokens queued and 40 requests running; o holds nothing, its
    scrape as ``other`` says."""
    eps = [ep("qwen", "h", theta=10_000.0, overhead=0.0, kv=0.4, running=40, kv_capacity_tokens=10_000_000),
           ep("qwen", "o", theta=10_000.0, overhead=0.0, **{"kv_capacity_tokens": 10_000_000, **other})]
    hashes = block_hashes("shared system prompt " * 500)
    index = PrefixIndex()
    index.record("default/qwen/h", hashes)
    ledger = InFlightLedger()
    ledger.sent("default/qwen/h", queue_at_holder, 0.0)
    return eps, hashes, index, ledger


#: a 2,600-token request for the idle world's prompt
IDLE_REQUEST = req("qwen-2.5", prompt_tokens=2_600, block_hashes=block_hashes("shared system prompt " * 500))
RUNNING = {"running": 30, "queued": 0, "kv": 0.4}
IDLE = {"running": 0, "queued": 0, "kv": 0.0}


def _idle_decide(other: dict, model: TTFTModel = NO_SPREAD, *, queue_at_holder: int = 7_000,
                 o_send: str | None = None, o_others: int = 0):  # noqa: ANN202 - (Decision, eps)
    """The decision on :data:`IDLE_REQUEST` in :func:`_idle_world` (tie-break
    PrefixAffinity), with one send to o since its scrape: ``"pending"``
    (before its first token), ``"started"`` (after it) or ``"peer"`` (a peer
    replica's, pending); ``o_others``: blocks of other prompts sent to o just
    now (a cache of 100 blocks)."""
    eps, _, index, ledger = _idle_world(other, queue_at_holder)
    if o_send == "pending":
        ledger.sent("default/qwen/o", 0, 0.0)
    elif o_send == "started":
        ledger.first_token(ledger.sent("default/qwen/o", 0, 0.0))
    elif o_send == "peer":
        peer = InFlightLedger()
        peer.sent("default/qwen/o", 0, 0.0)
        assert ledger.merge_peer("peer-1", 1, peer.summary(0.0), 0.0)
    if o_others:
        index.record("default/qwen/o", block_hashes("other groups' prompts " * 1300)[:o_others], 100)
    d = decide(snap(_pool(["PrefixAffinity"]), eps, ttft_model=model), IDLE_REQUEST, ledger=ledger, prefix=index)
    return d, eps


def test_a_decisions_prefill_at_each_pod_is_what_that_pod_lacks_of_the_prompt() -> None:
    """Where a gateway's retry sends the request to another pod than the
    pick, the ledger and the prompt share take that pod's prefill."""
    d, _ = _idle_decide(IDLE)
    at = {c.endpoint: d.prefill_tokens_at(c) for c in d.snapshot.candidates}
    assert at == {"h": 0, "o": 2_600}  # h holds all 41 blocks of the prompt, o none
    assert d.prefill_tokens == at[d.endpoint]


def test_a_pod_with_nothing_waiting_takes_a_copy_a_queued_one_would_not() -> None:
    # o prefills 2,600 tokens (0.26 s) and is charged for the copy: half as
    # much again (1,300 more) with nothing waiting there, three times (7,800
    # more) with a queue; h's 7,000 queued tokens fall between (3,900 <
    # 7,000 < 10,400). The spread is off: it is tested below.
    def pick(other: dict, model: TTFTModel = NO_SPREAD, **kw) -> str | None:
        return _idle_decide(other, model, **kw)[0].endpoint

    # idle, or running requests with none waiting: o takes it
    for free in (IDLE, RUNNING):
        d, _ = _idle_decide(free)
        assert d.endpoint == "o"
        # what traces show is o's own PredictedTTFT (2,600 tokens, slowed by
        # the running decodes: TTFTModel.running_slowdown), not the charge
        assert abs(d.steps[-1].tiers[-1].value - 0.26 * (1 + free["running"] / 2048)) < 1e-9
    # one request waiting, a KV cache more than half used, or no waiting
    # count in the scrape: charged as a pod with a queue; h keeps it
    for busy in ({"running": 0, "queued": 1, "kv": 0.0}, {"running": 30, "queued": 0, "kv": 0.6},
                 {"running": 30, "queued": None, "kv": 0.4}):
        assert pick(busy) == "h"
    # nothing waiting at its scrape, but this router sent it a request since
    # that has no first token yet: a queue too
    assert pick(RUNNING, o_send="pending") == "h"
    # ... whose first token came: nothing waits there again
    assert pick(RUNNING, o_send="started") == "o"
    # a peer replica's send there before its first token counts as this router's
    assert pick(RUNNING, o_send="peer") == "h"
    # ... and when o still wins (h's queue outweighs even three copies), the
    # trace shows its own PredictedTTFT without the charge either
    d, _ = _idle_decide(IDLE, queue_at_holder=20_000, o_send="pending")
    assert d.endpoint == "o" and abs(d.steps[-1].tiers[-1].value - 0.26) < 1e-6
    # a pod with nothing waiting whose cache is full of prompts sent to it lately is charged as any such pod
    assert pick({**IDLE, "kv_capacity_tokens": 6_400}, o_others=95) == "h"
    # with that charge set to the one of a queue, nothing waiting makes no difference
    three = TTFTModel(prefix_stickiness_unqueued=3.0, spread_fraction=0.0)
    for free in (IDLE, RUNNING):
        assert pick(free, three) == "h"
    # the charge is the model's: at 1, o's 2,600 + 2,600 still beat h's 7,000
    # by more than the tie tolerance; at 1.8 (2,600 + 4,680) they do not
    assert pick(RUNNING, TTFTModel(prefix_stickiness_unqueued=1.0, spread_fraction=0.0)) == "o"
    assert pick(RUNNING, TTFTModel(prefix_stickiness_unqueued=1.8, spread_fraction=0.0)) == "h"


def _relief_eps(o: dict) -> list:
    return [ep("qwen", "h", theta=10_000.0, overhead=0.0, kv=0.4, running=40, kv_capacity_tokens=10_000_000),
            ep("qwen", "o", theta=10_000.0, overhead=0.0, kv=0.4, kv_capacity_tokens=10_000_000, **o)]


def _relief_world(o: dict, o_hot_blocks: int = 20):  # noqa: ANN202 - (eps, index, ledger)
    """:func:`_relief_decide`'s pods, prefix index and ledger."""
    index = PrefixIndex()
    index.record("default/qwen/h", block_hashes("shared system prompt " * 500), 100)
    if o_hot_blocks:
        index.record("default/qwen/o", block_hashes("other groups' prompts " * 1300)[:o_hot_blocks], 100)
    ledger = InFlightLedger()
    ledger.sent("default/qwen/h", 9_000, 0.0)
    return _relief_eps(o), index, ledger


def _relief_decide(o: dict, o_hot_blocks: int = 20, model: TTFTModel = NO_SPREAD):  # noqa: ANN202 - Decision
    """h holds the whole 41-block prompt with 9,000 prefill tokens queued,
    40 requests running; o holds none of it, its scrape as ``o`` says, and
    ``o_hot_blocks`` blocks of other prompts were sent to it just now (both
    caches 100 blocks: h's hot fraction 0.41). A copy on o is 2,600 tokens
    plus the charge: 3x as much (10,400, h keeps it: 9,000 is within the
    tie tolerance of it and h holds the prefix) or half that when relieved
    (6,500: o is quicker by more than the tolerance)."""
    eps, index, ledger = _relief_world(o, o_hot_blocks)
    return decide(snap(_pool(["PrefixAffinity"]), eps, ttft_model=model), IDLE_REQUEST, ledger=ledger, prefix=index)


def test_a_holder_with_more_than_its_share_of_load_and_prefixes_lets_a_copy_go() -> None:
    """The relief (TTFTModel.stickiness_relief): h carries 40 requests
    against o's 21 (1.31x their mean, over 1.25x) and its cache holds 0.41
    of prefixes in use against o's 0.2 (1.34x their mean, over 1.1x): its
    charge is halved and o takes the request; either condition alone, or
    the relief off, and h keeps it."""
    queued_o = {"running": 20, "queued": 1}
    d = _relief_decide(queued_o)
    assert d.endpoint == "o"
    holder, factor, load, mean, hot, hot_mean = d.context.relief
    assert (holder.endpoint, factor, load, mean) == ("h", 0.5, 40, 30.5)
    assert abs(hot - 0.41) < 1e-9 and abs(hot_mean - 0.305) < 1e-9
    assert d.context.hot_read == {"default/qwen/h": hot, "default/qwen/o": 0.2}
    assert d.steps[-1].tiers[-1].relief == d.context.relief
    why = d.trace().rules[-1].tiers[-1].why
    assert "prefix stickiness x0.5: holder Local/qwen/h carries load 40 (mean 30.5)" in why
    assert "prefixes in use 41% of its cache (mean 30%)" in why
    # off: the full charge
    assert _relief_decide(queued_o, model=TTFTModel(spread_fraction=0.0, stickiness_relief=1.0)).endpoint == "h"
    # o holds as many prefixes in use as h: h's load is a moment's, not its share of the groups
    d = _relief_decide(queued_o, o_hot_blocks=41)
    assert d.endpoint == "h" and d.context.relief is None
    # o carries 35 of h's 40 (under 1.25x their mean): h has its share of
    # the load, the prefixes it holds do not matter, and they are not read
    d = _relief_decide({"running": 34, "queued": 1})
    assert d.endpoint == "h" and d.context.relief is None and d.context.hot_read is None



def test_the_relief_compares_a_holder_with_the_pods_of_its_own_kind() -> None:
    """In a fleet of two GPU types the slower pods take few requests by
    design: h (40 running) against o (35) is no more than its share, and
    two idle pods of half the KV capacity and a fifth of the prefill rate
    do not make it so (against all four, 40 is 2.1x the mean of 18.75)."""
    eps, index, ledger = _relief_world({"running": 34, "queued": 1})
    small = [ep("qwen", f"s{i}", theta=2_000.0, overhead=0.0, kv=0.0, kv_capacity_tokens=5_000_000) for i in (1, 2)]
    d = decide(snap(_pool(["PrefixAffinity"]), eps + small, ttft_model=NO_SPREAD), IDLE_REQUEST, ledger=ledger,
               prefix=index)
    assert d.endpoint == "h" and d.context.relief is None
    # the same four pods as one kind (the small ones given the others'
    # capacity, so their peers' prefill rate too): relieved against the mean
    # of 18.75, and the copy goes to an idle one
    same = [msgspec.structs.replace(e, kv_capacity_tokens=10_000_000) for e in small]
    d = decide(snap(_pool(["PrefixAffinity"]), eps + same, ttft_model=NO_SPREAD), IDLE_REQUEST, ledger=ledger,
               prefix=index)
    assert d.endpoint in ("s1", "s2") and d.context.relief[3] == 18.75


#: a conversation's turn, and the next one (the turn, its answer and a new question)
TURN = "user: how many pods serve qwen today? assistant: eight, in two zones. " * 120
NEXT_TURN = TURN + "user: and how long is their queue now? " * 60


TURN_REQUEST = req("qwen-2.5", prompt_tokens=2_600, block_hashes=block_hashes(NEXT_TURN))


def _turn_world(o: dict, sent: str = TURN, queue_at_holder: int = 2_700):  # noqa: ANN202 - (eps, index, ledger)
    """h was sent ``sent`` (the conversation's last turn, or another
    prompt), has ``queue_at_holder`` prefill tokens queued and 40 requests
    running; o holds nothing, its scrape as ``o`` says."""
    eps = [ep("qwen", "h", theta=10_000.0, overhead=0.0, kv=0.4, running=40, kv_capacity_tokens=10_000_000),
           ep("qwen", "o", theta=10_000.0, overhead=0.0, kv_capacity_tokens=10_000_000, **o)]
    index = PrefixIndex()
    index.record("default/qwen/h", block_hashes(sent))
    ledger = InFlightLedger()
    ledger.sent("default/qwen/h", queue_at_holder, 0.0)
    return eps, index, ledger


def _turn_decide(o: dict, *, sent: str = TURN, model: TTFTModel = NO_SPREAD):  # noqa: ANN202 - Decision
    """The decision on TURN_REQUEST (NEXT_TURN, 2,600 tokens, whose first
    blocks h holds) in :func:`_turn_world`."""
    eps, index, ledger = _turn_world(o, sent)
    return decide(snap(_pool(["PrefixAffinity"]), eps, ttft_model=model), TURN_REQUEST, ledger=ledger, prefix=index)


CONTINUATION_OFF = TTFTModel(spread_fraction=0.0, continuation_stickiness=1.0, continuation_unqueued=1.0)


def test_a_conversations_next_turn_may_leave_its_pod_for_one_with_nothing_waiting() -> None:
    """The continuation (TTFTModel.continuation_stickiness, continuation_unqueued):
    NEXT_TURN continues the prompt h was sent (the match ends at that
    prompt's last full block), so a copy on o leaves no second copy in use:
    o, with nothing waiting, is charged nothing and takes the turn; charged
    as any copy (the continuation off), h keeps it."""
    held = len(block_hashes(TURN))
    d = _turn_decide(IDLE)
    assert d.endpoint == "o"
    assert d.context.continued is True and d.context.continued_read == {"default/qwen/h": True}
    assert d.context.matches() == {"default/qwen/h": held}
    assert d.steps[-1].tiers[-1].continued == (0.5, 0.0)
    why = d.trace().rules[-1].tiers[-1].why
    assert "a conversation's next turn: prefix stickiness x0.5, x0 on pods with nothing waiting" in why
    d = _turn_decide(IDLE, model=CONTINUATION_OFF)
    assert d.endpoint == "h" and d.context.continued is None and d.context.continued_read is None
    # a pod running requests with nothing waiting is such a pod too
    assert _turn_decide(RUNNING).endpoint == "o"


def test_a_turn_stays_where_a_pod_has_a_queue_or_its_prefix_is_shared() -> None:
    """Half the charge on a pod with requests waiting is still more than
    h's queue here; and a prompt whose match ends inside a prompt sent to h
    (a system prompt shared with another question, not this conversation's
    last turn) is charged as any copy."""
    d = _turn_decide({"running": 30, "queued": 2, "kv": 0.4})
    assert d.endpoint == "h" and d.context.continued is True
    shared = TURN + "user: which zone is the largest? " * 60
    d = _turn_decide(IDLE, sent=shared)
    assert d.context.matches() == {"default/qwen/h": len(block_hashes(TURN))}
    assert d.endpoint == "h" and d.context.continued is False
    assert d.steps[-1].tiers[-1].continued is None


def test_a_pod_that_let_a_turn_go_no_longer_counts_it_as_an_end() -> None:
    """The index keeps the last block of each prompt sent to a pod only
    while the pod holds it: once its LRU let the turn go, a prompt matching
    up to there elsewhere does not continue anything on it."""
    index = PrefixIndex()
    turn = block_hashes(TURN)
    index.record("default/qwen/h", turn, 64)
    assert index.continued_on(["default/qwen/h", "default/qwen/o"], turn[-1]) == ["default/qwen/h"]
    assert index.continued_on(["default/qwen/h"], turn[-2]) == []
    for i in range(40):  # other conversations fill h's 64-block cache
        index.record("default/qwen/h", block_hashes(f"conversation {i} " * 200), 64)
    assert index.match(turn).get("default/qwen/h", 0) < len(turn)
    assert index.continued_on(["default/qwen/h"], turn[-1]) == []
    index.record("default/qwen/h", turn, 64)
    index.forget("default/qwen/h")
    assert index.continued_on(["default/qwen/h"], turn[-1]) == []
    # a peer's prompt cut short in its message (replica sync keeps the first hashes) ends nowhere known
    index.record_peer("default/qwen/h", turn[:-2], 64, whole=False)
    assert index.continued_on(["default/qwen/h"], turn[-3]) == []
    index.record_peer("default/qwen/h", turn, 64)
    assert index.continued_on(["default/qwen/h"], turn[-1]) == ["default/qwen/h"]


def test_a_new_prefix_goes_where_the_fewest_prompt_blocks_are_cached() -> None:
    eps = [ep("qwen", "a"), ep("qwen", "b"), ep("qwen", "c")]
    s = snap(_pool(["PrefixAffinity", "LeastInFlight"]), eps)
    index = PrefixIndex()
    index.record("default/qwen/a", block_hashes("first group's system prompt " * 300))
    index.record("default/qwen/b", block_hashes("second group's system prompt " * 300))
    index.record("default/qwen/b", block_hashes("third group's system prompt " * 300))
    ledger = InFlightLedger()
    ledger.sent("default/qwen/c", 0, 0.0)  # c has one in flight: LeastInFlight alone would avoid it
    fresh = block_hashes("a fourth group nobody has seen " * 300)
    d = decide(s, req("qwen-2.5", prompt_tokens=2_000, block_hashes=fresh), ledger=ledger, prefix=index)
    assert d.endpoint == "c"
    # a request without block hashes has no prefix to place: LeastInFlight decides
    d = decide(s, req("qwen-2.5", prompt_tokens=2_000), ledger=ledger, prefix=index)
    assert d.endpoint in ("a", "b")


def test_an_endpoint_that_has_served_nothing_gets_its_worker_sets_learned_overhead() -> None:
    # a and b learned T0 = 2 ms; c has served nothing yet (no T0, no Theta)
    eps = [ep("qwen", "a", overhead=0.002), ep("qwen", "b", overhead=0.002),
           ep("qwen", "c", overhead=None, theta=None)]
    s = snap(_pool(["LeastInFlight"]), eps)
    a, b, c = s.candidates
    assert c.t0 == 0.002 and c.theta == a.theta
    # so c is not predicted slower than the busy ones, and gets its share
    ledger = InFlightLedger()
    ledger.sent("default/qwen/a", 0, 0.0)
    ledger.sent("default/qwen/b", 0, 0.0)
    assert decide(s, req("qwen-2.5", prompt_tokens=300), ledger=ledger).endpoint == "c"
    # with nothing learned anywhere, the model's default
    s = snap(_pool(None), [ep("qwen", "x", overhead=None)])
    assert s.candidates[0].t0 == TTFTModel().default_overhead_seconds


def test_a_pod_whose_learned_prefill_rate_lags_its_peers_still_gets_new_prefixes() -> None:
    # four pods of one worker set on the same GPUs (the same KV capacity): c's
    # first prefills overlapped, so it learned 12,900 tokens/s against 15,900
    cap = {"kv_capacity_tokens": 19_200}
    eps = [ep("qwen", "a", theta=15_940.0, **cap), ep("qwen", "b", theta=15_930.0, **cap),
           ep("qwen", "c", theta=12_900.0, **cap), ep("qwen", "d", theta=15_935.0, **cap)]
    s = snap(_pool(["PrefixAffinity", "LeastInFlight"]), eps)
    assert [c.theta for c in s.candidates] == [15_940.0] * 4  # each gets its peers' best bound
    index = PrefixIndex()
    for pod, groups in (("a", 3), ("b", 3), ("c", 1), ("d", 3)):
        for g in range(groups):
            index.record(f"default/qwen/{pod}", block_hashes(f"{pod} group {g} system prompt " * 300))
    fresh = block_hashes("a group nobody has seen " * 300)
    d = decide(s, req("qwen-2.5", prompt_tokens=2_000, block_hashes=fresh), prefix=index)
    # c holds the fewest prompts: the new prefix goes there (with its own rate,
    # c was predicted 20% slower, out of the tie, and never got one)
    assert d.endpoint == "c"


def test_a_pod_that_went_away_does_not_hold_its_peers_up() -> None:
    cap = {"kv_capacity_tokens": 19_200}
    eps = [ep("qwen", "a", theta=12_000.0, **cap), ep("qwen", "gone", theta=20_000.0, ready=False, **cap)]
    assert snap(_pool(["LeastInFlight"]), eps).candidates[0].theta == 12_000.0
    eps[1] = ep("qwen", "gone", theta=20_000.0, **cap)
    assert snap(_pool(["LeastInFlight"]), eps).candidates[0].theta == 20_000.0


def test_pods_of_other_gpus_in_the_same_worker_set_keep_their_own_prefill_rate() -> None:
    eps = [ep("qwen", "big", theta=16_000.0, kv_capacity_tokens=131_072),
           ep("qwen", "small", theta=5_000.0, kv_capacity_tokens=65_536),
           ep("qwen", "small-2", theta=4_000.0, kv_capacity_tokens=65_536),
           ep("qwen", "unknown", theta=7_000.0)]
    s = snap(_pool(["LeastInFlight"]), eps)
    assert {c.endpoint: c.theta for c in s.candidates} == {
        "big": 16_000.0, "small": 5_000.0, "small-2": 5_000.0, "unknown": 7_000.0}
    # the larger GPU stays the clear pick for a long prompt
    assert decide(s, req("qwen-2.5", prompt_tokens=4_000)).endpoint == "big"


def _fleet_world(new: dict | None = None, holder_running: int = 40, others_running: int = 40):
    """a, b and c each hold one group's prompts and run requests (a
    ``holder_running``, b and c ``others_running``); n joined empty: its
    scrape as ``new`` says (idle by default) and the prefix index has
    nothing of it."""
    n = {"running": 0, "queued": 0, "kv": 0.0, "theta": 10_000.0, **(new or {})}
    eps = [ep("qwen", "a", theta=10_000.0, overhead=0.0, kv=0.3, running=holder_running),
           ep("qwen", "b", theta=10_000.0, overhead=0.0, kv=0.3, running=others_running),
           ep("qwen", "c", theta=10_000.0, overhead=0.0, kv=0.3, running=others_running),
           ep("qwen", "n", overhead=0.0, **n)]
    index = PrefixIndex()
    for pod, group in (("a", "first"), ("b", "second"), ("c", "third")):
        index.record(f"default/qwen/{pod}", block_hashes(f"the {group} group's system prompt " * 300))
    return eps, index


def _group_request(group: str = "first", question: str = "what is the answer?"):
    text = f"the {group} group's system prompt " * 300 + question
    return req("qwen-2.5", prompt_tokens=2_400, block_hashes=block_hashes(text))


def test_a_pod_that_joined_empty_takes_a_group_from_a_busy_holder() -> None:
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    eps, index = _fleet_world()
    r = _group_request()
    d = decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index)
    assert d.endpoint == "n"
    step = d.steps[-1].tiers[-1]
    holder, taker, load, mean, low = step.spread
    assert (holder.endpoint, taker.endpoint, load, low) == ("a", "n", 40, 0) and mean == 30.0
    # the PredictedTTFT shown is n's own: the whole prompt, cold
    assert abs(step.value - 2_400 / 10_000) < 1e-6
    why = d.trace().rules[-1].tiers[-1].why
    assert "spread: moved from prefix holder" in why and "qwen/n" in why
    # without the spread the warm holder keeps it (as before it existed)
    off = snap(pool_, eps, ttft_model=TTFTModel(spread_fraction=0.0))
    assert decide(off, r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # once n holds the group, the group's requests go where the fewest are in
    # flight (the tie-breakers, no spread needed)
    index.record("default/qwen/n", r.block_hashes)
    ledger = InFlightLedger()
    for _ in range(3):
        ledger.first_token(ledger.sent("default/qwen/a", 0, 0.0))
    d = decide(snap(pool_, eps), _group_request(question="and another?"), ledger=ledger, prefix=index)
    assert d.endpoint == "n" and d.steps[-1].tiers[-1].spread is None
    assert d.steps[-1].tiers[-1].tie_breaks == ("PrefixAffinity", "LeastInFlight")


def test_the_spread_moves_one_copy_at_a_time() -> None:
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    eps, index = _fleet_world()
    s = snap(pool_, eps)
    ledger = InFlightLedger()
    first = decide(s, _group_request("first"), ledger=ledger, prefix=index)
    assert first.endpoint == "n"
    send = ledger.sent(first.candidate.ledger_key, first.prefill_tokens, 0.0)
    # the copy on its way is in n's queue: the next group stays with its holder
    assert decide(s, _group_request("second"), ledger=ledger, prefix=index).endpoint == "b"
    # its first token came back: n takes the next one
    ledger.first_token(send)
    assert decide(s, _group_request("second"), ledger=ledger, prefix=index).endpoint == "n"


def test_the_spread_leaves_a_steady_fleet_alone() -> None:
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    r = _group_request()
    # the fleet is not busy: 4 running on each holder, under spread_min_load (32)
    eps, index = _fleet_world(holder_running=4, others_running=4)
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # ... nor is the holder when its load is unknown (no queue in its scrape)
    eps, index = _fleet_world()
    eps[0] = msgspec.structs.replace(eps[0], queued=None)
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # the holder carries less than the mean, though more than spread_min_load
    eps, index = _fleet_world(holder_running=35, others_running=60)
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # the least-loaded pod is not far below the mean: 10 running of a mean of 32.5
    eps, index = _fleet_world({"running": 10, "kv": 0.1})
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # an idle pod holding its share of the prefixes sent (a steady fleet between bursts)
    eps, index = _fleet_world()
    index.record("default/qwen/n", block_hashes("the fourth group's system prompt " * 300))
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # a slower pod: its cold prefill takes longer than the copy would on the holder
    eps, index = _fleet_world({"theta": 4_000.0})
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"
    # idle at its scrape, but this router has 10 requests open there since
    eps, index = _fleet_world()
    ledger = InFlightLedger()
    for _ in range(10):
        ledger.first_token(ledger.sent("default/qwen/n", 0, 0.0))
    assert decide(snap(pool_, eps), r, ledger=ledger, prefix=index).endpoint == "a"
    # a pod whose load is unknown (no scrape of its queue) is not taken for idle
    eps, index = _fleet_world({"queued": None})
    assert decide(snap(pool_, eps), r, ledger=InFlightLedger(), prefix=index).endpoint == "a"


def test_a_record_of_a_spread_keeps_the_held_blocks_and_replays_to_the_same_pick() -> None:
    """`kinfctl replay` takes the decision again from what it read: the spread
    reads how many blocks each pod holds, so the record keeps them."""
    from kinference_common.engine.trace import OutcomeTrace
    from kinference_common.recording import DecisionRecord, RecordedRequest, decode, encode
    from kinference_router.recording import Recorder
    from kinfctl.replay import _decide

    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    eps, index = _fleet_world()
    s = snap(pool_, eps)
    r = _group_request()
    d = decide(s, r, ledger=InFlightLedger(), prefix=index)
    assert d.endpoint == "n"
    Recorder.capture(d)
    assert set(d.inputs.held) == {"default/qwen/a", "default/qwen/b", "default/qwen/c"}
    rec = decode(encode(DecisionRecord(
        decision_id="d1", at=0.0, router="r", snapshot=1, namespace="default", pool="p",
        request=RecordedRequest(model="qwen-2.5", prompt_tokens=2_400, block_hashes=list(r.block_hashes)),
        loads=d.inputs.loads, matches=d.inputs.matches, held=d.inputs.held, pressure=d.inputs.pressure,
        outcome=OutcomeTrace(type="Routed", endpoint="n"))))
    again, _ = _decide(s, rec, r)
    assert again.endpoint == "n"
    # had n held as much as the others, the holder would have kept it: the held
    # blocks in the record are what the replay decides on
    again, _ = _decide(s, msgspec.structs.replace(rec, held={**rec.held, "default/qwen/n": 100}), r)
    assert again.endpoint == "a"


def test_the_spread_reads_the_routers_sends_and_judges_the_tie_breakers_pick() -> None:
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    r = _group_request()
    # the holder's scrape shows 20 running, but this router has 40 open there
    # (sent since, and running): busy, as the routers know
    eps, index = _fleet_world(holder_running=20, others_running=20)
    ledger = InFlightLedger()
    for _ in range(40):
        ledger.first_token(ledger.sent("default/qwen/a", 0, 0.0))
    d = decide(snap(pool_, eps), r, ledger=ledger, prefix=index)
    assert d.endpoint == "n" and d.steps[-1].tiers[-1].spread[2] == 40
    # two holders of the prefix rank equal; LeastInFlight picks the one less
    # loaded (b: 20 running), which is not above the mean: no move, whatever
    # the more loaded one (a: 60 running, 5 open) would have allowed
    eps, index = _fleet_world(holder_running=60)
    eps[1] = msgspec.structs.replace(eps[1], running=20)
    index.record("default/qwen/b", r.block_hashes)
    ledger = InFlightLedger()
    for _ in range(5):
        ledger.first_token(ledger.sent("default/qwen/a", 0, 0.0))
    d = decide(snap(pool_, eps), r, ledger=ledger, prefix=index)
    assert d.endpoint == "b" and d.steps[-1].tiers[-1].spread is None
    assert d.steps[-1].tiers[-1].tie_breaks == ("PrefixAffinity", "LeastInFlight")


def _snapshot_record(v: int, compiled, eps: list, model: TTFTModel) -> bytes:  # noqa: ANN001
    """A snapshot record of schema version ``v``, encoded as its router wrote it."""
    from kinference_common.recording import SnapshotRecord, encode

    from .helpers import NOW

    return encode(SnapshotRecord(v=v, router="r", version=1, namespace="default", pool="p", now=NOW,
                                 stale_after=5.0, provider_stale_after=60.0, pool_revision="1",
                                 compiled=compiled, endpoints=eps, ttft_model=model))


def _replayed(v: int, written: bytes, r, recorded: str | None = "a", **inputs) -> str | None:  # noqa: ANN001, ANN003
    """The endpoint ``kinfctl replay`` picks for ``r`` from a decision record
    of version ``v`` on the snapshot record ``written``, with the router's
    state the decision read (``inputs``: loads, matches, held, pressure)."""
    from kinference_common.engine.trace import OutcomeTrace
    from kinference_common.recording import DecisionRecord, RecordedRequest, decode
    from kinfctl.replay import Snapshots, _decide

    snaps = Snapshots()
    snaps.add(decode(written))
    rec = DecisionRecord(v=v, decision_id="d1", at=0.0, router="r", snapshot=1, namespace="default", pool="p",
                         request=RecordedRequest(model=r.model, prompt_tokens=r.prompt_tokens,
                                                 block_hashes=list(r.block_hashes)),
                         outcome=OutcomeTrace(type="Routed", endpoint=recorded), **inputs)
    d, _ = _decide(snaps.get("r", 1, "live"), rec, r)
    return d.endpoint


def test_a_record_from_a_router_without_the_spread_replays_without_it() -> None:
    """Records of schema version 1 (routers before the spread) kept ``held``
    only when no endpoint matched: their decisions are replayed as their
    router took them, with the spread off."""
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    eps, index = _fleet_world()
    r = _group_request()
    matches = index.match(r.block_hashes)
    picks = {}
    for v in (1, 2):
        written = _snapshot_record(v, pool_, eps, TTFTModel())
        # a version-1 router wrote no "v" at all (its default, omitted)
        assert (b'"v":' in written) is (v != 1)
        picks[v] = _replayed(v, written, r, matches=matches)
    # version 1: the router had no spread and kept no held blocks here: "a",
    # as it decided; a version-2 record without held blocks would read "n held
    # nothing" and move it
    assert picks == {1: "a", 2: "n"}


def test_a_record_from_a_router_without_peer_prefill_rates_replays_with_each_endpoints_own() -> None:
    """Records before schema version 3 come from routers that gave each
    endpoint its own Theta: replayed that way; version 3 with the peers'."""
    cap = {"kv_capacity_tokens": 19_200}
    eps = [ep("qwen", "a", theta=15_900.0, **cap), ep("qwen", "c", theta=12_900.0, **cap)]
    index = PrefixIndex()
    for g in range(3):
        index.record("default/qwen/a", block_hashes(f"a group {g} system prompt " * 300))
    fresh = req("qwen-2.5", prompt_tokens=2_000, block_hashes=block_hashes("a group nobody has seen " * 300))
    picks = {}
    for v in (2, 3):
        written = _snapshot_record(v, _pool(["PrefixAffinity", "LeastInFlight"]), eps, TTFTModel())
        picks[v] = _replayed(v, written, fresh, held=index.held())
    # version 2: c predicted 23% slower, out of the tie: "a", as its router
    # decided; version 3: c at a's Theta, holding nothing: "c"
    assert picks == {2: "a", 3: "c"}


def test_a_record_from_a_router_before_the_unqueued_charge_replays_with_the_idle_one() -> None:
    """Records before schema version 4 come from routers that charged a
    copy less (1x) on idle endpoints only: replayed that way; version 4
    with the charge on any endpoint where nothing waits."""
    from kinference_router.recording import Recorder

    picks = {}
    cases = {
        "running": (RUNNING, 7_000, None),
        "idle": (IDLE, 7_000, None),
        # h's queue between the two charges (1x: 5,200 < 5,000 * 1.1; 0.5x: 3,900): the charge's value
        "idle, shorter queue": (IDLE, 5_000, None),
        # o idle at its scrape, with a send since whose first token came: busy then, not now
        "idle, a send started": (IDLE, 7_000, "started"),
    }
    for v in (3, 4):
        for name, (other, queue, o_send) in cases.items():
            d, eps = _idle_decide(other, queue_at_holder=queue, o_send=o_send)
            Recorder.capture(d)
            written = _snapshot_record(v, _pool(["PrefixAffinity"]), eps, NO_SPREAD)
            picks[v, name] = _replayed(v, written, IDLE_REQUEST, d.endpoint, loads=d.inputs.loads,
                                       matches=d.inputs.matches, held=d.inputs.held, pressure=d.inputs.pressure)
    # version 3, as its router decided: o with 30 running and none waiting
    # charged as busy (3x), so h kept it; idle, 1x: o, unless h's queue is
    # shorter than the copy and o's prefill; a send in flight made o busy
    assert picks == {(3, "running"): "h", (3, "idle"): "o", (3, "idle, shorter queue"): "h",
                     (3, "idle, a send started"): "h",
                     (4, "running"): "o", (4, "idle"): "o", (4, "idle, shorter queue"): "o",
                     (4, "idle, a send started"): "o"}


def _replayed_as(versions: tuple[int, ...], d, eps: list, r, **read) -> dict[int, str | None]:  # noqa: ANN001, ANN003
    """What ``kinfctl replay`` picks for ``d`` (captured by the recorder) as
    a record of each of ``versions``, with the scrape and prefix reads every
    record has and ``read``, what this decision read besides."""
    inputs = {"loads": d.inputs.loads, "matches": d.inputs.matches, "held": d.inputs.held,
              "pressure": d.inputs.pressure, **read}
    return {v: _replayed(v, _snapshot_record(v, _pool(["PrefixAffinity"]), eps, NO_SPREAD), r, d.endpoint, **inputs)
            for v in versions}


def test_a_record_of_a_relief_keeps_the_hot_fractions_and_replays_to_the_same_pick() -> None:
    """The relief reads each candidate's hot fraction: the record keeps
    them, and replay relieves as the router did (version 5); a record before
    version 5 comes from a router that charged the full stickiness."""
    from kinference_router.recording import Recorder

    o = {"running": 20, "queued": 1}
    d = _relief_decide(o)
    assert d.endpoint == "o"
    Recorder.capture(d)
    assert d.inputs.hot == {"default/qwen/h": 0.41, "default/qwen/o": 0.2}
    eps = _relief_eps(o)
    assert _replayed_as((4, 5), d, eps, IDLE_REQUEST, hot=d.inputs.hot) == {4: "h", 5: "o"}
    # the hot fractions in the record are what the replay decides on: without
    # them o's share of the prefixes in use is unknown, and h keeps it
    assert _replayed_as((5,), d, eps, IDLE_REQUEST) == {5: "h"}


def test_a_record_of_a_turn_keeps_what_continued_and_replays_to_the_same_pick() -> None:
    """The continuation asks the prefix index whether the prompt continued
    one sent to the best holders: the record keeps the answer, and replay
    charges as the router did (version 6); a record before version 6 comes
    from a router that charged a turn's move as any copy."""
    from kinference_router.recording import Recorder

    d = _turn_decide(IDLE)
    assert d.endpoint == "o"
    Recorder.capture(d)
    assert d.inputs.continued == {"default/qwen/h": True}
    eps, _, _ = _turn_world(IDLE)
    assert _replayed_as((5, 6), d, eps, TURN_REQUEST, continued=d.inputs.continued) == {5: "h", 6: "o"}
    # without the answer in the record the prompt continued nothing known: h keeps it
    assert _replayed_as((6,), d, eps, TURN_REQUEST) == {6: "h"}
