"""Every semantic of POLICY.md sections 1-6, on hand-built compiled pools."""

from __future__ import annotations

import random

import pytest
from kinference_common.compiled import CandidateTest, Consider, Header, Range, RequestTest
from kinference_common.engine import InFlightLedger, PrefixIndex, decide, interpret, required_classifiers
from kinference_common.engine.tokens import block_hashes

from .helpers import (
    NOW,
    burst_policy_rule,
    ep,
    excl,
    pool,
    prov,
    pstate,
    req,
    rule,
    sig,
    snap,
    tier,
    ws,
)

QWEN = ws("qwen", "qwen-2.5", "Qwen/Qwen2.5-32B-Instruct")
GEMMA = ws("gemma", "gemma-4", "google/gemma-4-12b")
DB = prov("databricks", {"qwen-2.5": "databricks-qwen25"})


class FixedRandom(random.Random):
    """A random source that always draws the given index."""

    def __init__(self, index: int) -> None:
        super().__init__(0)
        self.index = index

    def randrange(self, n, *args, **kwargs):  # type: ignore[override]
        return min(self.index, n - 1)


# ------------------------------------------------------------------ rules


def test_rules_are_tried_in_order_and_first_match_decides() -> None:
    p = pool([QWEN, DB], [
        rule("to-provider", [tier("Provider")], index=0, matches=[RequestTest(tenants=["alice"])]),
        rule("to-local", [tier("Local")], index=1),
    ])
    s = snap(p, [ep("qwen", "q0")], [pstate("databricks", 0.5)])
    assert decide(s, req("qwen-2.5", tenant="alice")).backend == "Provider/databricks"
    d = decide(s, req("qwen-2.5", tenant="bob"))
    assert d.backend == "Local/qwen" and d.rule == "to-local"


def test_matches_any_entry_all_fields_within() -> None:
    m = [RequestTest(models=["qwen-2.5"], tenants=["alice"]), RequestTest(tenants=["carol"])]
    p = pool([QWEN, DB], [rule("r", [tier("Provider")], matches=m)])
    s = snap(p, [ep("qwen", "q0")], [pstate("databricks")])
    assert decide(s, req("qwen-2.5", tenant="alice")).rule == "r"
    assert decide(s, req("qwen-2.5", tenant="carol")).rule == "r"
    # alice alone is not enough for entry 0 when... the model differs: falls to unmatched
    p2 = pool([QWEN, GEMMA, DB], [rule("r", [tier("Provider")], matches=m)])
    s2 = snap(p2, [ep("qwen", "q0"), ep("gemma", "g0")], [pstate("databricks")])
    d = decide(s2, req("gemma-4", tenant="alice"))
    assert d.rule == "unmatched" and d.backend == "Local/gemma"


@pytest.mark.parametrize(
    ("test", "request_kw", "holds"),
    [
        (RequestTest(tags=["pii-confirmed", "pii-unknown"]), {"tags": {"pii-unknown"}}, True),
        (RequestTest(tags=["pii-confirmed"]), {"tags": {"pii-unknown"}}, False),
        (RequestTest(tags=[]), {"tags": {"pii-unknown"}}, False),
        (RequestTest(tenants=[]), {}, False),
        (RequestTest(objectives=["batch"]), {"objective": "batch"}, True),
        (RequestTest(objectives=["batch"]), {}, False),
        (RequestTest(priority=Range(greater_than=5)), {"priority": 6}, True),
        (RequestTest(priority=Range(greater_than=5)), {"priority": 5}, False),
        (RequestTest(prompt_tokens=Range(less_than=100)), {"prompt_tokens": 99}, True),
        (RequestTest(prompt_tokens=Range(less_than=100)), {}, False),  # unknown never holds
        (RequestTest(headers=[Header(name="x-team", value="a")]), {"headers": {"x-team": "a"}}, True),
        (RequestTest(headers=[Header(name="x-team", value="a")]), {"headers": {"x-team": "b"}}, False),
        (RequestTest(models=["qwen-2.5"]), {}, True),
    ],
)
def test_request_test_fields(test: RequestTest, request_kw: dict, holds: bool) -> None:
    p = pool([QWEN, DB], [rule("r", [tier("Provider")], matches=[test])])
    s = snap(p, [ep("qwen", "q0")], [pstate("databricks")])
    d = decide(s, req("qwen-2.5", **request_kw))
    assert (d.rule == "r") is holds


def test_catch_all_rule_matches_everything() -> None:
    p = pool([QWEN, DB], [rule("all", [tier("Provider")])])
    s = snap(p, [ep("qwen", "q0")], [pstate("databricks")])
    assert decide(s, req("qwen-2.5", tenant="anyone")).backend == "Provider/databricks"


def test_shadowed_rule_never_fires() -> None:
    p = pool([QWEN, DB], [rule("first", [tier("Local")], on_empty="Reject"),
                          rule("second", [tier("Provider")], index=1, shadowed=True)])
    s = snap(p, [ep("qwen", "q0", ready=False)], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert not d.routed and d.rule == "first"
    assert [st.outcome for st in d.steps] == ["Rejected"]
    # the pod not ready makes it no_capacity; the reason does not blame an exclusion (there is none)
    assert d.code == "no_capacity" and "not ready" in d.reason, d.reason


# -------------------------------------------------------------- unmatched


def test_unmatched_serve_local_never_reaches_a_provider() -> None:
    p = pool([QWEN, DB], [rule("alice-only", [tier("Provider")], matches=[RequestTest(tenants=["alice"])])])
    s = snap(p, [ep("qwen", "q0", queued=50), ep("qwen", "q1")], [pstate("databricks", 0.01)])
    d = decide(s, req("qwen-2.5", tenant="bob"))
    assert d.rule == "unmatched" and d.endpoint == "q1"
    s2 = snap(p, [ep("qwen", "q0", ready=False)], [pstate("databricks", 0.01)])
    d2 = decide(s2, req("qwen-2.5", tenant="bob"))
    assert not d2.routed and d2.code == "no_capacity"


def test_unmatched_reject() -> None:
    p = pool([QWEN], [rule("alice-only", [tier("Local")], matches=[RequestTest(tenants=["alice"])])],
             unmatched="Reject")
    s = snap(p, [ep("qwen", "q0")])
    d = decide(s, req("qwen-2.5", tenant="bob"))
    assert not d.routed and d.code == "policy_rejected" and d.rule == "unmatched"
    assert d.http_status == 403


def test_default_policy_serves_local_by_predicted_ttft_never_provider() -> None:
    p = pool([QWEN, DB], None)  # no policyRef: the default policy
    s = snap(p, [ep("qwen", "q0", queued=10), ep("qwen", "q1", queued=1)], [pstate("databricks", 0.001)])
    d = decide(s, req("qwen-2.5"))
    assert d.endpoint == "q1" and d.rule == "unmatched"
    s2 = snap(p, [], [pstate("databricks", 0.001)])
    assert not decide(s2, req("qwen-2.5")).routed


# ---------------------------------------------------------------- consider


def test_default_consider_is_the_requested_model_on_every_destination() -> None:
    p = pool([QWEN, GEMMA, DB], [rule("r", [tier("Provider"), tier("Local", 1)])])
    s = snap(p, [ep("qwen", "q0"), ep("gemma", "g0")], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert d.backend == "Provider/databricks"
    assert [c.id for c in d.steps[0].candidates] == ["Provider/databricks", "Local/qwen/q0"]
    d = decide(s, req("gemma-4"))
    assert d.backend == "Local/gemma"  # the provider does not serve gemma-4


def test_consider_other_model_rewrites_to_served_name() -> None:
    p = pool([QWEN, GEMMA], [rule("r", [tier("Local", minimize="PredictedTTFT")],
                                  consider=[Consider(models=["gemma-4"])])])
    s = snap(p, [ep("qwen", "q0"), ep("gemma", "g0", queued=30)])
    d = decide(s, req("qwen-2.5"))
    assert d.backend == "Local/gemma" and d.model == "google/gemma-4-12b"
    t = d.trace()
    assert t.model.canonical == "qwen-2.5" and t.outcome.model == "google/gemma-4-12b"


def test_forwarded_model_is_the_served_name_even_for_the_requested_model() -> None:
    p = pool([QWEN], None, aliases={"Qwen/Qwen2.5-32B-Instruct": "qwen-2.5"})
    s = snap(p, [ep("qwen", "q0")])
    d = decide(s, req("Qwen/Qwen2.5-32B-Instruct"))
    assert d.canonical_model == "qwen-2.5" and d.model == "Qwen/Qwen2.5-32B-Instruct"


def test_consider_backend_narrowing() -> None:
    other = ws("qwen-b", "qwen-2.5")
    p = pool([QWEN, other, DB], [rule("r", [tier("Local"), tier("Provider", 1)],
                                      consider=[Consider(backend_type="Local", backend_names=["qwen-b"])])])
    s = snap(p, [ep("qwen", "q0"), ep("qwen-b", "b0")], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert [c.id for c in d.steps[0].candidates] == ["Local/qwen-b/b0"]
    p2 = pool([QWEN, DB], [rule("r", [tier("Local"), tier("Provider", 1)],
                                consider=[Consider(backend_names=[])])])
    s2 = snap(p2, [ep("qwen", "q0")], [pstate("databricks")])
    d2 = decide(s2, req("qwen-2.5"))
    assert not d2.routed and d2.code == "policy_rejected"


def test_consider_union_of_entries() -> None:
    p = pool([QWEN, GEMMA, DB], [rule("r", [tier("Local", order=["gemma", "qwen"])],
                                      consider=[Consider(models=["gemma-4"]), Consider(backend_type="Local")])])
    s = snap(p, [ep("qwen", "q0"), ep("gemma", "g0")], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert {c.id for c in d.steps[0].candidates} == {"Local/qwen/q0", "Local/gemma/g0"}
    assert d.backend == "Local/gemma"


def test_provider_is_one_candidate_per_served_model() -> None:
    multi = prov("openai", {"qwen-2.5": "up-qwen", "gemma-4": "up-gemma"})
    p = pool([QWEN, GEMMA, multi], [rule("r", [tier("Provider", order=["openai"])],
                                         consider=[Consider(models=["qwen-2.5", "gemma-4"])])])
    s = snap(p, [], [pstate("openai", 0.2)])
    d = decide(s, req("gemma-4"))
    ids = [c.id for c in d.steps[0].candidates]
    assert ids == ["Provider/openai:gemma-4", "Provider/openai:qwen-2.5"]
    assert d.model == "up-gemma"


# --------------------------------------------------------------- exclusions


def test_exclusion_if_is_request_scoped() -> None:
    p = pool([QWEN, DB], [burst_policy_rule()])
    s = snap(p, [ep("qwen", "q0", queued=9)], [pstate("databricks", 0.5)])
    assert decide(s, req("qwen-2.5")).backend == "Provider/databricks"
    d = decide(s, req("qwen-2.5", tags={"pii-confirmed"}))
    assert not d.routed and d.code == "no_capacity"
    t = d.trace()
    assert t.rules[0].excluded[2].dropped == ["Provider/databricks"]
    d2 = decide(s, req("qwen-2.5", tags={"pii-none"}))
    assert d2.backend == "Provider/databricks"
    assert d2.trace().rules[0].excluded[2].applies is False


def test_unknown_values_never_drop() -> None:
    p = pool([QWEN, DB], [burst_policy_rule()])
    s = snap(p, [ep("qwen", "q0", queued=None, kv=None)], [pstate("databricks", 0.5)])
    assert decide(s, req("qwen-2.5")).backend == "Local/qwen"
    p2 = pool([DB], [rule("r", [tier("Provider")], exclude=[
        excl("slow", type_="Provider", signals=[sig("estimatedTTFT", gt=1.0)]),
        excl("flaky", type_="Provider", signals=[sig("errorRate", gt=0.1)]),
    ])])
    s2 = snap(p2, [], [pstate("databricks")])  # never observed
    assert decide(s2, req("qwen-2.5")).backend == "Provider/databricks"
    s3 = snap(p2, [], [pstate("databricks", est=2.0)])
    assert not decide(s3, req("qwen-2.5")).routed


def test_exclusion_with_less_than_and_names() -> None:
    other = ws("qwen-b", "qwen-2.5")
    p = pool([QWEN, other], [rule("r", [tier("Local")], exclude=[
        excl("idle-gpus-only-on-b", type_="Local", names=["qwen-b"], signals=[sig("gpuUtilization", lt=0.5)]),
    ])])
    s = snap(p, [ep("qwen", "q0", gpu_utilization=0.1), ep("qwen-b", "b0", gpu_utilization=0.1),
                 ep("qwen-b", "b1", gpu_utilization=0.9)])
    d = decide(s, req("qwen-2.5"))
    assert d.trace().rules[0].excluded[0].dropped == ["Local/qwen-b/b0"]


def test_in_flight_exclusion_reads_the_ledger() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")], exclude=[excl("busy", signals=[sig("inFlight", gt=1)])])])
    s = snap(p, [ep("qwen", "q0"), ep("qwen", "q1")])
    ledger = InFlightLedger()
    for _ in range(2):
        ledger.sent("default/qwen/q0", 100, NOW)
    d = decide(s, req("qwen-2.5"), ledger=ledger)
    assert d.endpoint == "q1"


# -------------------------------------------------------------------- tiers


def test_first_tier_with_a_candidate_picks() -> None:
    p = pool([QWEN, DB], [rule("r", [tier("Local", 0, backends=CandidateTest(signals=[sig("queuedPrompts", lt=3)])),
                                     tier("Provider", 1), tier("Local", 2, minimize="QueuedPrompts")])])
    s = snap(p, [ep("qwen", "q0", queued=5), ep("qwen", "q1", queued=4)], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert d.backend == "Provider/databricks"
    t = d.trace().rules[0].tiers
    assert [x.picked for x in t] == [None, "Provider/databricks"]
    s2 = snap(p, [ep("qwen", "q0", queued=5), ep("qwen", "q1", queued=2)], [pstate("databricks")])
    assert decide(s2, req("qwen-2.5")).endpoint == "q1"


def test_unreachable_tier_never_picks() -> None:
    p = pool([QWEN], [rule("r", [tier("Local", 0, backends=CandidateTest(backend_names=[])),
                                 tier("Local", 1, unreachable=True)])])
    s = snap(p, [ep("qwen", "q0")])
    assert not decide(s, req("qwen-2.5")).routed


@pytest.mark.parametrize(
    ("minimize", "winner"),
    [("QueuedPrompts", "q1"), ("KVCacheUsage", "q2"), ("InFlight", "q0"), ("PredictedTTFT", "q1")],
)
def test_minimize_signals(minimize: str, winner: str) -> None:
    p = pool([QWEN], [rule("r", [tier("Local", minimize=minimize)])])
    s = snap(p, [ep("qwen", "q0", queued=5, kv=0.5), ep("qwen", "q1", queued=0, kv=0.6),
                 ep("qwen", "q2", queued=3, kv=0.1)])
    ledger = InFlightLedger()
    ledger.sent("default/qwen/q1", 10, NOW - 10)
    ledger.observed("default/qwen/q1", NOW)
    ledger.sent("default/qwen/q2", 10, NOW - 10)
    ledger.observed("default/qwen/q2", NOW)
    assert decide(s, req("qwen-2.5"), ledger=ledger).endpoint == winner


def test_minimize_estimated_ttft_unobserved_sorts_last() -> None:
    a, b, c = prov("a", {"qwen-2.5": "x"}), prov("b", {"qwen-2.5": "x"}), prov("c", {"qwen-2.5": "x"})
    p = pool([a, b, c], [rule("r", [tier("Provider", minimize="EstimatedTTFT")])])
    s = snap(p, [], [pstate("a"), pstate("b", 0.9), pstate("c", 0.3)])
    assert decide(s, req("qwen-2.5")).backend == "Provider/c"
    s2 = snap(p, [], [pstate("a")])  # nothing observed: the first unobserved one is picked
    d = decide(s2, req("qwen-2.5"))
    assert d.backend == "Provider/a"


def test_order_prefers_listed_destinations_and_sees_only_them() -> None:
    a, b, c = prov("a", {"qwen-2.5": "x"}), prov("b", {"qwen-2.5": "x"}), prov("c", {"qwen-2.5": "x"})
    p = pool([a, b, c], [rule("r", [tier("Provider", order=["c", "b"])],
                               exclude=[excl("no-c", names=["c"])])])
    s = snap(p, [], [pstate("a"), pstate("b"), pstate("c")])
    d = decide(s, req("qwen-2.5"))
    assert d.backend == "Provider/b"
    assert d.trace().rules[0].tiers[0].kept == ["Provider/b"]


def test_no_minimize_no_order_keeps_stable_order() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")])])
    s = snap(p, [ep("qwen", "q2"), ep("qwen", "q0", queued=99), ep("qwen", "q1")])
    assert decide(s, req("qwen-2.5")).endpoint == "q0"


# ---------------------------------------------------------------- tieBreak


def test_tie_break_least_in_flight() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")], tie_break=["LeastInFlight"])])
    s = snap(p, [ep("qwen", "q0"), ep("qwen", "q1")])
    ledger = InFlightLedger()
    ledger.sent("default/qwen/q0", 10, NOW)
    assert decide(s, req("qwen-2.5"), ledger=ledger).endpoint == "q1"


def test_tie_break_prefix_affinity() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")], tie_break=["PrefixAffinity"])])
    s = snap(p, [ep("qwen", "q0"), ep("qwen", "q1"), ep("qwen", "q2")])
    prompt = "You are a helpful assistant. " * 100
    hashes = block_hashes(prompt)
    index = PrefixIndex()
    index.record("default/qwen/q2", hashes)
    d = decide(s, req("qwen-2.5", block_hashes=hashes), prefix=index)
    assert d.endpoint == "q2"
    assert d.trace().rules[0].tiers[0].why.endswith("tieBreak PrefixAffinity")


def test_tie_break_random_uses_the_injected_source() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")], tie_break=["Random"])])
    s = snap(p, [ep("qwen", "q0"), ep("qwen", "q1"), ep("qwen", "q2")])
    assert decide(s, req("qwen-2.5"), rng=FixedRandom(2)).endpoint == "q2"
    assert decide(s, req("qwen-2.5"), rng=FixedRandom(1)).endpoint == "q1"


def test_tie_breaks_apply_in_order_only_among_equals() -> None:
    p = pool([QWEN], [rule("r", [tier("Local", minimize="QueuedPrompts")],
                           tie_break=["LeastInFlight", "Random"])])
    s = snap(p, [ep("qwen", "q0", queued=1), ep("qwen", "q1", queued=1), ep("qwen", "q2", queued=1),
                 ep("qwen", "q3", queued=0)])
    assert decide(s, req("qwen-2.5"), rng=FixedRandom(2)).endpoint == "q3"
    s2 = snap(p, [ep("qwen", "q0", queued=1), ep("qwen", "q1", queued=1), ep("qwen", "q2", queued=1)])
    ledger = InFlightLedger()
    ledger.sent("default/qwen/q0", 10, NOW - 5)
    ledger.observed("default/qwen/q0", NOW)
    assert decide(s2, req("qwen-2.5"), ledger=ledger, rng=FixedRandom(1)).endpoint == "q2"


# ----------------------------------------------------------------- onEmpty


def test_on_empty_fall_through_tries_the_next_rule() -> None:
    p = pool([QWEN, DB], [
        rule("local", [tier("Local")], exclude=[excl("q", type_="Local", signals=[sig("queuedPrompts", gt=4)])],
             on_empty="FallThrough"),
        rule("provider", [tier("Provider")], index=1),
    ])
    s = snap(p, [ep("qwen", "q0", queued=9)], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert d.rule == "provider" and [st.outcome for st in d.steps] == ["FallThrough", "Routed"]


def test_on_empty_reject_stops() -> None:
    p = pool([QWEN, DB], [rule("local", [tier("Local")], exclude=[excl("all-local", type_="Local")]),
                          rule("provider", [tier("Provider")], index=1)])
    s = snap(p, [ep("qwen", "q0")], [pstate("databricks")])
    d = decide(s, req("qwen-2.5"))
    assert not d.routed and d.code == "policy_rejected" and len(d.steps) == 1


def test_fall_through_to_unmatched_reject_keeps_no_capacity() -> None:
    p = pool([QWEN], [rule("local", [tier("Local")], on_empty="FallThrough",
                           exclude=[excl("q", type_="Local", signals=[sig("queuedPrompts", gt=4)])])],
             unmatched="Reject")
    s = snap(p, [ep("qwen", "q0", queued=9)])
    d = decide(s, req("qwen-2.5"))
    assert d.code == "no_capacity" and d.http_status == 503


# ---------------------------------------------------------------- built-ins


def test_not_ready_and_ejected_are_not_candidates() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")])])
    s = snap(p, [ep("qwen", "q0", ready=False), ep("qwen", "q1"), ep("qwen", "q2")],
             ejected={"default/qwen/q1"})
    d = decide(s, req("qwen-2.5"))
    assert d.endpoint == "q2"
    b = {x.check: x.candidates for x in d.trace().rules[0].builtin}
    assert b == {"notReady": ["Local/qwen/q0"], "ejected": ["Local/qwen/q1"]}


def test_stale_endpoint_stays_a_candidate_on_the_ledger() -> None:
    p = pool([QWEN], [rule("r", [tier("Local", minimize="QueuedPrompts")],
                           exclude=[excl("kv", type_="Local", signals=[sig("kvCacheUsage", gt=0.5)])])])
    s = snap(p, [ep("qwen", "q0", queued=3, kv=0.9, age=60), ep("qwen", "q1", queued=1)], stale_after=5)
    d = decide(s, req("qwen-2.5"))
    # stale: kv unknown (not dropped), queued from this router's ledger (0)
    assert d.endpoint == "q0"
    t = d.trace().rules[0]
    assert {"check": "stale", "candidates": ["Local/qwen/q0"], "removed": False} in [
        {"check": b.check, "candidates": b.candidates, "removed": b.removed} for b in t.builtin
    ]
    ledger = InFlightLedger()
    ledger.sent("default/qwen/q0", 100, NOW - 100)
    ledger.sent("default/qwen/q0", 100, NOW - 100)
    assert decide(s, req("qwen-2.5"), ledger=ledger).endpoint == "q1"


def test_context_too_small_takes_the_prompt_and_max_tokens() -> None:
    small = ws("small", "qwen-2.5", context_window=4096)
    big = ws("big", "qwen-2.5", context_window=32768)
    p = pool([small, big], [rule("r", [tier("Local", order=["small", "big"])])])
    s = snap(p, [ep("small", "s0"), ep("big", "b0")])
    assert decide(s, req("qwen-2.5", prompt_tokens=4000, max_tokens=1000)).backend == "Local/big"
    assert decide(s, req("qwen-2.5", prompt_tokens=4000)).backend == "Local/small"
    d = decide(s, req("qwen-2.5", prompt_tokens=40000, max_tokens=1000))
    assert not d.routed
    assert d.trace().rules[0].builtin[0].check == "contextTooSmall"
    assert interpret(d).code == "context_length_exceeded"


def test_a_prompt_too_long_for_a_window_goes_where_it_fits_without_max_tokens_too() -> None:
    # the engine then writes until the window is full, but the prompt must leave room for one token
    small = ws("small", "qwen-2.5", context_window=4096)
    big = ws("big", "qwen-2.5", context_window=32768)
    p = pool([small, big], [rule("r", [tier("Local", order=["small", "big"])])])
    s = snap(p, [ep("small", "s0"), ep("big", "b0")])
    assert decide(s, req("qwen-2.5", prompt_tokens=4095)).backend == "Local/small"
    # over the small window by the estimate: to the big one, never to one that almost surely refuses it
    assert decide(s, req("qwen-2.5", prompt_tokens=4096)).backend == "Local/big"
    assert decide(s, req("qwen-2.5", prompt_tokens=5119)).backend == "Local/big"
    d = decide(s, req("qwen-2.5", prompt_tokens=50000))
    assert not d.routed and d.trace().rules[0].builtin[0].check == "contextTooSmall"
    out = interpret(d)
    assert out.code == "context_length_exceeded" and d.code != out.code
    assert "maximum context length is 32768 tokens" in out.reason and "about 50000 tokens" in out.reason


def test_the_router_refuses_for_length_only_what_surely_does_not_fit() -> None:
    # no window holds the estimate: one that would, were it 25% too high, still gets the request
    # (its engine counts exactly); past that it is the client's 400
    small = ws("small", "qwen-2.5", context_window=4096)
    s = snap(pool([small], [rule("r", [tier("Local")])]), [ep("small", "s0")])
    assert decide(s, req("qwen-2.5", prompt_tokens=5119)).backend == "Local/small"  # 5119 / 1.25 + 1 = 4096
    d = decide(s, req("qwen-2.5", prompt_tokens=5121))
    assert not d.routed and interpret(d).code == "context_length_exceeded"


def test_a_batch_is_a_completions_body_s_prompt_list_only() -> None:
    import json
    import random

    from kinference_common.engine.request import engine_request
    from kinference_common.request_body import parse

    s = snap(pool([ws("small", "qwen-2.5", context_window=4096)], [rule("r", [tier("Local")])]), [ep("small", "s0")])
    long = "The quick brown fox jumps over the lazy dog. " * 200
    batch = parse(json.dumps({"model": "qwen-2.5", "prompt": [long, "hi"]}).encode(), chat=False)
    r = engine_request(s, {}, batch, "t", random.Random(0))
    assert r.context_tokens is not None and r.context_tokens < r.prompt_tokens
    # a chat body's stray `prompt` (the engine ignores it) says nothing of its sequences
    chat = parse(json.dumps({"model": "qwen-2.5", "messages": [{"role": "user", "content": "hi"}],
                             "prompt": [long, long]}).encode(), chat=True)
    assert engine_request(s, {}, chat, "t", random.Random(0)).context_tokens is None


def test_a_batch_of_prompts_needs_room_for_its_longest_not_their_sum() -> None:
    # vLLM holds each prompt of a completions batch as its own sequence
    small = ws("small", "qwen-2.5", context_window=4096)
    p = pool([small], [rule("r", [tier("Local")])])
    s = snap(p, [ep("small", "s0")])
    batch = req("qwen-2.5", prompt_tokens=3 * 3000, max_tokens=100, context_tokens=3000)
    assert decide(s, batch).routed
    assert not decide(s, req("qwen-2.5", prompt_tokens=3 * 3000, max_tokens=100)).routed


def test_endpoint_context_window_overrides_the_worker_set() -> None:
    p = pool([ws("w", "qwen-2.5", context_window=32768)], [rule("r", [tier("Local")])])
    s = snap(p, [ep("w", "p0", context_window=2048), ep("w", "p1")])
    assert decide(s, req("qwen-2.5", prompt_tokens=3000, max_tokens=10)).endpoint == "p1"


# ------------------------------------------------------------------ models


def test_aliases_resolve_and_unknown_models_are_404() -> None:
    p = pool([QWEN], None, aliases={"qwen": "qwen-2.5"})
    s = snap(p, [ep("qwen", "q0")])
    assert decide(s, req("qwen")).routed
    d = decide(s, req("llama-3"))
    assert d.code == "model_not_found" and d.http_status == 404 and d.steps == []


# ---------------------------------------------------------- rejection codes


def test_policy_rejected_when_no_live_signal_removed_anything() -> None:
    p = pool([QWEN, DB], [burst_policy_rule()])
    s = snap(p, [], [pstate("databricks")])
    d = decide(s, req("qwen-2.5", tags={"pii-confirmed"}))
    assert d.code == "policy_rejected"


# ------------------------------------------------------------ classifiers


def test_required_classifiers_only_for_rules_whose_non_tag_terms_hold() -> None:
    rules = [
        rule("alice-pii", [tier("Local")], matches=[RequestTest(tenants=["alice"], tags=["pii-confirmed"])]),
        rule("inj", [tier("Local")], index=1, matches=[RequestTest(tenants=["bob"])],
             exclude=[excl("x", type_="Provider", when=RequestTest(tags=["injection-detected"]))]),
        rule("shadow", [tier("Local")], index=2, shadowed=True,
             matches=[RequestTest(tags=["pii-unknown"])]),
    ]
    p = pool([QWEN], rules)
    assert required_classifiers(p.policy, req("qwen-2.5", tenant="alice")) == ["pii"]
    assert required_classifiers(p.policy, req("qwen-2.5", tenant="bob")) == ["injection"]
    assert required_classifiers(p.policy, req("qwen-2.5", tenant="carol")) == []
    s = snap(p, [ep("qwen", "q0")])
    assert s.classifiers_for(req("qwen-2.5", tenant="alice")) == ["pii"]
    assert s.classifiers_for(req("qwen-2.5", tenant="bob")) == ["injection"]


def test_serve_local_rejection_codes() -> None:
    p = pool([QWEN, prov("openai", {"gpt-x": "gpt-x"})], None)
    s = snap(p, [])  # qwen scaled to zero
    assert decide(s, req("qwen-2.5")).code == "no_capacity"
    assert decide(s, req("gpt-x")).code == "policy_rejected"  # only a provider serves it


def test_model_rewrite_draws_by_weight_with_the_injected_source() -> None:
    from kinference_common.compiled import CompiledRewrite, RewriteTarget
    from kinference_common.engine.request import apply_rewrite

    p = pool([QWEN, GEMMA], None)
    p = p.__class__(**{**{f: getattr(p, f) for f in p.__struct_fields__}, "rewrites": [
        CompiledRewrite(source="a", match_model="qwen-2.5",
                        targets=[RewriteTarget(model="gemma-4", weight=1), RewriteTarget(model="qwen-2.5", weight=3)]),
        CompiledRewrite(source="b", match_model=None, targets=[RewriteTarget(model="qwen-2.5", weight=1)]),
    ]})

    class Fixed(random.Random):
        def __init__(self, x: float) -> None:
            super().__init__(0)
            self.x = x

        def random(self) -> float:  # type: ignore[override]
            return self.x

    assert apply_rewrite(p, "qwen-2.5", Fixed(0.1)) == "gemma-4"  # 0.1 * 4 < 1
    assert apply_rewrite(p, "qwen-2.5", Fixed(0.5)) == "qwen-2.5"
    assert apply_rewrite(p, "gemma-4", Fixed(0.9)) == "qwen-2.5"  # the generic rule
    p2 = pool([QWEN], None)
    assert apply_rewrite(p2, "qwen-2.5", Fixed(0.5)) is None


def test_ledger_exclusion_gives_the_same_answer_whatever_the_ledger_size() -> None:
    p = pool([QWEN], [rule("r", [tier("Local")], exclude=[excl("q", type_="Local", signals=[sig("queuedPrompts", gt=2)])])])
    s = snap(p, [ep("qwen", f"q{i}", queued=i % 4) for i in range(8)])
    small, big = InFlightLedger(), InFlightLedger()
    for led in (small, big):
        led.sent("default/qwen/q1", 10, NOW + 1)
        led.sent("default/qwen/q1", 10, NOW + 1)
    for i in range(50):
        big.sent(f"other/ws/p{i}", 10, NOW)
    a = decide(s, req("qwen-2.5"), ledger=small).trace().rules[0].excluded[0].dropped
    b = decide(s, req("qwen-2.5"), ledger=big).trace().rules[0].excluded[0].dropped
    assert a == b == ["Local/qwen/q1", "Local/qwen/q3", "Local/qwen/q7"]


def test_avoid_skips_a_failed_endpoint_on_retry() -> None:
    p = pool([QWEN], None)
    s = snap(p, [ep("qwen", "q0"), ep("qwen", "q1", queued=3)])
    first = decide(s, req("qwen-2.5"))
    assert first.endpoint == "q0"
    retry = decide(s, req("qwen-2.5"), avoid={first.candidate.ledger_key})
    assert retry.endpoint == "q1"
    assert retry.trace().rules[0].builtin[0].check == "ejected"
    none_left = decide(s, req("qwen-2.5"), avoid={"default/qwen/q0", "default/qwen/q1"})
    assert not none_left.routed and none_left.code == "no_capacity"
