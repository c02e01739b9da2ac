"""Policy compilation: an InferencePolicy (already schema-valid) to a
:class:`~kinference_common.compiled.CompiledPolicy`, its per-rule status, and
its warnings.

A policy is compiled once alone (``pool=None``), which gives the warnings
that do not depend on a pool, and once per pool that references it, with that
pool's aliases and destination names (RESOURCES.md). Warnings that depend on
the pool (:data:`POOL_DEPENDENT`) name the pool in their message.

Warning codes (POLICY.md section 7, then the checks added beyond it, which the
README's policy section lists):

=====================  ==========================================================
DuplicateRuleName      later rule dropped, not counted in ruleCount
ShadowedRule           follows a catch-all whose onEmpty is Reject: never fires
UnknownTag             tag removed from its list; an emptied list never holds
UncoveredFailureTag    a tag condition that would let PII reach a provider when
                       the classifier fails
ClassScopedSignal      exclusion (or tier ``backends`` term) dropped
SignalNotForType       tier ``minimize`` defaulted to its type's TTFT signal
UnknownDestination     name removed from ``order``/``names``
UnreachableTier        an earlier tier covers the same type: never picks
NoTierForConsidered    a consider entry explicit about a kind no tier selects
OutOfRange             0..1 signal compared outside 0..1: term dropped
UnknownField           not in a policy: every unknown field of a policy is a
                       manifest error (:func:`~kinference_common.manifests.policy_unknown_fields`),
                       in other kinds a document warning (compiler/__init__.py)
UnknownModel           (added) a model name no destination of the pool serves
ProviderOnlyOnOutage   (added) a Provider tier reached only when no Local
                       endpoint is ready (seed: "Providers never picked")
UnmatchedNeverApplies  (added) ``unmatched: Reject`` is set but a catch-all
                       rule that rejects comes first
EmptyRange             (added) greaterThan >= lessThan: the comparison never holds
TaggedFallThrough      (added) a rule keeps tagged requests local but falls
                       through to a later rule that can pick a Provider
DropsEverything        (added) an exclusion with no ``if`` whose ``drop`` names
                       nothing (``drop: {}``): it drops every candidate, so the
                       rule never picks
=====================  ==========================================================

A note on ``OutOfRange`` in an exclusion: dropping only the comparison would
turn "drop Local endpoints whose KV use is above 90" into "drop every Local
endpoint". So when the out-of-range comparison is the exclusion's only signal,
the whole exclusion is dropped (it does nothing), and the warning says so.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from kinference_common import classifiers as cl
from kinference_common import resources as r
from kinference_common.compiled import (
    FRACTION_SIGNALS,
    MINIMIZE_SCOPE,
    SIGNAL_SCOPE,
    CandidateTest,
    CompiledExclusion,
    CompiledPolicy,
    CompiledRule,
    CompiledTier,
    Consider,
    Header,
    Range,
    RequestTest,
    SignalTest,
)
from kinference_common.compiler.status import PolicyWarning, RuleStatus
from kinference_common.compiler.validate import WIRE_NAMES
from kinference_common.durations import format_duration, parse_duration
from kinference_common.manifests import closest

POOL_DEPENDENT = frozenset({"UnknownDestination", "NoTierForConsidered", "UnknownModel", "ProviderOnlyOnOutage"})
DEFAULT_TTFT = {"Local": "PredictedTTFT", "Provider": "EstimatedTTFT"}


@dataclass(frozen=True)
class PoolContext:
    """What compiling against one pool needs to know about it."""

    namespace: str
    name: str
    #: accepted model name -> canonical
    aliases: dict[str, str]
    #: destination name -> "Local" | "Provider"
    destinations: dict[str, str]
    #: canonical models served by Provider destinations
    provider_models: frozenset[str] = frozenset()
    #: destination name -> the reason the pool could not resolve it (its unresolvedDestinations)
    unresolved: dict[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class PolicyCompilation:
    policy: CompiledPolicy
    rules: list[RuleStatus]
    warnings: list[PolicyWarning]
    #: rules where a misspelt pii tag was removed (a PII condition that does not hold: said loudly)
    pii_typos: list[str] = field(default_factory=list)


@dataclass
class _Ctx:
    pool: PoolContext | None
    warnings: list[PolicyWarning] = field(default_factory=list)
    pii_typos: list[str] = field(default_factory=list)

    def warn(self, code: str, rule: str, term: str, message: str) -> None:
        if code in POOL_DEPENDENT and self.pool is not None:
            message = f"{message} (in pool {self.pool.ref})"
        self.warnings.append(PolicyWarning(code=code, rule=rule, term=term, message=message))


def default_policy(namespace: str) -> CompiledPolicy:
    """The policy of a pool with no policyRef, or whose policy is missing:
    no rules, ``unmatched: ServeLocal``. It never reaches a Provider."""
    return CompiledPolicy(namespace=namespace, name="", unmatched="ServeLocal", rules=[])


def compile_policy(
    policy: r.InferencePolicy, raw: dict[str, Any] | None = None, pool: PoolContext | None = None,
    in_process: Collection[str] = (),
) -> PolicyCompilation:
    """``raw``: the document as written, when compiled on its own (which
    fields it writes); ``in_process``: classifiers the router runs in its
    own process (the status then shows that path and its deadline)."""
    ctx = _Ctx(pool)

    rules: list[CompiledRule] = []
    statuses: list[RuleStatus] = []
    seen: dict[str, int] = {}
    blocking_catch_all: CompiledRule | None = None
    for i, rule in enumerate(policy.spec.rules):
        term = f"rules[{i}]"
        if rule.name in seen:
            ctx.warn(
                "DuplicateRuleName", rule.name, term,
                f"rules[{seen[rule.name]}] is already named {rule.name!r}; this rule is dropped "
                "and not counted. Give every rule a unique name.",
            )
            continue
        seen[rule.name] = i
        compiled = _compile_rule(ctx, rule, i, term)
        if blocking_catch_all is not None:
            ctx.warn(
                "ShadowedRule", rule.name, term,
                f"rule {blocking_catch_all.name!r} ({blocking_catch_all.term}) matches every request and "
                "rejects what it cannot place (onEmpty: Reject), so this rule never fires. Move it "
                "before that rule, give that rule `matches`, or set its onEmpty: FallThrough.",
            )
            compiled = _replace(compiled, shadowed=True)
        elif compiled.matches is None and compiled.on_empty == "Reject":
            blocking_catch_all = compiled
        rules.append(compiled)
        statuses.append(_rule_status(compiled, in_process))

    _check_uncovered_matches(ctx, rules)
    # Only a value other than the default: on a cluster the API server fills in the
    # CRD's `default: ServeLocal`, so "written" and "defaulted" cannot be told apart
    # there, and a file and the cluster must give the same warnings.
    if blocking_catch_all is not None and raw is not None and "unmatched" in (raw.get("spec") or {}) \
            and policy.spec.unmatched != "ServeLocal":
        ctx.warn(
            "UnmatchedNeverApplies", "", "unmatched",
            f"unmatched: {policy.spec.unmatched} never applies: rule {blocking_catch_all.name!r} "
            "matches every request and rejects what it cannot place. Remove one of the two.",
        )

    compiled_policy = CompiledPolicy(
        namespace=policy.metadata.namespace,
        name=policy.metadata.name,
        unmatched=policy.spec.unmatched,
        rules=rules,
        generation=policy.metadata.generation,
        in_process_classifiers=sorted(set(in_process) & set(cl.BUILTIN_CLASSIFIERS)),
    )
    return PolicyCompilation(compiled_policy, statuses, ctx.warnings, sorted(set(ctx.pii_typos)))


def _replace(rule: CompiledRule, **changes: Any) -> CompiledRule:
    import msgspec

    return msgspec.structs.replace(rule, **changes)


# ---------------------------------------------------------------------- rules


def _compile_rule(ctx: _Ctx, rule: r.PolicyRule, index: int, term: str) -> CompiledRule:
    name = rule.name
    matches: list[RequestTest] | None = None
    if rule.matches:
        compiled_entries = [
            _request_test(ctx, name, f"{term}.matches[{j}]", m) for j, m in enumerate(rule.matches)
        ]
        # An entry with no field holds for every request: the rule is a catch-all.
        if not any(_is_empty(m) for m in compiled_entries):
            matches = compiled_entries

    route = rule.route
    consider = None
    if route.consider is not None:
        consider = [
            _consider(ctx, name, f"{term}.route.consider[{j}]", c) for j, c in enumerate(route.consider)
        ]

    exclusions: list[CompiledExclusion] = []
    for j, ex in enumerate(route.exclude or []):
        compiled_ex = _exclusion(ctx, name, f"{term}.route.exclude[{j}]", ex)
        if compiled_ex is not None:
            exclusions.append(compiled_ex)

    tiers: list[CompiledTier] = []
    for j, tier in enumerate(route.select):
        tiers.append(_tier(ctx, name, f"{term}.route.select[{j}]", j, tier, tiers))

    required = sorted(
        {
            cl.TAG_TO_CLASSIFIER[t]
            for test in [*(matches or []), *(e.when for e in exclusions if e.when is not None)]
            for t in (test.tags or [])
        }
    )
    compiled = CompiledRule(
        name=name,
        index=index,
        term=term,
        matches=matches,
        consider=consider,
        exclude=exclusions,
        select=tiers,
        tie_break=list(route.tie_break or []),
        on_empty=route.on_empty,
        requires_classifiers=required,
    )
    _check_considered_kinds(ctx, compiled, route.consider is not None)
    _check_provider_only_on_outage(ctx, compiled)
    _check_uncovered_exclusions(ctx, compiled)
    return compiled


def _is_empty(t: RequestTest) -> bool:
    return t.tags is None and _tags_alone(t)


def _tags_alone(t: RequestTest) -> bool:
    """``t`` tests nothing but (perhaps) the request's tags."""
    return (t.models is None and t.tenants is None and t.objectives is None and t.priority is None
            and t.prompt_tokens is None and not t.headers)


def _as_list(value: str | list[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _range(ctx: _Ctx, rule: str, term: str, cmp: Any, duration: bool = False) -> Range:
    gt, lt = cmp.greater_than, cmp.less_than
    if duration:
        gt = parse_duration(gt) if gt is not None else None
        lt = parse_duration(lt) if lt is not None else None
    result = Range(
        greater_than=float(gt) if gt is not None else None,
        less_than=float(lt) if lt is not None else None,
    )
    if result.greater_than is not None and result.less_than is not None and result.greater_than >= result.less_than:
        ctx.warn(
            "EmptyRange", rule, term,
            f"greaterThan {cmp.greater_than} and lessThan {cmp.less_than} leave no value in between, "
            "so this comparison never holds. Did you swap them?",
        )
    return result


def _models(ctx: _Ctx, rule: str, term: str, names: list[str]) -> list[str]:
    """Canonical names; names the pool does not serve stay (they match nothing)."""
    if ctx.pool is None:
        return list(names)
    out = []
    for n in names:
        canonical = ctx.pool.aliases.get(n)
        if canonical is None:
            known = ", ".join(sorted(set(ctx.pool.aliases.values()))) or "none"
            ctx.warn(
                "UnknownModel", rule, term,
                f"no destination serves model {n!r}, so it matches nothing. Served models: {known}.",
            )
            out.append(n)
        else:
            out.append(canonical)
    return out


def _did_you_mean(word: str, choices: Collection[str]) -> str:
    guess = closest(word, choices)
    return f" (did you mean {guess!r}?)" if guess else ""


def _never_holds(term: str) -> str:
    """What a request condition that can never hold does, said where it matters."""
    if ".exclude[" in term:
        return (": this exclusion never applies, so it drops nothing for the requests it was written for "
                "(a PII guard with a misspelt tag keeps no PII from a provider)")
    return ""


def _request_test(ctx: _Ctx, rule: str, term: str, m: r.RequestMatch) -> RequestTest:
    tags = _as_list(m.tag)
    if tags is not None:
        kept = []
        for t in tags:
            if cl.classifier_for_tag(t) is None:
                owner = cl.classifier_for_prefix(t)
                guess = closest(t, cl.TAG_TO_CLASSIFIER)
                if guess is not None and cl.classifier_for_tag(guess).name == "pii":  # type: ignore[union-attr]
                    ctx.pii_typos.append(rule)
                hint = (f"did you mean {guess!r}? " if guess else "") + (
                    f"classifier {owner.name!r} emits only {', '.join(owner.tags)}"
                    if owner
                    else f"no classifier is named {t.split('-', 1)[0]!r}; tags that can occur: "
                    + ", ".join(sorted(cl.TAG_TO_CLASSIFIER))
                )
                ctx.warn(
                    "UnknownTag", rule, f"{term}.tag",
                    f"tag {t!r} can never be present ({hint}); it is removed"
                    + ("" if len(tags) > 1 else ", and the emptied list can never hold" + _never_holds(term)),
                )
            elif t not in kept:
                kept.append(t)
        if tags and not kept and len(tags) > 1:
            ctx.warn("UnknownTag", rule, f"{term}.tag", "every tag was removed: this condition can never hold"
                     + _never_holds(term))
        tags = kept
    models = _as_list(m.model)
    return RequestTest(
        models=_models(ctx, rule, f"{term}.model", models) if models is not None else None,
        tenants=_as_list(m.tenant),
        tags=tags,
        objectives=_as_list(m.objective),
        priority=_range(ctx, rule, f"{term}.priority", m.priority) if m.priority else None,
        prompt_tokens=_range(ctx, rule, f"{term}.promptTokens", m.prompt_tokens) if m.prompt_tokens else None,
        headers=[Header(name=h.name.lower(), value=h.value) for h in (m.headers or [])],
    )


def _names(
    ctx: _Ctx, rule: str, term: str, names: list[str], want: str | None
) -> list[str]:
    """Destination names, minus those no destination of the pool has (or of
    the wrong kind when ``want`` is given)."""
    if ctx.pool is None:
        return list(names)
    kept = []
    for n in names:
        kind = ctx.pool.destinations.get(n)
        if kind is None:
            known = ", ".join(sorted(ctx.pool.destinations)) or "none"
            why = ctx.pool.unresolved.get(n)
            ctx.warn(
                "UnknownDestination", rule, term,
                f"{n!r} is a destination the pool could not resolve ({why}: see the pool's "
                f"unresolvedDestinations); it is removed until it resolves. Destinations: {known}."
                if why is not None else
                f"{n!r} names no destination{_did_you_mean(n, ctx.pool.destinations)}; it is removed. "
                f"Destinations: {known}.",
            )
        elif want is not None and kind != want:
            ctx.warn(
                "UnknownDestination", rule, term,
                f"{n!r} is a {kind} destination but this term selects {want}; it is removed.",
            )
        else:
            kept.append(n)
    if names and not kept and ".drop.backend.names" in term:
        ctx.warn(
            "UnknownDestination", rule, term,
            "every name was removed: this exclusion now drops nothing, so the requests it was meant to keep "
            "from those destinations (PII, for a guard) are not kept from them; correct the name",
        )
    return kept


def _consider(ctx: _Ctx, rule: str, term: str, c: r.ConsiderEntry) -> Consider:
    btype = c.backend.type if c.backend else None
    names = c.backend.names if c.backend else None
    return Consider(
        models=_models(ctx, rule, f"{term}.models.names", c.models.names) if c.models else None,
        backend_type=btype,
        backend_names=_names(ctx, rule, f"{term}.backend.names", names, btype) if names is not None else None,
    )


def _signals(
    ctx: _Ctx, rule: str, term: str, p: r.CandidatePredicate
) -> tuple[list[SignalTest], list[tuple[str, str]]]:
    """Compile the comparisons of a predicate; return them and the dropped
    out-of-range ones as (signal, term)."""
    out: list[SignalTest] = []
    dropped: list[tuple[str, str]] = []
    for attr, signal in WIRE_NAMES.items():
        cmp = getattr(p, attr)
        if cmp is None:
            continue
        sterm = f"{term}.{signal}"
        rng = _range(ctx, rule, sterm, cmp, duration=signal in ("predictedTTFT", "estimatedTTFT"))
        if signal in FRACTION_SIGNALS:
            bad = [v for v in (rng.greater_than, rng.less_than) if v is not None and not 0 <= v <= 1]
            if bad:
                dropped.append((signal, sterm))
                continue
        out.append(SignalTest(signal=signal, range=rng))  # type: ignore[arg-type]
    return out, dropped


def _exclusion(ctx: _Ctx, rule: str, term: str, ex: r.Exclusion) -> CompiledExclusion | None:
    drop = ex.drop
    btype = drop.backend.type if drop.backend else None
    names = drop.backend.names if drop.backend else None
    signals, out_of_range = _signals(ctx, rule, f"{term}.drop", drop)

    for signal, sterm in out_of_range:
        whole = not signals
        ctx.warn(
            "OutOfRange", rule, sterm,
            f"{signal} is a fraction from 0 to 1, so this comparison is meaningless (write 0.9, not 90); "
            + (
                f"exclusion {ex.name!r} is dropped, because without it the exclusion would drop every "
                "candidate it names."
                if whole
                else "the comparison is dropped."
            ),
        )
    if out_of_range and not signals:
        return None

    for s in signals:
        scope = SIGNAL_SCOPE[s.signal]
        if scope is not None and btype != scope:
            ctx.warn(
                "ClassScopedSignal", rule, f"{term}.drop.{s.signal}",
                f"{s.signal} only means something for {scope} candidates, and this exclusion does not "
                f"constrain backend.type to {scope}"
                + (f" (it says {btype})" if btype else "")
                + f"; exclusion {ex.name!r} is dropped and does nothing. Add "
                f"`backend: {{type: {scope}}}` to its drop.",
            )
            return None

    when = _request_test(ctx, rule, f"{term}.if", ex.if_) if ex.if_ is not None else None
    compiled = CompiledExclusion(
        name=ex.name,
        term=term,
        when=when,
        drop=CandidateTest(
            backend_type=btype,
            backend_names=_names(ctx, rule, f"{term}.drop.backend.names", names, btype) if names is not None else None,
            signals=signals,
        ),
        live=bool(signals),
    )
    if _drops_everything(compiled):
        ctx.warn(
            "DropsEverything", rule, f"{term}.drop",
            f"exclusion {ex.name!r} has no `if` and its drop names no backend and no signal, so it drops "
            "every candidate of every request: this rule never picks, and every request it matches meets its "
            "onEmpty. Say what to drop (backend.type, a signal such as queuedPrompts), or give it an `if`.",
        )
    return compiled


def _drops_everything(e: CompiledExclusion) -> bool:
    """No ``if`` and a drop that names nothing: every candidate of every request goes."""
    return e.when is None and e.drop.backend_type is None and e.drop.backend_names is None and not e.drop.signals


def _tier(
    ctx: _Ctx, rule: str, term: str, index: int, tier: r.SelectTier, earlier: list[CompiledTier]
) -> CompiledTier:
    minimize = tier.minimize
    if minimize is not None:
        scope = MINIMIZE_SCOPE[minimize]
        if scope is not None and scope != tier.type:
            ctx.warn(
                "SignalNotForType", rule, f"{term}.minimize",
                f"{minimize} is a {scope} signal but this tier selects {tier.type}; it is defaulted to "
                f"{DEFAULT_TTFT[tier.type]}. Write minimize: {DEFAULT_TTFT[tier.type]} (or InFlight).",
            )
            minimize = DEFAULT_TTFT[tier.type]  # type: ignore[assignment]

    backends = None
    if tier.backends is not None:
        b = tier.backends
        signals, out_of_range = _signals(ctx, rule, f"{term}.backends", b)
        for signal, sterm in out_of_range:
            ctx.warn(
                "OutOfRange", rule, sterm,
                f"{signal} is a fraction from 0 to 1 (write 0.9, not 90); the comparison is dropped.",
            )
        kept = []
        for s in signals:
            scope = SIGNAL_SCOPE[s.signal]
            if scope is not None and scope != tier.type:
                ctx.warn(
                    "ClassScopedSignal", rule, f"{term}.backends.{s.signal}",
                    f"{s.signal} only means something for {scope} candidates and this tier selects "
                    f"{tier.type}; the comparison is dropped.",
                )
            else:
                kept.append(s)
        btype = b.backend.type if b.backend else None
        names = b.backend.names if b.backend else None
        backends = CandidateTest(
            backend_type=btype,
            backend_names=_names(ctx, rule, f"{term}.backends.backend.names", names, tier.type)
            if names is not None
            else None,
            signals=kept,
        )

    order = _names(ctx, rule, f"{term}.order", tier.order, tier.type) if tier.order is not None else None

    unreachable = False
    for prev in earlier:
        if prev.type == tier.type and prev.backends is None and prev.order is None:
            ctx.warn(
                "UnreachableTier", rule, term,
                f"select[{prev.index}] already sees every {tier.type} candidate, so this tier never picks. "
                f"Give select[{prev.index}] a `backends` subset or remove this tier.",
            )
            unreachable = True
            break
    return CompiledTier(
        index=index, term=term, type=tier.type, backends=backends, minimize=minimize,  # type: ignore[arg-type]
        order=order, unreachable=unreachable,
    )


# ------------------------------------------------------------ rule-level checks


def _check_considered_kinds(ctx: _Ctx, rule: CompiledRule, explicit: bool) -> None:
    """``NoTierForConsidered``: a consider entry that is explicit about a kind
    (``backend.type``, or ``backend.names`` naming destinations of it) admits
    candidates no tier selects. An entry that only names models admits
    whatever kinds serve them; it is how the guide narrows by model, and a
    provider it happens to admit is simply not selected, so it is not flagged."""
    if not explicit or rule.consider is None:
        return
    selected = {t.type for t in rule.select}
    admitted: set[str] = set()
    for c in rule.consider:
        if c.backend_type is not None:
            admitted.add(c.backend_type)
        elif c.backend_names and ctx.pool is not None:
            admitted |= {ctx.pool.destinations[n] for n in c.backend_names if n in ctx.pool.destinations}
    for kind in sorted(admitted - selected):
        ctx.warn(
            "NoTierForConsidered", rule.name, f"{rule.term}.route.consider",
            f"consider admits {kind} candidates but no select tier has type: {kind}, so they are never "
            f"picked. Add a tier {{type: {kind}}} or narrow consider with backend.type.",
        )


def _may_consider_local(ctx: _Ctx, rule: CompiledRule) -> bool:
    """``rule``'s ``consider`` can admit a Local candidate: no ``consider``,
    an entry of type Local or with no kind or names, or names of a worker set
    of the pool (unknown without a pool: False, so that nothing is claimed)."""
    if rule.consider is None:
        return True
    for c in rule.consider:
        if c.backend_type == "Local" or (c.backend_type is None and c.backend_names is None):
            return True
        if c.backend_type is None and ctx.pool is not None and \
                any(ctx.pool.destinations.get(n) == "Local" for n in c.backend_names or []):
            return True
    return False


def _check_provider_only_on_outage(ctx: _Ctx, rule: CompiledRule) -> None:
    """Seed 000, "Providers never picked": a Local tier that keeps every local
    candidate, before a Provider tier, with no exclusion that can drop Local
    candidates on a live signal. Not when ``consider`` admits no Local
    candidate: the Provider tier is then the one that picks (by
    ``backend.names``, known only with a pool: the pool's pass judges it)."""
    if not _may_consider_local(ctx, rule):
        return
    local_all = next(
        (t for t in rule.select if t.type == "Local" and t.backends is None and t.order is None), None
    )
    if local_all is None:
        return
    provider = next((t for t in rule.select if t.type == "Provider" and t.index > local_all.index), None)
    if provider is None:
        return
    if any(e.live and e.drop.backend_type in ("Local", None) for e in rule.exclude):
        return
    if any(_drops_everything(e) for e in rule.exclude):
        return  # no tier ever picks: DropsEverything says so
    ctx.warn(
        "ProviderOnlyOnOutage", rule.name, provider.term,
        f"select[{local_all.index}] keeps every Local candidate and no exclusion drops Local candidates "
        "on a live signal, so this Provider tier is reached only when no Local endpoint is ready. To "
        "burst on load, add an exclusion such as {name: drop-busy, drop: {backend: {type: Local}, "
        "queuedPrompts: {greaterThan: 4}}}.",
    )


def _uncovered(tags: list[str]) -> list[cl.ClassifierInfo]:
    """Classifiers some of whose tags are listed, but not their failure tag."""
    out = []
    for name in sorted({cl.TAG_TO_CLASSIFIER[t] for t in tags}):
        info = cl.BUILTIN_CLASSIFIERS[name]
        listed = set(tags) & set(info.tags)
        # Listing only the "clean" tag (pii-none) is safe: a failure is not clean.
        clean = {t for t in info.tags if t.endswith("-none")}
        if info.failure_tag not in listed and listed - clean:
            out.append(info)
    return out


def _check_uncovered_exclusions(ctx: _Ctx, rule: CompiledRule) -> None:
    for e in rule.exclude:
        if e.when is None or not e.when.tags or e.drop.backend_type == "Local":
            continue
        for info in _uncovered(e.when.tags):
            ctx.warn(
                "UncoveredFailureTag", rule.name, f"{e.term}.if.tag",
                f"this condition lists {', '.join(t for t in e.when.tags if t in info.tags)} but not "
                f"{info.failure_tag}, which the {info.name} classifier emits when it fails or misses its "
                f"deadline; such requests can reach a Provider. Add {info.failure_tag} to the list.",
            )


def _kept_tags(rule: CompiledRule) -> set[str]:
    """Classifier tags (not a ``-none``) whose requests ``rule`` keeps in the
    cluster: those its ``matches`` select when it has no Provider tier, and
    those an exclusion bars from every Provider (``if`` a tag test alone,
    ``drop`` every Provider)."""
    def listed(tags: list[str] | None) -> set[str]:
        return {t for t in tags or [] if t in cl.TAG_TO_CLASSIFIER and not t.endswith("-none")}

    kept = set()
    if not any(t.type == "Provider" for t in rule.select):
        kept |= {t for m in rule.matches or [] for t in listed(m.tags)}
    for e in rule.exclude:
        w, d = e.when, e.drop
        if w is not None and _tags_alone(w) and d.backend_type == "Provider" and d.backend_names is None and not d.signals:
            kept |= listed(w.tags)  # type: ignore[union-attr]
    return kept


def _holds_for(m: RequestTest, tag: str) -> bool | None:
    """Whether term ``m`` holds for a request tagged ``tag`` by its
    classifier: False when its tag test cannot (it names other tags of that
    classifier only; a request has one tag per classifier), True when it
    surely does (nothing but a tag test naming ``tag``), None when it may
    (other conditions, or tags of another classifier the request may carry)."""
    if m.tags is not None:
        if not m.tags:
            return False
        mine = cl.TAG_TO_CLASSIFIER.get(tag)
        if tag not in m.tags and all(cl.TAG_TO_CLASSIFIER.get(t) == mine for t in m.tags):
            return False
    return True if _tags_alone(m) and m.tags is not None and tag in m.tags else None


def _check_tagged_fall_through(ctx: _Ctx, rules: list[CompiledRule]) -> None:
    """``TaggedFallThrough``: a rule keeps tagged requests in the cluster
    (:func:`_kept_tags`) but ``onEmpty: FallThrough`` passes those it cannot
    place to the next rules, and one of them that may take them can send them
    to a Provider, before any rule that surely takes them rejects."""
    for i, rule in enumerate(rules):
        if rule.shadowed or rule.on_empty != "FallThrough":
            continue
        leaks: dict[str, list[str]] = {}
        for tag in sorted(_kept_tags(rule)):
            if rule.matches is not None and not any(_holds_for(m, tag) is not False for m in rule.matches):
                continue  # the rule never takes such a request
            for later in rules[i + 1:]:
                if later.shadowed:
                    continue
                holds = [_holds_for(m, tag) for m in later.matches] if later.matches is not None else [True]
                if all(h is False for h in holds):
                    continue
                if any(t.type == "Provider" for t in later.select) and tag not in _kept_tags(later):
                    leaks.setdefault(later.name, []).append(tag)
                    break
                if later.on_empty == "Reject" and any(h is True for h in holds):
                    break  # every such request stops here
        for name, tags in leaks.items():
            ctx.warn(
                "TaggedFallThrough", rule.name, f"{rule.term}.route.onEmpty",
                f"this rule keeps {', '.join(tags)} requests in the cluster only while it picks: with onEmpty: "
                f"FallThrough, those it leaves (every local pod excluded or unready) fall to rule {name!r}, "
                f"which can send them to a Provider. Set onEmpty: Reject to keep them in the cluster.",
            )


def _check_uncovered_matches(ctx: _Ctx, rules: list[CompiledRule]) -> None:
    """A rule that keeps tagged requests local (no Provider tier) whose
    ``matches`` miss the failure tag, while a later rule can reach a Provider."""
    _check_tagged_fall_through(ctx, rules)
    for i, rule in enumerate(rules):
        if rule.matches is None or any(t.type == "Provider" for t in rule.select):
            continue
        later_provider = next((r_ for r_ in rules[i + 1:] if any(t.type == "Provider" for t in r_.select)), None)
        if later_provider is None:
            continue
        for j, m in enumerate(rule.matches):
            for info in _uncovered(m.tags or []):
                ctx.warn(
                    "UncoveredFailureTag", rule.name, f"{rule.term}.matches[{j}].tag",
                    f"this rule keeps {', '.join(t for t in (m.tags or []) if t in info.tags)} requests "
                    f"local but not {info.failure_tag}, which the {info.name} classifier emits when it "
                    f"fails; those requests fall to rule {later_provider.name!r}, which can pick a "
                    f"Provider. Add {info.failure_tag} to the list.",
                )


# ----------------------------------------------------------------- status etc.


def _rule_status(rule: CompiledRule, in_process: Collection[str] = ()) -> RuleStatus:
    infos = [cl.BUILTIN_CLASSIFIERS[n] for n in rule.requires_classifiers]
    path = {i.name: cl.IN_PROCESS if i.name in in_process else cl.SERVICE for i in infos}
    worst = max((i.deadline(path[i.name]) for i in infos), default=0.0)
    return RuleStatus(
        name=rule.name,
        requires_classifiers=list(rule.requires_classifiers),
        worst_case_classifier_latency=format_duration(worst),
        classifier_failure_mode={i.name: i.failure_mode(path[i.name]) for i in infos},
        emittable_tags=sorted(t for i in infos for t in i.tags),
    )
