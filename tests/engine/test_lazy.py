"""Lazy classification (engine/lazy.py): the outcome is exactly the eager
one, whatever the classifiers would have said; classifiers are skipped only
when their answer cannot change it."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.engine import InFlightLedger, decide
from kinference_common.engine.lazy import decide_lazily, outcome_key, tag_classes

from .helpers import burst_policy_rule, ep, pool, prov, pstate, req, snap, ws
from .test_properties import world


def _eager_and_lazy(s, ledger, r, seed, true_tags: dict[str, str]) -> None:
    """Decide eagerly with ``true_tags``; lazily, classifying (= reading
    ``true_tags``) only what the lazy path asks for; compare."""
    needed = s.classifiers_for(r)
    bare = r.__class__(**{**{f: getattr(r, f) for f in r.__struct_fields__}, "tags": frozenset()})
    eager_req = bare.__class__(**{**{f: getattr(bare, f) for f in bare.__struct_fields__},
                                  "tags": frozenset(true_tags[c] for c in needed)})
    eager_rng = random.Random(seed)
    eager = decide(s, eager_req, ledger=ledger, rng=eager_rng)

    lazy_rng = random.Random(seed)
    known: set[str] = set()
    cur = bare
    asked: list[str] = []
    for _ in range(len(needed) + 1):
        got = decide_lazily(s, cur, needed, known=known, ledger=ledger, rng=lazy_rng)
        if got.decision is not None:
            break
        assert got.needed, "undecided but nothing to ask"
        assert not set(got.needed) & known
        asked += got.needed
        known |= set(got.needed)
        cur = cur.__class__(**{**{f: getattr(cur, f) for f in cur.__struct_fields__},
                               "tags": cur.tags | frozenset(true_tags[c] for c in got.needed)})
    else:
        raise AssertionError("lazy decision never converged")
    d = got.decision
    assert outcome_key(d) == outcome_key(eager)
    assert d.model == eager.model and d.prefill_tokens == eager.prefill_tokens
    # the random source moved exactly as in the eager path
    assert lazy_rng.getstate() == eager_rng.getstate()
    # skipped ones are named with a reason; asked ones are not skipped
    assert set(got.skipped) | set(asked) == set(needed)
    assert not set(got.skipped) & set(asked)
    assert d.request.tags == frozenset(true_tags[c] for c in asked)


@st.composite
def true_tags(draw) -> dict[str, str]:
    return {name: draw(st.sampled_from(info.tags)) for name, info in BUILTIN_CLASSIFIERS.items()}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world(), true_tags())
def test_lazy_outcome_is_the_eager_outcome(w, tags) -> None:
    s, ledger, r, seed = w
    _eager_and_lazy(s, ledger, r, seed, tags)


def _burst_world(queued: int, kv: float = 0.1):
    p = pool([ws("qwen", "m"), prov("databricks", {"m": "dbx"})], [burst_policy_rule()])
    eps = [ep("qwen", f"q{i}", queued=queued, kv=kv) for i in range(2)]
    return snap(p, eps, [pstate("databricks", 0.4)])


def test_tag_classes_of_the_burst_policy_group_confirmed_with_unknown() -> None:
    s = _burst_world(0)
    assert tag_classes(s, "pii") == [["pii-unknown", "pii-confirmed"], ["pii-none"]]
    # injection is read by no rule: one class
    assert tag_classes(s, "injection") == [["injection-unknown", "injection-detected", "injection-none"]]


def test_headroom_needs_no_classifier_and_says_why() -> None:
    s = _burst_world(0)
    r = req("m", prompt_tokens=100)
    assert s.classifiers_for(r) == ["pii"]
    got = decide_lazily(s, r, ["pii"], ledger=InFlightLedger())
    assert got.decision is not None and got.decision.routed
    assert got.decision.candidate.type == "Local"
    assert got.trials == 2
    assert "same outcome" in got.skipped["pii"] and "Local/qwen" in got.skipped["pii"]
    assert got.decision.request.tags == frozenset()
    trace = got.decision.trace()
    assert trace.tags == []


def test_saturation_needs_the_classifier() -> None:
    s = _burst_world(9)  # every local queue over the policy's 4
    r = req("m", prompt_tokens=100)
    got = decide_lazily(s, r, ["pii"])
    assert got.decision is None and got.needed == ["pii"]
    for tag, backend in (("pii-none", "Provider/databricks"), ("pii-confirmed", None)):
        again = decide_lazily(s, req("m", prompt_tokens=100, tags={tag}), ["pii"], known={"pii"})
        assert again.decision is not None and again.decision.backend == backend


def test_ledger_is_not_written_by_trials() -> None:
    s = _burst_world(3)
    ledger = InFlightLedger()
    ledger.sent("default/qwen/q0", 500, 0.0)
    before = {k: (v.in_flight, v.pending_tokens) for k, v in ledger.loads.items()}
    decide_lazily(s, req("m", prompt_tokens=100), ["pii"], ledger=ledger)
    assert {k: (v.in_flight, v.pending_tokens) for k, v in ledger.loads.items()} == before
