"""Candidate signals and candidate tests (an exclusion's ``drop``, a tier's
``backends``), compiled once per snapshot into closures.

Signals (POLICY.md section 4) are read through a :class:`DecisionContext`,
the per-decision view that joins the snapshot's candidates with what changes
between snapshots: this router's ledger (``queuedPrompts``, ``inFlight``) and
the request itself (``predictedTTFT``). Unknown values are ``None``; a
comparison with ``None`` is false, so an unknown value never drops a
candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kinference_common.compiled import CandidateTest, Range

from .candidates import Candidate
from .ledger import EndpointLoad
from .prefix import PrefixIndex
from .ttft import TTFTModel, uncached_tokens


class DecisionContext:
    """Per-decision values: the ledger's loads, the request's size and prefix
    matches, and a cache of PredictedTTFT per candidate."""

    __slots__ = ("loads", "prompt_tokens", "block_hashes", "prefix", "model", "_matches", "_pressure", "ttft",
                 "draws", "spread", "held_read", "ranked", "hot_read", "relief", "continued", "continued_read")

    def __init__(
        self,
        loads: Mapping[str, EndpointLoad],
        prompt_tokens: int | None,
        block_hashes: tuple[int, ...],
        prefix: PrefixIndex | None,
        model: TTFTModel,
    ) -> None:
        self.loads = loads
        self.prompt_tokens = prompt_tokens if prompt_tokens is not None else model.default_prompt_tokens
        self.block_hashes = block_hashes
        self.prefix = prefix
        self.model = model
        self._matches: dict[str, int] | None = None
        self._pressure: dict[str, float] | None = None
        #: candidate index -> PredictedTTFT, filled as computed
        self.ttft: dict[int, float | None] = {}
        #: ``tieBreak: Random``'s draws, ``(n, drawn)`` each (None: no draw):
        #: what a replay needs to take the same decision again
        self.draws: list[tuple[int, int]] | None = None
        #: a spread move (decide._spread): ``(holder, taker, holder's load,
        #: mean load, taker's load)``; None when the decision made none
        self.spread: tuple | None = None
        #: the decision read blocks held per endpoint (:meth:`held_blocks`)
        self.held_read = False
        #: the last PredictedTTFT ranking's candidates and the positions among
        #: them of those with a prefix match or sends open (decide._rank_predicted_ttft)
        self.ranked: tuple[list[Candidate], list[int]] | None = None
        #: endpoint key -> its hot fraction, for the endpoints the decision
        #: read it of (:meth:`hot_fractions`; what a record keeps), else None
        self.hot_read: dict[str, float] | None = None
        #: the relief (decide._relief): ``(holder, factor, holder's load,
        #: mean load, holder's hot fraction, mean hot fraction)``; None when
        #: the decision charged the full stickiness
        self.relief: tuple | None = None
        #: whether the decision's ranking (one at most: the first tier with
        #: candidates routes) found the prompt continuing one sent to a best
        #: holder (:meth:`continues`), None when it did not ask
        self.continued: bool | None = None
        #: endpoint key -> whether the prompt continued there, for every
        #: endpoint asked of (what a record keeps), else None
        self.continued_read: dict[str, bool] | None = None

    # -- prefix index ----------------------------------------------------

    def matches(self) -> dict[str, int]:
        """Endpoint key -> leading prompt blocks it holds (computed once)."""
        if self._matches is None:
            self._matches = (
                self.prefix.match(self.block_hashes) if self.prefix is not None and self.block_hashes else {}
            )
        return self._matches

    def pressure(self) -> dict[str, float]:
        """Endpoint key -> its cache's hot fraction, for the endpoints over
        :attr:`.prefix.PrefixIndex.PRESSED` (read once per decision)."""
        if self._pressure is None:
            self._pressure = self.prefix.pressure() if self.prefix is not None else {}
        return self._pressure

    def pressure_read(self) -> dict[str, float] | None:
        """What :meth:`pressure` answered, None when the decision did not ask
        (what a record of the decision keeps)."""
        return self._pressure

    def held_blocks(self, cands: list[Candidate]) -> list[int]:
        """Prompt blocks this router (and its peers) sent that the prefix
        index says each of ``cands``' caches holds."""
        self.held_read = True
        if self.prefix is None:
            return [0] * len(cands)
        return self.prefix.blocks_of([c.ledger_key for c in cands])

    def hot_fractions(self, cands: list[Candidate]) -> list[float]:
        """The part of each of ``cands``' caches the prefixes sent to it in
        the last seconds take (:meth:`.prefix.PrefixIndex.hot_fraction`)."""
        if self.prefix is None:
            return [0.0] * len(cands)
        keys = [c.ledger_key for c in cands]
        fs = self.prefix.hot_fractions(keys)
        if self.hot_read is None:
            self.hot_read = {}
        self.hot_read.update(zip(keys, fs))
        return fs

    def continues(self, holders: list[Candidate], m: int) -> bool:
        """Whether this prompt's first ``m`` blocks, all that ``holders``
        hold of it, end where a prompt sent to one of them ended
        (:meth:`.prefix.PrefixIndex.continued_on`)."""
        if self.prefix is None or m <= 0:
            self.continued = False
            return False
        keys = [c.ledger_key for c in holders]
        on = self.prefix.continued_on(keys, self.block_hashes[m - 1])
        if self.continued_read is None:
            self.continued_read = {}
        for k in keys:
            self.continued_read[k] = k in on
        self.continued = bool(on)
        return self.continued

    def matched_blocks(self, c: Candidate) -> int:
        return self.matches().get(c.ledger_key, 0) if self.block_hashes else 0

    # -- signals that join the ledger ---------------------------------------

    def queued(self, c: Candidate) -> int | None:
        """``queuedPrompts``: engine waiting - this router's (and its peer
        replicas') sends that left the queue since the scrape + their unseen
        sends; the known pending sends when the engine's count is unknown."""
        if not c.is_local:
            return None
        load = self.loads.get(c.ledger_key)
        if c.queued is None:
            return load.pending_count + load.peer_pending_count if load is not None else 0
        if load is None:
            return c.queued
        return (max(0, c.queued - load.drained_count - load.peer_drained_count)
                + load.unseen_count + load.peer_unseen_count)

    def in_flight(self, c: Candidate) -> int:
        """``inFlight``: requests open to the endpoint from this router and,
        with replica sync, from the other replicas (as last published)."""
        load = self.loads.get(c.ledger_key)
        return load.in_flight + load.peer_in_flight if load is not None else 0

    def queue_tokens(self, c: Candidate) -> float:
        """``Q`` of the TTFT model: prefill tokens queued ahead of this request.

        Sends this router (or, with replica sync, another replica) knows
        count with their real prompt tokens; the rest of the engine's waiting
        count at ``queued_prompt_tokens`` each. A known send the scrape
        already counts (sent before it, or prefilled since) is taken out of
        the waiting count, so nothing is counted twice."""
        load = self.loads.get(c.ledger_key)
        if load is None:
            return c.base_queue_tokens
        known = load.pending_tokens + load.peer_pending_tokens
        if c.queued is None:
            return float(known)
        others = (c.queued - (load.pending_count - load.unseen_count) - load.drained_count
                  - load.peer_seen_count)
        if others < 0:
            others = 0
        return others * self.model.queued_prompt_tokens + known

    def predicted_ttft(self, c: Candidate) -> float | None:
        """PredictedTTFT in seconds (see :mod:`.ttft`); None for a provider."""
        cached = self.ttft.get(c.index, False)
        if cached is not False:
            return cached  # type: ignore[return-value]
        if not c.is_local:
            self.ttft[c.index] = None
            return None
        if self.block_hashes:
            u = uncached_tokens(self.prompt_tokens, self.matched_blocks(c), len(self.block_hashes), None)
        else:
            u = uncached_tokens(self.prompt_tokens, 0, 0, c.hit_rate)
        work = self.queue_tokens(c) + u
        t = c.t0 + work * c.per_token
        if c.kv_free is not None and work > c.kv_free:
            t += (work - c.kv_free) / c.theta
        t *= self.model.calibration
        self.ttft[c.index] = t
        return t


SignalGetter = Callable[[Candidate, DecisionContext], "float | int | None"]

#: signal name (camelCase, as in manifests) -> getter
SIGNALS: dict[str, SignalGetter] = {
    "queuedPrompts": lambda c, ctx: ctx.queued(c),
    "runningPrompts": lambda c, ctx: c.running,
    "kvCacheUsage": lambda c, ctx: c.kv,
    "gpuUtilization": lambda c, ctx: c.gpu_util,
    "gpuMemoryUsage": lambda c, ctx: c.gpu_mem,
    "predictedTTFT": lambda c, ctx: ctx.predicted_ttft(c),
    "estimatedTTFT": lambda c, ctx: c.est_ttft,
    "errorRate": lambda c, ctx: c.error_rate,
    "inFlight": lambda c, ctx: ctx.in_flight(c),
}

#: signals that read only the snapshot (not the ledger, not the request)
STATIC_SIGNALS = frozenset(
    {"runningPrompts", "kvCacheUsage", "gpuUtilization", "gpuMemoryUsage", "estimatedTTFT", "errorRate"}
)
#: signals that read the snapshot and this router's ledger, not the request
LEDGER_SIGNALS = frozenset({"queuedPrompts", "inFlight"})

#: what a candidate test reads, from cheapest to precompute to dearest:
#: "static" (snapshot only: its result is precomputed per candidate),
#: "ledger" (precomputed for an idle ledger, re-evaluated for the few
#: endpoints with requests in flight), "request" (evaluated per decision)
TestKind = str

#: ``minimize`` value -> getter (lower is better; None sorts last)
MINIMIZE: dict[str, SignalGetter] = {
    "PredictedTTFT": SIGNALS["predictedTTFT"],
    "EstimatedTTFT": SIGNALS["estimatedTTFT"],
    "QueuedPrompts": SIGNALS["queuedPrompts"],
    "KVCacheUsage": SIGNALS["kvCacheUsage"],
    "InFlight": SIGNALS["inFlight"],
}

CandidatePredicate = Callable[[Candidate, DecisionContext], bool]


def _compile_range(get: SignalGetter, r: Range) -> CandidatePredicate:
    gt, lt = r.greater_than, r.less_than
    if gt is not None and lt is not None:
        def both(c: Candidate, ctx: DecisionContext) -> bool:
            v = get(c, ctx)
            return v is not None and gt < v < lt
        return both
    if gt is not None:
        def greater(c: Candidate, ctx: DecisionContext) -> bool:
            v = get(c, ctx)
            return v is not None and v > gt
        return greater
    if lt is not None:
        def less(c: Candidate, ctx: DecisionContext) -> bool:
            v = get(c, ctx)
            return v is not None and v < lt
        return less
    return lambda c, ctx: get(c, ctx) is not None


def compile_candidate_test(test: CandidateTest) -> tuple[CandidatePredicate, TestKind]:
    """``(predicate, kind)``: every present field of ``test`` must hold; see
    :data:`TestKind` for ``kind``."""
    parts: list[CandidatePredicate] = []
    kind = "static"
    if test.backend_type is not None:
        want_local = test.backend_type == "Local"
        parts.append(lambda c, ctx: c.is_local is want_local)
    if test.backend_names is not None:
        names = frozenset(test.backend_names)
        parts.append(lambda c, ctx: c.dest_name in names)
    for st in test.signals:
        parts.append(_compile_range(SIGNALS[st.signal], st.range))
        if st.signal in LEDGER_SIGNALS and kind == "static":
            kind = "ledger"
        elif st.signal not in STATIC_SIGNALS and st.signal not in LEDGER_SIGNALS:
            kind = "request"
    if not parts:
        return (lambda c, ctx: True), kind
    if len(parts) == 1:
        return parts[0], kind
    if len(parts) == 2:
        first, second = parts
        return (lambda c, ctx: first(c, ctx) and second(c, ctx)), kind
    frozen = tuple(parts)
    return (lambda c, ctx: all(p(c, ctx) for p in frozen)), kind
