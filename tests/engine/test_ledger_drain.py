"""Between scrapes, and when telemetry stops arriving, this router's own
completions move the queue estimate: sends the last scrape saw waiting that
have produced their first token since are taken off the engine's count, so a
frozen "saturated" scrape does not hold back an endpoint whose queue drained."""

from __future__ import annotations

import pytest
from kinference_common.engine import InFlightLedger, TTFTModel, decide
from kinference_common.engine.signals import DecisionContext

from .helpers import NOW, burst_policy_rule, ep, pool, prov, req, snap, ws

QWEN = ws("qwen", "qwen-2.5")
KEY0 = "default/qwen/q0"


def _ctx(ledger: InFlightLedger) -> DecisionContext:
    return DecisionContext(ledger.loads, 0, (), None, TTFTModel())


def test_sends_the_scrape_saw_waiting_leave_the_count_when_they_start() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=6, running=0, theta=1000, overhead=0.0)])
    c = s.candidates[0]
    ledger = InFlightLedger()
    sends = [ledger.sent(KEY0, 100, NOW - 1) for _ in range(6)]  # all six are ours, seen by the scrape
    ledger.observed(KEY0, NOW)
    assert _ctx(ledger).queued(c) == 6
    for send in sends[:4]:
        ledger.first_token(send)
    assert _ctx(ledger).queued(c) == 2  # the scrape still says 6; four of them have left
    assert _ctx(ledger).queue_tokens(c) == pytest.approx(2 * 100)  # the two still pending, at their size
    for send in sends:
        ledger.finished(send)
    assert _ctx(ledger).queued(c) == 0  # never below zero, and kept while the scrape is frozen
    assert KEY0 in ledger.loads
    ledger.observed(KEY0, NOW + 1)  # a new scrape: its own count is the truth again
    assert KEY0 not in ledger.loads
    assert _ctx(ledger).queued(c) == 6  # (the snapshot's figure until the next one is built)


def test_unseen_sends_are_not_counted_as_drained() -> None:
    s = snap(pool([QWEN]), [ep("qwen", "q0", queued=3, running=0)])
    c = s.candidates[0]
    ledger = InFlightLedger()
    ledger.observed(KEY0, NOW)
    send = ledger.sent(KEY0, 100, NOW + 1)  # after the scrape: not in its count
    assert _ctx(ledger).queued(c) == 4
    ledger.first_token(send)
    assert _ctx(ledger).queued(c) == 3  # back to the scrape's figure, not below it


def test_frozen_saturated_telemetry_lets_local_traffic_through_once_own_requests_drained() -> None:
    """The seed policy drops local endpoints while queuedPrompts > 4 (and a
    prompt with PII may not burst); a ledger-reading exclusion is corrected
    for the endpoints with drained sends."""
    p = pool([QWEN, prov("databricks", {"qwen-2.5": "db-qwen"})], [burst_policy_rule()])
    s = snap(p, [ep("qwen", "q0", queued=8, running=0)])
    ledger = InFlightLedger()
    sends = [ledger.sent(KEY0, 100, NOW - 1) for _ in range(8)]
    ledger.observed(KEY0, NOW)
    pii = req("qwen-2.5", prompt_tokens=100, tags=["pii-confirmed"])
    assert decide(s, pii, ledger=ledger).endpoint is None  # saturated: nowhere to go
    for send in sends[:5]:
        ledger.first_token(send)
        ledger.finished(send)
    assert _ctx(ledger).queued(s.candidates[-1]) == 3
    assert decide(s, pii, ledger=ledger).endpoint == "q0"  # local again, without fresh telemetry
