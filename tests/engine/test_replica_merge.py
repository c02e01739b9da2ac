"""Other router replicas' sends enter this replica's ledger (InFlightLedger.
summary / merge_peer / expire_peers) and prefix index (journal, record_peer):
queue_tokens counts the peers' real prompt tokens instead of a default per
engine-queued request, without counting what the scrape already counts twice."""

from __future__ import annotations

import pytest
from kinference_common.engine import InFlightLedger, PrefixIndex, TTFTModel, decide
from kinference_common.engine.ledger import EndpointSummary
from kinference_common.engine.signals import DecisionContext

from .helpers import NOW, ep, pool, req, snap, ws

QWEN = ws("qwen", "qwen-2.5")
KEY0 = "default/qwen/q0"
KEY1 = "default/qwen/q1"
QPT = TTFTModel().queued_prompt_tokens


def _ctx(ledger: InFlightLedger) -> DecisionContext:
    return DecisionContext(ledger.loads, 0, (), None, TTFTModel())


def _pair() -> tuple[InFlightLedger, InFlightLedger]:
    a, b = InFlightLedger(), InFlightLedger()
    a.sharing = b.sharing = True
    return a, b


def test_a_peers_pending_sends_count_with_their_real_tokens_not_the_default() -> None:
    # the engine says 3 waiting: all three are replica A's, sent before the scrape
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=3, running=0)])
    c = s.candidates[0]
    a, b = _pair()
    for _ in range(3):
        a.sent(KEY0, 4000, NOW - 1)
    a.observed(KEY0, NOW)
    b.observed(KEY0, NOW)
    assert _ctx(b).queue_tokens(c) == pytest.approx(3 * QPT)  # B alone: the default size
    assert b.merge_peer("a", 1, a.summary(NOW), NOW)
    assert _ctx(b).queue_tokens(c) == pytest.approx(3 * 4000)  # not 3 * 4000 + 3 * 512
    assert _ctx(b).queued(c) == 3
    assert _ctx(b).in_flight(c) == 3
    assert _ctx(a).queue_tokens(c) == pytest.approx(3 * 4000)  # A's own view is unchanged


def test_a_peers_sends_after_the_scrape_add_to_the_count() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=2, running=0)])
    c = s.candidates[0]
    a, b = _pair()
    a.observed(KEY0, NOW)
    b.observed(KEY0, NOW)
    a.sent(KEY0, 1000, NOW + 0.01)  # unseen by the scrape
    b.merge_peer("a", 1, a.summary(NOW + 0.02), NOW + 0.02)
    assert _ctx(b).queued(c) == 3
    assert _ctx(b).queue_tokens(c) == pytest.approx(2 * QPT + 1000)
    # the next scrape counts it: it moves from unseen to seen, the total stays
    b.observed(KEY0, NOW + 0.1)
    s2 = snap(pool([QWEN]), [ep("qwen", "q0", queued=3, running=0)])
    assert _ctx(b).queue_tokens(s2.candidates[0]) == pytest.approx(2 * QPT + 1000)


def test_a_peers_send_prefilled_since_the_scrape_leaves_the_count() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=2, running=0)])
    c = s.candidates[0]
    a, b = _pair()
    sends = [a.sent(KEY0, 800, NOW - 1) for _ in range(2)]
    a.observed(KEY0, NOW)
    b.observed(KEY0, NOW)
    a.first_token(sends[0], NOW + 0.05)
    b.merge_peer("a", 1, a.summary(NOW + 0.06), NOW + 0.06)
    assert _ctx(b).queued(c) == 1  # the scrape's 2, minus the one A saw start
    assert _ctx(b).queue_tokens(c) == pytest.approx(800)


def test_a_newer_summary_replaces_an_older_one_and_an_old_seq_is_ignored() -> None:
    a, b = _pair()
    b.observed(KEY0, NOW)
    s1 = a.sent(KEY0, 100, NOW + 1)
    b.merge_peer("a", 1, a.summary(NOW + 1), NOW + 1)
    assert b.loads[KEY0].peer_pending_count == 1
    a.finished(s1, NOW + 2)
    a.sent(KEY1, 300, NOW + 2)
    assert b.merge_peer("a", 2, a.summary(NOW + 2), NOW + 2)
    assert KEY0 not in b.loads or b.loads[KEY0].peer_pending_count == 0
    assert b.loads[KEY1].peer_pending_tokens == 300
    # a late, older message does not bring the old state back
    assert not b.merge_peer("a", 1, [EndpointSummary(KEY0, 5, [(NOW, 9)], [])], NOW + 3)
    assert KEY0 not in b.loads or b.loads[KEY0].peer_in_flight == 0


def test_a_quiet_peer_is_forgotten_after_the_ttl() -> None:
    a, b = _pair()
    a.sent(KEY0, 100, NOW)
    b.merge_peer("a", 1, a.summary(NOW), NOW)
    assert b.peers == ["a"]
    assert b.expire_peers(NOW + 1.0, ttl=2.0) == []
    assert b.loads[KEY0].peer_in_flight == 1
    assert b.expire_peers(NOW + 2.5, ttl=2.0) == ["a"]
    assert b.peers == []
    assert KEY0 not in b.loads  # nothing of its own there: the entry goes


def test_peers_add_up_and_the_local_sends_stay() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=0, running=0)])
    c = s.candidates[0]
    a, b, me = InFlightLedger(), InFlightLedger(), InFlightLedger()
    for x in (a, b, me):
        x.sharing = True
        x.observed(KEY0, NOW)
    a.sent(KEY0, 100, NOW + 1)
    b.sent(KEY0, 200, NOW + 1)
    mine = me.sent(KEY0, 400, NOW + 1)
    me.merge_peer("a", 1, a.summary(NOW + 1), NOW + 1)
    me.merge_peer("b", 7, b.summary(NOW + 1), NOW + 1)
    assert _ctx(me).queue_tokens(c) == pytest.approx(700)
    assert _ctx(me).in_flight(c) == 3
    me.finished(mine, NOW + 2)  # its own finishing does not take the peers' away
    assert _ctx(me).queue_tokens(c) == pytest.approx(300)


def test_sharing_changes_the_pick() -> None:
    """Replica B alone thinks q0 (3 queued, default-sized) is about as loaded
    as q1 (4 queued); with A's summary it knows q0's three are 8,000-token
    prompts and picks q1."""
    p = pool([QWEN])
    s = snap(p, [ep("qwen", "q0", queued=3, running=0, theta=10000, overhead=0.0),
                 ep("qwen", "q1", queued=4, running=0, theta=10000, overhead=0.0)])
    a, b = _pair()
    for _ in range(3):
        a.sent(KEY0, 8000, NOW - 1)
    for x in (a, b):
        x.observed(KEY0, NOW)
        x.observed(KEY1, NOW)
    alone = decide(s, req("qwen-2.5", prompt_tokens=100), ledger=b)
    b.merge_peer("a", 1, a.summary(NOW), NOW)
    shared = decide(s, req("qwen-2.5", prompt_tokens=100), ledger=b)
    assert alone.candidate.ledger_key == KEY0
    assert shared.candidate.ledger_key == KEY1


def test_summary_caps_sends_per_endpoint_and_sums_the_rest() -> None:
    from kinference_common.engine import ledger as ledger_mod

    a, b = _pair()
    n = ledger_mod.MAX_SENDS_PER_ENDPOINT + 10
    for i in range(n):
        a.sent(KEY0, 10, NOW + i * 1e-3)
    (e,) = a.summary(NOW + 1)
    assert len(e.pending) == ledger_mod.MAX_SENDS_PER_ENDPOINT and e.more_count == 10 and e.more_tokens == 100
    b.merge_peer("a", 1, [e], NOW + 1)
    assert b.loads[KEY0].peer_pending_count == n and b.loads[KEY0].peer_pending_tokens == 10 * n


def test_prefilled_sends_are_published_for_a_while_then_dropped() -> None:
    from kinference_common.engine.ledger import PREFILLED_WINDOW

    a = InFlightLedger()
    a.sharing = True
    s = a.sent(KEY0, 10, NOW)
    a.first_token(s, NOW + 0.1)
    (e,) = a.summary(NOW + 0.2)
    assert e.prefilled == [(NOW, NOW + 0.1)] and e.in_flight == 1 and e.pending == []
    a.finished(s, NOW + 0.3)
    assert len(a.summary(NOW + 0.4)) == 1  # still within the window
    assert a.summary(NOW + 0.2 + PREFILLED_WINDOW) == []


def test_prefix_journal_carries_records_to_a_peer_with_the_kv_cap() -> None:
    a, b = PrefixIndex(), PrefixIndex()
    a.start_journal()
    b.start_journal()
    hashes = tuple(range(100, 140))
    a.record(KEY0, hashes, 16, kv_usage=0.25)
    journal = a.take_journal()
    assert journal == [(KEY0, hashes, 16, 0.25)]
    assert a.take_journal() == []
    for key, hs, cap, kv in journal:
        b.record_peer(key, hs, cap, kv)
    assert b.match(hashes[:10]) == {KEY0: 10}
    assert b.blocks(KEY0) == 16  # the KV-sized cap holds for peers' records too
    assert b.take_journal() == []  # a peer's record is not published again
    assert b.fill(KEY0) == a.fill(KEY0) < PrefixIndex.KV_FILL  # and the fill the sender's KV usage gives


def test_sends_and_first_tokens_call_on_change_and_the_end_goes_with_the_next_summary() -> None:
    """The replica sync publishes on these calls: a send and its first token
    move the peers' queue estimates at once; a request's end only lowers
    inFlight and waits for the next summary."""
    ledger = InFlightLedger()
    ledger.sharing = True
    calls: list[int] = []
    ledger.on_change = lambda: calls.append(ledger.version)
    s = ledger.sent(KEY0, 10, NOW)
    assert len(calls) == 1
    ledger.first_token(s, NOW + 1)
    assert len(calls) == 2
    ledger.finished(s, NOW + 2)
    assert len(calls) == 2
    (e,) = ledger.summary(NOW + 2)
    assert e.in_flight == 0 and e.pending == []  # the next summary has it
    ledger.observed(KEY0, NOW + 3)  # telemetry is not this replica's news
    assert len(calls) == 2
