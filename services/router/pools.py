"""A router serving several pools at once, the pool chosen by route.

Operators run one router per cluster, not one per pool. Each compiled pool
carries the HTTPRoutes that name it as a backendRef (``CompiledPool.routes``:
hostnames and path matches); :class:`RouteTable` picks the pool of a request
from its ``Host`` header and path with Gateway API's matching and precedence:

1. a matching exact hostname beats a matching wildcard (``*.example.com``),
   which beats a route without hostnames; longer hostnames first;
2. then an ``Exact`` path beats a ``PathPrefix`` (longest first), which beats
   a ``RegularExpression``;
3. then a match with a method beats one without, then more header matches,
   then more query parameter matches (a match's method, headers and query
   parameters must all match: ``Exact``, or ``RegularExpression`` in full);
4. then the route's ``namespace/name``, then the pool's ``namespace/name``
   (not the route's age, Gateway API's next tie-break: a pool compiled from
   files and from the cluster must be the same, and files carry no
   ``creationTimestamp``).

A request no route matches is a 404 in the error envelope. Everything after
the pool is chosen is the single-pool :class:`~kinference_router.app.Router`
of that pool (one per pool, made when the pool first appears), all of them
sharing one in-flight ledger, prefix index, upstream health, provider limits,
metrics registry and one :class:`~kinference_router.state.PoolsFollower`
for configuration and telemetry.

The interface :mod:`kinference_router.__main__` uses is the same as the
single-pool router's: ``start``, ``stop``, ``data_server``, ``admin_server``
and ``keeper.resync()``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

import nats
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kinference_common import subjects
from kinference_common.compiled import CompiledPool, CompiledRoute, RoutePath, RouteValueMatch
from kinference_common.engine import Calibration, InFlightLedger, PrefixIndex
from kinference_router.app import ApiError, Router, RouterSettings, error_response, new_decision_id, server_error
from kinference_router.http_server import HttpServer, Request as HttpRequest, Response
from kinference_router import replica_sync
from kinference_router.metrics import RouterMetrics
from kinference_router.state import FedKeeper, PoolKey, PoolsFollower
from kinference_router.tenants import Authenticator
from kinference_router.upstream import ProviderLimiter, UpstreamHealth

# ------------------------------------------------------------------ matching


def request_host(headers: Mapping[str, str]) -> str:
    """The ``Host`` header without its port, lower-cased ("" when absent)."""
    host = headers.get("host", "").strip().lower()
    if host.startswith("["):  # [::1]:8080
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def hostname_matches(pattern: str, host: str) -> bool:
    """Gateway API hostname matching: exact, or ``*.suffix`` for one or more labels before ``suffix``."""
    pattern = pattern.lower()
    if pattern.startswith("*."):
        suffix = pattern[1:]  # ".example.com"
        return host.endswith(suffix) and len(host) > len(suffix)
    return host == pattern


def path_matches(match: RoutePath, path: str, regex: re.Pattern[str] | None = None) -> bool:
    if match.type == "Exact":
        return path == match.value
    if match.type == "PathPrefix":
        prefix = match.value.rstrip("/")
        # by path element: /v1 matches /v1 and /v1/models, not /v1x
        return not prefix or path == prefix or path.startswith(prefix + "/")
    return regex is not None and regex.fullmatch(path) is not None


def _value_regex(m: RouteValueMatch) -> re.Pattern[str] | None:
    return re.compile(m.value) if m.type == "RegularExpression" else None


def _values_match(matches: tuple[tuple[RouteValueMatch, re.Pattern[str] | None], ...],
                  get: Any) -> bool:
    for m, rx in matches:
        got = get(m.name)
        if got is None or (rx.fullmatch(got) is None if rx is not None else got != m.value):
            return False
    return True


@dataclass(frozen=True, slots=True)
class _Entry:
    """One (hostname, path) pair of one route for one pool, with its precedence."""

    rank: tuple[Any, ...]
    hostname: str | None
    path: RoutePath
    regex: re.Pattern[str] | None
    pool: PoolKey
    route: str
    headers: tuple[tuple[RouteValueMatch, re.Pattern[str] | None], ...] = ()
    query: tuple[tuple[RouteValueMatch, re.Pattern[str] | None], ...] = ()


class RouteTable:
    """The pools' routes, sorted by precedence: the first entry that matches wins."""

    def __init__(self, pools: Iterable[CompiledPool]) -> None:
        entries: list[_Entry] = []
        for pool in pools:
            key = (pool.namespace, pool.name)
            for route in pool.routes:
                entries.extend(self._entries(key, route))
        entries.sort(key=lambda e: e.rank)
        self.entries = entries

    @staticmethod
    def _entries(key: PoolKey, route: CompiledRoute) -> list[_Entry]:
        out = []
        for hostname in route.hostnames or [None]:
            if hostname is None:
                host_rank = (2, 0)
            elif hostname.startswith("*."):
                host_rank = (1, -len(hostname))
            else:
                host_rank = (0, -len(hostname))
            for path in route.paths or [RoutePath()]:
                regex = None
                if path.type == "RegularExpression":
                    try:
                        regex = re.compile(path.value)
                    except re.error:
                        continue  # an invalid expression matches nothing
                try:
                    headers = tuple((h, _value_regex(h)) for h in path.headers)
                    query = tuple((q, _value_regex(q)) for q in path.query_params)
                except re.error:
                    continue
                path_rank = {"Exact": 0, "PathPrefix": 1}.get(path.type, 2)
                rank = (*host_rank, path_rank, -len(path.value), 0 if path.method else 1,
                        -len(headers), -len(query), route.route, key)
                out.append(_Entry(rank, hostname, path, regex, key, route.route, headers, query))
        return out

    def match(self, host: str, path: str, method: str = "", headers: Mapping[str, str] | None = None,
              query: str = "") -> PoolKey | None:
        """The pool of a request; ``headers`` with lower-cased names, ``query`` the raw query string."""
        params: dict[str, list[str]] | None = None
        for e in self.entries:
            if not ((e.hostname is None or hostname_matches(e.hostname, host)) and path_matches(e.path, path, e.regex)):
                continue
            if e.path.method and e.path.method != method:
                continue
            if e.headers and not _values_match(e.headers, (headers or {}).get):
                continue
            if e.query:
                if params is None:
                    params = parse_qs(query, keep_blank_values=True)
                if not _values_match(e.query, lambda n: (params.get(n) or [None])[0]):  # type: ignore[union-attr]
                    continue
            return e.pool
        return None


# -------------------------------------------------------------------- router



class MultiPoolRouter:
    """Every pool the compiler publishes, each request to the pool its route names."""

    def __init__(self, settings: RouterSettings, auth: Authenticator, secrets: Any,
                 nc: nats.NATS | None = None) -> None:
        self.settings, self.auth, self.secrets, self.nc = settings, auth, secrets, nc
        self.metrics = RouterMetrics()
        self.ledger = InFlightLedger()
        self.prefix = PrefixIndex()
        self.sync = replica_sync.for_router(settings, self.ledger, self.prefix, self.metrics,
                                            subject=subjects.ROUTER_SYNC_ALL)
        self.health = UpstreamHealth()
        self.limiter = ProviderLimiter()
        self.calibration = Calibration()
        self.routers: dict[PoolKey, Router] = {}
        self.keeper = PoolsFollower(self._keeper, self.ledger)
        self.keeper.healthy = self.health.seen_healthy  # a fresh scrape ends an older ejection
        self.keeper.on_pools = self._pools_changed
        self.table = RouteTable(())
        self._started = False
        #: pools whose router was started (only those take requests)
        self._live: set[PoolKey] = set()
        self._starting: set[PoolKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def _keeper(self, key: PoolKey) -> FedKeeper:
        return FedKeeper(key[0], key[1], self.ledger, stale_after=self.settings.stale_after,
                         ejected=self.health.excluded)

    def router_for(self, key: PoolKey) -> Router:
        """The pool's own router (made on first use, kept: a pool that comes back reuses it)."""
        r = self.routers.get(key)
        if r is None:
            r = self.routers[key] = Router(
                replace(self.settings, namespace=key[0], pool=key[1]), self.auth, self.secrets, nc=self.nc,
                metrics=self.metrics, ledger=self.ledger, prefix=self.prefix, health=self.health,
                limiter=self.limiter, calibration=self.calibration, keeper=self.keeper.keeper_for(key),
            )
        return r

    def _pools_changed(self) -> None:
        for key in self.keeper.pools:
            self.router_for(key)
            if self._started and key not in self._live and key not in self._starting:
                self._starting.add(key)
                task = asyncio.get_running_loop().create_task(self._start_one(key))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self.table = RouteTable(self.keeper.pools.values())

    async def _start_one(self, key: PoolKey) -> None:
        try:
            await self.routers[key].start()
            self._live.add(key)
        finally:
            self._starting.discard(key)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.nc is not None:
            await self.keeper.start(self.nc)
            if self.sync is not None:
                await self.sync.start(self.nc)
        for key in list(self.routers):
            await self.routers[key].start()
            self._live.add(key)
        self._started = True

    async def stop(self) -> None:
        if self.sync is not None:
            await self.sync.stop()
        await self.keeper.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for key in list(self._live):
            await self.routers[key].stop()
        self._live.clear()

    # -------------------------------------------------------------- routing

    def pick(self, request: HttpRequest) -> Router | None:
        key = self.table.match(request_host(request.headers), request.path, request.method, request.headers,
                               request.query)
        if key is None or key not in self.keeper.pools or key not in self._live:
            return None
        return self.routers[key]

    def _not_routed(self, request: HttpRequest) -> Response:
        host = request_host(request.headers) or "(none)"
        err = ApiError(404, "route_not_found",
                       f"no HTTPRoute of any pool matches host {host} and path {request.path}")
        self.metrics.child(self.metrics.requests, "", "", err.code, "").inc()
        return error_response(err, new_decision_id())

    def _dispatch(self, name: str) -> Any:
        async def handler(request: HttpRequest) -> Response | None:
            r = self.pick(request)
            if r is None:
                if self.auth.tenant(request.headers) is None:
                    # 401 before anything else: a caller without a key learns nothing of the routes
                    err = ApiError(401, "unauthorized", "missing or unknown API key")
                    self.metrics.child(self.metrics.requests, "", "", err.code, "").inc()
                    return error_response(err, new_decision_id())
                return self._not_routed(request)
            return await getattr(r, name)(request)
        return handler

    def data_server(self) -> HttpServer:
        return self._server({
            "/v1/chat/completions": {"POST": self._dispatch("chat")},
            "/v1/completions": {"POST": self._dispatch("completions")},
            "/v1/models": {"GET": self._dispatch("models")},  # authenticated by the pool's router
            "/v1/models/*": {"GET": self._dispatch("model")},
        })

    def admin_server(self) -> HttpServer:
        return self._server({"/debug/explain": {"POST": self.explain}})

    def _server(self, routes: dict[str, Any]) -> HttpServer:
        """Made by the single-pool router's own ``_server`` (same limits and
        error answers, whatever they become), with health and metrics of all pools."""
        template = Router(self.settings, self.auth, self.secrets, metrics=self.metrics)
        server = template._server(routes)
        server.routes.update({"/healthz": {"GET": self.healthz}, "/readyz": {"GET": self.readyz}})
        if "/debug/explain" in routes or self.settings.metrics_on_data_port:  # the admin port's, by default
            server.routes["/metrics"] = {"GET": self.metrics_page}
        return server

    async def healthz(self, _: HttpRequest) -> Response:
        return Response(200, b"ok\n", content_type="text/plain; charset=utf-8")

    async def readyz(self, _: HttpRequest) -> Response:
        n = sum(1 for k in self.keeper.pools if self.routers.get(k) is not None
                and self.routers[k].keeper.snapshot is not None)
        body = f"ready: {n} pool(s)\n".encode() if n else b"no configuration yet\n"
        return Response(200 if n else 503, body, content_type="text/plain; charset=utf-8")

    async def metrics_page(self, _: HttpRequest) -> Response:
        return Response(200, generate_latest(self.metrics.registry), content_type=CONTENT_TYPE_LATEST)

    async def explain(self, request: HttpRequest) -> Response:
        """``POST /debug/explain?pool=NS/NAME`` (the pool may be left out when there is only one)."""
        wanted = (parse_qs(request.query).get("pool") or [""])[0]
        pools = sorted(self.keeper.pools)
        if wanted:
            ns, _, name = wanted.partition("/")
            key = (ns, name)
        elif len(pools) == 1:
            key = pools[0]
        else:
            names = ", ".join(f"{k[0]}/{k[1]}" for k in pools) or "none yet"
            return server_error(400, "bad_request", f"name the pool: ?pool=NS/NAME (pools: {names})")
        r = self.routers.get(key)
        if key not in self.keeper.pools or r is None:
            return server_error(404, "pool_not_found", f"no pool {key[0]}/{key[1]} in the configuration")
        return await r.explain(request)
