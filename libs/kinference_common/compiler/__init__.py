"""The policy compiler: a pure library (no I/O beyond reading the files you
name in :func:`compile_paths`).

:func:`compile_documents` takes loaded manifests of any kinds and returns a
:class:`CompileResult`: one :class:`~kinference_common.compiled.CompiledPool`
per valid InferencePool, the status of every policy, pool, provider,
InferenceObjective and InferenceModelRewrite exactly as the controllers write
them, the manifest errors, and the warnings about documents that have no
warnings field of their own. The policy-compiler service and ``kinfctl`` both
call it, so ``kinfctl lint -o json`` prints what the cluster will show.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import msgspec

from kinference_common import API_GROUP
from kinference_common import resources as r
from kinference_common.compiled import (
    CompiledFlowControl,
    CompiledPolicy,
    CompiledPool,
    CompiledRewrite,
    CompiledRoute,
    RewriteTarget,
    RoutePath,
    RouteValueMatch,
)
from kinference_common.compiler import validate
from kinference_common.compiler.gateways import (
    GIE_POOL_KEY,
    PICKER_CONTROLLER,
    ROUTER_CONTROLLER,
    as_kinference_pool,
    outside_pool,
)
from kinference_common.compiler.policy import (
    POOL_DEPENDENT,
    PoolContext,
    compile_policy,
    default_policy,
)
from kinference_common.compiler.pools import Inventory, provider_missing, resolve_pool
from kinference_common.compiler.status import (
    AcceptedStatus,
    DocumentWarning,
    GieParentReference,
    GieParentStatus,
    GiePoolStatus,
    ParentReference,
    ParentStatus,
    PolicyStatus,
    PolicyWarning,
    PoolStatus,
    ProviderStatus,
    condition,
)
from kinference_common.durations import parse_duration
from kinference_common.manifests import (
    Loaded,
    LoadedObject,
    ManifestError,
    SkippedDocument,
    load_paths,
    unknown_field_hints,
)

__all__ = ["CompileResult", "compile_documents", "compile_paths", "ROUTER_CONTROLLER"]

Key = tuple[str, str]  # (namespace, name)


@dataclass
class CompileResult:
    pools: dict[Key, CompiledPool] = field(default_factory=dict)
    policy_status: dict[Key, PolicyStatus] = field(default_factory=dict)
    pool_status: dict[Key, PoolStatus] = field(default_factory=dict)
    #: the Inference Extension pools Kinference serves: their parents[] entries
    #: (only Kinference's controllers'; others' entries are left as they are)
    gie_pool_status: dict[Key, GiePoolStatus] = field(default_factory=dict)
    provider_status: dict[Key, ProviderStatus] = field(default_factory=dict)
    #: (group, namespace, name) -> status, for InferenceObjective / InferenceModelRewrite
    objective_status: dict[tuple[str, str, str], AcceptedStatus] = field(default_factory=dict)
    rewrite_status: dict[tuple[str, str, str], AcceptedStatus] = field(default_factory=dict)
    errors: list[ManifestError] = field(default_factory=list)
    document_warnings: list[DocumentWarning] = field(default_factory=list)
    #: observations that are not warnings (nothing is dropped or defaulted),
    #: e.g. a pool lists a provider its policy never picks
    notes: list[DocumentWarning] = field(default_factory=list)
    skipped: list[SkippedDocument] = field(default_factory=list)
    #: every valid object, by kind then (namespace, name)
    objects: dict[str, dict[Key, LoadedObject]] = field(default_factory=lambda: defaultdict(dict))

    @property
    def warning_count(self) -> int:
        return sum(len(s.warnings) for s in self.policy_status.values()) + len(self.document_warnings)


def compile_paths(paths: Iterable[str | os.PathLike[str]], **kwargs: Any) -> CompileResult:
    """Load the manifests under ``paths`` and compile them."""
    return compile_documents(load_paths(paths), **kwargs)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compile_documents(
    loaded: Iterable[Loaded],
    *,
    now: str | None = None,
    watched_namespaces: Collection[str] | None = None,
    in_process_classifiers: Collection[str] = (),
    services_visible: bool = False,
) -> CompileResult:
    """Compile everything in ``loaded``. Never raises on bad input.

    ``now`` stamps conditions' ``lastTransitionTime`` (default: the current
    time); ``watched_namespaces`` limits what pools may refer to across
    namespaces (the router's scope; None = every namespace);
    ``in_process_classifiers``: classifiers routers run in their own process
    (compiled into each policy; its status shows that path and deadline);
    ``services_visible``: the input holds every Service of the namespaces in
    scope (Kubernetes mode), so an Inference Extension pool's
    ``endpointPickerRef`` is checked against them.
    """
    now = now or _now()
    res = CompileResult()
    if watched_namespaces is not None:
        # The controllers never see objects elsewhere: no status is written for
        # them (seed 000: "RULES blank").
        watched = set(watched_namespaces)
        loaded = [
            item for item in loaded
            if not isinstance(item, LoadedObject) or item.obj.metadata.namespace in watched
            or isinstance(item.obj, r.GatewayClass)  # cluster-scoped
        ]
    _index(res, loaded)
    inv = Inventory(watched_namespaces=watched_namespaces)
    for key, lo in res.objects["InferenceWorkerSet"].items():
        inv.worker_sets[key] = lo.obj  # type: ignore[assignment]
    for key, lo in res.objects["InferenceProvider"].items():
        inv.providers[key] = lo.obj  # type: ignore[assignment]
    for lo in res.objects["ReferenceGrant"].values():
        inv.grants[lo.obj.metadata.namespace].append(lo.obj)  # type: ignore[arg-type]
    for err in res.errors:
        doc = err.document
        if doc.kind in ("InferenceWorkerSet", "InferenceProvider", "InferencePolicy") and doc.name \
                and (doc.namespace or "default", doc.name) not in res.objects[doc.kind]:
            inv.invalid.setdefault((doc.kind, doc.namespace or "default", doc.name),
                                   f"{err.path}: {err.message}" if err.path else err.message)

    _document_unknown_fields(res)
    _provider_statuses(res, now)
    objectives, rewrites = _gie(res, now)
    parents = _route_parents(res, API_GROUP)
    routes = _route_matches(res, API_GROUP)
    gie_parents = _route_parents(res, r.GIE_POOL_GROUP)
    gie_routes = _route_matches(res, r.GIE_POOL_GROUP)

    # Every pool to compile: Kinference's, then the Inference Extension's that
    # name a Kinference policy (docs/kubernetes.md), as Kinference pools.
    entries: list[tuple[Key, LoadedObject, r.InferencePool, r.GieInferencePool | None]] = [
        (key, lo, lo.obj, None) for key, lo in sorted(res.objects["InferencePool"].items())  # type: ignore[misc]
    ]
    for key, lo in sorted(res.objects[GIE_POOL_KEY].items()):
        gpool: r.GieInferencePool = lo.obj  # type: ignore[assignment]
        if not r.is_kinference_gie_pool(gpool):
            continue  # another picker's pool: left alone
        if key in res.objects["InferencePool"]:
            res.document_warnings.append(_doc_warning(
                lo, "PoolNameTaken", "metadata.name",
                f"a {API_GROUP} InferencePool {key[0]}/{key[1]} exists too and is the one compiled and "
                "published; rename one of them. Nothing is written to this pool's status.",
                kind=GIE_POOL_KIND,
            ))
            continue
        tr = as_kinference_pool(gpool)
        for path, message in tr.problems:
            res.document_warnings.append(_doc_warning(lo, "InvalidAnnotation", path, message, kind=GIE_POOL_KIND))
        entries.append((key, lo, tr.pool, gpool))

    # Which pools reference which policy (valid group/kind only).
    referenced_by: dict[Key, list[str]] = defaultdict(list)
    pool_refs: dict[Key, r.PolicyRef | None] = {}
    for key, lo, pool, _gie_pool in entries:
        ref = pool.spec.policy_ref
        if isinstance(ref, list):
            if ref:
                res.document_warnings.append(_doc_warning(
                    lo, "PolicyRefList", "spec.policyRef",
                    "policyRef is an object, not a list; the single entry is used. Write "
                    f"`policyRef: {{name: {ref[0].name}}}`.",
                ))
            ref = ref[0] if ref else None
        pool_refs[key] = ref
        if ref is not None and ref.group == API_GROUP and ref.kind == "InferencePolicy":
            if (key[0], ref.name) in res.objects["InferencePolicy"]:
                referenced_by[(key[0], ref.name)].append(f"{key[0]}/{key[1]}")

    # Each policy alone: its pool-independent warnings and rule statuses.
    alone: dict[Key, Any] = {}
    for key, lo in sorted(res.objects["InferencePolicy"].items()):
        alone[key] = compile_policy(lo.obj, lo.raw, in_process=in_process_classifiers)  # type: ignore[arg-type]
    pool_warnings: dict[Key, list[PolicyWarning]] = defaultdict(list)

    for key, lo, pool, gie_pool in entries:
        resolved = resolve_pool(pool, inv, reach=(lambda ws, g=gie_pool: outside_pool(g, ws)) if gie_pool else None)
        for message in resolved.outside:
            res.document_warnings.append(_doc_warning(lo, "OutsidePoolSelector", "spec.selector", message,
                                                      kind=GIE_POOL_KIND))
        for message in resolved.alias_conflicts:
            res.document_warnings.append(_doc_warning(lo, "AliasConflict", "spec.destinations", message))
        for provider, name, canonical in resolved.divergent_names:
            res.document_warnings.append(_doc_warning(
                lo, "DivergentModelName", "spec.destinations",
                f"provider {provider} serves {name!r}, which worker sets call {canonical!r} (it is their "
                f"alias), so status.models lists them apart. Set the provider's model name: {canonical} "
                f"and upstreamName: {name}.",
            ))
        ref = pool_refs[key]
        qualifiers: list[str] = []
        if resolved.unresolved:
            qualifiers.append("UnresolvedDestinations")
        policy_obj: r.InferencePolicy | None = None
        if ref is not None:
            if ref.group != API_GROUP or ref.kind != "InferencePolicy":
                qualifiers.append("PolicyRefWrongKind")
            elif (key[0], ref.name) not in res.objects["InferencePolicy"]:
                qualifiers.append("PolicyNotFound")
            else:
                policy_obj = res.objects["InferencePolicy"][(key[0], ref.name)].obj  # type: ignore[assignment]

        if policy_obj is not None:
            ctx = PoolContext(
                namespace=key[0],
                name=key[1],
                aliases=resolved.aliases,
                destinations={d.name: d.type for d in resolved.destinations},
                provider_models=frozenset(
                    m.name for d in resolved.destinations if d.type == "Provider" for m in d.models
                ),
                unresolved={u.name: u.reason for u in reversed(resolved.unresolved) if u.name},
            )
            comp = compile_policy(policy_obj, None, ctx, in_process=in_process_classifiers)
            compiled_policy: CompiledPolicy = comp.policy
            pkey = (policy_obj.metadata.namespace, policy_obj.metadata.name)
            pool_warnings[pkey].extend(w for w in comp.warnings if w.code in POOL_DEPENDENT)
        else:
            compiled_policy = default_policy(key[0])

        providers = [d.name for d in resolved.destinations if d.type == "Provider"]
        if providers and not any(t.type == "Provider" for rule in compiled_policy.rules for t in rule.select):
            which = f"policy {compiled_policy.name}" if compiled_policy.name else "the default policy"
            res.notes.append(_doc_warning(
                lo, "ProvidersNeverPicked", "spec.destinations",
                f"{which} has no select tier of type Provider, so {', '.join(providers)} is never picked. "
                "Attach a policy with a {type: Provider} tier, or remove the provider from the pool.",
            ))

        generation = pool.metadata.generation
        primary = "Accepted" if resolved.destinations else "NoDestinations"
        state = ",".join([primary, *qualifiers])
        accepted = condition(
            "Accepted", bool(resolved.destinations), primary,
            f"{len(resolved.destinations)} destination(s) resolved" if resolved.destinations
            else "no destination resolved: nothing to route to",
            now, generation,
        )
        ref_problems = []
        if "PolicyRefWrongKind" in qualifiers:
            ref_problems.append(
                f"policyRef names {ref.group}/{ref.kind}, not {API_GROUP}/InferencePolicy; "  # type: ignore[union-attr]
                "the default policy is used"
            )
        if "PolicyNotFound" in qualifiers:
            ref_problems.append(f"policyRef names {ref.name!r}, {_no_policy(inv, key[0], ref.name)}; "  # type: ignore[union-attr]
                                "the default policy is used (it never reaches a Provider)")
        if resolved.unresolved:
            ref_problems.append(
                f"{len(resolved.unresolved)} destination(s) did not resolve: see unresolvedDestinations"
            )
        resolved_refs = condition(
            "ResolvedRefs", not ref_problems,
            next((q for q in ("PolicyRefWrongKind", "PolicyNotFound", "UnresolvedDestinations") if q in qualifiers),
                 "ResolvedRefs"),
            "; ".join(ref_problems) or "every reference resolved",
            now, generation,
        )
        conditions = [accepted, resolved_refs]
        if gie_pool is None:
            served = _served_parents(res, lo, parents.get(key, []), picker=False)
            res.pool_status[key] = PoolStatus(
                destination_count=len(resolved.destinations),
                models=resolved.models,
                unresolved_destinations=resolved.unresolved,
                parents=[
                    ParentStatus(parent_ref=p, controller_name=controller, conditions=conditions)
                    for p, controller in served
                ],
                conditions=conditions,
                state=state,
            )
        else:
            # no status field of its own says this: warnings (kinfctl lint, Events)
            if "PolicyNotFound" in qualifiers:
                res.document_warnings.append(_doc_warning(
                    lo, "PolicyNotFound", f"metadata.annotations[{r.POLICY_ANNOTATION}]",
                    f"names {ref.name!r}, {_no_policy(inv, key[0], ref.name)}; the default policy "  # type: ignore[union-attr]
                    "is used (it never reaches a Provider)", kind=GIE_POOL_KIND))
            for u in resolved.unresolved:
                res.document_warnings.append(_doc_warning(
                    lo, "UnresolvedDestination", f"metadata.annotations[{r.DESTINATIONS_ANNOTATION}]",
                    f"{u.kind}/{u.name}: {u.reason}: {u.message}", kind=GIE_POOL_KIND))
            served = _served_parents(res, lo, gie_parents.get(key, []), picker=True)
            gie_conditions = _gie_conditions(res, gie_pool, len(resolved.destinations), now, generation,
                                             services_visible)
            res.gie_pool_status[key] = GiePoolStatus(parents=[
                GieParentStatus(
                    parent_ref=GieParentReference(group=p.group, kind=p.kind, name=p.name, namespace=p.namespace),
                    controller_name=controller, conditions=gie_conditions)
                for p, controller in served
            ])

        flow = pool.spec.flow_control
        compiled = CompiledPool(
            namespace=key[0],
            name=key[1],
            destinations=resolved.destinations,
            models=resolved.models,
            aliases=resolved.aliases,
            policy=compiled_policy,
            rewrites=rewrites.get(key, []),
            objectives=objectives.get(key, {}),
            flow_control=CompiledFlowControl(
                max_queue_wait_seconds=parse_duration(flow.max_queue_wait), max_queued=flow.max_queued
            ) if flow else None,
            routes=(routes if gie_pool is None else gie_routes).get(key, []),
        )
        digest = hashlib.sha256(msgspec.json.encode(compiled)).hexdigest()[:16]
        res.pools[key] = msgspec.structs.replace(compiled, revision=digest)

    for key, lo in sorted(res.objects["InferencePolicy"].items()):
        comp = alone[key]
        refs = sorted(referenced_by.get(key, []))
        warnings = list(comp.warnings)
        # A pool-dependent warning the policy already has alone (e.g. a typed
        # consider with no tier) is not repeated per pool.
        alone_terms = {(w.code, w.rule, w.term) for w in warnings}
        seen = {(w.code, w.rule, w.term, w.message) for w in warnings}
        for w in pool_warnings.get(key, []):
            if (w.code, w.rule, w.term) in alone_terms or (w.code, w.rule, w.term, w.message) in seen:
                continue
            seen.add((w.code, w.rule, w.term, w.message))
            warnings.append(w)
        state = "Accepted" if refs else "NotReferenced"
        leaks = sorted({w.rule or w.term for w in warnings if w.code == "UncoveredFailureTag"})
        # seen at a glance (the MESSAGE column of -o wide): a warning that lets PII reach a provider
        leak_note = f"; WARNING: a classifier failure can send PII to a provider (UncoveredFailureTag in " \
            f"{', '.join(leaks)})" if leaks else ""
        falls = sorted({w.rule or w.term for w in warnings if w.code == "TaggedFallThrough"})
        if falls:
            leak_note += (f"; WARNING: tagged requests a rule keeps local can fall through to a provider "
                          f"(TaggedFallThrough in {', '.join(falls)})")
        if comp.pii_typos:
            leak_note += (f"; WARNING: a misspelt pii tag is removed, so a condition about PII does not "
                          f"hold for it (UnknownTag in {', '.join(comp.pii_typos)})")
        res.policy_status[key] = PolicyStatus(
            rule_count=len(comp.policy.rules),
            referenced_by=refs,
            rules=comp.rules,
            warnings=warnings,
            conditions=[condition(
                "Accepted", bool(refs), state,
                (f"in force on {', '.join(refs)}" if refs
                 else "compiled, but no InferencePool names it in spec.policyRef") + leak_note,
                now, lo.obj.metadata.generation,
            )],
            state=state,
            warning_count=len(warnings),
        )
    return res


# ------------------------------------------------------------------- indexing


def _index(res: CompileResult, loaded: Iterable[Loaded]) -> None:
    """Sort documents into errors, skipped and valid objects; check the
    schema rules beyond types (validate.py); reject duplicates."""
    for item in loaded:
        if isinstance(item, ManifestError):
            res.errors.append(item)
            continue
        if isinstance(item, SkippedDocument):
            res.skipped.append(item)
            continue
        obj = item.obj
        problems = validate.problems(obj)
        if problems:
            res.errors.extend(ManifestError(item.document, path, msg) for path, msg in problems)
            continue
        kind = obj.kind
        if kind in ("InferenceObjective", "InferenceModelRewrite"):
            key_kind = f"{kind}/{item.group}"
        else:
            key_kind = kind
        if kind == "InferencePool" and item.group == r.GIE_POOL_GROUP:
            key_kind = GIE_POOL_KEY
        key = (obj.metadata.namespace, obj.metadata.name)
        if isinstance(obj, r.GatewayClass):
            key = ("", obj.metadata.name)  # cluster-scoped
        table = res.objects[key_kind]
        if key in table:
            first = table[key].document
            res.errors.append(ManifestError(
                item.document, "metadata.name",
                f"{kind} {key[0]}/{key[1]} is defined twice; the definition in {first.source}#{first.index} "
                "is used and this one is ignored",
            ))
            continue
        table[key] = item


#: how warnings name an Inference Extension pool (``kinfctl lint``, Events)
GIE_POOL_KIND = f"InferencePool.{r.GIE_POOL_GROUP}"


def _doc_warning(lo: LoadedObject, code: str, path: str, message: str, *, kind: str | None = None) -> DocumentWarning:
    return DocumentWarning(
        code=code, kind=kind or lo.obj.kind, namespace=lo.obj.metadata.namespace, name=lo.obj.metadata.name,
        path=path, message=message, source=str(lo.document.source) + f"#{lo.document.index}",
    )


def _no_policy(inv: Inventory, namespace: str, name: str) -> str:
    """Why a policyRef found no policy: none of that name, or one that is invalid."""
    why = inv.invalid.get(("InferencePolicy", namespace, name))
    if why is not None:
        return f"an InferencePolicy in {namespace} that is invalid ({why}) and applies once fixed"
    return f"which is no InferencePolicy in {namespace}"


def _document_unknown_fields(res: CompileResult) -> None:
    """Unknown fields in documents other than policies (whose go to the
    policy's own status as UnknownField)."""
    for kind, table in list(res.objects.items()):
        # a Service or Gateway is read for a few fields only: the rest is not ours to judge
        if kind in ("InferencePolicy", "Service", "Gateway", "GatewayClass"):
            continue
        for lo in table.values():
            for path, hint in unknown_field_hints(lo.raw, type(lo.obj)):
                parent, _, name = path.rpartition(".")
                where = f"`{parent}` of {lo.obj.kind}" if parent else lo.obj.kind
                res.document_warnings.append(_doc_warning(
                    lo, "UnknownField", path,
                    f"{name!r} is not a field of {where}; the API server drops it{hint}",
                ))


def _provider_statuses(res: CompileResult, now: str) -> None:
    for key, lo in sorted(res.objects["InferenceProvider"].items()):
        missing = provider_missing(lo.obj)  # type: ignore[arg-type]
        res.provider_status[key] = ProviderStatus(conditions=[condition(
            "Ready", not missing, "Incomplete" if missing else "Configured",
            f"missing {', '.join(missing)}" if missing else "configuration complete",
            now, lo.obj.metadata.generation,
        )])


def _route_parents(res: CompileResult, group: str) -> dict[Key, list[ParentReference]]:
    """HTTPRoutes whose backendRefs name a pool of ``group``: each route's parentRefs."""
    out: dict[Key, list[ParentReference]] = defaultdict(list)
    for (ns, _), lo in sorted(res.objects["HTTPRoute"].items()):
        route: r.HTTPRoute = lo.obj  # type: ignore[assignment]
        pools = {
            (b.namespace or ns, b.name)
            for rule in route.spec.rules
            for b in rule.backend_refs
            if b.group == group and b.kind == "InferencePool"
        }
        for pool_key in sorted(pools):
            for p in route.spec.parent_refs:
                ref = ParentReference(
                    group=p.group, kind=p.kind, namespace=p.namespace or ns, name=p.name,
                    section_name=p.section_name,
                )
                if ref not in out[pool_key]:
                    out[pool_key].append(ref)
    return out


def _served_parents(
    res: CompileResult, lo: LoadedObject, refs: list[ParentReference], *, picker: bool
) -> list[tuple[ParentReference, str]]:
    """The parents among ``refs`` Kinference writes an entry for, each with
    the controllerName it writes under: a Gateway that exists and whose
    GatewayClass names :data:`ROUTER_CONTROLLER` (the router implements it);
    with ``picker`` (an Inference Extension pool Kinference picks for) also
    any other existing Gateway, under :data:`PICKER_CONTROLLER`. A parent
    Kinference does not serve gets a warning on the pool saying why."""
    kind = GIE_POOL_KIND if picker else None
    out: list[tuple[ParentReference, str]] = []
    for p in refs:
        where = f"parent {p.kind} {p.namespace}/{p.name}"
        if p.group != r.GATEWAY_GROUP or p.kind != "Gateway":
            res.document_warnings.append(_doc_warning(
                lo, "ParentNotServed", "status.parents",
                f"{where}: only a {r.GATEWAY_GROUP} Gateway can be a parent; no entry is written", kind=kind))
            continue
        gw_lo = res.objects["Gateway"].get((p.namespace, p.name))
        if gw_lo is None:
            res.document_warnings.append(_doc_warning(
                lo, "ParentNotFound", "status.parents",
                f"an HTTPRoute names Gateway {p.namespace}/{p.name}, which does not exist: nothing accepted "
                "this pool there and no parents[] entry is written", kind=kind))
            continue
        gw: r.Gateway = gw_lo.obj  # type: ignore[assignment]
        cls_lo = res.objects["GatewayClass"].get(("", gw.spec.gateway_class_name))
        controller = cls_lo.obj.spec.controller_name if cls_lo is not None else None  # type: ignore[union-attr]
        if controller == ROUTER_CONTROLLER:
            out.append((p, ROUTER_CONTROLLER))
        elif picker:
            out.append((p, PICKER_CONTROLLER))
        else:
            res.document_warnings.append(_doc_warning(
                lo, "ParentNotServed", "status.parents",
                f"Gateway {p.namespace}/{p.name} is implemented by "
                f"{controller or f'GatewayClass {gw.spec.gateway_class_name} (not found)'}, which cannot send "
                f"to a {API_GROUP} InferencePool: no parents[] entry is written. Use an "
                f"{r.GIE_POOL_GROUP} InferencePool with Kinference's endpoint picker, or the router's "
                "Service as the route's backend (docs/kubernetes.md)"))
    return out


def _gie_conditions(
    res: CompileResult, pool: r.GieInferencePool, destinations: int, now: str, generation: int | None,
    services_visible: bool,
) -> list[Any]:
    """``Accepted`` and ``ResolvedRefs`` of an Inference Extension pool's
    parents[] entry, with the reasons that API defines."""
    ref = pool.spec.endpoint_picker_ref
    ns = pool.metadata.namespace
    if ref is None:
        accepted = condition(
            "Accepted", False, "EndpointPickerRefMissing",
            "spec.endpointPickerRef is not set: a gateway has no endpoint picker to call; point it at "
            "Kinference's endpoint picker Service", now, generation)
    else:
        accepted = condition(
            "Accepted", True, "Accepted",
            f"Kinference's endpoint picker serves this pool ({destinations} destination(s)"
            + ("; every request is answered 503" if not destinations else "") + ")", now, generation)
    problem = None
    if ref is not None:
        if ref.group != "" or ref.kind != "Service":
            problem = f"endpointPickerRef names {ref.group or 'core'}/{ref.kind}; only a Service is supported"
        elif services_visible:
            svc_lo = res.objects["Service"].get((ns, ref.name))
            svc: r.Service | None = svc_lo.obj if svc_lo is not None else None  # type: ignore[assignment]
            if svc is None:
                problem = f"Service {ns}/{ref.name} named by endpointPickerRef does not exist"
            elif svc.spec.type == "ExternalName":
                problem = f"Service {ns}/{ref.name} is of type ExternalName, which an endpoint picker may not be"
            elif ref.port is not None and ref.port.number not in [p.port for p in svc.spec.ports]:
                problem = f"Service {ns}/{ref.name} has no port {ref.port.number}"
    resolved = condition(
        "ResolvedRefs", problem is None, "InvalidExtensionRef" if problem else "ResolvedRefs",
        problem or ("every reference resolved" if ref is not None else "no endpointPickerRef to resolve"),
        now, generation)
    return [accepted, resolved]


_PATH_TYPES = ("Exact", "PathPrefix", "RegularExpression")


def _route_matches(res: CompileResult, group: str) -> dict[Key, list[CompiledRoute]]:
    """For each pool, the HTTPRoutes whose rules name it as a backendRef,
    with their hostnames and the path matches of those rules (a router
    serving several pools picks the pool by them)."""
    out: dict[Key, list[CompiledRoute]] = defaultdict(list)
    for (ns, name), lo in sorted(res.objects["HTTPRoute"].items()):
        route: r.HTTPRoute = lo.obj  # type: ignore[assignment]
        paths: dict[Key, list[RoutePath]] = defaultdict(list)
        for rule in route.spec.rules:
            pools = {(b.namespace or ns, b.name) for b in rule.backend_refs
                     if b.group == group and b.kind == "InferencePool"}
            if not pools:
                continue
            # a match of a path type Gateway API does not define matches nothing
            rule_paths = [
                RoutePath(type=m.path.type if m.path else "PathPrefix",  # type: ignore[arg-type]
                          value=(m.path.value or "/") if m.path else "/", method=m.method,
                          headers=[RouteValueMatch(name=h.name.lower(), value=h.value, type=h.type)  # type: ignore[arg-type]
                                   for h in m.headers],
                          query_params=[RouteValueMatch(name=q.name, value=q.value, type=q.type)  # type: ignore[arg-type]
                                        for q in m.query_params])
                for m in rule.matches if (m.path is None or m.path.type in _PATH_TYPES)
                and all(v.type in ("Exact", "RegularExpression") for v in (*m.headers, *m.query_params))
            ] if rule.matches else [RoutePath()]
            for pool_key in pools:
                paths[pool_key].extend(p for p in rule_paths if p not in paths[pool_key])
        for pool_key, pool_paths in sorted(paths.items()):
            out[pool_key].append(CompiledRoute(
                route=f"{ns}/{name}", hostnames=list(route.spec.hostnames), paths=pool_paths,
            ))
    return out


# ---------------------------------------------- Inference Extension (seed 003)


def _gie(
    res: CompileResult, now: str
) -> tuple[dict[Key, dict[str, int]], dict[Key, list[CompiledRewrite]]]:
    """InferenceObjective and InferenceModelRewrite, in both API groups
    (``llm-d.ai`` wins a name clash). Only objects whose poolRef names a pool
    of our group are used and get a status; others are left alone."""
    objectives: dict[Key, dict[str, int]] = defaultdict(dict)
    rewrites: dict[Key, list[tuple[tuple[Any, ...], CompiledRewrite]]] = defaultdict(list)
    pools = res.objects["InferencePool"]
    gie_pools = {k for k, lo in res.objects[GIE_POOL_KEY].items()
                 if r.is_kinference_gie_pool(lo.obj) and k not in pools}  # type: ignore[arg-type]

    for kind, status_table in (("InferenceObjective", res.objective_status),
                               ("InferenceModelRewrite", res.rewrite_status)):
        by_name: dict[Key, dict[str, LoadedObject]] = defaultdict(dict)
        for group in r.GIE_GROUPS:
            for key, lo in res.objects.get(f"{kind}/{group}", {}).items():
                by_name[key][group] = lo
        for key, variants in sorted(by_name.items()):
            for group, lo in sorted(variants.items()):
                obj = lo.obj
                ref = obj.spec.pool_ref  # type: ignore[union-attr]
                gie_ref = ref.group == r.GIE_POOL_GROUP and ref.kind == "InferencePool" and \
                    (key[0], ref.name) in gie_pools
                if ref.group != API_GROUP and not gie_ref:
                    continue  # another implementation's object: left alone
                gen = obj.metadata.generation
                skey = (group, key[0], key[1])
                if group != "llm-d.ai" and "llm-d.ai" in variants and \
                        variants["llm-d.ai"].obj.spec.pool_ref.group in (API_GROUP, r.GIE_POOL_GROUP):  # type: ignore[union-attr]
                    status_table[skey] = AcceptedStatus(conditions=[condition(
                        "Accepted", False, "Superseded",
                        f"{kind} {key[0]}/{key[1]} also exists in llm-d.ai, which is used", now, gen)])
                    continue
                pool_key = (key[0], ref.name)
                if not gie_ref and (ref.kind != "InferencePool" or pool_key not in pools):
                    status_table[skey] = AcceptedStatus(conditions=[condition(
                        "Accepted", False, "PoolNotFound",
                        f"poolRef names {ref.kind} {ref.name}, which is no InferencePool in {key[0]}",
                        now, gen)])
                    continue
                if isinstance(obj, r.InferenceObjective):
                    objectives[pool_key][key[1]] = obj.spec.priority or 0
                    status_table[skey] = AcceptedStatus(conditions=[condition(
                        "Accepted", True, "Accepted", f"priority {obj.spec.priority or 0} on pool {ref.name}",
                        now, gen)])
                    continue
                assert isinstance(obj, r.InferenceModelRewrite)
                bad = [
                    i for i, rule in enumerate(obj.spec.rules)
                    if len({t.weight is None for t in rule.targets}) > 1
                ]
                if bad:
                    status_table[skey] = AcceptedStatus(conditions=[condition(
                        "Accepted", False, "InvalidWeights",
                        f"rules[{bad[0]}] sets a weight on some targets but not all; if any target has a "
                        "weight, all must. Nothing of this resource is applied.", now, gen)])
                    continue
                status_table[skey] = AcceptedStatus(conditions=[condition(
                    "Accepted", True, "Accepted", f"{len(obj.spec.rules)} rule(s) on pool {ref.name}",
                    now, gen)])
                created = obj.metadata.creation_timestamp or "9999"
                for i, rule in enumerate(obj.spec.rules):
                    targets = [RewriteTarget(model=t.model_rewrite, weight=t.weight or 1) for t in rule.targets]
                    source = f"{group} {key[0]}/{key[1]} rules[{i}]"
                    models = [m.model.value for m in rule.matches if m.model is not None]
                    if not models:
                        rewrites[pool_key].append(
                            ((1, created, key, i), CompiledRewrite(source=source, match_model=None, targets=targets)))
                    for model in models:
                        rewrites[pool_key].append(
                            ((0, created, key, i), CompiledRewrite(source=source, match_model=model, targets=targets)))
    ordered = {k: [rw for _, rw in sorted(v, key=lambda x: x[0])] for k, v in rewrites.items()}
    return objectives, ordered


def object_key(kind: str, group: str = API_GROUP) -> str:
    """The key of :attr:`CompileResult.objects` for a kind."""
    return f"{kind}/{group}" if kind in ("InferenceObjective", "InferenceModelRewrite") else kind

