"""The request as a policy sees it (POLICY.md section 1), and request tests.

The router builds one :class:`Request` per inference request
(:func:`engine_request`, from the body :mod:`kinference_common.request_body`
parsed), after the InferenceModelRewrite and the objective lookup; the
engine never parses bodies, and ``kinfctl explain`` builds its request the
same way. ``tags`` are whatever the classifiers emitted (their
failure tags when they failed); :func:`required_classifiers` says which
classifiers to ask before deciding.

Request tests (a ``matches`` entry, an exclusion's ``if``) are compiled once
per snapshot into small closures (:func:`compile_request_test`), so a
decision only calls them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msgspec import Struct

from kinference_common.classifiers import BUILTIN_CLASSIFIERS, classifier_for_prefix
from kinference_common.compiled import (
    CompiledPolicy,
    CompiledPool,
    CompiledRule,
    Range,
    RequestTest,
)

from .tokens import ESTIMATE_MARGIN, estimate_prompt_tokens, prompt_block_hashes

if TYPE_CHECKING:
    from kinference_common.request_body import ParsedBody

#: the headers that name a request's InferenceObjective
OBJECTIVE_HEADERS = ("x-gateway-inference-objective", "x-llm-d-inference-objective")


class Request(Struct, kw_only=True):
    """One inference request, as the policy sees it."""

    #: the model the policy sees: after InferenceModelRewrite; aliases are
    #: resolved by the engine with the pool's aliases
    model: str
    #: the ``model`` of the client's body (defaults to ``model``)
    requested_model: str | None = None
    tenant: str = "anonymous"
    #: InferenceObjective name from ``x-gateway-inference-objective``
    objective: str | None = None
    priority: int = 0
    #: estimated prompt size (:func:`kinference_common.engine.tokens.estimate_tokens`)
    prompt_tokens: int | None = None
    #: ``max_tokens`` / ``max_completion_tokens`` when the body gives one
    max_tokens: int | None = None
    #: the estimate of the longest sequence the engine must hold, when it is
    #: not ``prompt_tokens``: a completions body with several prompts is a
    #: batch, each prompt its own sequence
    context_tokens: int | None = None
    #: request headers, names lower-cased
    headers: dict[str, str] = {}
    #: tags emitted by classifiers (failure tags included)
    tags: frozenset[str] = frozenset()
    #: chained hashes of the prompt's blocks (:func:`.tokens.block_hashes`)
    block_hashes: tuple[int, ...] = ()

    @property
    def sequence_tokens(self) -> int | None:
        """The estimate of the longest sequence the engine must hold."""
        return self.context_tokens if self.context_tokens is not None else self.prompt_tokens

    def context_need(self, *, sure: bool = False) -> int | None:
        """Tokens of context the request needs: its longest sequence's
        estimate plus ``max_tokens``, or plus one token without it (an engine
        then writes until the window is full, but the prompt must leave room
        for one, as vLLM checks); None without a prompt estimate. With
        ``sure``, what it surely needs: the estimate taken
        :data:`.tokens.ESTIMATE_MARGIN` too high (the router refuses a
        request for its length only when even that does not fit)."""
        tokens = self.sequence_tokens
        if tokens is None:
            return None
        if sure:
            tokens = int(tokens / (1.0 + ESTIMATE_MARGIN))
        return tokens + (self.max_tokens if self.max_tokens is not None else 1)


#: ``(request, canonical model) -> bool``
RequestPredicate = Callable[[Request, str], bool]


def _range_holds(r: Range, value: float | None) -> bool:
    return r.holds(value)


def compile_request_test(test: RequestTest, *, ignore_tags: bool = False) -> RequestPredicate:
    """A closure that says whether ``test`` holds for a request.

    Every present field must hold; list fields: None = no constraint, [] =
    never holds. ``ignore_tags`` treats the tag term as holding (used to find
    which classifiers a request needs, POLICY.md section 6).
    """
    checks: list[RequestPredicate] = []
    if test.models is not None:
        models = frozenset(test.models)
        checks.append(lambda req, model: model in models)
    if test.tenants is not None:
        tenants = frozenset(test.tenants)
        checks.append(lambda req, model: req.tenant in tenants)
    if test.tags is not None and not ignore_tags:
        tags = frozenset(test.tags)
        checks.append(lambda req, model: not tags.isdisjoint(req.tags))
    if test.objectives is not None:
        objectives = frozenset(test.objectives)
        checks.append(lambda req, model: req.objective in objectives)
    if test.priority is not None:
        prio = test.priority
        checks.append(lambda req, model: prio.holds(req.priority))
    if test.prompt_tokens is not None:
        pt = test.prompt_tokens
        checks.append(lambda req, model: pt.holds(req.prompt_tokens))
    if test.headers:
        wanted = tuple((h.name.lower(), h.value) for h in test.headers)
        checks.append(lambda req, model: all(req.headers.get(n) == v for n, v in wanted))
    if not checks:
        return lambda req, model: True
    if len(checks) == 1:
        return checks[0]
    frozen = tuple(checks)
    return lambda req, model: all(check(req, model) for check in frozen)


def compile_matches(
    matches: list[RequestTest] | None, *, ignore_tags: bool = False
) -> RequestPredicate:
    """A rule's ``matches``: any entry holds; None = catch-all; [] = never."""
    if matches is None:
        return lambda req, model: True
    tests = tuple(compile_request_test(m, ignore_tags=ignore_tags) for m in matches)
    if len(tests) == 1:
        return tests[0]
    return lambda req, model: any(t(req, model) for t in tests)


def rule_classifiers(rule: CompiledRule) -> list[str]:
    """The classifiers a rule requires: the compiler's ``requiresClassifiers``,
    plus those named by tag prefixes in its ``matches`` and exclusions' ``if``
    (so a hand-built rule without the field still asks for them)."""
    names: list[str] = list(rule.requires_classifiers)
    tests = list(rule.matches or []) + [e.when for e in rule.exclude if e.when is not None]
    for t in tests:
        for tag in t.tags or []:
            info = classifier_for_prefix(tag)
            if info is not None and info.name not in names:
                names.append(info.name)
    return [n for n in names if n in BUILTIN_CLASSIFIERS]


def required_classifiers(
    policy: CompiledPolicy, request: Request, aliases: dict[str, str] | None = None
) -> list[str]:
    """The classifiers to ask for ``request`` (before its tags are known).

    A request pays for a classifier only if some rule whose non-tag terms
    hold for it requires that classifier (POLICY.md section 6). Shadowed
    rules never fire and require nothing. Order: first rule first.
    """
    model = (aliases or {}).get(request.model, request.model)
    out: list[str] = []
    for rule in policy.rules:
        if rule.shadowed:
            continue
        needed = rule_classifiers(rule)
        if not needed or all(n in out for n in needed):
            continue
        if compile_matches(rule.matches, ignore_tags=True)(request, model):
            out.extend(n for n in needed if n not in out)
    return out


def apply_rewrite(pool: CompiledPool, model: str, rng: random.Random) -> str | None:
    """The pool's InferenceModelRewrite for ``model``: the target drawn by
    weight (weight / sum of weights), or None when no rule applies.

    ``pool.rewrites`` is in precedence order; an exact match beats a generic
    rule (RESOURCES.md). Targets without weights are equally likely.
    """
    if not pool.rewrites:  # the common case: nothing to search, no draw
        return None
    chosen = next((r for r in pool.rewrites if r.match_model == model), None)
    if chosen is None:
        chosen = next((r for r in pool.rewrites if r.match_model is None), None)
    if chosen is None or not chosen.targets:
        return None
    weights = [max(t.weight, 0) for t in chosen.targets]
    total = sum(weights)
    if total <= 0:
        return chosen.targets[rng.randrange(len(chosen.targets))].model
    x = rng.random() * total
    for t, w in zip(chosen.targets, weights):
        x -= w
        if x < 0:
            return t.model
    return chosen.targets[-1].model


def engine_request(snap: Any, headers: Mapping[str, str], body: ParsedBody, tenant: str,
                   rng: random.Random, prefix_key: bytes | None = None) -> Request:
    """The engine's view of one request (pure) on ``snap`` (a Snapshot): the
    model after any InferenceModelRewrite, the objective's priority (0 when
    the pool has no such objective), the prompt-token estimate, the prompt's
    block hashes (keyed with ``prefix_key``) and the headers, whose names
    are lower-cased already (as the router's HTTP server gives them)."""
    rewritten = apply_rewrite(snap.pool, body.model, rng) or body.model
    objective = next((headers[h] for h in OBJECTIVE_HEADERS if h in headers), None)
    priority = snap.pool.objectives.get(objective, 0) if objective is not None else 0
    return Request(
        model=rewritten,
        requested_model=body.model,
        tenant=tenant,
        objective=objective,
        priority=priority,
        prompt_tokens=estimate_prompt_tokens(body.texts),
        max_tokens=body.max_tokens,
        context_tokens=_batch_longest(body.fields.prompt) if body.fields.messages is None else None,
        headers=dict(headers),
        block_hashes=prompt_block_hashes(body.texts, key=prefix_key),
    )


def _batch_longest(prompt: Any) -> int | None:
    """The longest prompt's estimate of a completions batch (a list of
    several prompts: texts, or token ids); None for one prompt."""
    if not isinstance(prompt, list) or len(prompt) < 2:
        return None
    if all(isinstance(p, int) for p in prompt):  # one prompt, as token ids
        return None
    return max((estimate_prompt_tokens([p], 0) if isinstance(p, str) else len(p) if isinstance(p, list) else 0)
               for p in prompt)
