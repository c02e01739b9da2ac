"""Kubernetes Events (``events.k8s.io/v1``) about the objects a controller
reconciles, deduplicated: one Event per (object, type, reason, note). The
Event's name is derived from that key, so a restarted controller or another
replica that becomes leader finds the same Event rather than creating a
second one. Seen again, the Event's ``series`` (``count``,
``lastObservedTime``) and ``deprecatedCount`` / ``deprecatedLastTimestamp``
rise by a merge patch, at most once per ``min_interval`` (a warning that
persists across reconciles is one Event with a rising count, not one Event
per pass). ``kubectl describe`` shows them under ``Events``."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime

import structlog

from kinference_common.kube.client import ApiException, Obj, ResourceClient
from kinference_common.kube.kinds import EVENT

log = structlog.get_logger("kube.events")

NOTE_MAX = 1024


def _micro(ts: float | None = None) -> str:
    return datetime.fromtimestamp(ts or time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def reference(obj: Obj) -> Obj:
    """An ObjectReference (``regarding``) to ``obj``."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion", ""), "kind": obj.get("kind", ""),
           "namespace": meta.get("namespace", ""), "name": meta.get("name", "")}
    if meta.get("uid"):
        ref["uid"] = meta["uid"]
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = meta["resourceVersion"]
    return ref


class EventRecorder:
    def __init__(self, rc: ResourceClient, controller: str, instance: str, *, min_interval: float = 60.0) -> None:
        self.rc = rc
        self.controller = controller
        self.instance = instance[:128]
        self.min_interval = min_interval
        #: event name -> (count, last update, monotonic)
        self._seen: dict[str, tuple[int, float]] = {}
        self.created = 0
        self.updated = 0

    @staticmethod
    def name_for(regarding: Obj, type_: str, reason: str, note: str) -> str:
        key = "\x00".join([regarding.get("kind", ""), regarding.get("namespace", ""), regarding.get("name", ""),
                           regarding.get("uid", ""), type_, reason, note])
        return f"{regarding.get('name', 'object')[:200]}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    async def emit(self, regarding: Obj, type_: str, reason: str, note: str, action: str = "Reconcile") -> None:
        """Record that ``reason``/``note`` holds for the object (an ObjectReference)."""
        note = note if len(note) <= NOTE_MAX else note[: NOTE_MAX - 3] + "..."
        ns = regarding.get("namespace") or "default"
        name = self.name_for(regarding, type_, reason, note)
        seen = self._seen.get(name)
        now = time.monotonic()
        if seen is not None and now - seen[1] < self.min_interval:
            return
        try:
            if seen is None:
                try:
                    await self.rc.create(EVENT, ns, {
                        "apiVersion": "events.k8s.io/v1", "kind": "Event",
                        "metadata": {"name": name, "namespace": ns},
                        "eventTime": _micro(), "regarding": regarding, "type": type_, "reason": reason[:128],
                        "note": note, "action": action[:128], "reportingController": self.controller,
                        "reportingInstance": self.instance,
                    })
                    self.created += 1
                    self._seen[name] = (1, now)
                    return
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    current = await self.rc.get(EVENT, ns, name)  # another replica, or before a restart
                    seen = (int((current.get("series") or {}).get("count") or current.get("deprecatedCount") or 1),
                            0.0)
            count = seen[0] + 1
            stamp = _micro()
            await self.rc.patch(EVENT, ns, name, {
                "series": {"count": count, "lastObservedTime": stamp},
                "deprecatedCount": count, "deprecatedLastTimestamp": stamp[:19] + "Z",
            })
            self.updated += 1
            self._seen[name] = (count, now)
        except ApiException as exc:
            if exc.status == 404:  # expired by the server's TTL: start a new one next time
                self._seen.pop(name, None)
                return
            log.warning("cannot record event", reason=reason, object=f"{ns}/{regarding.get('name')}",
                        status=exc.status)
        except Exception as exc:  # the API server went away: events are best effort
            log.warning("cannot record event", reason=reason, object=f"{ns}/{regarding.get('name')}",
                        error=str(exc) or type(exc).__name__)

    def forget(self, keep: set[str]) -> None:
        """Drop memory of events not in ``keep`` (their condition cleared)."""
        for name in list(self._seen):
            if name not in keep:
                del self._seen[name]


__all__ = ["EventRecorder", "reference"]
