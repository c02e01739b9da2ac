"""The decision: ``(snapshot, request) -> Decision``, pure and synchronous.

Evaluation (POLICY.md section 3)::

    model not served by any destination          -> Rejected, model_not_found
    rules are tried in order
      a rule applies if its ``matches`` hold (shadowed rules never do)
        candidates = consider - built-ins (notReady, ejected, contextTooSmall)
        candidates -= every exclusion whose ``if`` holds and whose ``drop`` matches
        walk ``select`` tiers in order: the first tier with any candidate picks
        nothing picked -> onEmpty: Reject stops here; FallThrough tries the next rule
    no rule picked and none rejected -> ``unmatched`` (ServeLocal: the requested
    model, Local only, by PredictedTTFT; Reject: rejected)

Picking within a tier (one small function each, :func:`_rank`, then the
tie-breakers of :data:`TIE_BREAKERS`): rank by ``minimize`` (unknown values
last) or by ``order``, or not at all; among the candidates that rank equal,
apply ``tieBreak`` in order; the first remaining in stable order wins.
``minimize: PredictedTTFT`` has a fast path (:func:`_rank_predicted_ttft`)
that gives the same values from the snapshot's per-endpoint precomputation;
with a ``tieBreak`` it also charges the copy of a prefix (prefix stickiness),
less where the best holder carries more than its share (:func:`_relief`),
and, after the tie-breakers, may move the request off a busy prefix holder
to a pod that holds little, such as one that joined empty (:func:`_spread`).

Filters run on precomputed sets where they can (see :mod:`.snapshot`): a
``drop`` on static signals is a set lookup; one on ``queuedPrompts`` or
``inFlight`` is a set lookup corrected for the endpoints this router has
requests open to (:func:`_ledger_adjusted`); one on ``predictedTTFT`` is
evaluated per candidate.

Rejection code (INTERFACES.md): ``no_capacity`` when, in any rule tried, an
exclusion on a live signal removed at least one candidate, or a built-in
(``notReady``, ``ejected``) did - more capacity could change the outcome;
otherwise ``policy_rejected``. ``unmatched: ServeLocal`` finding nothing is
``no_capacity`` when a worker set serves the model (its endpoints are all
down or scaled to zero), ``policy_rejected`` when only providers do.

The decision only *records* what it did (lists it already built); the trace
(:mod:`.trace`) is rendered from that record on demand, so the hot path pays
nothing for explainability it does not use.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable

from .candidates import Candidate
from .ledger import EndpointLoad, InFlightLedger
from .prefix import PrefixIndex
from .request import Request
from .signals import DecisionContext
from .snapshot import ExclusionRuntime, RuleRuntime, Snapshot, TierRuntime
from .ttft import TTFTModel, uncached_tokens

_EMPTY_LOADS: dict = {}
_INF = float("inf")


class TierStep:
    """What one tier saw: the candidates it kept, what it picked and why."""

    __slots__ = ("tier", "kept", "picked", "value", "tied", "tie_breaks", "spread", "relief", "continued")

    def __init__(self, tier: TierRuntime, kept: list[Candidate], picked: Candidate | None,
                 value: object = None, tied: int = 0, tie_breaks: tuple[str, ...] = (),
                 spread: tuple | None = None, relief: tuple | None = None,
                 continued: tuple[float, float] | None = None) -> None:
        self.tier = tier
        self.kept = kept
        self.picked = picked
        #: the winning ``minimize`` value or ``order`` rank
        self.value = value
        #: how many candidates ranked equal before tie-breaking
        self.tied = tied
        self.tie_breaks = tie_breaks
        #: the spread moved the pick (``DecisionContext.spread``), else None
        self.spread = spread
        #: the ranking relieved a busy holder's stickiness (``DecisionContext.relief``), else None
        self.relief = relief
        #: the prompt continued a conversation on a best holder: the continuation's
        #: factors ``(continuation_stickiness, continuation_unqueued)``, else None
        self.continued = continued


class RuleStep:
    """What one rule did (or that it did not match)."""

    __slots__ = ("rule", "matched", "candidates", "builtin", "too_small", "avoided", "exclusions", "tiers",
                 "outcome")

    def __init__(self, rule: RuleRuntime, matched: bool) -> None:
        self.rule = rule
        self.matched = matched
        self.candidates: list[Candidate] = []
        #: consider'ed candidates removed by notReady / ejected
        self.builtin: list[Candidate] = []
        self.too_small: list[Candidate] = []
        #: removed because the caller asked to avoid them (a retry after a failure)
        self.avoided: list[Candidate] = []
        #: (exclusion, applies, before, after)
        self.exclusions: list[tuple] = []
        self.tiers: list[TierStep] = []
        #: NotMatched | Shadowed | Routed | Rejected | FallThrough
        self.outcome = "NotMatched"


class Decision:
    """The result: a pick (``routed``) or a rejection, and how it was reached."""

    __slots__ = ("routed", "candidate", "rule", "reason", "code", "canonical_model",
                 "steps", "decide_us", "request", "snapshot", "context", "inputs")

    def __init__(self) -> None:
        self.routed = False
        self.candidate: Candidate | None = None
        #: the rule that decided (``unmatched`` for the default), None for model_not_found
        self.rule: str | None = None
        self.reason = ""
        #: error code of a rejection: policy_rejected | no_capacity | model_not_found
        self.code: str | None = None
        self.canonical_model = ""
        #: rules tried, in order: a RuleStep, or the bare RuleRuntime of a rule
        #: whose ``matches`` did not hold (cheaper than a RuleStep per rule)
        self.steps: list[RuleStep | RuleRuntime] = []
        self.decide_us = 0.0
        #: what the router captured of the state behind this decision when it
        #: was taken (the ledger's loads, the prefix matches), for its record
        #: (``kinference_router.recording``); None when not recording
        self.inputs: object = None

    @property
    def type(self) -> str:
        return "Routed" if self.routed else "Rejected"

    @property
    def backend(self) -> str | None:
        """``Local/<workerset>`` or ``Provider/<name>``."""
        return self.candidate.backend if self.candidate else None

    @property
    def endpoint(self) -> str | None:
        return self.candidate.endpoint if self.candidate else None

    @property
    def model(self) -> str | None:
        """The model name to send upstream: what the picked destination serves
        (worker set ``servedName``, provider ``upstreamName``)."""
        return self.candidate.served_name if self.candidate else None

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the pick must prefill (the prompt less what the prefix
        index says it holds): what to pass to ``InFlightLedger.sent`` so the
        next decisions see the work queued ahead of them."""
        return self.prefill_tokens_at(self.candidate) if self.candidate is not None else 0

    def prefill_tokens_at(self, c: Candidate) -> int:
        """:attr:`prefill_tokens` had this decision picked ``c`` (one of its
        snapshot's candidates): where a gateway's retry sent it instead."""
        ctx = self.context
        if not c.is_local:
            return ctx.prompt_tokens
        if ctx.block_hashes:
            u = uncached_tokens(ctx.prompt_tokens, ctx.matched_blocks(c), len(ctx.block_hashes), None)
        else:
            u = uncached_tokens(ctx.prompt_tokens, 0, 0, c.hit_rate)
        return round(u)

    @property
    def http_status(self) -> int:
        return {None: 200, "policy_rejected": 403, "model_not_found": 404, "no_capacity": 503}[self.code]

    def trace(self, **kwargs):  # noqa: ANN003, ANN201 - see trace.build_trace
        from .trace import build_trace

        return build_trace(self, **kwargs)

    def __repr__(self) -> str:
        if self.routed:
            return f"Decision(Routed {self.candidate} model={self.model} rule={self.rule})"
        return f"Decision(Rejected {self.code} rule={self.rule}: {self.reason})"


# ----------------------------------------------------------------- pickers


def _least_in_flight(tied: list[Candidate], ctx: DecisionContext, rng: random.Random) -> list[Candidate]:
    loads = [ctx.in_flight(c) for c in tied]
    low = min(loads)
    return [c for c, n in zip(tied, loads) if n == low]


def _prefix_affinity(tied: list[Candidate], ctx: DecisionContext, rng: random.Random) -> list[Candidate]:
    """The endpoints holding the longest part of the prompt's prefix; when
    none holds any of it (a new prefix), the endpoints whose caches hold the
    fewest prompt blocks this router sent (:meth:`.prefix.PrefixIndex.blocks`):
    the new prefix evicts the least there, and since the requests that share
    it will follow it, each prefix's future traffic lands where the least
    such traffic is already committed (the "smallest tree" rule cache-aware
    routers document)."""
    blocks = [ctx.matched_blocks(c) for c in tied]
    high = max(blocks)
    if high == 0 and ctx.prefix is not None and ctx.block_hashes and len(tied) > 1:
        held = ctx.held_blocks(tied)
        low = min(held)
        return [c for c, n in zip(tied, held) if n == low]
    return [c for c, n in zip(tied, blocks) if n == high]


def _random(tied: list[Candidate], ctx: DecisionContext, rng: random.Random) -> list[Candidate]:
    i = rng.randrange(len(tied))
    # kept with the decision: a replay of it draws the same (kinfctl replay)
    if ctx.draws is None:
        ctx.draws = [(len(tied), i)]
    else:
        ctx.draws.append((len(tied), i))
    return [tied[i]]


#: ``tieBreak`` value -> narrows candidates that rank equal (never to none)
TIE_BREAKERS: dict[str, Callable[[list[Candidate], DecisionContext, random.Random], list[Candidate]]] = {
    "LeastInFlight": _least_in_flight,
    "PrefixAffinity": _prefix_affinity,
    "Random": _random,
}


def _rank(tier: TierRuntime, kept: list[Candidate], ctx: DecisionContext) -> tuple[list[Candidate], object]:
    """The candidates that rank best in the tier (several when equal), and the value."""
    get = tier.minimize_get
    if get is not None:
        best = None
        tied: list[Candidate] = []
        for c in kept:
            v = get(c, ctx)
            if v is None:
                continue
            if best is None or v < best:
                best, tied = v, [c]
            elif v == best:
                tied.append(c)
        return (tied, best) if tied else (kept, None)  # all unknown: all equal, last is first
    rank = tier.order_rank
    if rank is not None:
        low = min(rank[c.dest_name] for c in kept)
        return [c for c in kept if rank[c.dest_name] == low], low
    return kept, None


# ------------------------------------------------------------------ rules


def _ledger_adjusted(ex: ExclusionRuntime, snapshot: Snapshot, ctx: DecisionContext) -> frozenset[int] | set[int]:
    """A ledger-reading ``drop``: its idle-ledger result, re-evaluated only for
    the candidates this router has requests open to (usually few); copied
    only when one of them changes it."""
    loads = ctx.loads
    base = ex.dropped
    if not loads:
        return base
    dropped: set[int] | None = None
    drop = ex.drop
    by_key = snapshot.by_key
    for key in loads:
        for c in by_key.get(key, ()):
            i = c.index
            if drop(c, ctx):
                if i not in base:
                    dropped = set(base) if dropped is None else dropped
                    dropped.add(i)
            elif i in base:
                dropped = set(base) if dropped is None else dropped
                dropped.discard(i)
    return base if dropped is None else dropped


def _rank_predicted_ttft(
    snapshot: Snapshot, kept: list[Candidate], ctx: DecisionContext, tolerance: bool = False
) -> tuple[list[Candidate], float]:
    """``minimize: PredictedTTFT`` over Local candidates, fast: the
    precomputed per-endpoint line (:meth:`Snapshot._ttft_arrays`) for every
    endpoint, the exact model only for those with requests in flight or a
    prefix match. Same values as :meth:`DecisionContext.predicted_ttft`.

    With ``tolerance``, the tied candidates are those within the model's
    ``tie_tolerance`` of the best (:class:`.ttft.TTFTModel`), in ascending
    order of their prediction (the best first)."""
    P = ctx.prompt_tokens
    A, PT, H, IT, F = snapshot.ttft_a, snapshot.ttft_pt, snapshot.ttft_h, snapshot.ttft_it, snapshot.ttft_f
    hashes = ctx.block_hashes
    loads = ctx.loads
    total = len(hashes)
    model = snapshot.ttft_model
    if hashes:
        matches = ctx.matches()
        special = matches.keys() | loads.keys() if loads else matches.keys()
    else:
        matches = {}
        special = loads.keys()
    js = [j for j, c in enumerate(kept) if c.ledger_key in special] if special else []
    ctx.ranked = (kept, js)
    # prefix stickiness (TTFTModel.prefix_stickiness): every candidate is ranked
    # as if it also prefilled ``s`` times the tokens it does beyond the best
    # prefix holder's. For candidates without a match that is a longer prompt
    # in the same line (no extra pass); the few special ones are moved below.
    # The charge per candidate (snapshot.ttft_s) grows with its KV use, and
    # with its cache's hot fraction (PrefixIndex.pressure): a second copy of
    # a prefix on a pod whose cache is full of prefixes in use evicts one.
    stick = 0.0
    m_best = 0
    S = snapshot.ttft_s
    if tolerance and matches and js and model.prefix_stickiness > 0:
        m_best = max(min(matches.get(kept[j].ledger_key, 0), total) for j in js)
        if m_best > 0:
            stick = P / total
            pressed = ctx.pressure()
            if pressed:
                S = _pressed_stickiness(snapshot, model, pressed, ctx.prefix)
            # the best prefix holders: what the continuation and the relief read
            holders = [c for j in js if min(matches.get((c := kept[j]).ledger_key, 0), total) == m_best]
            if (model.continuation_stickiness != 1.0 or model.continuation_unqueued != 1.0) and m_best < total \
                    and ctx.continues(holders, m_best):
                stick *= model.continuation_stickiness
                if model.continuation_unqueued != 1.0:
                    S = _continued_stickiness(snapshot, model, S)
            if model.stickiness_relief != 1.0:
                stick *= _relief(snapshot, kept, holders, ctx, model)
    if hashes:
        if stick:
            Pe = stick * m_best
            vals = [A[i] + PT[i] * (P + S[i] * Pe) + ((P - H[i]) * IT[i] if P > H[i] else 0.0)
                    for c in kept for i in (c.index,)]
        else:
            vals = [A[i] + PT[i] * P + ((P - H[i]) * IT[i] if P > H[i] else 0.0)
                    for c in kept for i in (c.index,)]
    else:
        vals = [A[i] + PT[i] * (u := P * F[i]) + ((u - H[i]) * IT[i] if u > H[i] else 0.0)
                for c in kept for i in (c.index,)]
    if js:
        # endpoints with a prefix match or requests in flight: the same line,
        # moved by their own uncached tokens and queue (DecisionContext.predicted_ttft)
        cal = model.calibration
        cache = ctx.ttft
        for j in js:
            c = kept[j]
            key, i = c.ledger_key, c.index
            m = 0
            if hashes:
                m = min(matches.get(key, 0), total)
                u = P * (1.0 - m / total) if m > 0 else float(P)
            else:
                u = P * F[i]
            load = loads.get(key)
            if load is None:
                a, h = A[i], H[i]
            else:
                q = ctx.queue_tokens(c)
                a = cal * (c.t0 + q * c.per_token)
                h = c.kv_free - q if c.kv_free is not None else _INF
            s = _charge(S[i], c, load, model)
            v = a + PT[i] * u + ((u - h) * IT[i] if u > h else 0.0)
            cache[i] = v
            vals[j] = v + s * stick * (m_best - m) * PT[i] if stick else v
    best = min(vals)
    if tolerance:
        limit = max(best * (1.0 + model.tie_tolerance), best + model.tie_tolerance_seconds)
        near = [(v, j) for j, v in enumerate(vals) if v <= limit]
        if len(near) > 1:
            near.sort()
            return [kept[j] for _, j in near], _unstuck(near[0][0], kept[near[0][1]], ctx, stick, m_best, PT, S)
        j = vals.index(best)
        return [kept[j]], _unstuck(best, kept[j], ctx, stick, m_best, PT, S)
    if vals.count(best) == 1:
        return [kept[vals.index(best)]], best
    return [c for c, v in zip(kept, vals) if v == best], best


def _spread(snapshot: Snapshot, kept: list[Candidate], pick: Candidate,
            ctx: DecisionContext) -> tuple[Candidate, float] | None:
    """The spread (:attr:`.ttft.TTFTModel.spread_fraction`): ``(e, e's
    PredictedTTFT)`` when the least-loaded candidate ``e`` of the tier should
    take this request from ``pick``, the busy prefix holder the ranking and
    the tie-breakers chose; None otherwise. Records the move in
    ``ctx.spread`` for the trace and the router's counter."""
    model = snapshot.ttft_model
    if model.spread_fraction <= 0:
        return None
    hashes = ctx.block_hashes
    total = len(hashes)
    m_p = min(ctx.matches().get(pick.ledger_key, 0), total)
    if m_p <= 0:
        return None
    L = snapshot.load
    loads = ctx.loads
    lp = L[pick.index]  # -1 (unknown) is under any spread_min_load
    if lp >= 0 and loads and pick.ledger_key in loads:
        lp = max(lp, ctx.in_flight(pick))
    if lp < model.spread_min_load:
        return None
    # exact early exit: a taker carries at most spread_fraction of a mean
    # that is at most lp, and the routers' sends only add to a scrape's load
    if snapshot.min_load() > model.spread_fraction * lp:
        return None
    ls = [L[c.index] for c in kept]
    if loads:
        # the routers' sends raise a scrape's load: only candidates with sends
        # open, which the ranking found already (its positions in ``kept``)
        ranked = ctx.ranked
        in_flight = ctx.in_flight
        for j in ranked[1] if ranked is not None and ranked[0] is kept else range(len(kept)):
            c = kept[j]
            if ls[j] >= 0 and c.ledger_key in loads:
                f = in_flight(c)
                if f > ls[j]:
                    ls[j] = f
    low = min(ls)
    if low >= 0:  # every load known (any Local endpoint with a scrape)
        mean = sum(ls) / len(ls)
    else:
        known = [v for v in ls if v >= 0]
        mean = sum(known) / len(known)
        low = min(known)
    if lp < mean or low > model.spread_fraction * mean:
        return None
    je = ls.index(low)
    e = kept[je]
    if e is pick:
        return None
    # no longer than the holder's with the copy to make on the holder: the
    # copies already on their way to e count in its queue, which bounds how
    # many it takes before their first tokens; a slower pod takes one only
    # when the holder's queue outweighs the difference
    pe, pp = ctx.predicted_ttft(e), ctx.predicted_ttft(pick)
    m_e = min(ctx.matches().get(e.ledger_key, 0), total)
    copy = snapshot.ttft_pt[pick.index] * ctx.prompt_tokens / total * max(0, m_p - m_e)
    if pe is None or pp is None or pe > pp + copy:
        return None
    # a pod that holds far less than its share of the prefixes sent (new,
    # restarted, or left out): not one in a steady fleet between two bursts
    held = ctx.held_blocks(kept)
    if held[je] > model.spread_held_fraction * sum(held) / len(held):
        return None
    ctx.spread = (pick, e, lp, mean, low)
    return e, pe


def _relief(snapshot: Snapshot, kept: list[Candidate], holders: list[Candidate], ctx: DecisionContext,
            model: TTFTModel) -> float:
    """The factor on the stickiness charge (:attr:`.ttft.TTFTModel.stickiness_relief`):
    ``stickiness_relief`` when the most loaded of the best prefix holders
    carries at least ``relief_load`` times its peers' mean scrape load and
    its cache at least ``relief_hot`` times their mean hot fraction, 1
    otherwise. Its peers are the candidates of its KV capacity (itself
    included: the same engine on the same GPUs, as for
    :func:`.candidates.peer_thetas`); in a fleet of two GPU types the
    slower pods take few requests by design, and against them every fast
    pod would look overloaded. Records the relief in ``ctx.relief`` for the
    trace and the router's counter. The hot fractions are read (and
    recorded) only when the load says the holder is overloaded."""
    L = snapshot.load
    holder = None
    for c in holders:  # the most loaded, the first of equals
        if holder is None or L[c.index] > L[holder.index]:
            holder = c
    if holder is None or L[holder.index] <= 0:
        return 1.0
    cap = holder.cache_blocks
    peers = [c for c in kept if c.cache_blocks == cap] if cap is not None else kept
    known = [v for c in peers if (v := L[c.index]) >= 0]
    if len(known) < 2:
        return 1.0
    mean = sum(known) / len(known)
    load = L[holder.index]
    if load < model.relief_load * mean:
        return 1.0
    hot = ctx.hot_fractions(peers)
    hot_mean = sum(hot) / len(hot)
    h = hot[peers.index(holder)]
    if hot_mean <= 0 or h < model.relief_hot * hot_mean:
        return 1.0
    ctx.relief = (holder, model.stickiness_relief, load, mean, h, hot_mean)
    return model.stickiness_relief


def _pressed_stickiness(snapshot: Snapshot, model: TTFTModel, pressed: dict[str, float],
                        prefix: object) -> list[float]:
    """``snapshot.ttft_s`` with each pressed endpoint's charge raised to what
    its hot fraction would give as KV use. Kept on the snapshot until the
    index's pressure changes (in steps of 1/64), so a burst of decisions
    builds it once."""
    version = getattr(prefix, "pressure_version", None)
    cached = snapshot.pressed_s
    if cached is not None and version is not None and cached[0] is prefix and cached[1] == version:
        return cached[2]
    S = list(snapshot.ttft_s)
    by_key = snapshot.by_key
    for key, f in pressed.items():
        s = model.stickiness(f)
        for c in by_key.get(key, ()):
            if s > S[c.index]:
                S[c.index] = s
    if version is not None:
        snapshot.pressed_s = (prefix, version, S)
    return S


def _continued_stickiness(snapshot: Snapshot, model: TTFTModel, S: list[float]) -> list[float]:
    """``S`` with each charge on a candidate with nothing waiting (under
    ``prefix_stickiness``) multiplied by ``continuation_unqueued``. Kept on
    the snapshot for the same ``S``, so a burst of turns builds it once."""
    cached = snapshot.continued_s
    if cached is not None and cached[0] is S:
        return cached[1]
    f, full = model.continuation_unqueued, model.prefix_stickiness
    out = [s * f if s < full else s for s in S]
    snapshot.continued_s = (S, out)
    return out


def _charge(s: float, c: Candidate, load: EndpointLoad | None, model: TTFTModel) -> float:
    """The stickiness charged to ``c``, whose snapshot charge is ``s`` and
    whose open sends (this router's and its peers') are ``load``: an
    endpoint with nothing waiting at its scrape (``prefix_stickiness_unqueued``)
    where one of them is still before its first token is charged as its KV
    use says, like any pod with a queue (without ``unqueued_running``: where
    any is open)."""
    if load is None:
        return s
    busy = bool(load.pending_count or load.peer_pending_count) if model.unqueued_running else True
    if busy and s < model.prefix_stickiness:
        return max(s, model.stickiness(c.kv))
    return s


def _unstuck(v: float, c: Candidate, ctx: DecisionContext, stick: float, m_best: int, PT: list[float],
             S: list[float]) -> float:
    """The pick's PredictedTTFT without the stickiness charge (what traces show)."""
    if not stick:
        return v
    m = min(ctx.matches().get(c.ledger_key, 0), len(ctx.block_hashes))
    load = ctx.loads.get(c.ledger_key) if ctx.loads else None
    return v - _charge(S[c.index], c, load, ctx.model) * stick * (m_best - m) * PT[c.index]


def _by_window(cands: list[Candidate], need: int) -> tuple[list[Candidate], list[Candidate]]:
    """``(those whose known context window is under need, the others)``."""
    small: list[Candidate] = []
    fit: list[Candidate] = []
    for c in cands:
        (small if c.context_window is not None and c.context_window < need else fit).append(c)
    return small, fit


def _run_rule(
    snapshot: Snapshot, rule: RuleRuntime, request: Request, model: str, ctx: DecisionContext,
    rng: random.Random, avoid: frozenset[str] | set[str] = frozenset(),
) -> tuple[RuleStep, Candidate | None, bool]:
    """Run one matching rule: ``(step, pick or None, a live signal removed something)``."""
    step = RuleStep(rule, True)
    cands, removed, min_window = rule.considered(model)
    step.builtin = removed
    live = bool(removed)
    if avoid:
        avoided = [c for c in cands if c.ledger_key in avoid]
        if avoided:
            step.avoided = avoided
            cands = [c for c in cands if c.ledger_key not in avoid]
            live = True
    need = request.context_need() if min_window is not None else None
    if need is not None and min_window is not None and need > min_window:
        too_small, fit = _by_window(cands, need)
        if too_small and not fit:
            # none holds the estimate: those that would were it ESTIMATE_MARGIN too high
            # stay (their engine, which counts exactly, decides); the rest surely cannot
            too_small, fit = _by_window(cands, request.context_need(sure=True) or 0)
        if too_small:
            step.too_small = too_small
            cands = fit
    step.candidates = cands
    exclusions = step.exclusions
    for ex in rule.exclusions:
        if ex.when is not None and not ex.when(request, model):
            exclusions.append((ex, False, cands, cands))
            continue
        kind = ex.kind
        if kind == "static" or (kind == "ledger" and len(ctx.loads) <= len(cands)):
            dropped = ex.dropped if kind == "static" else _ledger_adjusted(ex, snapshot, ctx)
            kept = [c for c in cands if c.index not in dropped] if dropped else cands
        else:
            drop = ex.drop
            kept = [c for c in cands if not drop(c, ctx)]
        if ex.live and len(kept) != len(cands):
            live = True
        exclusions.append((ex, True, cands, kept))
        cands = kept
    for tier in rule.tiers:
        if tier.unreachable:
            step.tiers.append(TierStep(tier, [], None))
            continue
        want = tier.want_local
        kept = [c for c in cands if c.is_local is want]
        if kept and tier.order_rank is not None:
            rank = tier.order_rank
            kept = [c for c in kept if c.dest_name in rank]
        if kept and tier.backends is not None:
            if tier.static:
                inside = tier.kept
                kept = [c for c in kept if c.index in inside]
            else:
                pred = tier.backends
                kept = [c for c in kept if pred(c, ctx)]
        if not kept:
            step.tiers.append(TierStep(tier, kept, None))
            continue
        if tier.minimize == "PredictedTTFT" and want:
            tied, value = _rank_predicted_ttft(snapshot, kept, ctx, tolerance=bool(rule.tie_break))
        else:
            tied, value = _rank(tier, kept, ctx)
        n_tied = len(tied)
        applied: tuple[str, ...] = ()
        if n_tied > 1:
            for name in rule.tie_break:
                if len(tied) == 1:
                    break
                tied = TIE_BREAKERS[name](tied, ctx, rng)
                applied += (name,)
        pick = tied[0]
        if want and tier.minimize == "PredictedTTFT" and rule.tie_break and ctx.block_hashes:
            moved = _spread(snapshot, kept, pick, ctx)
            if moved is not None:
                pick, value = moved
        model = snapshot.ttft_model
        cont = (model.continuation_stickiness, model.continuation_unqueued) if ctx.continued else None
        step.tiers.append(TierStep(tier, kept, pick, value, n_tied, applied, ctx.spread, ctx.relief, cont))
        step.outcome = "Routed"
        return step, pick, live
    step.outcome = "FallThrough" if rule.on_empty == "FallThrough" else "Rejected"
    return step, None, live


def decide(
    snapshot: Snapshot,
    request: Request,
    *,
    ledger: InFlightLedger | None = None,
    prefix: PrefixIndex | None = None,
    rng: random.Random | None = None,
    avoid: frozenset[str] | set[str] = frozenset(),
    timer: Callable[[], float] = time.perf_counter,
) -> Decision:
    """Decide where ``request`` goes on ``snapshot``. No I/O, no awaits.

    ``ledger``: this router's in-flight ledger (None = nothing in flight);
    ``prefix``: its prefix index (None = no prefix knowledge); ``rng``: the
    source for ``tieBreak: Random`` (default: the snapshot's); ``avoid``:
    ledger keys not to pick (the router's retry after a connect failure,
    before the ejection reaches a new snapshot; shown as ``ejected``);
    ``timer``: for ``decide_us`` only.
    """
    start = timer()
    d = Decision()
    d.request = request
    d.snapshot = snapshot
    model = snapshot.aliases.get(request.model, request.model)
    d.canonical_model = model
    ctx = DecisionContext(
        ledger.loads if ledger is not None else _EMPTY_LOADS,
        request.prompt_tokens, request.block_hashes, prefix, snapshot.ttft_model,
    )
    d.context = ctx
    if model not in snapshot.served:
        d.code = "model_not_found"
        d.reason = f"no destination of pool {snapshot.namespace}/{snapshot.name} serves model {request.model!r}"
        d.decide_us = (timer() - start) * 1e6
        return d
    rng = rng if rng is not None else snapshot.rng
    live = False
    steps = d.steps
    for rule in snapshot.rules:
        if rule.shadowed:
            s = RuleStep(rule, False)
            s.outcome = "Shadowed"
            steps.append(s)
            continue
        if not rule.matches(request, model):
            steps.append(rule)  # not matched: recorded as the bare RuleRuntime
            continue
        step, pick, rule_live = _run_rule(snapshot, rule, request, model, ctx, rng, avoid)
        steps.append(step)
        live = live or rule_live
        if pick is not None:
            d.routed, d.candidate, d.rule = True, pick, rule.name
            d.reason = f"rule {rule.name!r} picked {pick.id}"
            d.decide_us = (timer() - start) * 1e6
            return d
        if rule.on_empty != "FallThrough":
            d.rule = rule.name
            d.code = "no_capacity" if live else "policy_rejected"
            d.reason = (
                f"rule {rule.name!r} left no candidate (onEmpty: Reject)"
                + ("; live signals removed candidates (an exclusion on one, or a pod not ready or ejected)"
                   if live else "")
            )
            d.decide_us = (timer() - start) * 1e6
            return d
    unmatched = snapshot.unmatched
    if unmatched is None:
        d.rule = "unmatched"
        d.code = "no_capacity" if live else "policy_rejected"
        d.reason = "no rule picked a candidate and the policy says unmatched: Reject"
    else:
        step, pick, rule_live = _run_rule(snapshot, unmatched, request, model, ctx, rng, avoid)
        steps.append(step)
        live = live or rule_live
        d.rule = unmatched.name
        if pick is not None:
            d.routed, d.candidate = True, pick
            d.reason = f"no rule picked; unmatched: ServeLocal picked {pick.id}"
        else:
            # ServeLocal has no exclusions: it fails only for want of a ready
            # endpoint (capacity), or because no worker set serves the model
            step.outcome = "Rejected"
            if live or model in snapshot.local_models:
                d.code = "no_capacity"
                d.reason = "no rule picked and unmatched: ServeLocal found no ready local endpoint"
            else:
                d.code = "policy_rejected"
                d.reason = (f"no rule picked and unmatched: ServeLocal never reaches a provider; "
                            f"no worker set serves {model!r}")
    d.decide_us = (timer() - start) * 1e6
    return d


#: the HTTP status of a rejection, by its code (any other code: 403 ``policy_rejected``);
#: the router's answer and ``kinfctl explain`` both read it here
REJECTION_STATUS = {"model_not_found": 404, "no_capacity": 503, "context_length_exceeded": 400}


def rejection_status(code: str | None) -> int:
    return REJECTION_STATUS.get(code or "", 403)


def interpret(d: Decision) -> Decision:
    """``d``, or when it rejected the request because every candidate it
    considered has a context window smaller than what the request surely
    needs (:meth:`.request.Request.context_need` with ``sure``), a copy with code
    ``context_length_exceeded`` and a reason naming the window: the
    client's error (a 400), not a policy rejection. Not when something fit,
    or a candidate was dropped for another reason with a window that would
    fit or is unknown (not ready, ejected: capacity, not size). The router's
    answer, ``/debug/explain``, ``kinfctl explain`` and ``kinfctl replay``
    all read a decision through this."""
    if d.routed or not d.steps:
        return d
    steps = [s for s in d.steps if isinstance(s, RuleStep) and s.matched]
    if not steps or not any(s.too_small for s in steps) or any(s.candidates for s in steps):
        return d
    req = d.request
    need = req.context_need(sure=True) or 0
    windows = [c.context_window for s in steps for c in (*s.too_small, *s.builtin, *s.avoided)]
    if any(w is None or w >= need for w in windows):
        return d
    out = copy.copy(d)
    out.code = "context_length_exceeded"
    prompt = req.sequence_tokens or 0
    if req.max_tokens is not None:
        out.reason = (f"This model's maximum context length is {max(windows)} tokens. However, you requested "
                      f"about {prompt + req.max_tokens} tokens (about {prompt} in the prompt, {req.max_tokens} in "
                      "the completion). Please reduce the length of the prompt or completion.")
    else:
        out.reason = (f"This model's maximum context length is {max(windows)} tokens. However, the prompt is "
                      f"about {prompt} tokens, which leaves no room for the completion. Please reduce the length "
                      "of the prompt.")
    return out
