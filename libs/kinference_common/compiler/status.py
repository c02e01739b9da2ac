"""Status shapes, exactly as the controllers write them to the cluster.

``kinfctl lint -o json`` prints these same Structs, computed by the same code
(:mod:`kinference_common.compiler`), so what lint shows offline is what
``kubectl get -o yaml`` shows once applied.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Struct

from kinference_common.compiled import PoolModel


class _S(Struct, kw_only=True, omit_defaults=True, rename="camel"):
    pass


class Condition(_S, kw_only=True):
    """A Kubernetes ``metav1.Condition``."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class PolicyWarning(_S, kw_only=True, omit_defaults=False):
    """One compilation diagnostic (POLICY.md section 7). Never fatal."""

    code: str
    #: the rule's name, or "" for a policy-level term
    rule: str
    #: where in the spec, e.g. ``rules[0].route.exclude[1]``
    term: str
    message: str


class RuleStatus(_S, kw_only=True, omit_defaults=False):
    name: str
    requires_classifiers: list[str] = msgspec.field(default_factory=list)
    #: the largest deadline among the required classifiers ("0s" when none)
    worst_case_classifier_latency: str = "0s"
    #: classifier -> its built-in behaviour on failure
    classifier_failure_mode: dict[str, str] = msgspec.field(default_factory=dict)
    #: every tag the required classifiers can emit
    emittable_tags: list[str] = msgspec.field(default_factory=list)


class PolicyStatus(_S, kw_only=True, omit_defaults=False):
    rule_count: int = 0
    referenced_by: list[str] = msgspec.field(default_factory=list)
    rules: list[RuleStatus] = msgspec.field(default_factory=list)
    warnings: list[PolicyWarning] = msgspec.field(default_factory=list)
    conditions: list[Condition] = msgspec.field(default_factory=list)
    #: the printer column STATE: Accepted or NotReferenced
    state: str = ""
    #: ``len(warnings)``: the printer column WARNINGS (``-o wide``; a printer column cannot count a list)
    warning_count: int = 0


class UnresolvedDestination(_S, kw_only=True):
    kind: str
    name: str
    reason: Literal["NotFound", "AmbiguousName", "CrossNamespaceNotGranted", "Incomplete"]
    namespace: str | None = None
    selector: dict[str, str] | None = None
    message: str = ""


class ParentReference(_S, kw_only=True):
    group: str
    kind: str
    namespace: str
    name: str
    section_name: str | None = None


class ParentStatus(_S, kw_only=True):
    parent_ref: ParentReference
    controller_name: str
    conditions: list[Condition] = msgspec.field(default_factory=list)


class GieParentReference(_S, kw_only=True):
    """``status.parents[].parentRef`` of an Inference Extension pool (v1)."""

    group: str = "gateway.networking.k8s.io"
    kind: str = "Gateway"
    name: str
    namespace: str | None = None


class GieParentStatus(_S, kw_only=True):
    parent_ref: GieParentReference
    controller_name: str | None = None
    conditions: Annotated[list[Condition], msgspec.Meta(max_length=8)] = msgspec.field(default_factory=list)


class GiePoolStatus(_S, kw_only=True):
    """The Inference Extension pool's status (v1): only ``parents[]``. Each
    controller owns the entries carrying its ``controllerName``."""

    parents: Annotated[list[GieParentStatus], msgspec.Meta(max_length=32)] = msgspec.field(default_factory=list)


class PoolStatus(_S, kw_only=True, omit_defaults=False):
    destination_count: int = 0
    models: list[PoolModel] = msgspec.field(default_factory=list)
    unresolved_destinations: list[UnresolvedDestination] = msgspec.field(default_factory=list)
    parents: list[ParentStatus] = msgspec.field(default_factory=list)
    #: Accepted and ResolvedRefs for the pool itself (also on each parents[] entry)
    conditions: list[Condition] = msgspec.field(default_factory=list)
    #: the printer column STATE: primary token first, then qualifiers, comma-joined
    state: str = ""


class ProviderStatus(_S, kw_only=True):
    conditions: list[Condition] = msgspec.field(default_factory=list)
    #: RESOURCES.md's spelling (camelCase of the rest would make it estimatedTtft)
    estimated_ttft: str | None = msgspec.field(default=None, name="estimatedTTFT")
    error_rate: float | None = None


class AcceptedStatus(_S, kw_only=True):
    """InferenceObjective / InferenceModelRewrite status: condition Accepted."""

    conditions: list[Condition] = msgspec.field(default_factory=list)


class DocumentWarning(_S, kw_only=True):
    """A warning about a document that has no ``warnings`` status field of its
    own (a pool's list-shaped policyRef, an unknown field in a worker set, a
    model name that diverges across destinations). Shown by ``kinfctl lint``."""

    code: str
    kind: str
    namespace: str
    name: str
    path: str
    message: str
    source: str = ""


def condition(
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    now: str | None,
    generation: int | None,
) -> Condition:
    return Condition(
        type=type_,
        status="True" if ok else "False",
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )


def carry_transition_times(old: list[Condition], new: list[Condition]) -> list[Condition]:
    """Keep ``lastTransitionTime`` of conditions whose status did not change,
    as Kubernetes conventions ask; the controllers call this before writing."""
    before = {c.type: c for c in old}
    out = []
    for c in new:
        prev = before.get(c.type)
        if prev is not None and prev.status == c.status and prev.last_transition_time:
            c = msgspec.structs.replace(c, last_transition_time=prev.last_transition_time)
        out.append(c)
    return out
