"""``bench.null_router``: the router's transport with nothing on it carries
a request and its answer, whole or streamed, and nothing else."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from kinference_simulators.testing import serve

from bench.null_router import NullRouter
from kinference_router.http_server import HttpServer


async def test_it_carries_the_body_and_the_answer_whole_or_streamed() -> None:
    seen: list[tuple[bytes, str | None, str | None]] = []

    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append((body, request.headers.get("x-client"), request.headers.get("authorization"),
                     request.headers.get("content-type")))
        if b'"stream": true' not in body:
            return web.json_response({"echo": body.decode()}, status=201)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for part in (b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", upstream)
    async with serve(app) as up:
        null = NullRouter(f"127.0.0.1:{up.port}")
        server = HttpServer({"/v1/chat/completions": {"POST": null.chat}})
        await server.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as s:
                url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
                async with s.post(url, data=b'{"stream": false}', headers={"x-client": "a", "Authorization": "k",
                                                                           "Content-Type": "text/plain"}) as r:
                    assert r.status == 201 and await r.json() == {"echo": '{"stream": false}'}
                async with s.post(url, data=b'{"stream": true}') as r:
                    assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
                    assert await r.read() == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"
        finally:
            await server.close(grace=1.0)
            await null.client.close()
    # the body as it came, the client's headers as the router passes them on: not its credentials, JSON
    assert seen[0] == (b'{"stream": false}', "a", None, "application/json") and seen[1][0] == b'{"stream": true}'


async def test_an_upstream_that_is_gone_is_a_502() -> None:
    null = NullRouter("127.0.0.1:9")  # discard: nothing listens
    server = HttpServer({"/v1/chat/completions": {"POST": null.chat}})
    await server.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", data=b"{}") as r:
                assert r.status == 502 and (await r.json())["error"] == "ConnectFailed"
    finally:
        await server.close(grace=1.0)
        await null.client.close()
