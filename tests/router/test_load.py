"""A short version of ``make load-router``: many concurrent streams through
the router (in-process, a real nats-server, an upstream stand-in that streams
slowly), every one complete, none failed. Behaviour only: no timing or
memory figure is asserted here (the load test reports those)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_router.app import Router

from .manifests import one_worker_set_pool

STREAMS = 200  # open at once
SECONDS = 5.0  # new streams keep starting for this long
CHUNKS = 20  # content chunks per stream
INTERVAL = 0.05  # seconds between chunks: a stream lasts about a second

MANIFESTS = one_worker_set_pool("load", worker_set="load-stub", model="load-model", served_name="load-model-served",
                                policy="load-catch-all")


async def slow_stream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(CHUNKS):
        chunk = {"choices": [{"index": 0, "delta": {"content": f"tok{i}"}}], "model": body["model"]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(INTERVAL)
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": CHUNKS}}
    await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    await resp.write_eof()
    return resp


@dataclass
class LoadEnv:
    router: Router
    url: str


@pytest.fixture
async def load_env(start_pool: Any) -> AsyncIterator[LoadEnv]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", slow_stream)
    upstream = TestServer(app)
    await upstream.start_server()
    served = await start_pool(MANIFESTS, "load")
    await served.endpoint("load-stub", "load-model", f"127.0.0.1:{upstream.port}", settle=0.2)
    try:
        yield LoadEnv(served.router, served.url)
    finally:
        await upstream.close()


def content_of(raw: bytes) -> tuple[list[str], bool]:
    """The content chunks of a stream, and whether it ended with [DONE]."""
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    tokens = []
    for ev in events[:-1]:
        assert ev.startswith("data: "), ev
        for choice in json.loads(ev[6:]).get("choices", []):
            if choice.get("delta", {}).get("content"):
                tokens.append(choice["delta"]["content"])
    return tokens, bool(events) and events[-1] == "data: [DONE]"


@pytest.mark.slow
async def test_many_concurrent_streams_all_complete(load_env: LoadEnv) -> None:
    body = {"model": "load-model", "stream": True, "messages": [{"role": "user", "content": "a long story"}]}
    expected = [f"tok{i}" for i in range(CHUNKS)]
    results: list[tuple[int, list[str], bool]] = []
    failures: list[str] = []
    open_now = 0
    most_open = 0

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal open_now, most_open
        open_now += 1
        most_open = max(most_open, open_now)
        try:
            async with session.post(load_env.url, json=body) as r:
                raw = await r.read()
                results.append((r.status, *content_of(raw)))
        except Exception as exc:  # noqa: BLE001 - every failure is collected and asserted on
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            open_now -= 1

    async def worker(session: aiohttp.ClientSession, until: float) -> None:
        while time.monotonic() < until:
            await one(session)

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        until = time.monotonic() + SECONDS
        await asyncio.gather(*(worker(session, until) for _ in range(STREAMS)))

    assert failures == []
    assert most_open == STREAMS
    assert len(results) >= STREAMS
    for status, tokens, done in results:
        assert status == 200
        assert tokens == expected
        assert done
    # nothing left behind: every request counted in flight was finished
    await asyncio.sleep(0.1)
    inflight = [s.value for m in load_env.router.metrics.registry.collect() if m.name == "kinference_inflight"
                for s in m.samples]
    assert inflight and sum(inflight) == 0
