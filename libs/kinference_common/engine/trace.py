"""The decision trace (INTERFACES.md, "Decision trace (explain)").

The same JSON shape from ``kinfctl explain``, ``/debug/explain`` and (trimmed)
decision events::

    {decision_id, pool, tenant, model: {requested, rewritten, canonical}, tags,
     classifiers: [{name, ms, outcome}],
     rules: [{name, matched, candidates, excluded: [{exclusion, dropped}],
              tiers: [{index, kept, picked}], outcome}],
     outcome: {type, backend, endpoint, model, reason, code},
     decide_us}

Additive fields (allowed by the contract): per rule ``builtin`` (candidates a
built-in check removed or marked: ``notReady``, ``ejected``,
``contextTooSmall``, and ``stale``, which stays a candidate) and ``scores``
(each candidate's PredictedTTFT / EstimatedTTFT and the signals behind it);
per exclusion ``applies`` (its ``if`` held) and ``live``; per tier ``type``
and ``why``; in ``outcome``, ``rule`` (the ``x-kinference-rule`` header).

A candidate is named ``Local/<workerset>/<pod>`` or ``Provider/<name>``
(``Provider/<name>:<model>`` when the provider serves several models).
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from kinference_common.durations import format_duration

from .decide import Decision, RuleStep, TierStep
from .snapshot import RuleRuntime


class _T(Struct, kw_only=True):
    """Trace structs: snake_case JSON, every field present (nulls included)."""


class ModelTrace(_T, kw_only=True):
    requested: str
    rewritten: str | None = None
    canonical: str


class ClassifierTrace(_T, kw_only=True):
    name: str
    ms: float = 0.0
    #: ok | oversize | error | deadline | shed (the router; a failure tag was used
    #: unless ok); skipped (not asked: its answer could not change the decision);
    #: offline | absent (kinfctl explain)
    outcome: str = "ok"
    #: where it ran: Service (over NATS) | InProcess (in the router); None offline
    path: str | None = None
    #: the tags it gave this request (its failure tag unless ``outcome`` is ok)
    tags: list[str] = []
    #: why it was skipped or shed
    why: str = ""


class ExclusionTrace(_T, kw_only=True):
    exclusion: str
    dropped: list[str] = []
    applies: bool = True
    live: bool = False


class BuiltinTrace(_T, kw_only=True):
    #: notReady | ejected | contextTooSmall | stale
    check: str
    candidates: list[str]
    #: False for ``stale``: marked, still a candidate
    removed: bool = True


class TierTrace(_T, kw_only=True):
    index: int
    type: str
    kept: list[str] = []
    picked: str | None = None
    why: str = ""


class CandidateScore(_T, kw_only=True):
    candidate: str
    backend: str
    endpoint: str | None = None
    model: str
    predicted_ttft_ms: float | None = None
    estimated_ttft_ms: float | None = None
    queued_prompts: int | None = None
    running_prompts: int | None = None
    kv_cache_usage: float | None = None
    in_flight: int = 0
    prefix_blocks: int = 0
    stale: bool = False


class RuleTrace(_T, kw_only=True):
    name: str
    matched: bool
    candidates: list[str] = []
    excluded: list[ExclusionTrace] = []
    tiers: list[TierTrace] = []
    #: NotMatched | Shadowed | Routed | Rejected | FallThrough
    outcome: str
    builtin: list[BuiltinTrace] = []
    scores: list[CandidateScore] = []


class OutcomeTrace(_T, kw_only=True):
    type: Literal["Routed", "Rejected"]
    backend: str | None = None
    endpoint: str | None = None
    model: str | None = None
    reason: str = ""
    code: str | None = None
    rule: str | None = None


class DecisionTrace(_T, kw_only=True):
    decision_id: str
    pool: str
    tenant: str
    model: ModelTrace
    tags: list[str]
    classifiers: list[ClassifierTrace] = []
    rules: list[RuleTrace] = []
    outcome: OutcomeTrace
    decide_us: float


_encoder = msgspec.json.Encoder()


def encode_trace(trace: DecisionTrace) -> bytes:
    return _encoder.encode(trace)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 3)


def _why(t: TierStep) -> str:
    tier = t.tier
    if tier.unreachable:
        return "unreachable: an earlier tier with no backends subset covers this type"
    if t.picked is None:
        return "no candidate left for this tier"
    if tier.minimize:
        if t.value is None:
            head = f"minimize {tier.minimize}: every value unknown, all rank equal"
        elif tier.minimize in ("PredictedTTFT", "EstimatedTTFT"):
            head = f"minimize {tier.minimize}: lowest {format_duration(float(t.value))}"  # type: ignore[arg-type]
        else:
            head = f"minimize {tier.minimize}: lowest {t.value}"
    elif tier.order_rank is not None:
        head = f"order: first listed destination with a candidate ({t.picked.dest_name})"
    else:
        head = "no minimize/order: all rank equal"
    if t.tied > 1:
        if t.tie_breaks:
            head += f"; {t.tied} tied, tieBreak {', '.join(t.tie_breaks)}"
        else:
            head += f"; {t.tied} tied, first in stable order"
    if t.relief is not None:
        holder, factor, load, mean, hot, hot_mean = t.relief
        head += (f"; prefix stickiness x{factor:g}: holder {holder.id} carries load {load} (mean {mean:.1f}) "
                 f"and prefixes in use {hot:.0%} of its cache (mean {hot_mean:.0%})")
    if t.continued is not None:
        factor, unqueued = t.continued
        head += (f"; a conversation's next turn: prefix stickiness x{factor:g}, x{factor * unqueued:g} on pods "
                 "with nothing waiting")
    if t.spread is not None:
        holder, taker, load, mean, low = t.spread
        head += (f"; spread: moved from prefix holder {holder.id} (load {load}, mean {mean:.1f}) to "
                 f"{taker.id} (load {low}), which holds little of the prefixes sent")
    return head


def _scores(decision: Decision, step: RuleStep) -> list[CandidateScore]:
    ctx = decision.context
    out = []
    for c in step.candidates:
        out.append(
            CandidateScore(
                candidate=c.id,
                backend=c.backend,
                endpoint=c.endpoint,
                model=c.model,
                predicted_ttft_ms=_ms(ctx.predicted_ttft(c)),
                estimated_ttft_ms=_ms(c.est_ttft),
                queued_prompts=ctx.queued(c),
                running_prompts=c.running,
                kv_cache_usage=c.kv,
                in_flight=ctx.in_flight(c),
                prefix_blocks=ctx.matched_blocks(c),
                stale=c.stale,
            )
        )
    return out


def _rule_trace(decision: Decision, step: RuleStep | RuleRuntime, scores: bool = True) -> RuleTrace:
    if isinstance(step, RuleRuntime):
        return RuleTrace(name=step.name, matched=False, outcome="NotMatched")
    if not step.matched:
        return RuleTrace(name=step.rule.name, matched=False, outcome=step.outcome)
    builtin: list[BuiltinTrace] = []
    if step.builtin or step.avoided:
        for check in ("notReady", "ejected"):
            ids = [c.id for c in step.builtin if c.builtin == check]
            if check == "ejected":
                ids += [c.id for c in step.avoided]
            if ids:
                builtin.append(BuiltinTrace(check=check, candidates=ids))
    if step.too_small:
        builtin.append(BuiltinTrace(check="contextTooSmall", candidates=[c.id for c in step.too_small]))
    stale = [c.id for c in step.candidates if c.stale] if decision.snapshot.has_stale else []
    if stale:
        builtin.append(BuiltinTrace(check="stale", candidates=stale, removed=False))
    excluded = []
    for ex, applies, before, after in step.exclusions:
        # ``after`` is ``before`` filtered: the same length means nothing dropped
        if len(after) == len(before):
            dropped = []
        else:
            kept = {c.index for c in after}
            dropped = [c.id for c in before if c.index not in kept]
        excluded.append(
            ExclusionTrace(
                exclusion=ex.name,
                dropped=dropped,
                applies=applies,
                live=ex.live,
            )
        )
    tiers = [
        TierTrace(
            index=t.tier.index,
            type=t.tier.tier.type,
            kept=[c.id for c in t.kept],
            picked=t.picked.id if t.picked else None,
            why=_why(t),
        )
        for t in step.tiers
    ]
    return RuleTrace(
        name=step.rule.name,
        matched=True,
        candidates=[c.id for c in step.candidates],
        excluded=excluded,
        tiers=tiers,
        outcome=step.outcome,
        builtin=builtin,
        scores=_scores(decision, step) if scores else [],
    )


def build_trace(
    decision: Decision,
    *,
    decision_id: str = "",
    classifiers: list[ClassifierTrace] | None = None,
    scores: bool = True,
) -> DecisionTrace:
    """Render ``decision`` as the INTERFACES.md trace.

    ``scores=False`` gives the trimmed trace of decision events: every rule's
    path (candidates, exclusions, tiers, pick) without each candidate's
    signals and PredictedTTFT, which explain shows but which would make every
    event grow with the number of endpoints."""
    req = decision.request
    snap = decision.snapshot
    requested = req.requested_model if req.requested_model is not None else req.model
    return DecisionTrace(
        decision_id=decision_id,
        pool=snap.ref,
        tenant=req.tenant,
        model=ModelTrace(
            requested=requested,
            rewritten=req.model if req.model != requested else None,
            canonical=decision.canonical_model,
        ),
        tags=sorted(req.tags),
        classifiers=list(classifiers or []),
        rules=[_rule_trace(decision, s, scores) for s in decision.steps],
        outcome=OutcomeTrace(
            type="Routed" if decision.routed else "Rejected",
            backend=decision.backend,
            endpoint=decision.endpoint,
            model=decision.model,
            reason=decision.reason,
            code=decision.code,
            rule=decision.rule,
        ),
        decide_us=round(decision.decide_us, 1),
    )
