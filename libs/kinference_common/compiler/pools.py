"""Pool resolution: seed 002 and RESOURCES.md ("Pool resolution"), made precise.

:func:`resolve_pool` turns an InferencePool's ``destinations`` into resolved
:class:`~kinference_common.compiled.Destination` values plus the entries that
did not resolve, each with its reason:

- ``NotFound``: no object of that kind and name (or no object matching the
  selector) in the target namespace, or a group other than ours;
- ``AmbiguousName``: two resolved destinations share a name (of different
  kinds, as the seed says; also of one kind in two namespaces, since a policy
  names destinations by name alone and could not tell them apart): every one
  of them is unresolved;
- ``CrossNamespaceNotGranted``: another namespace without a ReferenceGrant
  there from this pool's namespace, or outside the namespaces the router
  watches;
- ``Incomplete``: no ``kind``, neither ``name`` nor ``selector``, a
  provider missing ``url``, ``auth.secretRef`` or ``models``, or an object
  named that exists but is invalid (its own error, which the message
  repeats: a wrong type, a bad duration; not "no such object"), or a
  selector with no label (it would take every object of the kind in the
  namespace: a typo such as ``matchLabel`` leaves it empty).

An empty (or absent) ``destinations`` is every InferenceWorkerSet in the
pool's namespace and no provider.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from kinference_common import API_GROUP
from kinference_common import resources as r
from kinference_common.compiled import (
    Destination,
    PoolModel,
    ProviderSettings,
    SecretRef,
    ServedModel,
)
from kinference_common.compiler.status import UnresolvedDestination
from kinference_common.durations import parse_duration

WORKER_SET = "InferenceWorkerSet"
PROVIDER = "InferenceProvider"


@dataclass
class Inventory:
    """Every valid object of the input, indexed for resolution."""

    worker_sets: dict[tuple[str, str], r.InferenceWorkerSet] = field(default_factory=dict)
    providers: dict[tuple[str, str], r.InferenceProvider] = field(default_factory=dict)
    grants: dict[str, list[r.ReferenceGrant]] = field(default_factory=lambda: defaultdict(list))
    #: namespaces the router can see; None = all
    watched_namespaces: Collection[str] | None = None
    #: (kind, namespace, name) -> why an object of the input is invalid (the
    #: first of its errors): a destination naming it says so, not "no such object"
    invalid: dict[tuple[str, str, str], str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> dict[tuple[str, str], r.InferenceWorkerSet | r.InferenceProvider]:
        return self.worker_sets if kind == WORKER_SET else self.providers  # type: ignore[return-value]

    def granted(self, target_ns: str, from_ns: str, kind: str, name: str | None) -> bool:
        """A ReferenceGrant in ``target_ns`` lets pools of ``from_ns`` refer to
        ``kind`` (and ``name``, when the grant names one; a selector needs a
        grant for the whole kind)."""
        for grant in self.grants.get(target_ns, []):
            if not any(
                f.group == API_GROUP and f.kind == "InferencePool" and f.namespace == from_ns
                for f in grant.spec.from_
            ):
                continue
            for to in grant.spec.to:
                if to.group == API_GROUP and to.kind == kind and (to.name is None or to.name == name):
                    return True
        return False


@dataclass
class ResolvedPool:
    destinations: list[Destination]
    unresolved: list[UnresolvedDestination]
    models: list[PoolModel]
    #: accepted model name (canonical or alias) -> canonical
    aliases: dict[str, str]
    #: messages for aliases that could not be honoured
    alias_conflicts: list[str]
    #: (provider, model it names, canonical name) where a provider names a
    #: worker set's alias instead of its canonical name (seed 002 diagnosis:
    #: "A model shows one servedBy entry, not two")
    divergent_names: list[tuple[str, str, str]]
    #: worker sets left out because the pool could not reach their pods
    #: (an Inference Extension pool's selector/targetPorts), each with why
    outside: list[str] = field(default_factory=list)


def provider_missing(p: r.InferenceProvider) -> list[str]:
    """Required provider fields that are missing (RESOURCES.md)."""
    missing = []
    if not p.spec.url:
        missing.append("spec.url")
    if p.spec.auth is None or p.spec.auth.secret_ref is None:
        missing.append("spec.auth.secretRef")
    if not p.spec.models:
        missing.append("spec.models")
    return missing


def _destination(obj: r.InferenceWorkerSet | r.InferenceProvider) -> Destination:
    if isinstance(obj, r.InferenceWorkerSet):
        m = obj.spec.model
        return Destination(
            type="Local",
            name=obj.metadata.name,
            namespace=obj.metadata.namespace,
            models=[
                ServedModel(
                    name=m.name,
                    served_name=m.served_name or m.name,
                    context_window=m.context_window,
                    aliases=list(m.aliases),
                )
            ],
            selector=dict(obj.spec.selector.match_labels),
            port=obj.spec.port,
            engine=obj.spec.engine,
        )
    spec = obj.spec
    assert spec.url and spec.auth and spec.auth.secret_ref and spec.models
    timeouts = spec.timeouts or r.ProviderTimeouts()
    limits = spec.limits or r.ProviderLimits()
    return Destination(
        type="Provider",
        name=obj.metadata.name,
        namespace=obj.metadata.namespace,
        models=[
            ServedModel(name=m.name, served_name=m.upstream_name or m.name, context_window=m.context_window)
            for m in spec.models
        ],
        provider=ProviderSettings(
            url=spec.url,
            secret_ref=SecretRef(name=spec.auth.secret_ref.name, key=spec.auth.secret_ref.key),
            max_concurrency=limits.max_concurrency,
            requests_per_minute=limits.requests_per_minute,
            connect_timeout_seconds=parse_duration(timeouts.connect) if timeouts.connect else None,
            first_token_timeout_seconds=parse_duration(timeouts.first_token) if timeouts.first_token else None,
        ),
    )


def resolve_pool(
    pool: r.InferencePool, inv: Inventory,
    reach: Callable[[r.InferenceWorkerSet], str | None] | None = None,
) -> ResolvedPool:
    """``reach``: why a worker set's pods are out of the pool's reach (None:
    in reach); such a worker set is left out (see :attr:`ResolvedPool.outside`)."""
    ns = pool.metadata.namespace
    found: list[tuple[str, r.InferenceWorkerSet | r.InferenceProvider]] = []
    unresolved: list[UnresolvedDestination] = []

    def fail(kind: str, name: str, reason: str, message: str, *, namespace: str | None = None,
             selector: dict[str, str] | None = None) -> None:
        unresolved.append(
            UnresolvedDestination(
                kind=kind, name=name, reason=reason, namespace=namespace,  # type: ignore[arg-type]
                selector=selector, message=message,
            )
        )

    entries = pool.spec.destinations
    if not entries:
        for (wns, _), ws in sorted(inv.worker_sets.items()):
            if wns == ns:
                found.append((WORKER_SET, ws))
    else:
        for i, d in enumerate(entries):
            name = d.name or ""
            sel = dict(d.selector.match_labels) if d.selector is not None else None
            if d.kind is None:
                fail("", name, "Incomplete", f"destinations[{i}] has no kind: write kind: InferenceWorkerSet or InferenceProvider", selector=sel)
                continue
            if d.group != API_GROUP:
                fail(d.kind, name, "NotFound", f"destinations[{i}]: group {d.group!r} is not {API_GROUP}", selector=sel)
                continue
            target_ns = d.namespace or ns
            if target_ns != ns:
                if inv.watched_namespaces is not None and target_ns not in inv.watched_namespaces:
                    fail(d.kind, name, "CrossNamespaceNotGranted",
                         f"namespace {target_ns} is outside the namespaces the router watches",
                         namespace=target_ns, selector=sel)
                    continue
                if not inv.granted(target_ns, ns, d.kind, d.name):
                    fail(d.kind, name, "CrossNamespaceNotGranted",
                         f"no ReferenceGrant in namespace {target_ns} allows InferencePool in {ns} "
                         f"to refer to {d.kind}{' ' + d.name if d.name else ''}",
                         namespace=target_ns, selector=sel)
                    continue
            objects = inv.of_kind(d.kind)
            if d.name is not None:
                obj = objects.get((target_ns, d.name))
                if obj is None:
                    why = inv.invalid.get((d.kind, target_ns, d.name))
                    if why is not None:
                        fail(d.kind, name, "Incomplete",
                             f"{d.kind} {target_ns}/{d.name} is invalid ({why}); it resolves once fixed",
                             namespace=d.namespace)
                    else:
                        fail(d.kind, name, "NotFound", f"no {d.kind} {target_ns}/{d.name}",
                             namespace=d.namespace)
                    continue
                matched = [obj]
            elif d.selector is not None and not d.selector.match_labels:
                fail(d.kind, "", "Incomplete",
                     f"destinations[{i}]: the selector names no label, so it would take every {d.kind} in "
                     f"{target_ns} (`matchLabel` for `matchLabels`?); give matchLabels, or name the destination",
                     namespace=d.namespace, selector={})
                continue
            elif d.selector is not None:
                matched = [
                    o for (ons, _), o in sorted(objects.items())
                    if ons == target_ns and r.selector_matches(d.selector, o.metadata.labels)
                ]
                if not matched:
                    fail(d.kind, "", "NotFound", f"no {d.kind} in {target_ns} matches the selector",
                         namespace=d.namespace, selector=sel)
                    continue
            else:
                fail(d.kind, "", "Incomplete", f"destinations[{i}] has neither name nor selector")
                continue
            for obj in matched:
                if isinstance(obj, r.InferenceProvider):
                    missing = provider_missing(obj)
                    if missing:
                        fail(d.kind, obj.metadata.name, "Incomplete",
                             f"InferenceProvider {obj.metadata.namespace}/{obj.metadata.name} is missing "
                             + ", ".join(missing), namespace=d.namespace)
                        continue
                found.append((d.kind, obj))

    outside: list[str] = []
    if reach is not None:
        kept = []
        for kind, obj in found:
            why = reach(obj) if isinstance(obj, r.InferenceWorkerSet) else None
            if why is None:
                kept.append((kind, obj))
            elif why not in outside:
                outside.append(why)
        found = kept

    # Deduplicate (the same object listed twice), then find clashing names.
    unique: dict[tuple[str, str, str], r.InferenceWorkerSet | r.InferenceProvider] = {}
    for kind, obj in found:
        unique.setdefault((kind, obj.metadata.namespace, obj.metadata.name), obj)
    by_name: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for kind, ons, name in unique:
        by_name[name].append((kind, ons))
    destinations: list[Destination] = []
    for (kind, ons, name), obj in sorted(unique.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        clash = by_name[name]
        if len(clash) > 1:
            others = ", ".join(f"{k} {n}/{name}" for k, n in clash if (k, n) != (kind, ons))
            fail(kind, name, "AmbiguousName",
                 f"{kind} {ons}/{name} shares its name with {others}; a policy could not tell them apart",
                 namespace=ons if ons != ns else None)
            continue
        destinations.append(_destination(obj))

    models, aliases, conflicts, divergent = _models(destinations)
    return ResolvedPool(destinations, unresolved, models, aliases, conflicts, divergent, outside)


def _models(
    destinations: list[Destination],
) -> tuple[list[PoolModel], dict[str, str], list[str], list[tuple[str, str, str]]]:
    """``status.models[]``, the alias map, alias conflicts, and provider model
    names that are a worker set's alias rather than its canonical name."""
    served_by: dict[str, list[str]] = defaultdict(list)
    windows: dict[str, list[int]] = defaultdict(list)
    for d in destinations:
        for m in d.models:
            if d.name not in served_by[m.name]:
                served_by[m.name].append(d.name)
            if m.context_window:
                windows[m.name].append(m.context_window)

    local = [d for d in destinations if d.type == "Local"]
    local_canonical = {d.models[0].name for d in local}
    worker_alias = {a: d.models[0].name for d in local for a in d.models[0].aliases if a != d.models[0].name}

    # A provider serving a worker set's alias as if it were canonical: the
    # two show as separate models (seed 002 diagnosis); say so once.
    divergent: list[tuple[str, str, str]] = []
    for d in destinations:
        if d.type != "Provider":
            continue
        for m in d.models:
            if m.name in worker_alias and m.name not in local_canonical:
                divergent.append((d.name, m.name, worker_alias[m.name]))
    divergent_names = {name for _, name, _ in divergent}

    aliases: dict[str, str] = {name: name for name in served_by}
    alias_of: dict[str, set[str]] = defaultdict(set)
    conflicts: list[str] = []
    for d in local:
        m = d.models[0]
        for alias in m.aliases:
            if alias == m.name:
                continue
            prev = aliases.get(alias)
            if prev is not None and prev != m.name:
                if alias not in divergent_names:
                    what = "a canonical model name" if prev == alias else f"an alias of {prev!r}"
                    conflicts.append(
                        f"alias {alias!r} of {d.name} is already {what}; requests for it go to {prev!r}"
                    )
                continue
            aliases[alias] = m.name
            alias_of[m.name].add(alias)

    models = [
        PoolModel(
            name=name,
            aliases=sorted(alias_of.get(name, ())),
            served_by=sorted(served_by[name]),
            context_window={"min": min(windows[name]), "max": max(windows[name])} if windows[name] else None,
        )
        for name in sorted(served_by)
    ]
    return models, aliases, conflicts, divergent
