"""An informer: a local cache of one kind, kept current by list then watch.

The loop (per namespace in scope, or once for all namespaces):

1. list; the cache of that scope becomes the list (objects that vanished
   while we were not watching are dropped);
2. watch from the list's resourceVersion; each event updates the cache and
   the last seen version (bookmarks too);
3. a watch the server ends (its timeout) is resumed from the last version;
   410 Gone (the version was compacted) relists at once;
4. any other failure (API errors, 503, connection refused, a watch cut
   mid-stream, and any unforeseen exception, a handler's included) waits a
   jittered exponential backoff, then relists: the loop never dies;
5. a kind the server does not serve (404 on the list: its CRD is not
   installed, e.g. the Gateway API's) counts as empty and synced, and is
   looked for again every ``missing_recheck`` seconds.

Handlers never see events: a change only calls ``on_change()`` (a "wake" of
a level-triggered reconcile that recomputes everything from the caches).
:attr:`synced` is set once every scope has listed once, so a controller can
wait for a complete picture before its first write.

``transform`` may reduce every object before it is cached (e.g. keep only a
Secret's metadata).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Collection
from typing import Any

import aiohttp
import structlog

from kinference_common.kube.backoff import Backoff
from kinference_common.kube.client import ApiException, Obj, ResourceClient
from kinference_common.kube.kinds import Kind

log = structlog.get_logger("kube.informer")

Key = tuple[str, str]  # (namespace, name)


def object_key(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


class Informer:
    def __init__(
        self,
        rc: ResourceClient,
        kind: Kind,
        *,
        namespaces: Collection[str] | None = None,
        label_selector: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        transform: Callable[[Obj], Obj] | None = None,
        watch_timeout: int = 300,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
        missing_recheck: float = 60.0,
    ) -> None:
        self.rc = rc
        self.missing_recheck = missing_recheck
        #: True while the server does not serve the kind (404 on list)
        self.missing = False
        self.kind = kind
        self.scopes: list[str | None] = sorted(set(namespaces)) if namespaces is not None else [None]  # type: ignore[list-item]
        self.label_selector = label_selector
        self.on_change = on_change
        self.transform = transform
        self.watch_timeout = watch_timeout
        self.backoff_base, self.backoff_cap = backoff_base, backoff_cap
        self._caches: dict[str | None, dict[Key, Obj]] = {s: {} for s in self.scopes}
        self._synced_scopes: set[str | None] = set()
        self.synced = asyncio.Event()
        #: counters, for tests and metrics
        self.lists = 0
        self.watches = 0
        self.gone = 0
        self.errors = 0
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ cache

    def items(self) -> dict[Key, Obj]:
        """Every cached object by (namespace, name), across the scopes."""
        out: dict[Key, Obj] = {}
        for cache in self._caches.values():
            out.update(cache)
        return out

    def get(self, namespace: str, name: str) -> Obj | None:
        for cache in self._caches.values():
            if (namespace, name) in cache:
                return cache[(namespace, name)]
        return None

    def _store(self, obj: Obj) -> Obj:
        return self.transform(obj) if self.transform else obj

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for scope in self.scopes:
            self._tasks.append(asyncio.create_task(self._run(scope), name=f"informer-{self.kind}-{scope or '*'}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()

    async def _run(self, scope: str | None) -> None:
        backoff = Backoff(self.backoff_base, self.backoff_cap)
        while True:
            try:
                rv = await self._list(scope)
                backoff.reset()
                while True:
                    rv = await self._watch(scope, rv)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    self.gone += 1
                    log.info("watch expired, relisting", kind=str(self.kind), namespace=scope or "*")
                    continue
                if exc.status == 404:
                    if not self.missing:
                        log.warning("kind not served by the API server (CRD not installed?); treated as empty",
                                    kind=str(self.kind), recheck_in=self.missing_recheck)
                    self.missing = True
                    self._mark_empty(scope)
                    await asyncio.sleep(self.missing_recheck)
                    continue
                self.errors += 1
                delay = backoff.next()
                if exc.status in (401, 403):
                    # RBAC (or the token): say so, with the server's words naming verb and resource
                    log.warning("forbidden: the service account lacks RBAC permission; will retry",
                                kind=str(self.kind), namespace=scope or "*", status=exc.status,
                                message=api_message(exc), retry_in=round(delay, 2))
                else:
                    log.warning("API error, will relist", kind=str(self.kind), namespace=scope or "*",
                                status=exc.status, reason=exc.reason, retry_in=round(delay, 2))
                await asyncio.sleep(delay)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self.errors += 1
                delay = backoff.next()
                log.warning("API unreachable, will relist", kind=str(self.kind), namespace=scope or "*",
                            error=str(exc) or type(exc).__name__, retry_in=round(delay, 2))
                await asyncio.sleep(delay)
            except Exception as exc:  # anything else (the client's bare "Malformed JSON response",
                # a handler's bug): a dead task would leave the cache stale for good; relist instead
                self.errors += 1
                delay = backoff.next()
                log.warning("informer failed, will relist", kind=str(self.kind), namespace=scope or "*",
                            error=f"{type(exc).__name__}: {exc}", retry_in=round(delay, 2))
                await asyncio.sleep(delay)

    def _mark_empty(self, scope: str | None) -> None:
        had = bool(self._caches[scope])
        self._caches[scope] = {}
        first = scope not in self._synced_scopes
        self._synced_scopes.add(scope)
        if len(self._synced_scopes) == len(self.scopes):
            self.synced.set()
        if first or had:
            self.on_change()

    async def _list(self, scope: str | None) -> str:
        items, rv = await self.rc.list(self.kind, scope, label_selector=self.label_selector)
        self.lists += 1
        if self.missing:
            log.info("kind now served", kind=str(self.kind))
            self.missing = False
        fresh = {object_key(o): self._store(o) for o in items}
        old = self._caches[scope]
        self._caches[scope] = fresh
        first = scope not in self._synced_scopes
        self._synced_scopes.add(scope)
        if len(self._synced_scopes) == len(self.scopes):
            self.synced.set()
        if first or _versions(old) != _versions(fresh):
            self.on_change()
        return rv

    async def _watch(self, scope: str | None, rv: str) -> str:
        """Watch until the server ends the stream; return the last version seen.
        A stream cut before its timeout (a dropped connection) raises, so the
        caller relists: events may have been lost in between."""
        self.watches += 1
        cache = self._caches[scope]
        loop = asyncio.get_running_loop()
        started = loop.time()
        async for ev in self.rc.watch(self.kind, scope, rv, self.watch_timeout, label_selector=self.label_selector):
            etype, obj = ev["type"], ev["object"]
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:
                rv = str(version)
            if etype == "BOOKMARK":
                continue
            key = object_key(obj)
            if etype == "DELETED":
                if cache.pop(key, None) is not None:
                    self.on_change()
            elif etype in ("ADDED", "MODIFIED"):
                cache[key] = self._store(obj)
                self.on_change()
        if loop.time() - started < self.watch_timeout * 0.9:
            raise ConnectionResetError("the watch ended before its timeout")
        return rv


def api_message(exc: ApiException) -> str:
    """The ``message`` of the API server's Status answer, else the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    msg = body.get("message") if isinstance(body, dict) else None
    return str(msg or exc.reason or exc.status)[:500]


def _versions(cache: dict[Key, Obj]) -> dict[Key, Any]:
    return {k: (o.get("metadata") or {}).get("resourceVersion") for k, o in cache.items()}


async def wait_synced(informers: Collection[Informer], timeout: float | None = None) -> None:
    await asyncio.wait_for(asyncio.gather(*(i.synced.wait() for i in informers)), timeout)
