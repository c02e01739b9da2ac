"""The EPP decides as the router does (same engine, snapshot, classification,
flow control, decision events), carries out Provider decisions only through
the egress and its tokens, and reports health as the gateways probe it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from contextlib import asynccontextmanager
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import msgspec
import nats
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kinference_common import bus, subjects
from kinference_router.epp import EppServer, EppSettings
from tests.epp.client import EppClient
from tests.epp.conftest import Epp
from tests.epp.test_epp import CHAT, chat_body, inflight
from tests.router.test_router import CLEAN_PROMPT, PII_PROMPT, Env


@asynccontextmanager
async def decision_events(nc: nats.NATS, pool: str = "inference-all") -> AsyncIterator[list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    async def on_event(msg: Any) -> None:
        events.append(json.loads(msg.data))

    sub = await nc.subscribe(subjects.decisions_subject("default", pool), cb=on_event)
    try:
        await bus.sync(nc)
        yield events
    finally:
        await sub.unsubscribe()


async def event(nc: nats.NATS, events: list[dict[str, Any]], decision_id: str) -> dict[str, Any]:
    for _ in range(50):
        await bus.sync(nc)
        got = [e for e in events if e["decision_id"] == decision_id]
        if got:
            assert len(got) == 1
            return got[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no decision event for {decision_id}")


def shape(e: dict[str, Any]) -> Any:
    """What must agree between the two front doors' events (the endpoint may
    differ between ties; the rules, tiers' verdicts and outcome may not)."""
    o = e["outcome"]
    return (o["type"], o["rule"], (o["backend"] or "").rsplit("/", 1)[0] if o["type"] == "Routed" else None,
            o.get("code"), [(r["name"], r["matched"], r["outcome"]) for r in e["rules"]], e["model"]["canonical"])


def request_counts(env: Env) -> dict[tuple[str, str], float]:
    return {(s.labels["outcome"], s.labels["backend_type"]): s.value for m in env.router.metrics.registry.collect()
            if m.name == "kinference_requests" for s in m.samples if s.name == "kinference_requests_total"}


def counted(before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def settled(env: Env, before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """What was counted since ``before``, once something was and a little more
    time passed (a second count, if any, would have come by then)."""
    for _ in range(100):
        if counted(before, request_counts(env)):
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    return counted(before, request_counts(env))


async def test_the_epp_decision_is_the_routers_and_is_published(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    async with decision_events(env.nc) as events:
        for saturated in (False, True):
            if saturated:
                await env.saturate()
            r = await env.chat(CLEAN_PROMPT)
            assert r.status == 200
            via_router = await event(env.nc, events, r.headers["x-kinference-decision-id"])
            rq = await epp.client.exchange(CHAT, {}, chat_body())
            via_epp = await event(env.nc, events, rq.set_headers["x-kinference-decision-id"])
            assert shape(via_epp) == shape(via_router)
            assert via_epp["outcome"]["backend"].startswith("Provider/" if saturated else "Local/")
    assert inflight(env) == 0


async def test_a_provider_decision_goes_through_the_egress_with_its_token(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    await env.saturate()
    before = request_counts(env)
    rt = await epp.client.roundtrip(CHAT, chat_body(), session=epp.session)
    assert rt.request.destination == epp.settings.egress_address  # the egress, no fallback list
    assert rt.status == 200, rt.body
    # one request, counted once (by the egress that carried it out), as the data port counts it
    assert counted(before, request_counts(env)) == {("routed", "Provider"): 1}
    got = env.provider.received[-1]
    assert got["auth"] == "Bearer sk-test" and got["body"]["model"] == "databricks-qwen25-32b"
    assert msgspec.json.decode(rt.body)["model"] == "qwen-2.5"
    assert sum(len(p.received) for p in env.pods.values()) == 0
    await asyncio.sleep(0.05)
    assert inflight(env) == 0


async def test_a_provider_decision_without_an_egress_is_a_503_naming_rule_and_backend(start_epp: Any,
                                                                                        classifier: Any) -> None:
    epp: Epp = await start_epp()  # no --egress-port
    env = epp.env
    await env.saturate()
    async with decision_events(env.nc) as events:
        rq = await epp.client.exchange(CHAT, {}, chat_body())
        assert rq.status == 503 and rq.immediate is not None
        headers = {h.header.key: h.header.raw_value.decode() for h in rq.immediate.headers.set_headers}
        assert headers["x-kinference-backend"].startswith("Provider/") and headers["x-kinference-rule"], headers
        assert b"no provider egress" in rq.immediate.body
        answer = json.loads(rq.immediate.body)
        for _ in range(50):  # the decision's event, then the event of what the client was answered
            await bus.sync(env.nc)
            mine = [e for e in events if e["decision_id"] == headers["x-kinference-decision-id"]]
            if len(mine) >= 2:
                break
            await asyncio.sleep(0.02)
    assert [e["outcome"]["code"] for e in mine] == [None, "no_capacity"], mine
    assert mine[0]["outcome"]["backend"] == mine[1]["outcome"]["backend"] == headers["x-kinference-backend"]
    assert "no provider egress" in mine[1]["outcome"]["reason"]
    assert answer["error"]["code"] == "no_capacity"
    assert inflight(env) == 0


async def post_egress(epp: Epp, body: bytes, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["x-kinference-egress"] = token
    async with epp.session.post(f"http://127.0.0.1:{epp.egress_port}{CHAT}", data=body, headers=headers) as r:
        return r.status, json.loads(await r.read())


async def test_the_egress_is_no_open_proxy(start_epp: Any, classifier: Any) -> None:
    import time

    epp: Epp = await start_epp(egress=True)
    env = epp.env
    await env.saturate()
    rq = await epp.client.exchange(CHAT, {}, chat_body())
    token, body = rq.set_headers["x-kinference-egress"], rq.body
    tokens = epp.settings.egress
    assert tokens is not None
    payload, mac = token.split(".")
    forged = payload + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    expired = tokens.mint(decision_id="d" * 32, pool="default/inference-all", provider="default/databricks",
                          model="databricks-qwen25-32b", address=epp.settings.egress_address, body=body,
                          rule="r", now=time.time() - 120)
    changed = body.replace(CLEAN_PROMPT.encode(), PII_PROMPT.encode())
    for b, t, reason in ((body, None, "missing"), (body, forged, "invalid"), (body, "garbage", "invalid"),
                         (body, expired, "expired"), (changed, token, "body_changed")):
        status, answer = await post_egress(epp, b, t)
        assert status == 403 and answer["error"]["code"] == "egress_forbidden", (reason, answer)
        assert env.router.metrics.registry.get_sample_value("kinference_egress_refused_total",
                                                            {"reason": reason}) >= 1
    assert env.provider.received == []
    status, _ = await post_egress(epp, body, token)
    assert status == 200 and len(env.provider.received) == 1
    status, answer = await post_egress(epp, body, token)  # a token is good once
    assert status == 403 and "used" in answer["error"]["message"]
    assert len(env.provider.received) == 1


async def test_pii_under_saturation_never_gets_a_provider_destination(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    await env.saturate()
    system = {"model": "qwen-2.5", "messages": [{"role": "system", "content": PII_PROMPT},
                                                {"role": "user", "content": CLEAN_PROMPT}]}
    for body in (chat_body(PII_PROMPT), json.dumps(system).encode()):
        rq = await epp.client.exchange(CHAT, {}, body)
        assert rq.status == 503 and rq.destination is None
    assert env.provider.received == []
    # a client cannot bring its own token or destination to a Local pick
    await asyncio.gather(*(env.telemetry(p) for p in env.pods))
    await env.settle()
    rq = await epp.client.exchange(CHAT, {"x-kinference-egress": "x.y", "x-gateway-destination-endpoint": "10.0.0.1:1"},
                                   chat_body())
    assert "x-kinference-egress" in rq.remove_headers
    assert rq.destination.split(",")[0] in {p.address for p in env.pods.values()}


async def test_conformance_hooks(start_epp: Any, classifier: Any) -> None:
    plain: Epp = await start_epp(fallbacks=0)
    env = plain.env
    natural = (await plain.client.exchange(CHAT, {}, chat_body())).destination
    one, two = [p.address for p in env.pods.values() if p.address != natural][:2]
    # without the flag the header is only a header
    rq = await plain.client.exchange(CHAT, {"test-epp-endpoint-selection": one}, chat_body())
    assert rq.destination == natural and "x-echo-set-header" not in rq.set_headers
    epp: Epp = await start_epp(conformance_hooks=True, fallbacks=0)
    for _ in range(3):
        rt = await epp.client.roundtrip(CHAT, chat_body(), {"test-epp-endpoint-selection": one},
                                        session=epp.session)
        assert rt.request.destination == one
        assert rt.request.set_headers["x-echo-set-header"] == f"x-conformance-test-served-endpoint:{one}"
        assert rt.headers["x-conformance-test-served-endpoint"] == one
    rq = await epp.client.exchange(CHAT, {"test-epp-endpoint-selection": f"{one},{two}"}, chat_body())
    assert rq.destination in {one, two}


async def health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return r.status


async def test_health_is_ready_only_with_a_snapshot(start_epp: Any, tmp_path: Any) -> None:
    from kinference_router.app import Router, RouterSettings
    from kinference_router.tenants import Authenticator
    from kinference_router.upstream import SecretFiles

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    bare = Router(RouterSettings(replica_sync=False), Authenticator("none"), SecretFiles(tmp_path))  # no NATS: no snapshot
    server = EppServer(bare, EppSettings())
    await server.start("127.0.0.1", 0)
    try:
        assert await health(server.port, "liveness") == serving
        assert await health(server.port, "") == serving
        for name in ("readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            assert await health(server.port, name) == not_serving
        client = EppClient(server.port)
        rq = await client.exchange(CHAT, {}, chat_body())
        assert rq.status == 503  # answered at once, never hung
        await client.close()
    finally:
        await server.close()
    epp: Epp = await start_epp()
    for name in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        assert await health(epp.server.port, name) == serving


async def test_flow_control_sheds_with_429_as_the_router_does(start_pool: Any) -> None:
    from tests.router.test_flow import MANIFESTS, answering_upstream

    upstream = await answering_upstream()
    served = await start_pool(MANIFESTS, "queued")
    await served.endpoint("stub", "m", f"127.0.0.1:{upstream.port}", queued=10)  # saturated
    server = EppServer(served.router, EppSettings())
    await server.start("127.0.0.1", 0)
    client = EppClient(server.port)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
    try:
        waiting = [asyncio.create_task(client.exchange(CHAT, {}, body)) for _ in range(2)]
        for _ in range(100):
            if len(served.router.flow) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(served.router.flow) == 2
        rq = await client.exchange(CHAT, {}, body)
        assert rq.status == 429
        assert msgspec.json.decode(rq.immediate.body)["error"]["code"] == "rate_limited"
        await served.endpoint("stub", "m", f"127.0.0.1:{upstream.port}", queued=0)  # capacity back
        for task in waiting:
            got = await asyncio.wait_for(task, 5)
            assert got.destination == f"127.0.0.1:{upstream.port}"
    finally:
        await client.close()
        await server.close()
        await upstream.close()


async def test_a_streamed_provider_answer_has_usage_only_when_the_client_asked(start_epp: Any,
                                                                               classifier: Any) -> None:
    """As on the data port (tests/router/test_stream_usage.py): the egress asks
    the provider for usage, and the client gets the usage event only when its
    own body asked for it (the body the egress token covers says so)."""
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    env.provider.usage_only_when_asked = True
    await env.saturate()
    rt = await epp.client.roundtrip(CHAT, chat_body(stream=True), session=epp.session)
    assert rt.status == 200 and rt.headers["x-kinference-backend"] == "Provider/databricks", rt.body
    text = rt.body.decode()
    assert env.provider.received[-1]["body"]["stream_options"] == {"include_usage": True}
    assert '"usage"' not in text and text.count("data: ") == 4 and text.rstrip().endswith("data: [DONE]"), text
    rt = await epp.client.roundtrip(CHAT, chat_body(stream=True, stream_options={"include_usage": True}),
                                    session=epp.session)
    text = rt.body.decode()
    assert '"usage"' in text and text.count("data: ") == 5, text
    await asyncio.sleep(0.05)
    assert inflight(env) == 0


async def test_the_gateways_own_error_in_place_of_a_pods_answer_is_said_as_the_data_port_says_it(
        start_epp: Any, classifier: Any) -> None:
    """A gateway that reports the endpoint it sent to (the shipped Envoy)
    reports none when no pod's answer reached it: the pod's connection failed
    or was cut after the request left (Envoy does not send that again). The
    trial: Envoy's reset reply read as "the pod answered 503"; the data port
    says it was not sent again, and publishes the decision's second event."""
    epp: Epp = await start_epp(fallbacks=0)
    env = epp.env
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body())
    await s.response(200, {"content-type": "application/json"}, [b'{"model": "Qwen/Qwen2.5-32B-Instruct"}'],
                     served=rq.destination)  # this gateway reports the endpoint it sent to
    await s.close()
    before = request_counts(env)
    async with decision_events(env.nc) as events:
        s = epp.client.stream()
        rq = await s.request("POST", CHAT, {}, chat_body())
        decision_id = rq.set_headers["x-kinference-decision-id"]
        rp = await s.response(503, {"content-type": "text/plain"}, [b"upstream connect error or disconnect/reset "
                                                                    b"before headers. reset reason: connection "
                                                                    b"termination"])
        await s.close()
        assert rp.immediate is not None and rp.immediate.status.code == 502
        err = json.loads(rp.immediate.body)["error"]
        assert err["code"] == "upstream_error" and err["decision_id"] == decision_id
        assert "not sent again" in err["message"] and "answered 503" not in err["message"].split(":")[0], err
        for _ in range(50):
            await bus.sync(env.nc)
            mine = [e for e in events if e["decision_id"] == decision_id]
            if len(mine) >= 2:
                break
            await asyncio.sleep(0.02)
    assert [e["outcome"]["code"] for e in mine] == [None, "upstream_error"], mine
    assert counted(before, request_counts(env)) == {("upstream_error", ""): 1}
    assert inflight(env) == 0


async def test_a_provider_pick_whose_egress_the_gateway_could_not_reach_is_counted_once(
        start_epp: Any, classifier: Any) -> None:
    """The egress counts what it answers; when the gateway answered instead
    (the egress unreachable), the EPP counts it and answers in the envelope."""
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    assert epp.server.picker is not None
    epp.server.picker.gateway_reports_served = True  # as after any earlier answer through the shipped Envoy
    await env.saturate()
    before = request_counts(env)
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body())
    assert rq.destination == epp.settings.egress_address
    rp = await s.response(503, {"content-type": "text/plain"}, [b"upstream connect error or disconnect/reset "
                                                                b"before headers. reset reason: connection failure"])
    await s.close()
    assert rp.immediate is not None and rp.immediate.status.code == 502
    assert json.loads(rp.immediate.body)["error"]["code"] == "upstream_error"
    assert counted(before, request_counts(env)) == {("upstream_error", ""): 1}


async def test_a_retried_refusal_of_the_egress_is_the_same_refusal(start_epp: Any, classifier: Any) -> None:
    """Envoy retries a 503: the egress's "the pool no longer has that
    provider" (nothing sent) came back the second time as 403 "used already".
    Now the retry gets the same refusal, counted once; a token whose request
    reached the provider stays single-use."""
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    tokens = epp.settings.egress
    assert tokens is not None
    body = chat_body()
    token = tokens.mint(decision_id="e" * 32, pool="default/inference-all", provider="default/gone",
                        model="databricks-qwen25-32b", address=epp.settings.egress_address, body=body, rule="r")
    before = request_counts(env)
    first = await post_egress(epp, body, token)
    again = await post_egress(epp, body, token)
    assert first[0] == again[0] == 503 and first[1]["error"]["code"] == again[1]["error"]["code"] == "no_capacity"
    assert again[1]["error"]["decision_id"] == "e" * 32
    assert counted(before, request_counts(env)) == {("no_capacity", "Provider"): 1}
    # a token whose request was carried out is refused a second time
    await env.saturate()
    rq = await epp.client.exchange(CHAT, {}, chat_body())
    sent = rq.set_headers["x-kinference-egress"]
    assert (await post_egress(epp, rq.body, sent))[0] == 200
    status, answer = await post_egress(epp, rq.body, sent)
    assert status == 403 and "used already" in answer["error"]["message"]


async def test_a_provider_stream_cut_through_the_egress_is_counted_once(start_epp: Any, classifier: Any) -> None:
    """The review: the egress counted the cut as upstream_error, then the
    gateway's reset of the picker's stream counted it again as abandoned. The
    data port counts it once (upstream_error); so does the gateway path now."""
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    await env.saturate()
    env.provider.cut_after = 1
    before = request_counts(env)
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body(stream=True))
    assert rq.destination == epp.settings.egress_address
    headers = {k: v for k, v in rq.set_headers.items() if not k.startswith(":")}
    async with epp.session.post(f"http://{rq.destination}{CHAT}", data=rq.body, headers=headers) as r:
        assert r.status == 200
        with contextlib.suppress(aiohttp.ClientPayloadError):
            await r.read()  # ends abruptly: the router ends a cut stream without its last chunk
    s.call.cancel()  # the gateway resets the picker's stream with the client's
    assert await settled(env, before) == {("upstream_error", "Provider"): 1}
    assert inflight(env) == 0


async def test_a_client_that_leaves_a_provider_stream_is_counted_once_as_abandoned(
        start_epp: Any, classifier: Any) -> None:
    """Through the gateway the egress carries a Provider pick's send: it counts
    the client's leaving, as the data port does, and the picker does not again."""
    epp: Epp = await start_epp(egress=True)
    env = epp.env
    await env.saturate()
    before = request_counts(env)
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body(stream=True))
    headers = {k: v for k, v in rq.set_headers.items() if not k.startswith(":")}
    async with aiohttp.ClientSession() as client:
        async with client.post(f"http://{rq.destination}{CHAT}", data=rq.body, headers=headers) as r:
            assert r.status == 200
            await r.content.readany()  # the first event, then the client goes away
            r.close()
    s.call.cancel()
    assert await settled(env, before) == {("abandoned", ""): 1}
