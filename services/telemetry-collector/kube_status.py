"""The status the collector owns, written to the cluster (``--source kubernetes``).

The collector owns (the policy-compiler writes every other status):

- **InferenceWorkerSet** ``status``: ``readyEndpoints``, ``endpoints[]``
  (``{pod, address, ready, lastScrape}``) and condition ``Ready``;
- **InferenceProvider** ``status``: ``estimatedTTFT``, ``errorRate`` and
  condition ``Ready`` (``False`` when a field is missing, when a router cannot
  read its API key, as the routers report it, or on a high error rate).

Level-triggered: every ``interval`` (1 s) the desired status of every object
is recomputed from the informers' caches and the collector's own state, and
written (a merge patch of the status subresource) only when it differs from
the object's observed status, so each object is written at most once a
second and not at all while nothing changes. ``lastTransitionTime`` moves
only when a condition's status changes; ``observedGeneration`` is the
object's ``metadata.generation``.

Granularity, so that a scrape every 100 ms does not mean a write every 100 ms:

- ``lastScrape`` is the last successful scrape's time rounded down to
  ``scrape_granularity`` (30 s by default): a healthy worker set's status is
  rewritten about every 30 s, and an endpoint whose scrapes stopped keeps its
  last value (and turns ``ready: false``);
- ``estimatedTTFT`` is rounded to 10 ms (to 2 significant digits above 1 s),
  ``errorRate`` to 0.01.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog

from kinference_common import resources as r
from kinference_common.compiler.pools import provider_missing
from kinference_common.durations import format_duration
from kinference_common.messages import ProviderState

from .derive import EndpointTracker
from .discovery import Target

log = structlog.get_logger("kinference.collector.status")

Obj = dict[str, Any]
#: write(kind, observed object, desired status) -> True when it wrote; raises on failure
Writer = Callable[[str, Obj, Obj], Awaitable[bool]]

#: a provider whose errorRate is at least this (over enough requests) is not Ready
ERROR_RATE_NOT_READY = 0.5
MIN_OBSERVATIONS = 5


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(ok: bool, reason: str, message: str, generation: int | None, now: float,
               old: Iterable[Mapping[str, Any]]) -> Obj:
    status = "True" if ok else "False"
    prev = next((c for c in old if c.get("type") == "Ready"), None)
    since = prev.get("lastTransitionTime") if prev is not None and prev.get("status") == status else None
    c: Obj = {"type": "Ready", "status": status, "reason": reason, "message": message,
              "lastTransitionTime": since or rfc3339(now)}
    if generation is not None:
        c["observedGeneration"] = generation
    return c


def worker_set_status(ws: Obj, targets: list[Target], trackers: Mapping[tuple[str, str, str, str], EndpointTracker],
                      now: float, *, scrape_granularity: float = 30.0) -> Obj:
    """The desired status of one InferenceWorkerSet (pure)."""
    endpoints = []
    for t in targets:
        tr = trackers.get(t.key)
        ready = bool(t.ready and tr is not None and tr.ready(now))
        e: Obj = {"pod": t.pod, "address": t.address, "ready": ready}
        if tr is not None and tr.last_success:
            g = scrape_granularity
            e["lastScrape"] = rfc3339(math.floor(tr.last_success / g) * g if g > 0 else tr.last_success)
        endpoints.append(e)
    n = sum(1 for e in endpoints if e["ready"])
    meta = ws.get("metadata") or {}
    old = (ws.get("status") or {}).get("conditions") or []
    if not endpoints:
        cond = _condition(False, "NoEndpoints", "no running pod with an IP matches spec.selector",
                          meta.get("generation"), now, old)
    elif n:
        cond = _condition(True, "EndpointsReady", f"{n} of {len(endpoints)} endpoint(s) ready",
                          meta.get("generation"), now, old)
    else:
        cond = _condition(False, "NoReadyEndpoints",
                          f"0 of {len(endpoints)} endpoint(s) ready (pod not Ready, or its metrics not scraped)",
                          meta.get("generation"), now, old)
    return {"readyEndpoints": n, "endpoints": endpoints, "conditions": [cond]}


def _round_ttft(seconds: float) -> str:
    if seconds < 1:
        return format_duration(round(seconds, 2) or 0.01)
    return format_duration(float(f"{seconds:.2g}"))


def provider_status(provider: Obj, state: ProviderState | None, now: float,
                    key_problem: tuple[str, str] | None = None) -> Obj:
    """The desired status of one InferenceProvider (pure). ``key_problem``:
    ``(reason, message)`` when a router cannot read its API key (``SecretNotWatched``,
    ``SecretUnavailable``; :mod:`kinference_router.key_report`)."""
    meta = provider.get("metadata") or {}
    old = (provider.get("status") or {}).get("conditions") or []
    try:
        typed = msgspec.convert(provider, r.InferenceProvider, strict=False)
        missing = provider_missing(typed)
    except msgspec.ValidationError as exc:
        missing = [f"a valid spec ({exc})"]
    est = state.estimated_ttft_seconds if state is not None else None
    rate = state.error_rate if state is not None else None
    if missing:
        cond = _condition(False, "Incomplete", f"missing {', '.join(missing)}", meta.get("generation"), now, old)
    elif key_problem is not None:
        cond = _condition(False, key_problem[0], key_problem[1][:1000], meta.get("generation"), now, old)
    elif rate is not None and state is not None and state.observations >= MIN_OBSERVATIONS \
            and rate >= ERROR_RATE_NOT_READY:
        cond = _condition(False, "HighErrorRate",
                          f"{rate:.0%} of the last {state.observations} request(s) failed",
                          meta.get("generation"), now, old)
    else:
        cond = _condition(True, "Configured", "configuration complete", meta.get("generation"), now, old)
    return {
        "conditions": [cond],
        # null removes the field in a merge patch: a provider no longer observed shows none
        "estimatedTTFT": _round_ttft(est) if est is not None else None,
        "errorRate": round(rate, 2) if rate is not None else None,
    }


def differs(desired: Obj, observed: Mapping[str, Any] | None) -> bool:
    """Whether writing ``desired`` would change the observed status (null = absent)."""
    observed = observed or {}
    for k, v in desired.items():
        if v is None:
            if observed.get(k) is not None:
                return True
        elif observed.get(k) != v:
            return True
    return False


def _attempted(tr: EndpointTracker | None) -> bool:
    return tr is not None and (tr.last_success is not None or tr.scrape_errors > 0)


class StatusReporter:
    """Writes the statuses above, level-triggered, at most once per
    ``interval`` per object. ``objects()`` gives the cached worker sets and
    providers; ``targets()`` the current worker-set targets; ``trackers`` and
    ``providers`` are the collector's."""

    def __init__(self, write: Writer, *, interval: float = 1.0, scrape_granularity: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.write = write
        self.interval = interval
        self.scrape_granularity = scrape_granularity
        self.clock = clock
        #: (kind, ns, name) -> (status written, when): the cache may lag our own write
        self._written: dict[tuple[str, str, str], tuple[Obj, float]] = {}
        self.writes = 0
        self.failures = 0

    async def report(self, worker_sets: Iterable[Obj], providers: Iterable[Obj], targets: list[Target],
                     trackers: Mapping[tuple[str, str, str, str], EndpointTracker],
                     provider_state: Callable[[str, str], ProviderState | None],
                     key_problem: Callable[[str, str], tuple[str, str] | None] = lambda ns, name: None) -> None:
        now = self.clock()
        by_ws: dict[tuple[str, str], list[Target]] = {}
        for t in targets:
            if t.kind == "vllm":
                by_ws.setdefault((t.namespace, t.worker_set), []).append(t)
        wanted: list[tuple[str, Obj, Obj]] = []
        for ws in worker_sets:
            m = ws["metadata"]
            key = (m.get("namespace", "default"), m["name"])
            if any(not _attempted(trackers.get(t.key)) for t in by_ws.get(key, [])):
                # a pod not scraped even once yet (collector start, new pod): its readiness is not
                # known; wait for the first scrape rather than write a "not ready" that flips back
                continue
            wanted.append(("InferenceWorkerSet", ws, worker_set_status(
                ws, by_ws.get(key, []), trackers, now, scrape_granularity=self.scrape_granularity)))
        for p in providers:
            m = p["metadata"]
            ns = m.get("namespace", "default")
            wanted.append(("InferenceProvider", p, provider_status(
                p, provider_state(ns, m["name"]), now, key_problem(ns, m["name"]))))
        live = set()
        for kind, obj, desired in wanted:
            m = obj["metadata"]
            key = (kind, m.get("namespace", "default"), m["name"])
            live.add(key)
            if not differs(desired, obj.get("status")):
                continue
            prev = self._written.get(key)
            if prev is not None and now - prev[1] < 5 * self.interval and (
                    prev[0] == desired or now - prev[1] < self.interval):
                continue  # just written (the cache has not caught up), or written less than a second ago
            try:
                wrote = await self.write(kind, obj, desired)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the next pass retries
                self.failures += 1
                log.warning("status_write_failed", kind=kind, namespace=key[1], name=key[2], error=str(exc)[:300])
                continue
            if wrote:
                self._written[key] = (desired, now)
                self.writes += 1
        for key in [k for k in self._written if k not in live]:
            del self._written[key]
