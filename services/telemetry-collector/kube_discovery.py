"""Scrape targets from the cluster (``--source kubernetes``), behind the
collector's :class:`~.discovery.Discovery` Protocol.

Watched (through the shared informer, :mod:`kinference_common.kube`):
InferenceWorkerSets, Pods, and the DCGM exporter pods (``--dcgm-selector``).
Every call of :meth:`KubeDiscovery.endpoints` recomputes the targets from the
informers' caches (level-triggered: nothing depends on an event having
arrived):

- each InferenceWorkerSet's pods are the pods of its namespace whose labels
  match ``spec.selector`` (``matchLabels`` and ``matchExpressions``); a pod
  without an IP yet (not scheduled, or no sandbox) is not a target; a pod
  that has finished (``Succeeded``/``Failed``) is not a target;
- a target is ``ready`` when the pod's ``Ready`` condition is ``True`` and
  the pod is not terminating (``deletionTimestamp`` set = not ready: the
  router stops sending before the pod goes away);
- its address is ``<pod IP>:<spec.port>``, its model the worker set's
  ``spec.model.name``;
- a DCGM exporter pod (labels matching ``--dcgm-selector``, in the watched
  namespaces: add the exporter's namespace to ``--namespaces`` when it is
  limited) with an IP is a ``dcgm`` target on ``--dcgm-port``; its
  GPU metrics are tied to engine pods by the exporter's ``pod`` and
  ``namespace`` labels, as in local mode.

A pod matched by two worker sets is a target of each (the operator's
selectors overlap; the status of both lists it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from .discovery import Target

log = structlog.get_logger("kinference.collector.kube")

API_GROUP = "kinference.buoyant.io"
API_VERSION = "v1alpha1"

Obj = dict[str, Any]


# ---------------------------------------------------------------- pure part


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (``matchLabels``, ``matchExpressions``)
    against labels. An empty or absent selector matches nothing here: a worker
    set without a selector has no pods (never every pod of the namespace)."""
    if not selector:
        return False
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    for k, v in match_labels.items():
        if labels.get(k) != str(v):
            return False
    for e in expressions:
        key, op, values = e.get("key", ""), e.get("operator", ""), [str(v) for v in e.get("values") or []]
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an operator Kubernetes does not define selects nothing
    return True


def parse_label_selector(text: str) -> dict[str, str]:
    """``app=nvidia-dcgm-exporter,tier=gpu`` -> matchLabels (``=`` and ``==`` only)."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.replace("==", "=").partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label selector {text!r}: {part!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's ``Ready`` condition is True and it is not terminating."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _live(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return bool(status.get("podIP")) and status.get("phase") not in ("Succeeded", "Failed")


def _address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def worker_set_targets(worker_sets: Iterable[Obj], pods: Iterable[Obj]) -> list[Target]:
    """Every engine pod of every worker set, as scrape targets (pure)."""
    by_ns: dict[str, list[Obj]] = {}
    for p in pods:
        if _live(p):
            by_ns.setdefault(p["metadata"].get("namespace", "default"), []).append(p)
    out: list[Target] = []
    for ws in sorted(worker_sets, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])):
        meta, spec = ws["metadata"], ws.get("spec") or {}
        ns = meta.get("namespace", "default")
        port = spec.get("port")
        if not isinstance(port, int) or not 0 < port < 65536:
            continue  # the compiler reports the invalid spec; nothing to scrape
        model = (spec.get("model") or {}).get("name", "")
        for p in sorted(by_ns.get(ns, []), key=lambda o: o["metadata"]["name"]):
            if selector_matches(spec.get("selector"), p["metadata"].get("labels") or {}):
                out.append(Target(kind="vllm", namespace=ns, worker_set=meta["name"], pod=p["metadata"]["name"],
                                  address=_address(p["status"]["podIP"], port), model=model, ready=pod_ready(p)))
    return out


def dcgm_targets(pods: Iterable[Obj], selector: Mapping[str, str], port: int) -> list[Target]:
    """DCGM exporter pods (labels matching ``selector``) with an IP, on ``port`` (pure)."""
    sel = {"matchLabels": dict(selector)}
    return [Target(kind="dcgm", address=_address(p["status"]["podIP"], port))
            for p in sorted(pods, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
            if _live(p) and (p.get("status") or {}).get("phase", "Running") == "Running"
            and selector_matches(sel, p["metadata"].get("labels") or {})]


def slim_pod(pod: Obj) -> Obj:
    """What the collector keeps of a Pod (the informer's cache holds only this)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "namespace", "labels", "deletionTimestamp", "resourceVersion")
                     if k in meta},
        "status": {"podIP": status.get("podIP"), "phase": status.get("phase"),
                   "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]},
    }


# ------------------------------------------------------------- the watches


class KubeDiscovery:
    """The collector's :class:`~.discovery.Discovery` from the cluster, and
    the writer of the statuses the collector owns (:mod:`.kube_status`).

    ``rc`` is a :class:`kinference_common.kube.client.ResourceClient`;
    ``namespaces`` None = every namespace."""

    def __init__(self, rc: Any, *, namespaces: list[str] | None = None,
                 dcgm_selector: str = "app=nvidia-dcgm-exporter", dcgm_port: int = 9400,
                 status_interval: float = 1.0, scrape_granularity: float = 30.0) -> None:
        from kinference_common.kube import kinds
        from kinference_common.kube.informer import Informer

        self.rc = rc
        self.dcgm_selector = parse_label_selector(dcgm_selector) if dcgm_selector else {}
        self.dcgm_port = dcgm_port
        self.status_interval, self.scrape_granularity = status_interval, scrape_granularity
        self.reporter: Any = None
        self.changed = asyncio.Event()
        wake = self.changed.set
        self.worker_sets = Informer(rc, kinds.INFERENCE_WORKER_SET, namespaces=namespaces, on_change=wake)
        self.providers = Informer(rc, kinds.INFERENCE_PROVIDER, namespaces=namespaces, on_change=wake)
        self.pods = Informer(rc, kinds.POD, namespaces=namespaces, on_change=wake, transform=slim_pod)
        # DCGM exporter pods come from the same pod watch (filtered by --dcgm-selector here)
        self.informers = [self.worker_sets, self.providers, self.pods]

    def start(self) -> None:
        for i in self.informers:
            i.start()

    async def stop(self) -> None:
        for i in self.informers:
            await i.stop()

    async def wait_synced(self, timeout: float | None = None) -> None:
        from kinference_common.kube.informer import wait_synced

        await wait_synced(self.informers, timeout)

    def vllm_targets(self) -> list[Target]:
        return worker_set_targets(self.worker_sets.items().values(), self.pods.items().values())

    async def endpoints(self) -> list[Target]:
        self.changed.clear()
        out = self.vllm_targets()
        if self.dcgm_selector:
            out.extend(dcgm_targets(self.pods.items().values(), self.dcgm_selector, self.dcgm_port))
        return out

    # ------------------------------------------------- running with the collector

    async def attach(self, collector: Any) -> None:
        """Run beside ``collector`` (called by :func:`.service.run_service`):
        start the watches, refresh the collector's targets as soon as the
        cluster changes, and write the statuses the collector owns."""
        from kinference_common.kube import kinds
        from kinference_common.kube.status import StatusWriter

        from .kube_status import StatusReporter

        status_interval, scrape_granularity = self.status_interval, self.scrape_granularity

        writer = StatusWriter(self.rc)
        kind_of = {"InferenceWorkerSet": kinds.INFERENCE_WORKER_SET, "InferenceProvider": kinds.INFERENCE_PROVIDER}

        async def write(kind: str, observed: Obj, desired: Obj) -> bool:
            return await writer.write(kind_of[kind], observed, desired)

        reporter = self.reporter = StatusReporter(write, interval=status_interval,
                                                  scrape_granularity=scrape_granularity, clock=collector._clock)
        def provider_state(ns: str, name: str) -> Any:
            key = (ns, name)
            return collector.providers.state(key, collector._clock()) if key in collector.providers.keys() else None

        def key_problem(ns: str, name: str) -> Any:
            keys = getattr(collector, "provider_keys", None)
            return keys.problem(ns, name, collector._clock()) if keys is not None else None

        self.start()
        try:
            while not all(i.synced.is_set() for i in self.informers):
                if not await _wait(asyncio.gather(*(i.synced.wait() for i in self.informers)), 10.0):
                    log.warning("kube_not_synced_yet", hint="is the API server reachable, and RBAC granted?")
            log.info("kube_synced", worker_sets=len(self.worker_sets.items()), pods=len(self.pods.items()))
            loop = asyncio.get_running_loop()
            last_report = 0.0
            while True:
                woke = self.changed.is_set()
                if woke:
                    await collector.refresh_targets()
                # at once on a change (each object is still written at most once per interval), and
                # every interval (scrape results move readiness too)
                # several replicas: the leader alone writes, from every replica's states
                # (once it has followed every other replica's states for a republish interval)
                if (woke or loop.time() - last_report >= status_interval) and getattr(collector, "leader", True) \
                        and getattr(collector, "status_view_complete", lambda: True)():
                    last_report = loop.time()
                    trackers = collector.status_trackers() if hasattr(collector, "status_trackers") \
                        else collector.trackers
                    try:
                        await reporter.report(self.worker_sets.items().values(), self.providers.items().values(),
                                              self.vllm_targets(), trackers, provider_state, key_problem)
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:  # pragma: no cover - a bug; keep discovery alive
                        log.warning("status_report_failed", error=str(exc)[:300])
                await _wait(self.changed.wait(), max(0.05, status_interval / 4))
        finally:
            await self.stop()


async def _wait(aw: Any, timeout: float) -> bool:
    """Wait for ``aw`` at most ``timeout`` seconds; True when it finished. Unlike
    ``asyncio.wait_for`` on Python 3.11, a cancel that coincides with ``aw``
    finishing is never swallowed (the loop above stops when cancelled)."""
    fut = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({fut}, timeout=timeout)
    finally:
        if not fut.done():
            fut.cancel()
    return bool(done)
