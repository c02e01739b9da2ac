"""How Router._send copes with what an upstream does (services/router/app.py):
most were written during a review as failing tests, and their docstrings tell
the defect each caught (all fixed); the last checks what the router learns
from upstream timing (TTFT calibration). One local endpoint whose behaviour
each test chooses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_common import subjects
from kinference_router.app import Router

from .manifests import one_worker_set_pool

MANIFESTS = one_worker_set_pool("review", served_name="m-served")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Env:
    router: Router
    url: str
    handler: list[Handler]
    observations: list[dict[str, Any]]


@pytest.fixture
async def env(start_pool: Any) -> AsyncIterator[Env]:
    handler: list[Handler] = []

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await handler[0](request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", dispatch)
    upstream = TestServer(app)
    await upstream.start_server()
    served = await start_pool(MANIFESTS, "review", first_byte_timeout=2.0)
    observations: list[dict[str, Any]] = []

    async def on_obs(msg: Any) -> None:
        observations.append(json.loads(msg.data))

    await served.nc.subscribe(subjects.observations_subject("default", "review"), cb=on_obs)
    await served.endpoint("stub", "m", f"127.0.0.1:{upstream.port}", settle=0.2)
    try:
        yield Env(served.router, served.url, handler, observations)
    finally:
        await upstream.close()


BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def test_a_large_non_streamed_completion_is_not_a_504(env: Env) -> None:
    """A non-streamed completion well over 256 KiB (2 MiB here) (long output, logprobs, n > 1):
    Response.read() stalls with reading paused until first_byte_timeout, and
    the client gets 504 upstream_timeout instead of the completion."""
    big = {"id": "x", "object": "chat.completion",
           "choices": [{"message": {"role": "assistant", "content": "a" * (2 * 1024 * 1024)}}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 2}}

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(big)

    env.handler.append(handler)
    async with aiohttp.ClientSession() as s:
        r = await s.post(env.url, json=BODY)
        body = await r.read()
    assert r.status == 200, body[:200]
    assert json.loads(body)["choices"][0]["message"]["content"] == "a" * (2 * 1024 * 1024)


async def test_a_non_latin1_client_header_is_not_a_502(env: Env) -> None:
    """A client header whose value is not latin-1 (``X-Title: 日本``, sent by
    aiohttp/httpx as UTF-8) makes the request head's latin-1 encode raise
    UnicodeEncodeError; _send maps that ValueError to 502 upstream_error
    "request not sent" (an upstream error for what the client sent; before,
    aiohttp's ClientSession forwarded it)."""
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [], "usage": None})

    env.handler.append(handler)
    async with aiohttp.ClientSession() as s:
        r = await s.post(env.url, json=BODY, headers={"X-Title": "日本"})
        text = await r.text()
    assert r.status == 200, text


async def test_a_stream_cut_by_the_upstream_is_not_a_clean_end_for_the_client(env: Env) -> None:
    """The upstream drops the connection mid-stream: _send catches the
    UpstreamBroken and returns the prepared StreamResponse without
    write_eof(); aiohttp then finishes it normally (the terminating 0-chunk),
    so the client sees a well-formed, complete stream and cannot tell the
    completion was truncated (OpenAI SDKs do not require [DONE])."""
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"delta": {"content": "Hel"}}]}\n\n')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()  # the upstream pod dies mid-generation
        return resp

    env.handler.append(handler)
    async with aiohttp.ClientSession() as s:
        r = await s.post(env.url, json={**BODY, "stream": True})
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


async def test_the_router_learns_ttft_calibration_from_streams_only(env: Env) -> None:
    """PredictedTTFT's calibration (TELEMETRY.md): an upstream whose first
    chunk comes ~100 ms after the request, far slower than the model predicts
    from its telemetry, moves ``c`` above 1 once enough streams were seen, and
    the next snapshot uses it. Non-streamed answers teach nothing (their first
    byte comes after the last token)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await asyncio.sleep(0.1)
        if not body.get("stream"):
            return web.json_response({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    env.handler.append(handler)
    async with aiohttp.ClientSession() as s:
        for _ in range(25):
            async with s.post(env.url, json=BODY) as r:
                assert r.status == 200
    assert env.router.calibration.samples == 0
    assert env.router.keeper.snapshot is not None and env.router.keeper.snapshot.ttft_model.calibration == 1.0
    async with aiohttp.ClientSession() as s:
        await asyncio.gather(*(_stream_once(s, env.url) for _ in range(25)))
    assert env.router.calibration.samples == 25
    learned = env.router.calibration.value
    assert learned > 1.5  # observed ~0.1 s against a prediction of a few tens of ms
    env.router.keeper.rebuild()
    assert env.router.keeper.snapshot.ttft_model.calibration == pytest.approx(learned, abs=1e-3)
    page = (await env.router.metrics_page(None)).body  # type: ignore[arg-type]
    assert b'kinference_ttft_calibration{pool="default/review"}' in page


async def _stream_once(s: aiohttp.ClientSession, url: str) -> None:
    async with s.post(url, json={**BODY, "stream": True}) as r:
        assert r.status == 200
        await r.read()
