"""Bad input gets a 4xx in the error envelope, never a 500, a traceback or
an error log: token limits the router can check, a prompt no candidate's
context window holds, JSON nested a thousand deep, malformed explain
requests, and an upstream's own 4xx (wrapped, with the decision id, its
message kept)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer

from .manifests import one_worker_set_pool

MANIFESTS = one_worker_set_pool("validate").replace("contextWindow: 32768", "contextWindow: 1000")


@dataclass
class Stub:
    """The one local pod: answers what the test sets, records what it received."""

    status: int = 200
    reply: Any = field(default_factory=lambda: {"id": "x", "object": "chat.completion", "choices": [
        {"message": {"role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    headers: dict[str, str] = field(default_factory=dict)
    received: list[Any] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        if isinstance(self.reply, bytes):
            return web.Response(status=self.status, body=self.reply, headers=self.headers)
        return web.json_response(self.reply, status=self.status, headers=self.headers)


@dataclass
class Env:
    url: str
    admin: str
    stub: Stub
    session: aiohttp.ClientSession

    async def post(self, url: str, data: bytes | None = None, **kw: Any) -> tuple[int, dict[str, Any], Any]:
        r = await self.session.post(url, data=data, **kw)
        return r.status, await r.json(content_type=None), r.headers


@pytest.fixture
async def env(start_pool: Any) -> AsyncIterator[Env]:
    stub = Stub()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stub.chat)
    upstream = TestServer(app)
    await upstream.start_server()
    served = await start_pool(MANIFESTS, "validate")
    await served.endpoint("stub", "m", f"127.0.0.1:{upstream.port}", settle=0.2)
    admin = served.router.admin_server()
    await admin.start("127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield Env(served.url, f"http://127.0.0.1:{admin.port}/debug/explain", stub, session)
    finally:
        await session.close()
        await admin.close(grace=0.5)
        await upstream.close()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], **extra}


def envelope(body: dict[str, Any], status: int, code: str, headers: Any = None) -> dict[str, Any]:
    err = body["error"]
    assert err["code"] == code, err
    assert len(err["decision_id"]) == 32 and err["message"]
    assert err["type"] == ("invalid_request_error" if status < 500 and status not in (401, 403, 429) else err["type"])
    if headers is not None:
        assert headers["x-kinference-decision-id"] == err["decision_id"]
    return err


@pytest.mark.parametrize("field_name", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [1e12, 10**12, -1, 0, 1.5, "10", True, 2**31])
async def test_token_limits_out_of_range_are_400_and_never_forwarded(env: Env, field_name: str, value: Any) -> None:
    status, body, headers = await env.post(env.url, json=chat(**{field_name: value}))
    assert status == 400
    err = envelope(body, 400, "bad_request", headers)
    assert field_name in err["message"]
    assert env.stub.received == []


async def test_a_prompt_longer_than_every_context_window_is_context_length_exceeded(env: Env) -> None:
    long = " ".join(f"word{i}" for i in range(3000))
    status, body, headers = await env.post(env.url, json=chat(messages=[{"role": "user", "content": long}],
                                                               max_tokens=100))
    assert status == 400
    err = envelope(body, 400, "context_length_exceeded", headers)
    assert "maximum context length is 1000 tokens" in err["message"]
    assert env.stub.received == []
    # a request that fits is served
    status, body, _ = await env.post(env.url, json=chat(max_tokens=100))
    assert status == 200 and len(env.stub.received) == 1


async def test_a_prompt_longer_than_the_window_is_refused_without_max_tokens_too(env: Env) -> None:
    # before, only a body with max_tokens was checked: this one reached the pod, which refused it
    long = " ".join(f"word{i}" for i in range(3000))
    status, body, headers = await env.post(env.url, json=chat(messages=[{"role": "user", "content": long}]))
    assert status == 400
    err = envelope(body, 400, "context_length_exceeded", headers)
    assert "maximum context length is 1000 tokens" in err["message"] and "no room" in err["message"]
    assert env.stub.received == []
    # explain says what the data port answered
    status, trace, _ = await env.post(env.admin, json={"body": chat(messages=[{"role": "user", "content": long}])})
    assert status == 200 and trace["outcome"]["code"] == "context_length_exceeded", trace["outcome"]


async def test_a_prompt_no_window_holds_is_a_400_not_a_wait_under_flow_control(start_pool: Any) -> None:
    # with flow control and a pod not ready (a rollout), the engine's rejection reads as no capacity:
    # it was queued until maxQueueWait and answered a retryable 503, for ever
    import time

    from kinference_common import bus, subjects
    from kinference_common.messages import EndpointState, encode

    from .manifests import one_worker_set_pool

    manifests = one_worker_set_pool("fc", flow_control="{maxQueueWait: 2s, maxQueued: 10}").replace(
        "contextWindow: 32768", "contextWindow: 1000")
    served = await start_pool(manifests, "fc")
    for pod, ready in (("stub-0", True), ("stub-1", False)):
        state = EndpointState(namespace="default", worker_set="stub", pod=pod, address="127.0.0.1:9", model="m",
                              ready=ready, scraped_at=time.time(), queued=0, running=0, kv_cache_usage=0.1,
                              prefill_tokens_per_second=10000.0)
        await served.nc.publish(subjects.endpoint_subject("default", "stub", pod), encode(state))
    await bus.sync(served.nc)
    await asyncio.sleep(0.3)
    long = " ".join(f"word{i}" for i in range(3000))
    async with aiohttp.ClientSession() as s:
        for extra in ({}, {"max_tokens": 10}):
            async with s.post(served.url, json=chat(messages=[{"role": "user", "content": long}], **extra)) as r:
                body = await r.json(content_type=None)
            assert r.status == 400 and body["error"]["code"] == "context_length_exceeded", body
            assert "Retry-After" not in r.headers  # a client error: nothing to retry


async def test_explain_refuses_the_bodies_the_data_port_refuses(env: Env) -> None:
    for bad, words in ((chat(max_tokens=-5), "`max_tokens` must be an integer"),
                       ({"model": "m", "messages": "hi"}, "`messages` must be a list")):
        status, body, _ = await env.post(env.url, json=bad)
        assert status == 400 and words in body["error"]["message"], body
        status, body, _ = await env.post(env.admin, json={"body": bad})
        assert status == 400 and words in body["error"]["message"], body
    assert env.stub.received == []


async def test_max_tokens_over_the_window_alone_is_context_length_exceeded(env: Env) -> None:
    status, body, _ = await env.post(env.url, json=chat(max_tokens=5000))
    assert status == 400
    assert "1000 tokens" in envelope(body, 400, "context_length_exceeded")["message"]


@pytest.mark.parametrize("reply, status, want_status, code, message", [
    ({"object": "error", "message": "temperature must be in [0, 2]", "type": "BadRequestError", "code": 400},
     400, 400, "bad_request", "temperature must be in [0, 2]"),
    ({"object": "error", "message": "This model's maximum context length is 1000 tokens. However, ...",
      "type": "BadRequestError", "code": 400}, 400, 400, "context_length_exceeded", "maximum context length"),
    ({"error": {"message": "bad enum", "type": "invalid_request_error", "code": "invalid_value"}},
     400, 400, "invalid_value", "bad enum"),
    ({"detail": "Unprocessable"}, 422, 422, "bad_request", "Unprocessable"),
    (b"plain text refusal", 400, 400, "bad_request", "plain text refusal"),
    ({"object": "error", "message": "The model `m` does not exist.", "code": 404}, 404, 502, "upstream_error",
     "Local/stub answered 404: The model `m` does not exist."),
    ({"error": {"message": "Incorrect API key"}}, 401, 502, "upstream_error", "Incorrect API key"),
])
async def test_an_upstream_4xx_is_wrapped_in_the_envelope_with_its_message(
        env: Env, reply: Any, status: int, want_status: int, code: str, message: str) -> None:
    env.stub.status, env.stub.reply = status, reply
    got, body, headers = await env.post(env.url, json=chat())
    assert got == want_status
    err = envelope(body, want_status, code, headers)
    assert message in err["message"]
    # routed, then refused: the answer names the rule and the backend, as every routed answer does
    assert headers["x-kinference-backend"] == "Local/stub" and headers["x-kinference-rule"], dict(headers)


async def test_an_upstream_429_keeps_its_retry_after(env: Env) -> None:
    env.stub.status, env.stub.headers = 429, {"Retry-After": "7"}
    env.stub.reply = {"error": {"message": "slow down"}}
    status, body, headers = await env.post(env.url, json=chat())
    assert status == 429 and headers["Retry-After"] == "7"
    assert envelope(body, 429, "rate_limited")["message"] == "slow down"


async def test_json_nested_a_thousand_deep_is_400_without_an_error_log(env: Env) -> None:
    deep = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    with structlog.testing.capture_logs() as logs:
        status, body, _ = await env.post(env.url, data=deep, headers={"Content-Type": "application/json"})
        status2, body2, _ = await env.post(env.admin, data=b"[" * 100_000)
    assert status == 400 and "nested more than 64" in envelope(body, 400, "bad_request")["message"]
    assert status2 == 400 and "nested" in envelope(body2, 400, "bad_request")["message"]
    assert [e for e in logs if e["log_level"] not in ("debug", "info")] == []
    assert env.stub.received == []


@pytest.mark.parametrize("payload, words", [
    ({"body": "x"}, "`body` must be a JSON object"),
    ({"body": chat(), "headers": ["a"]}, "`headers`"),
    ({"body": chat(), "headers": {"a": {"b": 1}}}, "`headers`"),
    ({"body": chat(), "tags": 5}, "`tags`"),
    ({"body": chat(), "tags": [1]}, "`tags`"),
    ({"body": chat(), "tags": ["pii-confrmed"]}, "`tags`: pii-confrmed: not a tag a classifier emits (the pii "
                                                 "classifier emits pii-confirmed, pii-none, pii-unknown)"),
    ({"body": chat(), "tags": ["pii-none", "pii-confirmed"]}, "pii-confirmed: pii already gave pii-none"),
    ({"body": chat(), "tenant": 7}, "`tenant`"),
    ({"body": {"model": "m"}}, "messages"),  # read as a chat body, as the data port's chat path refuses it
    ([1, 2], "JSON object"),
])
async def test_malformed_explain_requests_are_400_in_the_envelope(env: Env, payload: Any, words: str) -> None:
    with structlog.testing.capture_logs() as logs:
        status, body, _ = await env.post(env.admin, json=payload)
    assert status == 400
    assert words in envelope(body, 400, "bad_request")["message"]
    assert [e for e in logs if e["log_level"] in ("error", "critical", "warning")] == []


async def test_a_good_explain_request_still_explains(env: Env) -> None:
    status, body, _ = await env.post(env.admin, json={"body": chat(), "tags": ["pii-none"], "headers": {"X-A": "b"}})
    assert status == 200 and body["outcome"]["type"] == "Routed" and body["tags"] == ["pii-none"]
