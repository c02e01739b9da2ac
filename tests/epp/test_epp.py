"""The Endpoint Picker (services/router/epp.py) driven as Envoy drives it
(tests/epp/client.py), on the router tests' pool: its picks are the router's
decisions, and what it says goes out in the protocol's order and shape."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from kinference_common.engine import PrefixIndex
from tests.epp.client import headers_message, immediate_headers
from tests.epp.conftest import Epp
from tests.router.test_router import CLEAN_PROMPT, Env, router_estimate

CHAT = "/v1/chat/completions"


def chat_body(content: str = CLEAN_PROMPT, **extra: Any) -> bytes:
    return json.dumps({"model": "qwen-2.5", "messages": [{"role": "user", "content": content}], **extra}).encode()


def inflight(env: Env) -> int:
    return sum(env.router.metrics.inflight.values())


async def test_plain_request_picks_a_pod_and_forwards(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp()
    env = epp.env
    rt = await epp.client.roundtrip(CHAT, chat_body(), session=epp.session)
    rq = rt.request
    assert rq.kinds[0] == "request_headers" and set(rq.kinds[1:]) == {"request_body"}
    assert rq.clear_route_cache
    dest = rq.destination
    pods = {p.address: p for p in env.pods.values()}
    assert dest is not None and dest in pods  # one ip:port by default: what ORIGINAL_DST accepts
    # the same value, twice
    assert rq.dynamic_metadata == {"envoy.lb": {"x-gateway-destination-endpoint": dest}}
    assert rq.set_headers["content-length"] == str(len(rq.body))
    got = pods[dest.split(",")[0]].received[-1]
    assert got["body"]["model"] == "Qwen/Qwen2.5-32B-Instruct"  # the worker set's servedName
    assert rt.status == 200
    # restored for the client
    assert msgspec.json.decode(rt.body)["model"] == "qwen-2.5"
    assert rt.headers["x-kinference-backend"].startswith("Local/qwen-2-5-32b")
    assert env.provider.received == []
    assert inflight(env) == 0


REWRITE = """
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {name: alias, namespace: default}
spec:
  poolRef: {group: kinference.buoyant.io, kind: InferencePool, name: inference-all}
  rules:
    - matches: [{model: {type: Exact, value: qwen}}]
      targets: [{modelRewrite: qwen-2.5}]
"""


async def republish(env: Env, extra: str) -> None:
    """The example pool again, with ``extra`` documents."""
    import asyncio

    from kinference_common.compiler import compile_documents
    from kinference_common.manifests import load_text
    from kinference_policy_compiler.publisher import ConfigPublisher
    from tests.router.manifests import example_documents

    res = compile_documents(example_documents(env.provider.address) + load_text(extra, "extra"))
    assert not res.errors, res.errors
    publisher = ConfigPublisher(env.nc)
    await publisher.start()
    await publisher.publish(res.pools)
    for _ in range(50):
        await asyncio.sleep(0.05)
        snap = env.router.keeper.snapshot
        if snap is not None and snap.pool.rewrites:
            return
    raise AssertionError("the rewrite never reached the router")


async def test_model_rewrite_reaches_the_pod_and_is_undone_for_the_client(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp()
    await republish(epp.env, REWRITE)
    body = json.dumps({"model": "qwen", "messages": [{"role": "user", "content": CLEAN_PROMPT}]}).encode()
    rt = await epp.client.roundtrip(CHAT, body, session=epp.session)
    assert rt.status == 200, rt.body
    pods = {p.address: p for p in epp.env.pods.values()}
    assert pods[rt.request.destination.split(",")[0]].received[-1]["body"]["model"] == "Qwen/Qwen2.5-32B-Instruct"
    assert msgspec.json.decode(rt.body)["model"] == "qwen"  # the client's name, back
    # the new length, announced with the held response
    assert rt.response is not None and rt.response.set_headers["content-length"] == str(len(rt.body))
    # streamed: every chunk's model put back, as it passes
    rt = await epp.client.roundtrip(CHAT, body[:-1] + b', "stream": true}', session=epp.session)
    text = rt.body.decode()
    assert text.count('"model": "qwen"') == 3 and "Qwen/" not in text


async def test_a_body_over_62000_bytes_goes_back_in_chunks(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp()
    body = chat_body("lorem ipsum " * 12_000)  # ~144 kB, about 27,500 tokens: inside the 32,768-token window
    rq = await epp.client.exchange(CHAT, {}, body, chunk=50_000)
    assert rq.immediate is None
    assert max(rq.chunks) <= 62_000 and len(rq.chunks) >= 3
    assert rq.kinds.count("request_headers") == 1 and rq.kinds[0] == "request_headers"
    sent = msgspec.json.decode(rq.body)
    assert sent["messages"][0]["content"] == "lorem ipsum " * 12_000
    assert rq.set_headers["content-length"] == str(len(rq.body))


async def test_immediate_answers_in_the_router_envelope(start_epp: Any, classifier: Any, tmp_path: Any) -> None:
    from kinference_router.tenants import Authenticator

    epp: Epp = await start_epp()
    env = epp.env
    cases = [
        (b'{"model": "qwen-2.5", "messages": [', 400, "bad_request"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "bad_request"),
        (b'{"model": "llama-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
        (b"x" * (5 * 1024 * 1024), 413, "payload_too_large"),
    ]
    for body, status, code in cases:
        rq = await epp.client.exchange(CHAT, {}, body, chunk=1 << 20)
        assert rq.status == status, (body[:40], rq.immediate)
        err = msgspec.json.decode(rq.immediate.body)["error"]
        assert err["code"] == code and err["message"] and len(err["decision_id"]) == 32
    keys = tmp_path / "tenants.yaml"
    keys.write_text("tenants:\n  - name: alice\n    apiKeys: [sk-alice]\n")
    env.router.auth = Authenticator.from_file("apiKey", keys)
    rq = await epp.client.exchange(CHAT, {"authorization": "Bearer sk-wrong"}, chat_body())
    assert rq.status == 401 and msgspec.json.decode(rq.immediate.body)["error"]["code"] == "unauthorized"
    rq = await epp.client.exchange(CHAT, {"authorization": "Bearer sk-alice"}, chat_body())
    assert rq.immediate is None and rq.destination
    assert "authorization" in rq.remove_headers  # the tenant's key never reaches a pod
    assert sum(len(p.received) for p in env.pods.values()) == 0
    # the model list asks for a key too, as the data port's does
    for path in ("/v1/models", "/v1/models/qwen-2.5"):
        rq = await epp.client.exchange(path, {}, None)
        assert rq.status == 401 and msgspec.json.decode(rq.immediate.body)["error"]["code"] == "unauthorized"
        rq = await epp.client.exchange(path, {"authorization": "Bearer sk-alice"}, None)
        assert rq.status == 200, path
    # saturated, a PII prompt has nowhere to go: 503 with Retry-After
    await env.saturate()
    rq = await epp.client.exchange(CHAT, {"authorization": "Bearer sk-alice"},
                                   chat_body("Email jane.doe@example.com the contract."))
    assert rq.status == 503
    assert {h.header.key: h.header.raw_value for h in rq.immediate.headers.set_headers}["retry-after"] == b"1"


async def test_get_models_is_answered_from_the_snapshot(start_epp: Any) -> None:
    epp: Epp = await start_epp()
    rq = await epp.client.exchange("/v1/models", {}, None)
    assert rq.status == 200
    assert "qwen-2.5" in [m["id"] for m in msgspec.json.decode(rq.immediate.body)["data"]]
    rq = await epp.client.exchange("/v1/models/nope", {}, None)
    assert rq.status == 404


async def test_subset_hint_restricts_the_pick(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(fallbacks=0)
    env = epp.env
    one = env.pods["qwen-1"].address
    for subset in ([one], one, f"{one}, 10.9.9.9:1"):  # a list, or a comma string
        for _ in range(4):
            rq = await epp.client.exchange(CHAT, {}, chat_body(), subset=subset)
            assert rq.destination == one, (subset, rq.immediate)
    # a bare IP matches every port: every pod here is on 127.0.0.1
    rq = await epp.client.exchange(CHAT, {}, chat_body(), subset=["127.0.0.1"])
    assert rq.destination in {p.address for p in env.pods.values()}
    for subset in ([], ["10.9.9.9:8000"], ""):
        rq = await epp.client.exchange(CHAT, {}, chat_body(), subset=subset)
        assert rq.status == 503, subset
        assert msgspec.json.decode(rq.immediate.body)["error"]["code"] == "no_capacity"


async def test_fallback_list_is_the_next_best_of_the_same_decision(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(fallbacks=2)
    env = epp.env
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body())
    endpoints = rq.destination.split(",")
    pods = {p.address for p in env.pods.values()}
    assert len(endpoints) == 3 and len(set(endpoints)) == 3 and set(endpoints) <= pods
    assert inflight(env) == 1  # the pick's send only; the fallbacks are not sends
    await s.close()
    # each fallback is what the engine picks with the ones before it avoided
    snap = env.router.keeper.snapshot
    keys = {c.state.address: c.ledger_key for c in snap.candidates if c.is_local}
    from kinference_common.engine import Request
    req = Request(model="qwen-2.5", prompt_tokens=10, tags=frozenset({"pii-clean"}))
    d = env.router.director.decide(req, snap, {keys[endpoints[0]]})
    assert d.candidate.state.address == endpoints[1]


async def test_the_served_endpoint_takes_the_in_flight_work(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp(fallbacks=2)
    env = epp.env
    ledger = env.router.ledger
    # each pod its own prefix cache hit rate: the prompt each would prefill differs (the prompt
    # is shorter than a prefix block: the hit rate is all the router knows of their caches)
    hit_rates = dict(zip(env.pods, (0.0, 0.3, 0.6), strict=True))
    for pod, rate in hit_rates.items():
        await env.telemetry(pod, prefix_cache_hit_rate=rate)
    await env.settle()
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body())
    snap = env.router.keeper.snapshot
    keys = {c.state.address: c.ledger_key for c in snap.candidates if c.is_local}
    backend = {c.state.address: c.backend for c in snap.candidates if c.is_local}
    listed = rq.destination.split(",")
    first = listed[0]
    # served by the first of the list in another worker set (the gateway's retries walked on)
    second = next(a for a in listed[1:] if backend[a] != backend[first])

    def open_at(addr: str) -> int:
        load = ledger.loads.get(keys[addr])
        return load.in_flight if load is not None else 0

    assert open_at(first) == 1 and open_at(second) == 0
    rp = await s.response(200, {"content-type": "application/json"}, [b'{"model": "Qwen/Qwen2.5-32B-Instruct", ',
                                                                     b'"usage": {"prompt_tokens": 5, '
                                                                     b'"completion_tokens": 2}}'], served=second)
    assert msgspec.json.decode(rp.body)["model"] == "qwen-2.5"
    await s.close()
    assert open_at(first) == 0 and open_at(second) == 0 and inflight(env) == 0
    # the answer's length is the served endpoint's (its prefix index fill), not the first pick's, and
    # so is the prompt it computed: what the served pod's cache did not hold, 5 tokens by the usage
    prefix = env.router.prefix
    assert prefix.prompt_share(keys[first]) == PrefixIndex.PROMPT_SHARE
    estimate = router_estimate(CLEAN_PROMPT)
    prefill = round(estimate * (1 - hit_rates[next(p for p in env.pods if env.pods[p].address == second)]))
    computed = prefill * 5 / estimate
    w = PrefixIndex.SHARE_WEIGHT
    assert prefix.prompt_share(keys[second]) == pytest.approx(
        PrefixIndex.PROMPT_SHARE * (1 - w) + w * computed / (computed + 2), rel=1e-9)
    served = next(c for c in snap.candidates if c.is_local and c.state.address == second)
    assert rp.set_headers["x-kinference-backend"] == served.backend  # the answer names who served it
    sent = env.router.metrics.registry.get_sample_value(
        "kinference_endpoint_requests_total",
        {"pool": "default/inference-all", "worker_set": served.dest_name, "pod": served.endpoint, "outcome": "ok"})
    assert sent == 1


async def test_a_streamed_answer_without_usage_counts_its_events_for_the_prefix_index(start_epp: Any,
                                                                                    classifier: Any) -> None:
    """Through the gateway as on the data port: a local stream whose client
    did not ask for usage counts a token an event (less [DONE]) for the
    served pod's prompt share (fix 13); the other pods' shares stay."""
    epp: Epp = await start_epp()
    env = epp.env
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body(stream=True))
    snap = env.router.keeper.snapshot
    keys = {c.state.address: c.ledger_key for c in snap.candidates if c.is_local}
    served = rq.destination.split(",")[0]
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % w for w in (b"a", b"b", b"c")]
    await s.response(200, {"content-type": "text/event-stream"}, [*events, b"data: [DONE]\n\n"], served=served)
    await s.close()
    prefix = env.router.prefix
    assert prefix.prompt_share(keys[served]) != PrefixIndex.PROMPT_SHARE
    assert all(prefix.prompt_share(k) == PrefixIndex.PROMPT_SHARE for a, k in keys.items() if a != served)


async def test_a_stream_cut_mid_way_leaks_no_in_flight_work(start_epp: Any, classifier: Any) -> None:
    import asyncio

    epp: Epp = await start_epp()
    env = epp.env
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body(stream=True))
    assert rq.destination and inflight(env) == 1
    await s.send(response_headers=headers_message(
        {":status": "200", "content-type": "text/event-stream"}, end_of_stream=False))
    await s.recv()
    s.call.cancel()  # the gateway goes away mid-response
    for _ in range(100):
        if inflight(env) == 0:
            break
        await asyncio.sleep(0.02)
    assert inflight(env) == 0
    assert not any(load.in_flight for load in env.router.ledger.loads.values())


CONTEXT_REFUSAL = {"error": {"message": "This model's maximum context length is 32768 tokens. However, you requested "
                             "32790 tokens (30 in the messages, 32760 in the completion).",
                             "type": "BadRequestError", "param": None, "code": 400}}


async def test_a_pods_refusal_is_answered_in_the_routers_envelope(start_epp: Any, classifier: Any) -> None:
    """A pod's own 4xx (vLLM's envelope) comes back as the data port answers
    it: the router's envelope with the decision id, the pod's message, the
    code mapped (context_length_exceeded), rule and backend headers."""
    epp: Epp = await start_epp()
    env = epp.env
    s = epp.client.stream()
    rq = await s.request("POST", CHAT, {}, chat_body())
    rp = await s.response(400, {"content-type": "application/json"}, [json.dumps(CONTEXT_REFUSAL).encode()],
                          served=rq.destination)
    await s.close()
    assert rp.immediate is not None and rp.immediate.status.code == 400, rp
    assert msgspec.json.decode(rp.immediate.body) == {"error": {
        "message": CONTEXT_REFUSAL["error"]["message"], "type": "invalid_request_error",
        "code": "context_length_exceeded", "decision_id": rq.set_headers["x-kinference-decision-id"]}}
    headers = immediate_headers(rp.immediate)
    assert headers["x-kinference-decision-id"] == rq.set_headers["x-kinference-decision-id"]
    assert headers["x-kinference-backend"].startswith("Local/") and headers["x-kinference-rule"]
    assert headers["content-type"] == "application/json"
    assert inflight(env) == 0


async def test_pods_refusals_are_answered_alike_at_both_doors(start_epp: Any, classifier: Any) -> None:
    """The same pod answer, through the data port and through the EPP: the
    same status, code, type and message (a 401, 403 or 404 is the router's
    configuration: 502 naming the backend; a 5xx is 502)."""
    epp: Epp = await start_epp()
    env = epp.env
    for status, want in ((400, 400), (422, 422), (401, 502), (404, 502), (500, 502)):
        for pod in env.pods.values():
            pod.status = status
        r = await env.chat(CLEAN_PROMPT)
        via_router = msgspec.json.decode(await r.read())["error"]
        rt = await epp.client.roundtrip(CHAT, chat_body(), session=epp.session)
        via_epp = msgspec.json.decode(rt.body)["error"]
        assert (rt.status, r.status) == (want, want), (status, rt.body)
        assert len(via_epp.pop("decision_id")) == len(via_router.pop("decision_id")) == 32
        # the backend named may differ (either worker set may serve)
        via_epp["message"] = via_epp["message"].replace(rt.headers["x-kinference-backend"], "B")
        via_router["message"] = via_router["message"].replace(r.headers["x-kinference-backend"], "B")
        assert via_epp == via_router, status
        assert rt.headers["x-kinference-rule"] == r.headers["x-kinference-rule"]
    assert inflight(env) == 0


async def test_a_wrong_method_or_path_is_answered_as_on_the_data_port(start_epp: Any) -> None:
    """405 with the data port's message and ``Allow`` (404 for a path it does
    not serve), at once, with or without a body."""
    epp: Epp = await start_epp()
    env = epp.env
    assert env.client.session is not None
    cases = [("POST", "/v1/models", b"{}"), ("POST", "/v1/models", None), ("GET", CHAT, None),
             ("GET", "/v1/completions", chat_body()), ("DELETE", "/v1/models/qwen-2.5", None),
             ("POST", "/v2/chat/completions", chat_body())]
    for method, path, body in cases:
        s = epp.client.stream()
        try:
            rq = await s.request(method, path, {}, body)
        finally:
            await s.close()
        async with env.client.session.request(method, path, data=body) as r:
            want_status, want, allow = r.status, msgspec.json.decode(await r.read())["error"], r.headers.get("Allow")
        assert rq.status == want_status == (404 if path.startswith("/v2") else 405), (method, path, rq)
        got = msgspec.json.decode(rq.immediate.body)["error"]
        assert (got["code"], got["message"], got["type"]) == (want["code"], want["message"], want["type"])
        assert immediate_headers(rq.immediate).get("allow") == allow, (method, path)
