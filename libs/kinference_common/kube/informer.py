"""An informer: a local cache of one kind, kept current by list then watch.

The loop (per namespace in scope, or once for all namespaces):

1. list; the cache of that scope becomes the list (objects that vanished
   while we were not watching are dropped);
2. watch from the list's resourceVersion; each event updates the cache and
   the last seen version (bookmarks too);
3. a watch that ends (its timeout, a cut connection, the API server's
   restart) is resumed from the last version seen, bookmarks included, as
   client-go's reflector does: no relist, so a fleet's pods are listed once
   per informer, not once per cut; 410 Gone (that version was compacted)
   relists at once;
4. any other failure (API errors, 503, connection refused, and any
   unforeseen exception, a handler's included) waits a jittered exponential
   backoff, then resumes the watch from the last version (410 then relists);
   before the first list, or after a handler's failure (the cache may have
   missed an event), it relists: the loop never dies;
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
import json
from collections.abc import Callable, Collection
from typing import Any

import aiohttp
import structlog

from kinference_common.kube.backoff import Backoff
from kinference_common.kube.client import ApiException, Obj, ResourceClient
from kinference_common.kube.kinds import Kind
from kinference_common.tasks import cancel_and_wait

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
        #: per scope, the last resourceVersion seen (None = list first)
        self._rv: dict[str | None, str | None] = {}

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

    def listed(self, namespace: str) -> bool:
        """Whether the scope holding ``namespace`` has been listed at least once."""
        return namespace in self._synced_scopes or None in self._synced_scopes

    def _store(self, obj: Obj) -> Obj:
        return self.transform(obj) if self.transform else obj

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        for scope in self.scopes:
            self._tasks.append(asyncio.create_task(self._run(scope), name=f"informer-{self.kind}-{scope or '*'}"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()

    async def _run(self, scope: str | None) -> None:
        backoff = Backoff(self.backoff_base, self.backoff_cap)
        self._rv[scope] = None
        while True:
            try:
                if self._rv[scope] is None:
                    self._rv[scope] = await self._list(scope)
                    backoff.reset()
                while True:
                    if await self._watch(scope):
                        backoff.reset()
                    else:  # ended at once with nothing: do not spin on a server that closes every watch
                        await asyncio.sleep(backoff.next())
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status == 410:
                    self._rv[scope] = None
                    self.gone += 1
                    log.info("watch expired, relisting", kind=str(self.kind), namespace=scope or "*")
                    continue
                if exc.status == 404:
                    self._rv[scope] = None
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
                    log.warning("API error, will resume the watch", kind=str(self.kind), namespace=scope or "*",
                                status=exc.status, reason=exc.reason, retry_in=round(delay, 2))
                await asyncio.sleep(delay)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                self.errors += 1
                delay = backoff.next()
                log.warning("API unreachable, will resume the watch", kind=str(self.kind), namespace=scope or "*",
                            error=str(exc) or type(exc).__name__, retry_in=round(delay, 2))
                await asyncio.sleep(delay)
            except Exception as exc:  # anything else (the client's bare "Malformed JSON response",
                # a handler's bug): a dead task would leave the cache stale for good; relist instead
                self.errors += 1
                delay = backoff.next()
                self._rv[scope] = None  # a handler or transform failed mid-event: the cache may lack it
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

    async def _watch(self, scope: str | None) -> bool:
        """Watch from the last version seen until the stream ends, keeping
        that version current (bookmarks too) so the next watch resumes where
        this one stopped. True when the watch lasted or carried an event."""
        self.watches += 1
        cache = self._caches[scope]
        rv = self._rv[scope]
        assert rv is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        events = 0
        async for ev in self.rc.watch(self.kind, scope, rv, self.watch_timeout, label_selector=self.label_selector):
            etype, obj = ev["type"], ev["object"]
            events += 1
            if etype == "BOOKMARK":
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self._rv[scope] = str(version)
                continue
            key = object_key(obj)
            if etype == "DELETED":
                if cache.pop(key, None) is not None:
                    self.on_change()
            elif etype in ("ADDED", "MODIFIED"):
                cache[key] = self._store(obj)
                self.on_change()
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if version:  # only once the event is in the cache: a failed handler does not skip it
                self._rv[scope] = str(version)
        return bool(events) or loop.time() - started >= min(1.0, self.watch_timeout * 0.5)


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
