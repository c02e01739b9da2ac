"""Writing an object's status through its status subresource.

:meth:`StatusWriter.write` takes the object as observed (from an informer's
cache) and the status the controller wants, and

- keeps ``lastTransitionTime`` of every condition whose ``status`` did not
  change (top-level ``conditions`` and each ``parents[].conditions``, matched
  by ``parentRef``), as Kubernetes conventions ask;
- writes nothing when the status fields it owns (the keys of the desired
  status) already hold the desired values (:func:`covers`: fields the API
  server defaulted where the desired status is silent are no difference);
- otherwise sends one JSON merge patch to ``.../status`` carrying the
  observed ``metadata.resourceVersion``, so a write based on a stale read is
  refused (409) instead of overwriting;
- on 409 reads the object afresh: if its generation moved on, the desired
  status was computed from an old spec and is dropped (the informer brings
  the new spec and the next reconcile recomputes); otherwise (someone else
  wrote status or metadata) it retries on the fresh version;
- an object deleted meanwhile (404) is skipped.

``parents[]`` is shared with other controllers (Gateway API, Inference
Extension): a writer constructed with ``own_controllers`` treats only the
entries whose ``controllerName`` is one of them as its own. The desired
``parents`` lists those; every other controller's entry observed on the
object is kept as it is, in its place, and the writer's own entries follow
(so one it no longer wants is removed, and nobody else's is ever touched).
"""

from __future__ import annotations

from typing import Any

import structlog

from kinference_common.kube.client import ApiException, Obj, ResourceClient
from kinference_common.kube.kinds import Kind

log = structlog.get_logger("kube.status")


def _carry_conditions(old: list[Any] | None, new: list[Any]) -> list[Any]:
    before = {c.get("type"): c for c in old or [] if isinstance(c, dict)}
    out = []
    for c in new:
        prev = before.get(c.get("type"))
        if prev is not None and prev.get("status") == c.get("status") and prev.get("lastTransitionTime"):
            c = {**c, "lastTransitionTime": prev["lastTransitionTime"]}
        out.append(c)
    return out


def carry_transition_times(observed: Obj | None, desired: Obj) -> Obj:
    """``desired`` with the observed ``lastTransitionTime`` of unchanged conditions."""
    observed = observed or {}
    out = dict(desired)
    if isinstance(desired.get("conditions"), list):
        out["conditions"] = _carry_conditions(observed.get("conditions"), desired["conditions"])
    if isinstance(desired.get("parents"), list):
        # an entry is one controller's for one parent: several controllers may report the same Gateway
        old_parents = {(_freeze(p.get("parentRef")), p.get("controllerName")): p
                       for p in observed.get("parents") or [] if isinstance(p, dict)}
        parents = []
        for p in desired["parents"]:
            prev = old_parents.get((_freeze(p.get("parentRef")), p.get("controllerName")))
            if prev is not None and isinstance(p.get("conditions"), list):
                p = {**p, "conditions": _carry_conditions(prev.get("conditions"), p["conditions"])}
            parents.append(p)
        out["parents"] = parents
    return out


def merge_parents(observed: Obj | None, desired: Obj, own: frozenset[str]) -> Obj:
    """``desired`` whose ``parents`` keeps the observed entries of controllers
    not in ``own`` ahead of the desired (own) ones."""
    if not own or not isinstance(desired.get("parents"), list):
        return desired
    others = [p for p in (observed or {}).get("parents") or []
              if isinstance(p, dict) and p.get("controllerName") not in own]
    return {**desired, "parents": [*others, *desired["parents"]]}


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def covers(observed: Any, desired: Any) -> bool:
    """Whether ``observed`` already holds ``desired``: every key desired holds
    the desired value (``None``: absent), lists item by item, and keys the
    desired value does not name are free. The API server fills in the CRD's
    ``default:`` values (a condition's ``message: ''``, ``ruleCount: 0``)
    where a writer left a field out: those must not count as a difference,
    or every pass would write the same status again."""
    if isinstance(desired, dict):
        if not isinstance(observed, dict):
            return False
        return all(observed.get(k) is None if v is None else k in observed and covers(observed[k], v)
                   for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(observed, list) and len(observed) == len(desired) and \
            all(covers(o, d) for o, d in zip(observed, desired, strict=True))
    return bool(observed == desired)


def differs(observed_status: Obj | None, desired: Obj) -> bool:
    return not covers(observed_status or {}, desired)


class StatusWriter:
    def __init__(self, rc: ResourceClient, retries: int = 4, own_controllers: frozenset[str] = frozenset()) -> None:
        self.rc = rc
        #: the controllerNames whose parents[] entries are this writer's
        self.own_controllers = own_controllers
        self.retries = retries
        self.writes = 0
        self.conflicts = 0

    async def write(self, kind: Kind, observed: Obj, desired: Obj) -> bool:
        """Write ``desired`` (the fields this controller owns) unless the
        object already shows it. True when a write happened."""
        meta = observed.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta["name"]
        generation = meta.get("generation")
        obj = observed
        for _attempt in range(self.retries):
            want = carry_transition_times(obj.get("status"),
                                          merge_parents(obj.get("status"), desired, self.own_controllers))
            if not differs(obj.get("status"), want):
                return False
            patch = {"metadata": {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")},
                     "status": want}
            try:
                await self.rc.patch(kind, ns, name, patch, status=True)
                self.writes += 1
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                if exc.status != 409:
                    raise
                self.conflicts += 1
            try:
                obj = await self.rc.get(kind, ns, name)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            if (obj.get("metadata") or {}).get("generation") != generation:
                log.info("spec changed under a status write; recomputing", kind=kind.kind, namespace=ns, name=name)
                return False
        log.warning("status write kept conflicting; will retry next reconcile", kind=kind.kind, namespace=ns,
                    name=name)
        return False
