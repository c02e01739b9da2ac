"""Property-based: for random compiled policies, snapshots and requests, an
applicable exclusion is never overridden."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kinference_common.compiled import (
    LIVE_SIGNALS,
    CandidateTest,
    CompiledExclusion,
    Consider,
    Range,
    RequestTest,
    SignalTest,
)
from kinference_common.engine import InFlightLedger, decide
from kinference_common.engine.signals import SIGNALS, DecisionContext

from .helpers import NOW, ep, pool, prov, pstate, req, rule, snap, tier, ws

MODELS = ["m1", "m2"]
TENANTS = ["alice", "bob"]
TAGS = ["pii-confirmed", "pii-unknown", "pii-none", "injection-detected"]
WS_NAMES = ["ws-a", "ws-b", "ws-c"]
PROV_NAMES = ["prov-x", "prov-y"]
LOCAL_SIGNALS = ["queuedPrompts", "runningPrompts", "kvCacheUsage", "gpuUtilization", "predictedTTFT", "inFlight"]
PROVIDER_SIGNALS = ["estimatedTTFT", "errorRate", "inFlight"]
THRESHOLDS = {"queuedPrompts": (0, 10), "runningPrompts": (0, 100), "kvCacheUsage": (0, 1),
              "gpuUtilization": (0, 1), "predictedTTFT": (0, 2), "inFlight": (0, 4),
              "estimatedTTFT": (0, 2), "errorRate": (0, 1)}

maybe_none = lambda s: st.one_of(st.none(), s)  # noqa: E731


@st.composite
def signal_test(draw, kind: str) -> SignalTest:
    name = draw(st.sampled_from(LOCAL_SIGNALS if kind == "Local" else PROVIDER_SIGNALS))
    lo, hi = THRESHOLDS[name]
    a = draw(st.floats(lo, hi, allow_nan=False))
    if draw(st.booleans()):
        r = Range(greater_than=a)
    else:
        r = Range(less_than=a)
    return SignalTest(signal=name, range=r)  # type: ignore[arg-type]


@st.composite
def candidate_test(draw) -> CandidateTest:
    kind = draw(st.sampled_from([None, "Local", "Local", "Provider"]))
    names = draw(st.one_of(st.none(), st.none(),
                           st.lists(st.sampled_from(WS_NAMES + PROV_NAMES), max_size=2, unique=True)))
    sigs = draw(st.lists(signal_test(kind), min_size=draw(st.sampled_from([0, 1, 1])), max_size=2)) if kind else []
    return CandidateTest(backend_type=kind, backend_names=names, signals=sigs)


def _term(values: list[str]):
    """None (no constraint) most often; rarely [] (never holds)."""
    return st.one_of(st.none(), st.none(), st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True),
                     st.just([]) if values is TAGS else st.none())


@st.composite
def request_test(draw) -> RequestTest:
    return RequestTest(models=draw(_term(MODELS)), tenants=draw(_term(TENANTS)), tags=draw(_term(TAGS)))


@st.composite
def exclusion(draw, i: int) -> CompiledExclusion:
    drop = draw(candidate_test())
    shape = draw(st.sampled_from(["seed", "always", "if"]))
    if shape == "seed":  # the seed's shape: a tag-conditional drop of every provider
        when = RequestTest(tags=draw(st.lists(st.sampled_from(TAGS), min_size=1, max_size=2, unique=True)))
        drop = CandidateTest(backend_type="Provider")
    else:
        when = None if shape == "always" else draw(request_test())
    return CompiledExclusion(name=f"x{i}", term=f"x{i}", when=when, drop=drop,
                             live=any(s.signal in LIVE_SIGNALS for s in drop.signals))


@st.composite
def a_tier(draw, i: int):
    kind = draw(st.sampled_from(["Local", "Provider"]))
    how = draw(st.sampled_from(["minimize", "order", "none"]))
    minimize = order = None
    if how == "minimize":
        minimize = draw(st.sampled_from(
            ["PredictedTTFT", "QueuedPrompts", "KVCacheUsage", "InFlight"] if kind == "Local"
            else ["EstimatedTTFT", "InFlight"]))
    elif how == "order":
        order = draw(st.lists(st.sampled_from(WS_NAMES if kind == "Local" else PROV_NAMES),
                              min_size=1, max_size=3, unique=True))
    backends = draw(maybe_none(candidate_test()))
    return tier(kind, i, minimize=minimize, order=order, backends=backends)


@st.composite
def a_rule(draw, i: int):
    consider = draw(maybe_none(st.lists(st.builds(
        Consider,
        models=maybe_none(st.lists(st.sampled_from(MODELS), min_size=1, max_size=2, unique=True)),
        backend_type=st.sampled_from([None, "Local", "Provider"]),
        backend_names=maybe_none(st.lists(st.sampled_from(WS_NAMES + PROV_NAMES), max_size=2, unique=True)),
    ), min_size=1, max_size=2)))
    return rule(
        f"r{i}",
        draw(st.lists(st.integers(0, 100), min_size=1, max_size=3).map(lambda xs: list(range(len(xs))))
             .flatmap(lambda idx: st.tuples(*[a_tier(j) for j in idx]).map(list))),
        index=i,
        matches=draw(st.one_of(st.none(), st.lists(request_test(), min_size=1, max_size=2))),
        consider=consider,
        exclude=draw(st.lists(st.integers(0, 100), max_size=3).map(lambda xs: list(range(len(xs))))
                     .flatmap(lambda idx: st.tuples(*[exclusion(j) for j in idx]).map(list))),
        tie_break=draw(st.lists(st.sampled_from(["LeastInFlight", "PrefixAffinity", "Random"]),
                                max_size=3, unique=True)),
        on_empty=draw(st.sampled_from(["Reject", "FallThrough"])),
    )


@st.composite
def live_rule(draw):
    """One catch-all rule whose exclusions compare live (ledger- and
    request-dependent) signals, some behind an ``if``."""
    exclusions = []
    for i in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["queuedPrompts", "inFlight", "predictedTTFT"]))
        lo, hi = THRESHOLDS[name]
        r = Range(greater_than=draw(st.floats(lo, hi))) if draw(st.booleans()) else Range(
            less_than=draw(st.floats(lo, hi)))
        when = draw(st.sampled_from([None, RequestTest(tenants=["alice"]), RequestTest(tags=["pii-none"])]))
        exclusions.append(CompiledExclusion(
            name=f"live{i}", term=f"live{i}", when=when, live=True,
            drop=CandidateTest(backend_type="Local", signals=[SignalTest(signal=name, range=r)])))  # type: ignore[arg-type]
    minimize = draw(st.sampled_from([None, "PredictedTTFT", "QueuedPrompts", "InFlight"]))
    return rule("live", [tier("Local", 0, minimize=minimize), tier("Provider", 1)], exclude=exclusions,
                tie_break=draw(st.lists(st.sampled_from(["LeastInFlight", "PrefixAffinity", "Random"]),
                                        max_size=3, unique=True)))


@st.composite
def world(draw, rules_strategy=None):
    wss = [ws(n, draw(st.sampled_from(MODELS)), f"{n}-served", draw(maybe_none(st.sampled_from([2048, 8192]))))
           for n in draw(st.lists(st.sampled_from(WS_NAMES), min_size=1, max_size=3, unique=True))]
    provs = [prov(n, {m: f"{n}-{m}" for m in draw(st.lists(st.sampled_from(MODELS), min_size=1, unique=True))})
             for n in draw(st.lists(st.sampled_from(PROV_NAMES), max_size=2, unique=True))]
    if rules_strategy is None:
        rules = [draw(a_rule(i)) for i in range(draw(st.integers(0, 4)))]
    else:
        rules = [draw(rules_strategy)]
    p = pool(wss + provs, rules, unmatched=draw(st.sampled_from(["ServeLocal", "Reject"])))
    eps = []
    for w in wss:
        for k in range(draw(st.integers(0, 5))):
            eps.append(ep(w.name, f"p{k}", ready=draw(st.integers(0, 5)) > 0,
                          queued=draw(maybe_none(st.integers(0, 12))), running=draw(maybe_none(st.integers(0, 99))),
                          kv=draw(maybe_none(st.floats(0, 1))), age=draw(st.sampled_from([0.1, 0.1, 60.0])),
                          gpu_utilization=draw(maybe_none(st.floats(0, 1)))))
    pstates = [pstate(pv.name, draw(maybe_none(st.floats(0.01, 3))), draw(maybe_none(st.floats(0, 1))))
               for pv in provs]
    ejected = {f"default/{e.worker_set}/{e.pod}" for e in eps if draw(st.integers(0, 9)) == 0}
    s = snap(p, eps, pstates, ejected=ejected)
    ledger = InFlightLedger()
    for c in s.candidates:
        for _ in range(draw(st.integers(0, 3))):
            ledger.sent(c.ledger_key, draw(st.integers(0, 4000)), NOW + draw(st.sampled_from([-1.0, 1.0])))
    r = req(draw(st.sampled_from(MODELS)), tenant=draw(st.sampled_from(TENANTS)),
            tags=set(draw(st.lists(st.sampled_from(TAGS), max_size=2, unique=True))),
            prompt_tokens=draw(maybe_none(st.integers(1, 9000))), max_tokens=draw(maybe_none(st.integers(1, 2000))))
    return s, ledger, r, draw(st.integers(0, 2**32))


def _oracle_drop(test: CandidateTest, c, ctx: DecisionContext) -> bool:
    """An exclusion's ``drop``, evaluated directly from its definition."""
    if test.backend_type is not None and c.type != test.backend_type:
        return False
    if test.backend_names is not None and c.dest_name not in test.backend_names:
        return False
    return all(s.range.holds(SIGNALS[s.signal](c, ctx)) for s in test.signals)


def _when_holds(t: RequestTest | None, r, model: str) -> bool:
    if t is None:
        return True
    return ((t.models is None or model in t.models) and (t.tenants is None or r.tenant in t.tenants)
            and (t.tags is None or bool(set(t.tags) & r.tags)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world())
def test_the_pick_is_never_a_candidate_an_applicable_exclusion_dropped(w) -> None:
    check_pick(*w)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world(live_rule()))
def test_exclusions_on_live_signals_are_never_overridden(w) -> None:
    check_pick(*w)


def check_pick(s, ledger, r, seed) -> None:
    d = decide(s, r, ledger=ledger, rng=random.Random(seed))
    if not d.routed:
        assert d.code in ("policy_rejected", "no_capacity", "model_not_found")
        return
    pick = d.candidate
    assert pick.builtin is None, "a notReady/ejected endpoint was picked"
    if r.context_need() is not None and pick.context_window is not None:
        # what the request surely needs fits (one whose estimate does not fit
        # stays when nothing else does: decide._by_window, ESTIMATE_MARGIN)
        assert pick.context_window >= r.context_need(sure=True)
    assert d.model == pick.served_name
    step = d.steps[-1]
    assert step.outcome == "Routed"
    if d.rule == "unmatched":
        assert pick.type == "Local" and pick.model == d.canonical_model
        return
    compiled_rule = step.rule.rule
    for ex in compiled_rule.exclude:
        if _when_holds(ex.when, r, d.canonical_model):
            assert not _oracle_drop(ex.drop, pick, d.context), f"{pick.id} was dropped by {ex.name}"
            if (ex.when is not None and ex.when.tags and set(ex.when.tags) & r.tags
                    and ex.drop.backend_type == "Provider" and ex.drop.backend_names is None
                    and not ex.drop.signals):
                assert pick.type != "Provider", f"tagged request sent to {pick.id} despite {ex.name}"
    # and the same inputs give the same answer
    again = decide(s, r, ledger=ledger, rng=random.Random(seed))
    assert again.candidate is pick
