"""Writing statuses and Events to the cluster (Kubernetes mode), next to
:class:`~kinference_policy_compiler.statuses.StatusDirectory` (local mode).

What the compiler writes, through each kind's status subresource:

- InferencePolicy: the whole status (``ruleCount``, ``referencedBy``,
  ``rules``, ``warnings``, ``conditions``, ``state``);
- InferencePool: the whole status; in ``parents[]`` only the entries of
  Kinference's controllers (``kinference.buoyant.io/router`` for a Gateway
  whose class the router implements), other controllers' entries kept;
- the Inference Extension's InferencePool (v1) that Kinference serves:
  ``parents[]`` entries under ``kinference.buoyant.io/endpoint-picker`` (or
  the router's), one per existing Gateway an HTTPRoute attaches it to, with
  ``Accepted`` and ``ResolvedRefs``; other controllers' entries kept;
- InferenceObjective / InferenceModelRewrite (both groups), for those whose
  ``poolRef`` names one of our pools: ``conditions`` (``Accepted``).

InferenceWorkerSet and InferenceProvider statuses belong to the
telemetry-collector (``readyEndpoints``, ``endpoints``, ``estimatedTTFT``,
``errorRate`` and their ``Ready`` condition): the compiler writes nothing
there, so the two never fight over a field. Objects outside the namespaces
in scope are never seen, so never written.

Every write is a merge patch of only the fields above, sent only when they
differ from what the object shows (:class:`~kinference_common.kube.status.StatusWriter`).

Events (``events.k8s.io/v1``, deduplicated by
:class:`~kinference_common.kube.events.EventRecorder`) on the object they
concern: every policy warning, every warning about another document
(``UnknownField``, ``PolicyRefList``...), every manifest error, a pool's
``Accepted``/``ResolvedRefs`` that is False, an objective's or rewrite's
``Accepted`` that is False (type Warning); notes such as
``ProvidersNeverPicked`` (type Normal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from kinference_common import API_GROUP
from kinference_common.compiler import CompileResult
from kinference_common.compiler.gateways import OWN_CONTROLLERS
from kinference_common.kube import kinds
from kinference_common.kube.backoff import Backoff
from kinference_common.kube.client import ApiException, ResourceClient
from kinference_common.kube.events import EventRecorder, reference
from kinference_common.kube.kinds import Kind
from kinference_common.kube.status import StatusWriter
from kinference_common.manifests import ManifestError
from kinference_policy_compiler.kube_source import KubernetesSource
from kinference_policy_compiler.statuses import with_refused_condition

log = structlog.get_logger("policy-compiler.kube")

CONTROLLER = "kinference.buoyant.io/policy-compiler"

_GIE = {
    ("InferenceObjective", g): k for g, k in zip((k.group for k in kinds.INFERENCE_OBJECTIVES),
                                                 kinds.INFERENCE_OBJECTIVES, strict=True)
} | {
    ("InferenceModelRewrite", g): k for g, k in zip((k.group for k in kinds.INFERENCE_MODEL_REWRITES),
                                                    kinds.INFERENCE_MODEL_REWRITES, strict=True)
}


def desired_statuses(res: CompileResult) -> dict[tuple[Kind, str, str], dict[str, Any]]:
    """(kind, namespace, name) -> the status fields the compiler owns."""
    out: dict[tuple[Kind, str, str], dict[str, Any]] = {}
    for (ns, name), st in res.policy_status.items():
        out[(kinds.INFERENCE_POLICY, ns, name)] = msgspec.to_builtins(st)
    for (ns, name), st in res.pool_status.items():
        out[(kinds.INFERENCE_POOL, ns, name)] = msgspec.to_builtins(st)
    for (ns, name), gst in res.gie_pool_status.items():
        out[(kinds.GIE_INFERENCE_POOL, ns, name)] = msgspec.to_builtins(gst)
    for kind_name, table in (("InferenceObjective", res.objective_status),
                             ("InferenceModelRewrite", res.rewrite_status)):
        for (group, ns, name), st in table.items():
            out[(_GIE[(kind_name, group)], ns, name)] = msgspec.to_builtins(st)
    return out


def _kinds_for(kind: str | None, group: str | None = None) -> list[Kind]:
    """The watched kinds of that name (both groups of the Inference Extension's when no group is given);
    ``Kind.group`` names one group."""
    if kind and "." in kind:
        kind, group = kind.split(".", 1)
    return [k for k in kinds.COMPILER_INPUTS if k.kind == kind and (group is None or k.group == group)]


def refused_generations(errors: list[ManifestError]) -> dict[tuple[str, str, str], list[ManifestError]]:
    """(kind, namespace, name) -> the errors of its current generation."""
    out: dict[tuple[str, str, str], list[ManifestError]] = {}
    for e in errors:
        d = e.document
        if d.kind and d.name:
            out.setdefault((d.kind, d.namespace or "default", d.name), []).append(e)
    return out


def with_refused(status: dict[str, Any], errs: list[ManifestError], observed: Any) -> dict[str, Any]:
    """``status`` plus ``ManifestValid=False`` (reason ``InvalidManifest``) for
    a generation the compiler refused while the last good one stays in force."""
    meta = observed.get("metadata", {}) if isinstance(observed, dict) else getattr(observed, "metadata", {})
    generation = meta.get("generation") if isinstance(meta, dict) else getattr(meta, "generation", None)
    why = "; ".join(f"{e.path}: {e.message}" if e.path else e.message for e in errs[:3])
    cond = {"type": "ManifestValid", "status": "False", "reason": "InvalidManifest",
            "message": f"generation {generation} refused, the last good generation stays in force: {why}",
            "observedGeneration": generation}
    return {**status, "conditions": with_refused_condition(status.get("conditions", []), cond)}


class KubernetesStatusSink:
    """Statuses and Events for one compile result. Only the leader calls it."""

    def __init__(self, rc: ResourceClient, source: KubernetesSource, identity: str,
                 *, event_interval: float = 60.0, backoff_cap: float = 10.0,
                 is_leader: Callable[[], bool] = lambda: True) -> None:
        self.source = source
        #: checked before every write and every Event: a replica that lost the Lease stops mid-pass
        self.is_leader = is_leader
        self.writer = StatusWriter(rc, own_controllers=OWN_CONTROLLERS)
        self.recorder = EventRecorder(rc, CONTROLLER, identity, min_interval=event_interval)
        self.passes = 0
        self._backoff = Backoff(0.2, backoff_cap)
        self._retry_at = 0.0

    async def write(self, res: CompileResult, errors: list[ManifestError]) -> bool:
        """Write every status that differs and record the Events. True when the
        pass completed (False: the API server failed; call again later)."""
        if time.monotonic() < self._retry_at:
            return False
        ok = True
        changed = 0
        desired = desired_statuses(res)
        # An Inference Extension pool Kinference no longer serves (its annotation
        # removed, a name taken): Kinference's parents[] entries go, others' stay.
        for (ns, name), obj in self.source.informers[kinds.GIE_INFERENCE_POOL].items().items():
            key = (kinds.GIE_INFERENCE_POOL, ns, name)
            if key not in desired and any(
                    isinstance(p, dict) and p.get("controllerName") in OWN_CONTROLLERS
                    for p in (obj.get("status") or {}).get("parents") or []):
                desired[key] = {"parents": []}
        refused = refused_generations(errors)
        for (kind, ns, name), status in sorted(desired.items(),
                                               key=lambda kv: (kv[0][0].plural, kv[0][0].group, kv[0][1], kv[0][2])):
            if not self.is_leader():
                return False
            observed = self.source.observed(kind, ns, name)
            if observed is None:
                continue
            if (kind.kind, ns, name) in refused:  # in force at its last good version: the status says so
                status = with_refused(status, refused[(kind.kind, ns, name)], observed)
            try:
                changed += await self.writer.write(kind, observed, status)
            except ApiException as exc:
                ok = False
                log.warning("status write failed", kind=kind.kind, namespace=ns, name=name, status=exc.status,
                            reason=exc.reason)
                if exc.status >= 500 or exc.status == 429:
                    break  # the server is unwell: try the whole pass again later
            except Exception as exc:  # connection refused, timeout: temporary
                ok = False
                log.warning("status write failed", kind=kind.kind, namespace=ns, name=name,
                            error=str(exc) or type(exc).__name__)
                break
        if ok:
            await self._events(res, errors)
            self._backoff.reset()
        else:
            self._retry_at = time.monotonic() + self._backoff.next()
        self.passes += 1
        if changed:
            log.info("statuses written", changed=changed)
        return ok

    async def _emit(self, kind: Kind | list[Kind], ns: str | None, name: str | None, type_: str, reason: str,
                    note: str) -> None:
        if not ns or not name:
            return
        if not self.is_leader():  # the Lease was lost during this pass: a standby records nothing
            return
        obj, found = None, None
        for k in kind if isinstance(kind, list) else [kind]:
            if (obj := self.source.observed(k, ns, name)) is not None:
                found = k
                break
        if obj is None or found is None:
            return
        ref = reference({**obj, "apiVersion": obj.get("apiVersion", found.api_version),
                         "kind": obj.get("kind", found.kind)})
        ref.pop("resourceVersion", None)  # one Event across versions of the object
        await self.recorder.emit(ref, type_, reason, note, action="Compile")

    async def _events(self, res: CompileResult, errors: list[ManifestError]) -> None:
        for (ns, name), st in sorted(res.policy_status.items()):
            for w in st.warnings:
                note = (f"rule {w.rule}, " if w.rule else "") + (f"{w.term}: " if w.term else "") + w.message
                await self._emit(kinds.INFERENCE_POLICY, ns, name, "Warning", w.code, note)
        for w in res.document_warnings:
            await self._emit(_kinds_for(w.kind), w.namespace, w.name, "Warning", w.code,
                             f"{w.path}: {w.message}" if w.path else w.message)
        for w in res.notes:
            await self._emit(_kinds_for(w.kind), w.namespace, w.name, "Normal", w.code, w.message)
        for (ns, name), pst in sorted(res.pool_status.items()):
            for c in pst.conditions:
                if c.status != "True":
                    await self._emit(kinds.INFERENCE_POOL, ns, name, "Warning", c.reason, c.message)
        for (ns, name), gst in sorted(res.gie_pool_status.items()):
            for c in {(c.reason, c.message): c for p in gst.parents for c in p.conditions}.values():
                if c.status != "True":
                    await self._emit(kinds.GIE_INFERENCE_POOL, ns, name, "Warning", c.reason, c.message)
        for kind_name, table in (("InferenceObjective", res.objective_status),
                                 ("InferenceModelRewrite", res.rewrite_status)):
            for (group, ns, name), ast in sorted(table.items()):
                for c in ast.conditions:
                    if c.status != "True":
                        await self._emit(_GIE[(kind_name, group)], ns, name, "Warning", c.reason, c.message)
        for e in errors:
            d = e.document
            group = None
            if d.kind in ("InferenceObjective", "InferenceModelRewrite"):
                group = d.source.split("/", 1)[0]
            elif d.kind == "InferencePool" and d.source.startswith(f"{kinds.GIE_INFERENCE_POOL.group}/"):
                group = kinds.GIE_INFERENCE_POOL.group
            elif d.kind in ("InferencePolicy", "InferencePool", "InferenceWorkerSet", "InferenceProvider"):
                group = API_GROUP
            await self._emit(_kinds_for(d.kind, group), d.namespace, d.name, "Warning", "InvalidManifest",
                             f"{e.path}: {e.message}" if e.path else e.message)
