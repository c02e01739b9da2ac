"""One router serving several pools, each request to the pool its HTTPRoute
names (hostname and path), against a real nats-server and real upstreams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_common import bus, subjects
from kinference_common.compiled import CompiledRoute, RoutePath
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text
from kinference_common.messages import EndpointState, encode
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import RouterSettings
from kinference_router.pools import MultiPoolRouter, RouteTable, hostname_matches, request_host
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles


def fleet(team: str, model: str) -> str:
    return f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {team}-ws, namespace: {team}}}
spec:
  model: {{name: {model}}}
  engine: vLLM
  selector: {{matchLabels: {{app: {team}}}}}
  port: 8000
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{name: {team}-pool, namespace: {team}}}
spec:
  destinations:
    - {{kind: InferenceWorkerSet, name: {team}-ws}}
"""


ROUTES = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: by-host, namespace: team-a, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.com]
  rules:
    - backendRefs: [{group: kinference.buoyant.io, kind: InferencePool, name: team-a-pool}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wildcard, namespace: team-b}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["*.b.example.com"]
  rules:
    - backendRefs: [{group: kinference.buoyant.io, kind: InferencePool, name: team-b-pool}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: completions-only, namespace: team-b}
spec:
  parentRefs: [{name: gw}]
  hostnames: [a.example.com]
  rules:
    - matches: [{path: {type: Exact, value: /v1/completions}}]
      backendRefs: [{group: kinference.buoyant.io, kind: InferencePool, name: team-b-pool}]
"""

MANIFESTS = fleet("team-a", "model-a") + "---" + fleet("team-b", "model-b") + "---" + ROUTES


# ------------------------------------------------------------- pure matching


def test_compiled_pools_carry_their_routes() -> None:
    res = compile_documents(load_text(MANIFESTS, "m"))
    assert not res.errors
    a = res.pools[("team-a", "team-a-pool")].routes
    b = res.pools[("team-b", "team-b-pool")].routes
    assert [r.route for r in a] == ["team-a/by-host"]
    assert a[0].hostnames == ["a.example.com"] and a[0].paths == [RoutePath(type="PathPrefix", value="/")]
    assert sorted(r.route for r in b) == ["team-b/completions-only", "team-b/wildcard"]
    exact = next(r for r in b if r.route == "team-b/completions-only")
    assert exact.paths == [RoutePath(type="Exact", value="/v1/completions")]


def test_route_precedence() -> None:
    res = compile_documents(load_text(MANIFESTS, "m"))
    table = RouteTable(res.pools.values())
    assert table.match("a.example.com", "/v1/chat/completions") == ("team-a", "team-a-pool")
    # same host: the Exact path beats the other route's PathPrefix "/"
    assert table.match("a.example.com", "/v1/completions") == ("team-b", "team-b-pool")
    assert table.match("x.b.example.com", "/v1/models") == ("team-b", "team-b-pool")
    assert table.match("b.example.com", "/v1/models") is None  # a wildcard needs a label in front
    assert table.match("c.example.com", "/v1/models") is None


def test_matching_details() -> None:
    assert request_host({"host": "A.Example.com:8080"}) == "a.example.com"
    assert request_host({"host": "[::1]:8080"}) == "[::1]"
    assert request_host({}) == ""
    assert hostname_matches("*.example.com", "a.b.example.com")
    assert not hostname_matches("*.example.com", "example.com")

    def pool(name: str, *routes: CompiledRoute) -> Any:
        res = compile_documents(load_text(fleet(name, "m"), "m"))
        return msgspec.structs.replace(res.pools[(name, f"{name}-pool")], routes=list(routes))

    prefix = RouteTable([
        pool("short", CompiledRoute(route="x/short", paths=[RoutePath(value="/v1")])),
        pool("long", CompiledRoute(route="x/long", paths=[RoutePath(value="/v1/chat/")])),
        pool("old", CompiledRoute(route="x/b-route", hostnames=["h"])),
        pool("new", CompiledRoute(route="x/a-route", hostnames=["h"])),
        pool("rx", CompiledRoute(route="x/rx", hostnames=["r"],
                                 paths=[RoutePath(type="RegularExpression", value="/v1/.*models")])),
    ])
    assert prefix.match("any", "/v1/chat/completions") == ("long", "long-pool")  # longest prefix
    assert prefix.match("any", "/v1/models") == ("short", "short-pool")
    assert prefix.match("any", "/v1x") is None  # prefixes match whole path elements
    assert prefix.match("h", "/v1/models") == ("new", "new-pool")  # a tie: the route's namespace/name
    assert prefix.match("r", "/v1/models") == ("rx", "rx-pool")
    assert prefix.match("r", "/v1/chat/completions") == ("long", "long-pool")


# --------------------------------------------------------- through the router


@dataclass
class Upstream:
    name: str
    received: list[dict[str, Any]] = field(default_factory=list)
    server: TestServer | None = None

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        return web.json_response({"id": self.name, "object": "chat.completion", "model": body["model"],
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]})

    async def start(self) -> Upstream:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        return self

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"


@pytest.fixture
async def multi(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    nc = await nats.connect(nats_server.url)
    router = MultiPoolRouter(RouterSettings(), Authenticator("none"), SecretFiles(None), nc=nc)
    await router.start()
    data, admin = router.data_server(), router.admin_server()
    await data.start("127.0.0.1", 0)
    await admin.start("127.0.0.1", 0)
    ups = {t: await Upstream(t).start() for t in ("team-a", "team-b")}
    session = aiohttp.ClientSession()
    env = {"router": router, "nc": nc, "ups": ups, "session": session,
           "data": f"http://127.0.0.1:{data.port}", "admin": f"http://127.0.0.1:{admin.port}"}
    try:
        yield env
    finally:
        await session.close()
        await data.close()
        await admin.close()
        await router.stop()
        for u in ups.values():
            assert u.server is not None
            await u.server.close()
        await nc.close()


async def publish_fleet(env: dict[str, Any], manifests: str = MANIFESTS) -> dict[Any, Any]:
    res = compile_documents(load_text(manifests, "m"))
    assert not res.errors
    publisher = ConfigPublisher(env["nc"])
    await publisher.start()
    await publisher.publish(res.pools)
    for team, up in env["ups"].items():
        state = EndpointState(namespace=team, worker_set=f"{team}-ws", pod=f"{team}-0", address=up.address,
                              model=f"model-{team[-1]}", ready=True, scraped_at=time.time(), queued=0,
                              running=0, kv_cache_usage=0.1)
        await env["nc"].publish(subjects.endpoint_subject(team, f"{team}-ws", f"{team}-0"), encode(state))
    await bus.sync(env["nc"])
    await until(lambda: len(env["router"]._live) == 2 and all(
        r.keeper.snapshot is not None and r.keeper.snapshot.candidates for r in env["router"].routers.values()))
    return res.pools


async def until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


async def test_requests_go_to_the_pool_their_route_names(multi: dict[str, Any]) -> None:
    s, data = multi["session"], multi["data"]
    async with s.get(f"{data}/readyz") as r:
        assert r.status == 503  # no configuration yet
    decisions: list[str] = []

    async def on_decision(msg: Any) -> None:
        decisions.append(msg.subject)

    await multi["nc"].subscribe(f"{subjects.DECISIONS_PREFIX}.>", cb=on_decision)
    await publish_fleet(multi)
    async with s.get(f"{data}/readyz") as r:
        assert r.status == 200

    async def chat(host: str, model: str, path: str = "/v1/chat/completions") -> aiohttp.ClientResponse:
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}]} if "chat" in path \
            else {"model": model, "prompt": "hello"}
        return await s.post(f"{data}{path}", json=body, headers={"Host": host})

    r = await chat("a.example.com", "model-a")
    assert r.status == 200, await r.text()
    assert (await r.json())["id"] == "team-a"
    r = await chat("x.b.example.com:443", "model-b")
    assert r.status == 200 and (await r.json())["id"] == "team-b"
    # a.example.com/v1/completions is team-b's (Exact path beats PathPrefix "/")
    r = await chat("a.example.com", "model-b", path="/v1/completions")
    assert r.status == 200 and (await r.json())["id"] == "team-b"
    # a pool serves only its own models: model-b is unknown on team-a's pool
    r = await chat("a.example.com", "model-b")
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"

    r = await chat("nowhere.example.com", "model-a")
    assert r.status == 404
    err = (await r.json())["error"]
    assert err["code"] == "route_not_found" and "nowhere.example.com" in err["message"]
    assert err["type"] == "invalid_request_error" and len(err["decision_id"]) == 32

    async with s.get(f"{data}/v1/models", headers={"Host": "a.example.com"}) as r:
        assert [m["id"] for m in (await r.json())["data"]] == ["model-a"]
    async with s.get(f"{data}/v1/models", headers={"Host": "z.b.example.com"}) as r:
        assert [m["id"] for m in (await r.json())["data"]] == ["model-b"]

    await bus.sync(multi["nc"])
    await until(lambda: len(decisions) >= 4)
    assert subjects.decisions_subject("team-a", "team-a-pool") in decisions
    assert subjects.decisions_subject("team-b", "team-b-pool") in decisions

    async with s.get(f"{data}/metrics") as r:
        assert r.status == 404  # metrics are on the admin port only
    async with s.get(f"{multi['admin']}/metrics") as r:
        page = await r.text()
    assert 'kinference_requests_total{backend_type="Local",outcome="routed",pool="team-a/team-a-pool"' in page
    assert 'pool="team-b/team-b-pool"' in page and 'outcome="route_not_found"' in page


async def test_explain_names_the_pool_and_pools_come_and_go(multi: dict[str, Any]) -> None:
    s, admin = multi["session"], multi["admin"]
    pools = await publish_fleet(multi)
    body = {"model": "model-b", "messages": [{"role": "user", "content": "hi"}]}
    async with s.post(f"{admin}/debug/explain", json=body) as r:
        err = (await r.json())["error"]
        assert r.status == 400 and err["code"] == "bad_request" and "team-a/team-a-pool" in err["message"]
        assert err["decision_id"]
    async with s.post(f"{admin}/debug/explain?pool=team-b/team-b-pool", json=body) as r:
        assert r.status == 200
        trace = await r.json()
        assert json.dumps(trace).count("team-b") > 0
    async with s.post(f"{admin}/debug/explain?pool=team-c/nope", json=body) as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "pool_not_found"

    # team-b's pool is deleted: its hosts no longer route; team-a's still do
    publisher = ConfigPublisher(multi["nc"])
    await publisher.start()
    await publisher.publish({k: v for k, v in pools.items() if k[0] == "team-a"})
    await until(lambda: ("team-b", "team-b-pool") not in multi["router"].keeper.pools)
    r = await s.post(f"{multi['data']}/v1/chat/completions", json=body, headers={"Host": "x.b.example.com"})
    assert r.status == 404 and (await r.json())["error"]["code"] == "route_not_found"
    r = await s.post(f"{multi['data']}/v1/chat/completions", json={**body, "model": "model-a"},
                     headers={"Host": "a.example.com"})
    assert r.status == 200

    # a restarted router reads every pool from the bucket
    other = MultiPoolRouter(RouterSettings(), Authenticator("none"), SecretFiles(None), nc=multi["nc"])
    await other.start()
    try:
        assert set(other.keeper.pools) == {("team-a", "team-a-pool")}
        assert other.table.match("a.example.com", "/v1/chat/completions") == ("team-a", "team-a-pool")
    finally:
        await other.stop()


async def test_unknown_route_is_401_first_without_a_key(multi: dict[str, Any]) -> None:
    await publish_fleet(multi)
    auth = multi["router"].auth  # shared by every pool's router
    auth.mode = "apiKey"
    auth.set_keys([("alice", "sk-alice")])
    s, data = multi["session"], multi["data"]
    body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
    for host, key, status, code in (("nowhere.example.com", None, 401, "unauthorized"),
                                    ("nowhere.example.com", "sk-alice", 404, "route_not_found"),
                                    ("a.example.com", None, 401, "unauthorized"),
                                    ("a.example.com", "sk-alice", 200, None)):
        headers = {"Host": host, **({"Authorization": f"Bearer {key}"} if key else {})}
        async with s.post(f"{data}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == status, (host, key)
            if code:
                assert (await r.json())["error"]["code"] == code
    async with s.post(f"{multi['admin']}/debug/explain?pool=team-a%2Fteam-a-pool", json=body) as r:
        assert r.status == 200  # the pool may be URL-encoded


def test_a_pods_update_rebuilds_only_the_pools_it_serves() -> None:
    """At many pools a rebuild of every pool on every pod's update cost the
    router time in the whole fleet; only the pools with that worker set (or
    provider) rebuild."""
    from kinference_common.engine import InFlightLedger
    from kinference_router.state import FedKeeper, PoolsFollower

    ledger = InFlightLedger()
    follower = PoolsFollower(lambda key: FedKeeper(key[0], key[1], ledger), ledger)
    for team in ("team-a", "team-b"):
        res = compile_documents(load_text(fleet(team, "m"), "m"))
        follower.set_pool((team, f"{team}-pool"), res.pools[(team, f"{team}-pool")])
    keepers = {key[0]: k for key, k in follower.keepers.items()}
    for k in keepers.values():
        k.rebuild()
    follower.set_endpoint(EndpointState(namespace="team-a", worker_set="team-a-ws", pod="p", address="a:1",
                                        ready=True, scraped_at=time.time()))
    assert (keepers["team-a"]._dirty, keepers["team-b"]._dirty) == (True, False)
    keepers["team-a"].rebuild()
    assert [c.endpoint for c in keepers["team-a"].snapshot.candidates] == ["p"]  # type: ignore[union-attr]
    # an endpoint of a worker set no pool names rebuilds nothing
    follower.set_endpoint(EndpointState(namespace="team-c", worker_set="x", pod="q", address="c:1"))
    assert not any(k._dirty for k in keepers.values())
