"""``Snapshot.updated``: the snapshot built from the previous one, rebuilding
only the candidates whose inputs changed, is the snapshot built whole.

Random pools and rules (the property tests' generators), then a run of
random steps: endpoints' telemetry changing (signals, readiness, learned
Theta and T0), time passing so that scrapes turn stale, ejections, the
calibration moving, providers' telemetry, a new endpoint. After every step
the chained incremental snapshot is compared with a whole build of the same
inputs: every candidate's every field, the indexes, the TTFT arrays, every
rule's precomputed sets, what each rule considers, and the decision."""

from __future__ import annotations

import random

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kinference_common.engine import InFlightLedger, Snapshot, TTFTModel, decide
from kinference_common.engine.candidates import Candidate, endpoint_key

from .helpers import NOW, ep, pool, prov, pstate, req, tier, ws
from .test_properties import MODELS, TAGS, TENANTS, WS_NAMES, a_rule, maybe_none

SLOTS = [s for s in Candidate.__slots__ if s != "state"]


def same_snapshot(a: Snapshot, b: Snapshot, models: list[str]) -> None:
    assert len(a.candidates) == len(b.candidates)
    for x, y in zip(a.candidates, b.candidates, strict=True):
        for s in SLOTS:
            assert getattr(x, s) == getattr(y, s), (x.id, s, getattr(x, s), getattr(y, s))
        assert x.state == y.state, x.id
    assert {k: c.id for k, c in a.by_id.items()} == {k: c.id for k, c in b.by_id.items()}
    assert {k: [c.id for c in v] for k, v in a.by_key.items()} == {k: [c.id for c in v] for k, v in b.by_key.items()}
    assert {k: [c.id for c in v] for k, v in a.by_model.items()} == \
        {k: [c.id for c in v] for k, v in b.by_model.items()}
    assert a.has_stale == b.has_stale and a._stale_count == b._stale_count
    # the incremental bound may be earlier than the oldest fresh scrape, never later
    assert a._oldest_fresh <= b._oldest_fresh
    assert a.fallbacks == b.fallbacks
    for arr in ("ttft_a", "ttft_pt", "ttft_f", "ttft_h", "ttft_it", "ttft_s"):
        assert getattr(a, arr) == getattr(b, arr), arr
    rules_a = a.rules + ([a.unmatched] if a.unmatched else [])
    rules_b = b.rules + ([b.unmatched] if b.unmatched else [])
    assert len(rules_a) == len(rules_b)
    for ra, rb in zip(rules_a, rules_b, strict=True):
        assert [e.dropped for e in ra.exclusions] == [e.dropped for e in rb.exclusions], ra.name
        assert [t.kept for t in ra.tiers] == [t.kept for t in rb.tiers], ra.name
        for m in models:
            ea, xa, wa = ra.considered(m)
            eb, xb, wb = rb.considered(m)
            assert ([c.id for c in ea], [c.id for c in xa], wa) == ([c.id for c in eb], [c.id for c in xb], wb)


def fingerprint(s: Snapshot) -> tuple:  # type: ignore[type-arg]
    """Everything a decision on ``s`` reads, as values (the previous snapshot
    must not change: decisions in flight still read it)."""
    return (tuple(tuple(getattr(c, x) for x in SLOTS) + (id(c.state),) for c in s.candidates),
            tuple(tuple(getattr(s, a)) for a in ("ttft_a", "ttft_pt", "ttft_f", "ttft_h", "ttft_it", "ttft_s")),
            tuple((k, tuple(id(c) for c in v)) for k, v in s.by_model.items()),
            tuple((k, tuple(id(c) for c in v)) for k, v in s.by_key.items()),
            tuple((k, id(c)) for k, c in s.by_id.items()),
            tuple((tuple(e.dropped for e in r.exclusions), tuple(t.kept for t in r.tiers)) for r in s.rules),
            tuple(s._local_states), s._stale_count, s._oldest_fresh, s.has_stale)


def changed_state(rng: random.Random, st_: object, now: float) -> object:
    """The endpoint's next scrape: a few of its fields moved."""
    fields = {}
    for _ in range(rng.randint(1, 3)):
        what = rng.choice(["queued", "running", "kv", "ready", "theta", "overhead", "age", "hit", "capacity",
                           "same"])
        if what == "queued":
            fields["queued"] = rng.choice([None, 0, 3, 5, 12])
        elif what == "running":
            fields["running"] = rng.choice([None, 0, 40, 99])
        elif what == "kv":
            fields["kv_cache_usage"] = rng.choice([None, 0.1, 0.5, 0.95])
        elif what == "ready":
            fields["ready"] = rng.random() < 0.8
        elif what == "theta":  # learned, forgotten, relearned: the worker set's fallback moves
            fields["prefill_tokens_per_second"] = rng.choice([None, 0.0, 5000.0, 12000.0])
        elif what == "overhead":
            fields["fixed_overhead_seconds"] = rng.choice([None, -1.0, 0.01, 0.05])
        elif what == "age":
            fields["scraped_at"] = now - rng.choice([0.1, 0.1, 1.9, 60.0])
        elif what == "hit":
            fields["prefix_cache_hit_rate"] = rng.choice([None, 0.0, 0.4, 1.0])
        elif what == "capacity":  # restarted on other GPUs: its peers for Theta change
            fields["kv_capacity_tokens"] = rng.choice([None, 40000, 80000])
    # "same": a new message whose content did not change is still a new object
    return msgspec.structs.replace(st_, **fields)  # type: ignore[type-var]


@st.composite
def fleet(draw):
    wss = [ws(n, draw(st.sampled_from(MODELS)), f"{n}-served", draw(maybe_none(st.sampled_from([2048, 8192]))))
           for n in draw(st.lists(st.sampled_from(WS_NAMES), min_size=1, max_size=3, unique=True))]
    provs = [prov(n, {m: f"{n}-{m}" for m in draw(st.lists(st.sampled_from(MODELS), min_size=1, unique=True))})
             for n in draw(st.lists(st.sampled_from(["prov-x", "prov-y"]), max_size=2, unique=True))]
    rules = [draw(a_rule(i)) for i in range(draw(st.integers(0, 3)))]
    p = pool(wss + provs, rules, unmatched=draw(st.sampled_from(["ServeLocal", "Reject"])))
    eps = {}
    for w in wss:
        for k in range(draw(st.integers(0, 6))):
            e = ep(w.name, f"p{k}", queued=draw(maybe_none(st.integers(0, 12))),
                   kv=draw(maybe_none(st.floats(0, 1))), theta=draw(st.sampled_from([None, 8000.0, 10000.0])),
                   age=draw(st.sampled_from([0.1, 0.1, 60.0])),
                   kv_capacity_tokens=draw(st.sampled_from([None, 40000, 40000, 80000])))
            eps[endpoint_key(e.namespace, e.worker_set, e.pod)] = e
    return p, wss, provs, eps, draw(st.integers(0, 2**32))


@given(fleet())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_updated_is_the_whole_build(f) -> None:
    p, wss, provs, eps, seed = f
    rng = random.Random(seed)
    now = NOW
    stale_after = 2.0
    pstates = [pstate(pv.name, 0.5, 0.01) for pv in provs]
    ejected: frozenset[str] = frozenset()
    model = TTFTModel()
    snap = Snapshot.first(p, eps, pstates, now=now, stale_after=stale_after, ttft_model=model)
    whole_builds = 0
    for _step in range(12):
        action = rng.random()
        keys = list(eps)
        if keys and action < 0.55:
            for k in rng.sample(keys, rng.randint(1, len(keys))):
                eps[k] = changed_state(rng, eps[k], now)
        elif action < 0.6:
            now += rng.choice([0.5, 1.5, 2.5])  # scrapes turn stale with time alone
        elif action < 0.65:
            now -= rng.choice([0.5, 3.0])  # the wall clock stepped back
        elif keys and action < 0.75:  # endpoints and providers (a 429's cool-down) ejected
            ejected = frozenset(k for k in keys + [f"default/{pv.name}" for pv in provs] if rng.random() < 0.3)
        elif action < 0.82:
            model = TTFTModel(calibration=rng.choice([0.8, 1.0, 1.25]))
        elif action < 0.9:
            pstates = [pstate(pv.name, rng.choice([None, 0.2, 2.0]), rng.choice([None, 0.0, 0.5])) for pv in provs]
        else:  # a new pod: the key set changes
            w = rng.choice(wss)
            e = ep(w.name, f"new{_step}", age=0.1)
            eps[endpoint_key(e.namespace, e.worker_set, e.pod)] = e
            whole_builds += 1
        before = fingerprint(snap)
        prev, snap = snap, snap.updated(eps, pstates, now=now, ejected=ejected, ttft_model=model)
        assert fingerprint(prev) == before, "the previous snapshot changed"
        whole = Snapshot(p, eps.values(), pstates, now=now, stale_after=stale_after, ejected=ejected,
                         ttft_model=model)
        same_snapshot(snap, whole, MODELS)
        r = req(rng.choice(MODELS), tenant=rng.choice(TENANTS), tags=set(rng.sample(TAGS, rng.randint(0, 2))),
                prompt_tokens=rng.choice([None, 10, 3000]), max_tokens=rng.choice([None, 100]))
        ledger = InFlightLedger()
        for c in whole.candidates:
            if rng.random() < 0.3:
                ledger.sent(c.ledger_key, rng.randint(0, 4000), now - 0.5)
        s2 = rng.randrange(2**32)
        a = decide(snap, r, ledger=ledger, rng=random.Random(s2))
        b = decide(whole, r, ledger=ledger, rng=random.Random(s2))
        assert (a.routed, a.code, a.candidate.id if a.candidate else None) == \
            (b.routed, b.code, b.candidate.id if b.candidate else None)


def test_unchanged_endpoints_keep_their_candidates_and_changed_ones_are_new() -> None:
    """What makes it cheap: only the changed endpoint's candidate is built again."""
    p = pool([ws("ws-a", "m1")], [])
    eps = {endpoint_key("default", "ws-a", f"p{i}"): ep("ws-a", f"p{i}") for i in range(50)}
    s1 = Snapshot.first(p, eps, now=NOW, stale_after=2.0)
    k = endpoint_key("default", "ws-a", "p7")
    eps[k] = msgspec.structs.replace(eps[k], queued=9)
    s2 = s1.updated(eps, now=NOW + 0.01)
    fresh = [c.id for a, c in zip(s1.candidates, s2.candidates, strict=True) if a is not c]
    assert fresh == ["Local/ws-a/p7"]
    assert s2.by_id["Local/ws-a/p7"].queued == 9
    # time alone: every scrape older than stale_after is rebuilt (stale), the others kept
    s3 = s2.updated(eps, now=NOW + 5.0)
    assert all(c.stale for c in s3.candidates) and all(a is not c for a, c in zip(s2.candidates, s3.candidates))
    # a learned Theta moves the worker set's fallback: the endpoints without one follow it
    eps = {endpoint_key("default", "ws-a", f"p{i}"): ep("ws-a", f"p{i}", theta=None if i else 8000.0)
           for i in range(3)}
    s4 = Snapshot.first(p, eps, now=NOW, stale_after=2.0)
    eps[endpoint_key("default", "ws-a", "p0")] = msgspec.structs.replace(
        eps[endpoint_key("default", "ws-a", "p0")], prefill_tokens_per_second=16000.0)
    s5 = s4.updated(eps, now=NOW)
    assert [c.theta for c in s5.candidates] == [16000.0, 16000.0, 16000.0]


def test_a_new_key_or_another_model_builds_whole() -> None:
    p = pool([ws("ws-a", "m1")], [])
    eps = {endpoint_key("default", "ws-a", "p0"): ep("ws-a", "p0")}
    s1 = Snapshot.first(p, eps, now=NOW)
    eps[endpoint_key("default", "ws-a", "p1")] = ep("ws-a", "p1")
    s2 = s1.updated(eps, now=NOW)
    assert [c.id for c in s2.candidates] == ["Local/ws-a/p0", "Local/ws-a/p1"]
    assert s2.candidates[0] is not s1.candidates[0]
    s3 = s2.updated(eps, now=NOW, ttft_model=TTFTModel(queued_prompt_tokens=100.0))
    assert s3.candidates[0] is not s2.candidates[0] and s3.ttft_model.queued_prompt_tokens == 100.0
    # a calibration step keeps the candidates, moves the arrays
    s4 = s3.updated(eps, now=NOW, ttft_model=TTFTModel(queued_prompt_tokens=100.0, calibration=2.0))
    assert s4.candidates[0] is s3.candidates[0]
    assert s4.ttft_pt[0] == 2.0 * s3.ttft_pt[0]


def test_tier_backends_sets_follow_a_changed_endpoint() -> None:
    """A tier's precomputed ``kept`` set is tested again for the changed endpoint only."""
    from kinference_common.compiled import CandidateTest

    from .helpers import rule, sig
    kept_if_cool = CandidateTest(backend_type="Local", signals=[sig("kvCacheUsage", lt=0.5)])
    p = pool([ws("ws-a", "m1")], [rule("r", [tier("Local", 0, backends=kept_if_cool)])])
    eps = {endpoint_key("default", "ws-a", f"p{i}"): ep("ws-a", f"p{i}", kv=0.1) for i in range(3)}
    s1 = Snapshot.first(p, eps, now=NOW)
    assert s1.rules[0].tiers[0].kept == {0, 1, 2}
    k = endpoint_key("default", "ws-a", "p1")
    eps[k] = msgspec.structs.replace(eps[k], kv_cache_usage=0.9)
    s2 = s1.updated(eps, now=NOW)
    assert s2.rules[0].tiers[0].kept == {0, 2}
    assert s1.rules[0].tiers[0].kept == {0, 1, 2}  # the old snapshot is left as it was


def test_a_clock_that_went_back_makes_a_stale_scrape_fresh_again() -> None:
    """Found in review: the wall clock stepped back (NTP) after a scrape had
    turned stale by age alone; the next snapshot is built whole."""
    p = pool([ws("ws-a", "m1")], [])
    eps = {endpoint_key("default", "ws-a", "p0"): ep("ws-a", "p0", age=1.0)}
    s1 = Snapshot.first(p, eps, now=NOW, stale_after=2.0)
    s2 = s1.updated(eps, now=NOW + 5)
    assert s2.candidates[0].stale
    s3 = s2.updated(eps, now=NOW)
    assert not s3.candidates[0].stale and s3.candidates[0].queued == 0 and not s3.has_stale
