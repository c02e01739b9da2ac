"""The snapshot a decision runs on: the compiled pool joined with telemetry,
with everything that does not depend on the request precomputed.

Build a new :class:`Snapshot` when the compiled pool, the telemetry, the
ejection set or staleness changes (the router coalesces telemetry updates
and rebuilds on a short tick: building is O(endpoints x rules), a few
milliseconds at 1,000 endpoints). A snapshot is immutable apart from its
memo of per-model ``consider`` results, which only ever grows.

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
from collections.abc import Iterable

from kinference_common.compiled import (
    DEFAULT_POLICY_RULE_NAME,
    CompiledExclusion,
    CompiledPool,
    CompiledRule,
    CompiledTier,
)
from kinference_common.messages import EndpointState, ProviderState

from .candidates import Candidate, build_candidates
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


class ExclusionRuntime:
    __slots__ = ("exclusion", "name", "when", "drop", "kind", "dropped", "live")

    def __init__(self, ex: CompiledExclusion, candidates: list[Candidate], ctx: DecisionContext) -> None:
        self.exclusion = ex
        self.name = ex.name
        self.when: RequestPredicate | None = compile_request_test(ex.when) if ex.when is not None else None
        self.drop, self.kind = compile_candidate_test(ex.drop)
        self.live = ex.live
        #: indexes of the candidates ``drop`` holds for with an idle ledger
        #: (exact for a "static" test; the base for a "ledger" one)
        self.dropped: frozenset[int] = (
            frozenset(c.index for c in candidates if self.drop(c, ctx)) if self.kind != "request" else frozenset()
        )


class TierRuntime:
    __slots__ = ("tier", "index", "want_local", "order_rank", "backends", "static", "kept",
                 "minimize", "minimize_get", "unreachable")

    def __init__(self, tier: CompiledTier, candidates: list[Candidate], ctx: DecisionContext) -> None:
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
                self.kept = frozenset(c.index for c in candidates if self.backends(c, ctx))
        self.minimize = tier.minimize if tier.order is None else None
        self.minimize_get: SignalGetter | None = MINIMIZE[self.minimize] if self.minimize else None
        self.unreachable = tier.unreachable


class RuleRuntime:
    """A compiled rule, ready to run against this snapshot's candidates."""

    __slots__ = ("rule", "name", "matches", "shadowed", "consider", "exclusions", "tiers",
                 "tie_break", "on_empty", "classifiers", "non_tag_matches", "_consider_memo", "_snapshot")

    def __init__(self, rule: CompiledRule, snapshot: Snapshot, ctx: DecisionContext) -> None:
        self.rule = rule
        self.name = rule.name
        self.matches = compile_matches(rule.matches)
        self.shadowed = rule.shadowed
        self.consider = rule.consider
        self.exclusions = [ExclusionRuntime(e, snapshot.candidates, ctx) for e in rule.exclude]
        self.tiers = [TierRuntime(t, snapshot.candidates, ctx) for t in rule.select]
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
        self.pool = pool
        self.namespace = pool.namespace
        self.name = pool.name
        #: ``namespace/name``, as traces name the pool
        self.ref = f"{pool.namespace}/{pool.name}"
        self.revision = pool.revision
        self.aliases = pool.aliases
        self.ttft_model = ttft_model
        self.rng = rng if rng is not None else random.Random()
        self.now = now
        # the inputs, kept so that the snapshot can be recorded and built again (replay)
        self.stale_after, self.provider_stale_after = stale_after, provider_stale_after
        self.ejected = frozenset(ejected)
        #: the keeper's number for this snapshot (recorded decisions name it)
        self.version = 0
        #: what it was built from, ``(endpoints, providers)`` by key, when the
        #: router records decisions (else None)
        self.inputs: tuple[dict[str, EndpointState], dict[str, ProviderState]] | None = None
        #: every canonical model some destination serves
        self.served: frozenset[str] = frozenset(m.name for d in pool.destinations for m in d.models)
        #: models some worker set serves (ServeLocal can route them, given capacity)
        self.local_models: frozenset[str] = frozenset(
            m.name for d in pool.destinations if d.type == "Local" for m in d.models)
        self.candidates = build_candidates(
            pool, endpoints, providers, now=now, stale_after=stale_after,
            provider_stale_after=provider_stale_after, ejected=ejected, model=ttft_model,
        )
        self.by_id = {c.id: c for c in self.candidates}
        #: some candidate's telemetry is stale (traces list them; most snapshots have none)
        self.has_stale = any(c.stale for c in self.candidates)
        #: ledger key -> candidates (a provider serving n models has n)
        self.by_key: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            self.by_key.setdefault(c.ledger_key, []).append(c)
        self._ttft_arrays(ttft_model)
        #: canonical model -> every candidate serving it (stable order)
        self.by_model: dict[str, list[Candidate]] = {}
        for c in self.candidates:
            self.by_model.setdefault(c.model, []).append(c)
        ctx = DecisionContext({}, None, (), None, ttft_model)
        self.rules = [RuleRuntime(r, self, ctx) for r in pool.policy.rules]
        self.unmatched: RuleRuntime | None = (
            RuleRuntime(_unmatched_rule(), self, ctx) if pool.policy.unmatched == "ServeLocal" else None
        )

    def _ttft_arrays(self, model: TTFTModel) -> None:
        """PredictedTTFT of an endpoint with nothing of this router's in flight
        and no prefix match, as ``A + PT*u + max(0, u - H) * IT`` for ``u``
        uncached prompt tokens (see :mod:`.ttft`), calibration included;
        indexed by candidate index. The decision ranks 1,000 endpoints with
        one arithmetic expression each."""
        cal = model.calibration
        inf = float("inf")
        n = len(self.candidates)
        self.ttft_a = [inf] * n
        self.ttft_pt = [0.0] * n
        self.ttft_f = [1.0] * n  # 1 - the endpoint's prefix hit rate
        self.ttft_h = [inf] * n  # KV headroom left after the queue, tokens
        self.ttft_it = [0.0] * n
        #: prefix stickiness per candidate (TTFTModel.stickiness)
        self.ttft_s = [model.prefix_stickiness] * n
        for c in self.candidates:
            if not c.is_local:
                continue
            i = c.index
            self.ttft_s[i] = model.stickiness(c.kv)
            q = c.base_queue_tokens
            self.ttft_a[i] = cal * (c.t0 + q * c.per_token)
            self.ttft_pt[i] = cal * c.per_token
            if c.hit_rate:
                self.ttft_f[i] = 1.0 - min(max(c.hit_rate, 0.0), 1.0)
            if c.kv_free is not None:
                self.ttft_h[i] = c.kv_free - q
            self.ttft_it[i] = cal / c.theta

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
