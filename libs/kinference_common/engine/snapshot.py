"""The snapshot a decision runs on: the compiled pool joined with telemetry,
with everything that does not depend on the request precomputed.

Build a new :class:`Snapshot` when the compiled pool, the telemetry, the
ejection set or staleness changes (the router coalesces telemetry updates
and rebuilds on a short tick). Building whole is O(endpoints x rules), about
10 ms at 1,000 endpoints; :meth:`Snapshot.updated` builds the next snapshot
from the previous one and rebuilds only the endpoints whose inputs changed
(a new state, turned stale, ejected or back, a worker-set fallback that
moved), so its cost follows the changes: 0.25 ms at 1,000 endpoints when
none changed. A snapshot is immutable apart from its memo of per-model
``consider`` results, which only ever grows; consecutive snapshots share
the candidates that did not change.

Precomputed here:

- candidates in stable order, split per model into eligible ones and those a
  built-in check removed (``notReady``, ``ejected``); stale ones marked;
- every rule's ``matches`` and exclusions' ``if`` as closures;
- every exclusion's ``drop`` and tier's ``backends`` as closures, and, when
  they read only static signals, the set of candidates they hold for (for a
  ``drop`` on ``queuedPrompts``/``inFlight``: the set with an idle ledger,
  which a decision corrects for the few endpoints with requests in flight);
- per endpoint, PredictedTTFT as a line in the request's uncached tokens
  (``A + PT*u``, plus the KV-wait kink), so ranking is one expression each;
- per rule and model, the ``consider`` result (memoised on first use).

Measured (``make bench-decision``): building takes ~4 ms at 1,000 endpoints
with 1 rule, ~10 ms with 20; a decision ~35-45 us at 100 endpoints, ~220 us at
1,000 (p50, one core of a shared 2-core machine).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from itertools import compress
from operator import is_not

import msgspec

from kinference_common.compiled import (
    DEFAULT_POLICY_RULE_NAME,
    CompiledExclusion,
    CompiledPool,
    CompiledRule,
    CompiledTier,
)
from kinference_common.messages import EndpointState, ProviderState

from .candidates import (
    Candidate,
    Fallback,
    build_candidates,
    fallbacks,
    local_candidate,
    local_dest_index,
    local_groups,
    provider_candidates,
    uses_fallback,
)
from .request import (
    Request,
    RequestPredicate,
    compile_matches,
    compile_request_test,
    rule_classifiers,
)
from .signals import (
    MINIMIZE,
    CandidatePredicate,
    DecisionContext,
    SignalGetter,
    compile_candidate_test,
)
from .ttft import DEFAULT_TTFT_MODEL, TTFTModel


def _holding(test: CandidatePredicate, candidates: list[Candidate], ctx: DecisionContext,
             prev: frozenset[int] | None, changed: frozenset[int]) -> frozenset[int]:
    """The indexes of the candidates ``test`` holds for: every candidate's,
    or, from ``prev`` (the previous snapshot's answer), only the ``changed``
    ones tested again."""
    if prev is None:
        return frozenset(c.index for c in candidates if test(c, ctx))
    if not changed:
        return prev
    return (prev - changed) | frozenset(i for i in changed if test(candidates[i], ctx))


class ExclusionRuntime:
    __slots__ = ("exclusion", "name", "when", "drop", "kind", "dropped", "live")

    def __init__(self, ex: CompiledExclusion, candidates: list[Candidate], ctx: DecisionContext,
                 prev: ExclusionRuntime | None = None, changed: frozenset[int] = frozenset()) -> None:
        """``prev``: the same exclusion in the snapshot this one follows, whose
        candidates differ only at the indexes ``changed``."""
        self.exclusion = ex
        self.name = ex.name
        self.when: RequestPredicate | None = compile_request_test(ex.when) if ex.when is not None else None
        self.drop, self.kind = compile_candidate_test(ex.drop)
        self.live = ex.live
        #: indexes of the candidates ``drop`` holds for with an idle ledger
        #: (exact for a "static" test; the base for a "ledger" one)
        self.dropped: frozenset[int] = frozenset()
        if self.kind != "request":
            self.dropped = _holding(self.drop, candidates, ctx, None if prev is None else prev.dropped, changed)


class TierRuntime:
    __slots__ = ("tier", "index", "want_local", "order_rank", "backends", "static", "kept",
                 "minimize", "minimize_get", "unreachable")

    def __init__(self, tier: CompiledTier, candidates: list[Candidate], ctx: DecisionContext,
                 prev: TierRuntime | None = None, changed: frozenset[int] = frozenset()) -> None:
        self.tier = tier
        self.index = tier.index
        self.want_local = tier.type == "Local"
        self.order_rank: dict[str, int] | None = (
            {name: i for i, name in reversed(list(enumerate(tier.order)))} if tier.order is not None else None
        )
        self.backends: CandidatePredicate | None = None
        self.static = True
        self.kept: frozenset[int] = frozenset()
        if tier.backends is not None:
            self.backends, kind = compile_candidate_test(tier.backends)
            self.static = kind == "static"
            if self.static:
                self.kept = _holding(self.backends, candidates, ctx, None if prev is None else prev.kept, changed)
        self.minimize = tier.minimize if tier.order is None else None
        self.minimize_get: SignalGetter | None = MINIMIZE[self.minimize] if self.minimize else None
        self.unreachable = tier.unreachable


class RuleRuntime:
    """A compiled rule, ready to run against this snapshot's candidates."""

    __slots__ = ("rule", "name", "matches", "shadowed", "consider", "exclusions", "tiers",
                 "tie_break", "on_empty", "classifiers", "non_tag_matches", "_consider_memo", "_snapshot")

    def __init__(self, rule: CompiledRule, snapshot: Snapshot, ctx: DecisionContext,
                 prev: RuleRuntime | None = None, changed: frozenset[int] = frozenset()) -> None:
        self.rule = rule
        self.name = rule.name
        self.matches = compile_matches(rule.matches)
        self.shadowed = rule.shadowed
        self.consider = rule.consider
        cands = snapshot.candidates
        self.exclusions = [ExclusionRuntime(e, cands, ctx, prev.exclusions[i] if prev else None, changed)
                           for i, e in enumerate(rule.exclude)]
        self.tiers = [TierRuntime(t, cands, ctx, prev.tiers[i] if prev else None, changed)
                      for i, t in enumerate(rule.select)]
        self.tie_break = tuple(rule.tie_break)
        self.on_empty = rule.on_empty
        self.classifiers = rule_classifiers(rule)
        #: ``matches`` with tag terms taken as holding (which classifiers to ask)
        self.non_tag_matches = compile_matches(rule.matches, ignore_tags=True)
        self._consider_memo: dict[str, tuple[list[Candidate], list[Candidate], int | None]] = {}
        self._snapshot = snapshot

    def considered(self, model: str) -> tuple[list[Candidate], list[Candidate], int | None]:
        """``(eligible, removed by a built-in, smallest known context window)``
        for a request of canonical ``model``, in stable order."""
        memo = self._consider_memo.get(model)
        if memo is not None:
            return memo
        snap = self._snapshot
        if self.consider is None:
            pool = snap.by_model.get(model, [])
        else:
            chosen: dict[int, Candidate] = {}
            for entry in self.consider:
                models = entry.models if entry.models is not None else [model]
                names = frozenset(entry.backend_names) if entry.backend_names is not None else None
                for m in models:
                    for c in snap.by_model.get(m, ()):
                        if entry.backend_type is not None and c.type != entry.backend_type:
                            continue
                        if names is not None and c.dest_name not in names:
                            continue
                        chosen[c.index] = c
            pool = [chosen[i] for i in sorted(chosen)]
        eligible = [c for c in pool if c.builtin is None]
        removed = [c for c in pool if c.builtin is not None]
        windows = [c.context_window for c in eligible if c.context_window is not None]
        memo = (eligible, removed, min(windows) if windows else None)
        self._consider_memo[model] = memo
        return memo


def _unmatched_rule() -> CompiledRule:
    """``unmatched: ServeLocal`` as a rule: the requested model, Local, by PredictedTTFT."""
    return CompiledRule(
        name=DEFAULT_POLICY_RULE_NAME,
        index=-1,
        term="unmatched",
        select=[CompiledTier(index=0, term="unmatched.select[0]", type="Local", minimize="PredictedTTFT")],
    )


class Snapshot:
    """Compiled pool + telemetry, precomputed for fast decisions."""

    def __init__(
        self,
        pool: CompiledPool,
        endpoints: Iterable[EndpointState] = (),
        providers: Iterable[ProviderState] = (),
        *,
        now: float,
        stale_after: float = 5.0,
        provider_stale_after: float = 3600.0,
        ejected: frozenset[str] | set[str] = frozenset(),
        ttft_model: TTFTModel = DEFAULT_TTFT_MODEL,
        rng: random.Random | None = None,
    ) -> None:
        """``now``: the time telemetry ages are measured against (the
        router's wall clock); ``stale_after``: the collector's freshness bound
        in seconds; ``ejected``: endpoint keys (``ns/workerset/pod``) this
        router has ejected; ``rng``: the source for ``tieBreak: Random``."""
        self._inputs(pool, now, stale_after, provider_stale_after, ejected, ttft_model,
                     rng if rng is not None else random.Random())
        #: per worker set: ``(Theta, T0)`` for endpoints that learned neither,
        #: and the largest Theta per KV capacity (:func:`.candidates.fallbacks`)
        self.fallbacks: dict[tuple[str, str], Fallback] = {}
        self.candidates = build_candidates(
            pool, endpoints, providers, now=now, stale_after=stale_after,
            provider_stale_after=provider_stale_after, ejected=ejected, model=ttft_model,
            fallback=self.fallbacks,
        )
        self._index(None, frozenset())

    def _inputs(self, pool: CompiledPool, now: float, stale_after: float, provider_stale_after: float,
                ejected: frozenset[str] | set[str], ttft_model: TTFTModel, rng: random.Random) -> None:
        self.pool = pool
        self.namespace = pool.namespace
        self.name = pool.name
        #: ``namespace/name``, as traces name the pool
        self.ref = f"{pool.namespace}/{pool.name}"
        self.revision = pool.revision
        self.aliases = pool.aliases
        self.ttft_model = ttft_model
        self.rng = rng
        self.now = now
        # the inputs, kept so that the snapshot can be recorded and built again (replay)
        self.stale_after, self.provider_stale_after = stale_after, provider_stale_after
        self.ejected = frozenset(ejected)
        #: the keeper's number for this snapshot (recorded decisions name it)
        self.version = 0
        #: what it was built from, ``(endpoints, providers)`` by key, when the
        #: router records decisions (else None)
        self.inputs: tuple[dict[str, EndpointState], dict[str, ProviderState]] | None = None
        #: ``ttft_s`` raised by a prefix index's pressure: (index, its pressure_version, list)
        self.pressed_s: tuple[object, int, list[float]] | None = None
        #: ``(S, S with the continuation's charge on candidates with nothing waiting)`` (decide)
        self.continued_s: tuple[list[float], list[float]] | None = None
        #: the keys of the endpoint mapping :meth:`updated` was given (None: built whole)
        self.endpoint_keys: frozenset[str] | None = None
        #: every canonical model some destination serves
        self.served: frozenset[str] = frozenset(m.name for d in pool.destinations for m in d.models)
        #: models some worker set serves (ServeLocal can route them, given capacity)
        self.local_models: frozenset[str] = frozenset(
            m.name for d in pool.destinations if d.type == "Local" for m in d.models)

    def _index(self, prev: Snapshot | None, changed: frozenset[int],
               states: list[EndpointState] | None = None, oldest_fresh: float = 0.0) -> None:
        """Everything derived from the candidates; from ``prev`` (whose
        candidates are these but at the indexes ``changed``, the endpoints'
        ``states`` in candidate order) where it can be."""
        cands = self.candidates
        if prev is None:
            self._index_whole()
        else:
            assert states is not None
            self._index_from(prev, changed, states, oldest_fresh)
        #: some candidate's telemetry is stale (traces list them; most snapshots have none)
        self.has_stale = self._stale_count > 0
        if prev is None or prev.ttft_model is not self.ttft_model:
            self._ttft_arrays(self.ttft_model, range(len(cands)))
        else:
            self.ttft_a, self.ttft_pt, self.ttft_f = list(prev.ttft_a), list(prev.ttft_pt), list(prev.ttft_f)
            self.ttft_h, self.ttft_it, self.ttft_s = list(prev.ttft_h), list(prev.ttft_it), list(prev.ttft_s)
            self.load = list(prev.load)
            self._min_load = None
            self._ttft_entries(self.ttft_model, changed)
        ctx = DecisionContext({}, None, (), None, self.ttft_model)
        rules = self.pool.policy.rules
        self.rules = [RuleRuntime(r, self, ctx, prev.rules[i] if prev else None, changed)
                      for i, r in enumerate(rules)]
        self.unmatched: RuleRuntime | None = (
            RuleRuntime(_unmatched_rule(), self, ctx, prev.unmatched if prev else None, changed)
            if self.pool.policy.unmatched == "ServeLocal" else None
        )

    def _index_whole(self) -> None:
        cands = self.candidates
        self.by_id = {c.id: c for c in cands}
        #: ledger key -> candidates (a provider serving n models has n)
        self.by_key: dict[str, list[Candidate]] = {}
        #: canonical model -> every candidate serving it (stable order)
        self.by_model: dict[str, list[Candidate]] = {}
        by_key, by_model = self.by_key, self.by_model
        #: each candidate's place in its ``by_model`` list
        self._pos = [0] * len(cands)
        for c in cands:
            k = by_key.get(c.ledger_key)
            if k is None:
                by_key[c.ledger_key] = [c]
            else:
                k.append(c)
            m = by_model.get(c.model)
            if m is None:
                m = by_model[c.model] = []
            self._pos[c.index] = len(m)
            m.append(c)
        # what :meth:`updated` compares: the endpoint candidates' indexes,
        # ledger keys and states, in candidate order
        local = [c for c in cands if c.is_local]
        self._local_index = [c.index for c in local]
        self._local_keys = [c.ledger_key for c in local]
        self._local_states: list[EndpointState] = [c.state for c in local]  # type: ignore[misc]
        self._key_index = {c.ledger_key: c.index for c in local}
        self._stale_count = sum(1 for c in cands if c.stale)
        self._oldest_fresh = self._oldest_fresh_scrape()

    def _oldest_fresh_scrape(self) -> float:
        """The oldest scrape of an endpoint that is not stale (inf: none). No
        endpoint turned stale with time alone while ``now - it`` is at most
        ``stale_after`` (float subtraction is monotonic: exact, no margin)."""
        return min((c.state.scraped_at for c in self.candidates  # type: ignore[union-attr]
                    if c.is_local and not c.stale), default=float("inf"))

    def _index_from(self, prev: Snapshot, changed: frozenset[int], states: list[EndpointState],
                    oldest_fresh: float) -> None:
        """``states``: the endpoints' states in candidate order; ``oldest_fresh``:
        a lower bound of the oldest fresh scrape (earlier is safe: it only
        makes the next :meth:`updated` look at the ages sooner)."""
        cands = self.candidates
        self._local_states, self._oldest_fresh = states, oldest_fresh
        self._pos, self._local_index, self._local_keys = prev._pos, prev._local_index, prev._local_keys
        self._key_index = prev._key_index
        self.by_id = dict(prev.by_id)
        self.by_key = dict(prev.by_key)
        self.by_model = dict(prev.by_model)
        stale = prev._stale_count
        copied: set[str] = set()
        for i in changed:
            c, old = cands[i], prev.candidates[i]
            stale += c.stale - old.stale
            self.by_id[c.id] = c
            if c.ledger_key not in copied:
                copied.add(c.ledger_key)
                self.by_key[c.ledger_key] = [cands[x.index] for x in prev.by_key[c.ledger_key]]
            lst = self.by_model[c.model]
            if lst is prev.by_model[c.model]:
                lst = self.by_model[c.model] = list(lst)
            lst[self._pos[i]] = c
        self._stale_count = stale

    def updated(
        self,
        endpoints: Mapping[str, EndpointState],
        providers: Iterable[ProviderState] = (),
        *,
        now: float,
        ejected: frozenset[str] | set[str] = frozenset(),
        ttft_model: TTFTModel | None = None,
    ) -> Snapshot:
        """The snapshot of the same pool for new telemetry, built from this
        one: equal to ``Snapshot(self.pool, endpoints.values(), providers,
        ...)`` with this one's settings, but an endpoint candidate whose
        inputs did not change (the same state object, the same staleness,
        ejection and worker-set fallbacks) is this snapshot's own, and only
        the changed ones are tested again against the rules. ``endpoints`` is
        keyed by :func:`~.candidates.endpoint_key` (the router's dictionary);
        a key added or removed since, or a new TTFT model other than its
        calibration, or a clock that went back, builds the snapshot whole.
        The Python work follows what changed; what grows with the pool is
        done at C speed (a comparison of every endpoint's state object, copies
        of the indexes and TTFT arrays: 0.36 us an endpoint at 10,000), and
        the ages are looked at only once the oldest fresh scrape could have
        turned stale. The snapshots of a chain share one random source
        (``tieBreak: Random``), as decisions on one keeper always have."""
        model = ttft_model if ttft_model is not None else self.ttft_model
        if model is not self.ttft_model and msgspec.structs.replace(model, calibration=self.ttft_model.calibration) \
                != self.ttft_model:
            return self._whole(endpoints, providers, now, ejected, model)
        if self.endpoint_keys is None or endpoints.keys() != self.endpoint_keys:
            return self._whole(endpoints, providers, now, ejected, model)
        if now < self.now:  # the clock stepped back: a stale scrape may be fresh again
            return self._whole(endpoints, providers, now, ejected, model)
        ejected = frozenset(ejected)
        stale_after = self.stale_after
        old = self.candidates
        states = list(map(endpoints.__getitem__, self._local_keys))
        # the endpoints with a new state (compared as objects, in C)
        replaced = set(compress(self._local_index, map(is_not, states, self._local_states)))
        learned = any(old[i].state.prefill_tokens_per_second  # type: ignore[union-attr]
                      != endpoints[old[i].ledger_key].prefill_tokens_per_second
                      or old[i].state.fixed_overhead_seconds  # type: ignore[union-attr]
                      != endpoints[old[i].ledger_key].fixed_overhead_seconds
                      or old[i].state.kv_capacity_tokens  # type: ignore[union-attr]
                      != endpoints[old[i].ledger_key].kv_capacity_tokens
                      or old[i].state.ready  # type: ignore[union-attr]
                      != endpoints[old[i].ledger_key].ready for i in replaced)
        # the same state, turned stale with time (a stale one turns fresh
        # only with a new scrape, a new state)
        check_ages = now - self._oldest_fresh > stale_after
        if check_ages:
            replaced.update(c.index for c in old if c.is_local and not c.stale
                            and now - c.state.scraped_at > stale_after)  # type: ignore[union-attr]
        key_index = self._key_index
        replaced.update(key_index[k] for k in ejected ^ self.ejected if k in key_index)
        fb = self.fallbacks
        if learned:  # an endpoint using a fallback that moved is built again too
            fb = fallbacks(local_groups(self.pool, endpoints.values()), model)
            moved = {k for k, v in fb.items() if self.fallbacks.get(k, (None, None))[:2] != v[:2]}
            # and one whose peers' largest Theta moved (only those of that KV capacity)
            peers_moved = {k: {cap for cap, _ in set(v[2]) ^ set(self.fallbacks[k][2] if k in self.fallbacks else ())}
                           for k, v in fb.items()}
            if moved or any(peers_moved.values()):
                replaced.update(c.index for c in old if c.is_local and (
                    ((key := (c.state.namespace, c.dest_name)) in moved  # type: ignore[union-attr]
                     and uses_fallback(endpoints[c.ledger_key]))
                    or endpoints[c.ledger_key].kv_capacity_tokens in peers_moved.get(key, ())))
        snap = Snapshot.__new__(Snapshot)
        snap._inputs(self.pool, now, stale_after, self.provider_stale_after, ejected, model, self.rng)
        snap.fallbacks = fb
        snap.endpoint_keys = self.endpoint_keys
        cands = list(old)
        dests = local_dest_index(self.pool)
        oldest_fresh = self._oldest_fresh
        peer_theta: dict[tuple[str, str], dict[int, float]] = {}  # per worker set, made once
        for i in replaced:
            st = endpoints[old[i].ledger_key]
            key = (st.namespace, st.worker_set)
            theta_fb, t0_fb, peers = fb[key]
            if key not in peer_theta:
                peer_theta[key] = dict(peers)
            c = local_candidate(dests[key], st, now=now, stale_after=stale_after,
                                ejected=ejected, theta_fallback=theta_fb, t0_fallback=t0_fb, model=model,
                                peer_theta=peer_theta[key])
            c.index = i
            cands[i] = c
            if not c.stale:
                oldest_fresh = min(oldest_fresh, st.scraped_at)
        # providers are few: built again every time, in their places
        for p in provider_candidates(self.pool, providers, now=now,
                                     provider_stale_after=self.provider_stale_after, ejected=ejected):
            i = self.by_id[p.id].index
            p.index = i
            cands[i] = p
            replaced.add(i)
        snap.candidates = cands
        snap._index(self, frozenset(replaced), states, oldest_fresh)
        if check_ages:  # every age was looked at: the bound is exact again
            snap._oldest_fresh = snap._oldest_fresh_scrape()
        return snap

    def _whole(self, endpoints: Mapping[str, EndpointState], providers: Iterable[ProviderState], now: float,
               ejected: frozenset[str] | set[str], model: TTFTModel) -> Snapshot:
        return Snapshot.first(self.pool, endpoints, providers, now=now, stale_after=self.stale_after,
                              provider_stale_after=self.provider_stale_after, ejected=ejected, ttft_model=model,
                              rng=self.rng)

    @classmethod
    def first(cls, pool: CompiledPool, endpoints: Mapping[str, EndpointState],
              providers: Iterable[ProviderState] = (), **kw: object) -> Snapshot:
        """A snapshot built whole from a keyed endpoint mapping, which
        :meth:`updated` can then follow."""
        snap = cls(pool, endpoints.values(), providers, **kw)  # type: ignore[arg-type]
        snap.endpoint_keys = frozenset(endpoints.keys())
        return snap

    def _ttft_arrays(self, model: TTFTModel, indexes: Iterable[int]) -> None:
        """PredictedTTFT of an endpoint with nothing of this router's in flight
        and no prefix match, as ``A + PT*u + max(0, u - H) * IT`` for ``u``
        uncached prompt tokens (see :mod:`.ttft`), calibration included;
        indexed by candidate index. The decision ranks 1,000 endpoints with
        one arithmetic expression each."""
        inf = float("inf")
        n = len(self.candidates)
        self.ttft_a = [inf] * n
        self.ttft_pt = [0.0] * n
        self.ttft_f = [1.0] * n  # 1 - the endpoint's prefix hit rate
        self.ttft_h = [inf] * n  # KV headroom left after the queue, tokens
        self.ttft_it = [0.0] * n
        #: prefix stickiness per candidate (TTFTModel.stickiness; an endpoint
        #: the scrape shows nothing waiting on: prefix_stickiness_unqueued,
        #: which the decision raises to its KV use's charge when a send of
        #: this router or a peer there is before its first token)
        self.ttft_s = [model.prefix_stickiness] * n
        #: requests running and waiting at the scrape (-1: unknown, a
        #: provider): the load the spread compares (decide._spread)
        self.load = [-1] * n
        self._min_load: float | None = None
        self._ttft_entries(model, indexes)

    def _ttft_entries(self, model: TTFTModel, indexes: Iterable[int]) -> None:
        """Set the TTFT arrays' entries of the candidates at ``indexes``."""
        cal = model.calibration
        inf = float("inf")
        cands = self.candidates
        for i in indexes:
            c = cands[i]
            if not c.is_local:
                self.ttft_a[i], self.ttft_pt[i], self.ttft_f[i] = inf, 0.0, 1.0
                self.ttft_h[i], self.ttft_it[i], self.ttft_s[i] = inf, 0.0, model.prefix_stickiness
                self.load[i] = -1
                continue
            load = self.load[i] = c.running + c.queued if c.running is not None and c.queued is not None else -1
            # charged as a pod with a queue: a request waiting (or no count
            # of them), or more than busy_kv of its KV cache in use
            busy = (c.queued != 0 if model.unqueued_running else load != 0) or (
                c.kv is not None and c.kv > model.busy_kv)
            self.ttft_s[i] = (model.stickiness(c.kv) if busy
                              else min(model.prefix_stickiness_unqueued, model.prefix_stickiness))
            q = c.base_queue_tokens
            self.ttft_a[i] = cal * (c.t0 + q * c.per_token)
            self.ttft_pt[i] = cal * c.per_token
            self.ttft_f[i] = 1.0 - min(max(c.hit_rate, 0.0), 1.0) if c.hit_rate else 1.0
            self.ttft_h[i] = c.kv_free - q if c.kv_free is not None else inf
            self.ttft_it[i] = cal / c.theta

    def min_load(self) -> float:
        """The lowest known :attr:`load` of any endpoint (inf: none known),
        computed once per snapshot, when a decision first asks."""
        if self._min_load is None:
            self._min_load = min((v for v in self.load if v >= 0), default=float("inf"))
        return self._min_load

    def classifiers_for(self, request: Request) -> list[str]:
        """The classifiers ``request`` needs before deciding: those required
        by rules whose non-tag terms hold for it (POLICY.md section 6), in
        rule order. Same as :func:`.request.required_classifiers`, precompiled."""
        model = self.aliases.get(request.model, request.model)
        out: list[str] = []
        if model not in self.served:  # rejected as model_not_found before any rule
            return out
        for rule in self.rules:
            if rule.shadowed or not rule.classifiers:
                continue
            if rule.non_tag_matches(request, model):
                out.extend(n for n in rule.classifiers if n not in out)
        return out
