"""The router's upstream HTTP client against real servers on localhost
(aiohttp's server, and a raw asyncio server for what aiohttp would not send)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kinference_common import upstream_http
from kinference_common.upstream_http import ConnectFailed, Target, UpstreamBroken, UpstreamClient, UpstreamTimeout

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Upstream:
    """An aiohttp server recording what it received and from which client port."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.peers: set[int] = set()
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            self.peers.add(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
            self.requests.append({"path": request.path_qs, "headers": dict(request.headers),
                                  "body": await request.read()})
            return await handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", wrapped)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[..., Awaitable[Upstream]]]:
    made: list[Upstream] = []

    async def make(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> Upstream:
        u = Upstream()
        await u.start(handler, ssl_context)
        made.append(u)
        return u

    yield make
    for u in made:
        assert u.runner is not None
        await u.runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient()
    yield c
    await c.close()


async def post(c: UpstreamClient, url: str, body: bytes = b"{}", headers: Any = (),
               read_timeout: float = 5.0) -> upstream_http.Response:
    return await c.post(url, body, headers, connect_timeout=2.0, read_timeout=read_timeout)


async def ok_json(request: web.Request) -> web.Response:
    return web.json_response({"echo": len(await request.read())}, headers={"X-Up": "yes"})


async def test_post_sends_request_and_reads_response(upstream: Any, client: UpstreamClient) -> None:
    up = await upstream(ok_json)
    r = await post(client, f"http://127.0.0.1:{up.port}/v1/chat/completions?x=1", b'{"a": 1}',
                   [("Content-Type", "application/json"), ("X-Trace", "t-1")])
    assert r.status == 200
    assert r.header("x-up") == "yes" and r.header("Content-Type", "").startswith("application/json")
    assert r.header("missing") is None
    assert await r.read() == b'{"echo": 8}'
    got = up.requests[0]
    assert got["path"] == "/v1/chat/completions?x=1" and got["body"] == b'{"a": 1}'
    assert got["headers"]["Host"] == f"127.0.0.1:{up.port}"
    assert got["headers"]["X-Trace"] == "t-1" and got["headers"]["Content-Length"] == "8"


async def test_connection_is_reused_after_a_complete_response(upstream: Any, client: UpstreamClient) -> None:
    up = await upstream(ok_json)
    for _ in range(5):
        async with await post(client, f"http://127.0.0.1:{up.port}/v1/completions") as r:
            assert await r.read() == b'{"echo": 2}'
    assert len(up.requests) == 5 and len(up.peers) == 1
    assert client.idle_connections() == 1


async def test_idle_connection_expires(upstream: Any) -> None:
    up = await upstream(ok_json)
    c = UpstreamClient(idle_timeout=0.05)
    try:
        await (await post(c, f"http://127.0.0.1:{up.port}/")).read()
        assert c.idle_connections() == 1
        await asyncio.sleep(0.15)
        # closed by the sweep, without a request coming to find it expired
        assert c.idle_connections() == 0
        await (await post(c, f"http://127.0.0.1:{up.port}/")).read()
        assert len(up.peers) == 2, "an expired idle connection must not be reused"
    finally:
        await c.close()


async def test_streaming_chunks_arrive_as_they_are_sent(upstream: Any, client: UpstreamClient) -> None:
    go_on = asyncio.Event()

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        await go_on.wait()
        await resp.write(b"data: two\n\n")
        await resp.write_eof()
        return resp

    up = await upstream(sse)
    r = await post(client, f"http://127.0.0.1:{up.port}/v1/chat/completions")
    assert r.header("transfer-encoding") == "chunked"
    it = r.chunks()
    assert await asyncio.wait_for(it.__anext__(), 5) == b"data: one\n\n"  # before the server sends more
    go_on.set()
    rest = b"".join([c async for c in it])
    assert rest == b"data: two\n\n"
    assert client.idle_connections() == 1, "a stream read to the end leaves a reusable connection"
    # read to the end, the iterator stays ended: its connection went back to the pool, and
    # carries the next request's answer now, which is not this iterator's to take
    r2 = await post(client, f"http://127.0.0.1:{up.port}/v1/chat/completions")
    assert len(up.peers) == 1, "the second request reuses the connection"
    await asyncio.sleep(0.1)  # the second answer is in
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(it.__anext__(), 1)
    assert [c async for c in r.chunks()] == []
    assert await r2.read() == b"data: one\n\ndata: two\n\n"


async def test_large_body_is_read_whole_and_reading_pauses_while_unread(
    upstream: Any, client: UpstreamClient
) -> None:
    payload = bytes(range(256)) * (8 * 1024)  # 2 MiB

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=payload)

    up = await upstream(big)
    r = await post(client, f"http://127.0.0.1:{up.port}/")
    await asyncio.sleep(0.3)  # the server has written everything it could
    conn = r._conn  # type: ignore[attr-defined]
    assert conn.buffered <= upstream_http._HIGH_WATER + 256 * 1024, "unread body must not pile up"
    assert b"".join([c async for c in r.chunks()]) == payload


async def test_header_timeout(upstream: Any, client: UpstreamClient) -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    up = await upstream(slow)
    with pytest.raises(UpstreamTimeout, match="0.2 s"):
        await post(client, f"http://127.0.0.1:{up.port}/", read_timeout=0.2)
    assert client.idle_connections() == 0


async def test_stall_mid_stream_times_out(upstream: Any, client: UpstreamClient) -> None:
    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        await asyncio.sleep(5)
        return resp

    up = await upstream(stalls)
    r = await post(client, f"http://127.0.0.1:{up.port}/", read_timeout=0.3)
    got = []
    with pytest.raises(UpstreamTimeout):
        async for chunk in r.chunks():
            got.append(chunk)
    assert got == [b"data: one\n\n"]


async def test_connection_refused_is_connect_failed() -> None:
    c = UpstreamClient()
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    with pytest.raises(ConnectFailed, match=f"127.0.0.1:{port}"):
        await post(c, f"http://127.0.0.1:{port}/v1/completions")
    await c.close()


async def raw_server(reply: bytes, close: bool = True) -> tuple[asyncio.Server, int]:
    """A TCP server that reads a request head and writes ``reply`` verbatim."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(reply)
        await writer.drain()
        if close:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_body_delimited_by_close(client: UpstreamClient) -> None:
    srv, port = await raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nuntil the end")
    async with srv:
        r = await post(client, f"http://127.0.0.1:{port}/")
        assert await r.read() == b"until the end"
        assert client.idle_connections() == 0


async def test_connection_dropped_mid_body_is_broken(client: UpstreamClient) -> None:
    srv, port = await raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")
    async with srv:
        r = await post(client, f"http://127.0.0.1:{port}/")
        with pytest.raises(UpstreamBroken, match="middle of the response"):
            await r.read()


async def test_not_http_is_broken(client: UpstreamClient) -> None:
    srv, port = await raw_server(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    async with srv:
        with pytest.raises(UpstreamBroken):
            await post(client, f"http://127.0.0.1:{port}/")


async def test_interim_100_continue_is_skipped(client: UpstreamClient) -> None:
    srv, port = await raw_server(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
                                 close=False)
    async with srv:
        r = await post(client, f"http://127.0.0.1:{port}/")
        assert r.status == 201 and await r.read() == b"ok"


async def test_closing_early_closes_the_upstream_connection(upstream: Any, client: UpstreamClient) -> None:
    cancelled = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"data: more\n\n")
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            cancelled.set()
            raise

    up = await upstream(endless)
    async with await post(client, f"http://127.0.0.1:{up.port}/") as r:
        it = r.chunks()
        assert (await it.__anext__()).startswith(b"data: more")
    await asyncio.wait_for(cancelled.wait(), 5)
    assert client.idle_connections() == 0


async def test_line_breaks_in_headers_are_refused_before_sending(upstream: Any, client: UpstreamClient) -> None:
    up = await upstream(ok_json)
    with pytest.raises(ValueError, match="Authorization"):
        await post(client, f"http://127.0.0.1:{up.port}/", headers=[("Authorization", "Bearer k\r\nX-Evil: 1")])
    assert up.requests == []


def test_target_parsing() -> None:
    t = Target.parse("https://api.example.com/serving-endpoints/v1/chat/completions")
    assert (t.scheme, t.host, t.port, t.authority) == ("https", "api.example.com", 443, "api.example.com")
    assert t.path == "/serving-endpoints/v1/chat/completions"
    t = Target.parse("http://10.0.0.7:8000/v1/completions")
    assert (t.port, t.authority, t.path) == (8000, "10.0.0.7:8000", "/v1/completions")
    assert Target.parse("http://[::1]:8000/x").authority == "[::1]:8000"
    for bad in ("ftp://x/y", "not a url", "http:///nohost"):
        with pytest.raises(ValueError):
            Target.parse(bad)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "the TLS test needs the openssl command (Debian: apt-get install openssl)"
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


async def test_https_with_verification(upstream: Any, self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    up = await upstream(ok_json, ssl_context=server_ctx)
    trusting = UpstreamClient(ssl_context=ssl.create_default_context(cafile=str(cert)))
    try:
        r = await post(trusting, f"https://127.0.0.1:{up.port}/v1/chat/completions", b"{}")
        assert r.status == 200 and await r.read() == b'{"echo": 2}'
    finally:
        await trusting.close()
    default = UpstreamClient()  # the system's CAs do not know this certificate
    try:
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await post(default, f"https://127.0.0.1:{up.port}/v1/chat/completions")
    finally:
        await default.close()
