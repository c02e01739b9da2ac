"""The retry rule through the whole router: a pod that read the request on
a reused connection and then died mid-generation gets no duplicate, the
client gets 502, the other pod never sees the request, and the decision
event says why. A pod that refuses the connection still has its request
tried on the next one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_common import subjects
from kinference_router import retry

from .manifests import one_worker_set_pool

MANIFESTS = one_worker_set_pool("retry")
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
COMPLETION = json.dumps({"id": "x", "object": "chat.completion", "choices": [
    {"message": {"role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


@dataclass
class DyingPod:
    """Answers the first request on a connection; reads the second whole,
    "generates" for a moment, then dies (the connection is cut)."""

    requests: list[int] = field(default_factory=list)  # connection number of each request read
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = id(writer)
        try:
            for n in range(2):
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                self.requests.append(conn)
                if n == 0:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                                 % (len(COMPLETION), COMPLETION))
                    await writer.drain()
                else:
                    await asyncio.sleep(0.2)  # generating...
                    writer.transport.abort()  # ... and killed
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@dataclass
class Env:
    served: Any
    dying: DyingPod
    other: list[Any]
    events: list[dict[str, Any]]


@pytest.fixture
async def env(start_pool: Any) -> AsyncIterator[Env]:
    dying = DyingPod()
    dying.server = await asyncio.start_server(dying.handle, "127.0.0.1", 0)
    other: list[Any] = []

    async def record(request: web.Request) -> web.Response:
        other.append(await request.json())
        return web.Response(body=COMPLETION, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", record)
    healthy = TestServer(app)
    await healthy.start_server()
    served = await start_pool(MANIFESTS, "retry")
    events: list[dict[str, Any]] = []

    async def on_event(msg: Any) -> None:
        events.append(json.loads(msg.data))

    await served.nc.subscribe(subjects.decisions_subject("default", "retry"), cb=on_event)
    # the dying pod is the faster pick; the healthy one is next best
    await served.endpoint("stub", "m", dying.address, pod="stub-0", settle=0.0)
    await served.endpoint("stub", "m", f"127.0.0.1:{healthy.port}", pod="stub-1", queued=3, settle=0.2)
    try:
        yield Env(served, dying, other, events)
    finally:
        await healthy.close()
        dying.server.close()


async def test_a_pod_killed_mid_generation_on_a_reused_connection_is_not_sent_the_request_again(env: Env) -> None:
    async with aiohttp.ClientSession() as s:
        r1 = await s.post(env.served.url, json=BODY)
        assert r1.status == 200 and r1.headers["x-kinference-backend"] == "Local/stub"
        assert env.served.router.upstream.idle_connections() == 1  # the connection is pooled
        r2 = await s.post(env.served.url, json=BODY)
        err = (await r2.json())["error"]
    assert r2.status == 502
    assert err["code"] == "upstream_error" and "not sent again" in err["message"]
    assert len(env.dying.requests) == 2 and env.dying.requests[0] == env.dying.requests[1]  # reused
    assert env.other == []  # never a duplicate on the other pod
    await asyncio.sleep(0.1)
    mine = [e for e in env.events if e["decision_id"] == err["decision_id"]]
    assert mine[0]["outcome"]["code"] is None  # routed, published while the pod worked
    assert mine[-1]["outcome"]["code"] == "upstream_error"
    assert retry.MAY_HAVE_BEEN_RECEIVED in mine[-1]["outcome"]["reason"]
    assert mine[-1]["outcome"]["endpoint"] == "stub-0"  # the dying pod


async def test_a_refused_connection_is_still_tried_on_the_next_pod(env: Env) -> None:
    assert env.dying.server is not None
    env.dying.server.close()
    await env.dying.server.wait_closed()
    async with aiohttp.ClientSession() as s:
        r = await s.post(env.served.url, json=BODY)
        await r.read()
    assert r.status == 200
    assert len(env.other) == 1 and env.dying.requests == []
