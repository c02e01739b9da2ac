"""Edge cases of the upstream HTTP/1.1 client (libs/kinference_common/upstream_http.py),
written during a review as failing tests; each docstring tells the defect it
caught (all fixed) and the test holds the fixed behaviour.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from kinference_common import upstream_http
from kinference_common.upstream_http import UpstreamBroken, UpstreamClient


async def serve(handler) -> tuple[web.AppRunner, int]:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient()
    yield c
    await c.close()


async def test_read_of_a_body_over_the_high_water_mark_completes(client: UpstreamClient) -> None:
    """Response.read() never takes the buffered body until the response is
    complete, but on_body pauses reading once more than _HIGH_WATER (256 KiB)
    is buffered: nothing resumes it, so read() waits until read_timeout fires
    and raises UpstreamTimeout. The router's non-streaming path uses read():
    any non-streamed completion over 256 KiB becomes a 504 after
    first_byte_timeout (120 s)."""
    payload = b"x" * (1024 * 1024)

    async def big(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=payload)

    runner, port = await serve(big)
    try:
        started = time.monotonic()
        r = await client.post(f"http://127.0.0.1:{port}/", b"{}", [], connect_timeout=2, read_timeout=2)
        data = await r.read()  # raises UpstreamTimeout after 2 s
        assert data == payload
        assert time.monotonic() - started < 1.5
    finally:
        await runner.cleanup()


async def test_a_paused_connection_is_never_pooled(client: UpstreamClient) -> None:
    """A response that completed while reading was paused (more than 256 KiB
    unread) and is then closed unread (a 429/5xx the router raises on, or a
    client that went away mid-stream) goes back to the pool with its transport
    still paused; send() resets _paused to False without calling
    resume_reading(), so the next request on that connection never gets its
    response: UpstreamTimeout after read_timeout."""
    # exactly one byte over the high-water mark: the read that crosses it is
    # the one that carries the last byte, so the response is complete and
    # reading paused at the same time
    size = upstream_http._HIGH_WATER + 1
    payload = b"y" * size
    calls = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        await request.read()
        return web.Response(body=payload if calls == 1 else b"small")

    runner, port = await serve(handler)
    try:
        url = f"http://127.0.0.1:{port}/"
        r = await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)
        await asyncio.sleep(0.3)  # all of it arrived
        conn = r._conn  # type: ignore[attr-defined]
        assert conn.complete and conn._paused  # precondition of the scenario
        r.close()  # the caller is done with it without reading the body
        r2 = await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)  # UpstreamTimeout
        assert await r2.read() == b"small"
    finally:
        await runner.cleanup()


async def test_a_slow_consumer_is_not_an_upstream_timeout(client: UpstreamClient) -> None:
    """The read-timeout timer keeps running while the client itself paused
    reading (consumer behind by > 256 KiB): the upstream sent everything at
    once, yet the response fails with UpstreamTimeout ("no data from the
    upstream") and the connection is aborted. In the router a slow
    downstream client thus becomes an upstream timeout (stream cut, outcome
    "timeout")."""
    payload = b"z" * (2 * 1024 * 1024)

    async def big(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=payload)

    runner, port = await serve(big)
    try:
        r = await client.post(f"http://127.0.0.1:{port}/", b"{}", [], connect_timeout=2, read_timeout=0.5)
        got = []
        async for chunk in r.chunks():
            got.append(chunk)
            if len(got) == 1:
                await asyncio.sleep(1.0)  # the downstream client is slow for a moment
        assert b"".join(got) == payload
    finally:
        await runner.cleanup()


async def test_non_latin1_header_values_are_forwarded(client: UpstreamClient) -> None:
    """aiohttp's server hands the router header values decoded as UTF-8; the
    request head is encoded as latin-1, so a client header such as
    ``X-Title: 日本`` raises UnicodeEncodeError (a ValueError), which the router
    answers as 502 upstream_error "request not sent". aiohttp's ClientSession,
    which this replaces, sent such values (UTF-8)."""
    seen: list[str] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-Title", ""))
        return web.Response(text="ok")

    runner, port = await serve(echo)
    try:
        r = await client.post(f"http://127.0.0.1:{port}/", b"{}", [("X-Title", "日本")],
                              connect_timeout=2, read_timeout=2)
        assert await r.read() == b"ok"
        assert seen == ["日本"]
    finally:
        await runner.cleanup()


async def raw_server(replies: list[bytes], *, rst_after: bool = False) -> tuple[asyncio.Server, int]:
    """Answers the n-th request head on a connection with replies[n]; with
    ``rst_after``, then resets the connection (SO_LINGER 0)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for reply in replies:
            try:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)  # the b"{}" body
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            writer.write(reply)
            await writer.drain()
        if rst_after:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        else:
            await asyncio.sleep(0.5)
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_bytes_beyond_a_complete_response_do_not_leak_into_it(client: UpstreamClient) -> None:
    """After a message is complete the parser keeps feeding: bytes the upstream
    sends beyond the response (a buggy/malicious upstream, or a stray late
    response) are parsed as a *new* response into the same Connection: its
    headers are appended to the first Response's header list and its body to
    the first body; the connection is then pooled (response desync)."""
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Stray: 1\r\n\r\nwrong"
    srv, port = await raw_server([first + stray])
    async with srv:
        r = await client.post(f"http://127.0.0.1:{port}/", b"{}", [], connect_timeout=2, read_timeout=2)
        await asyncio.sleep(0.2)  # the stray bytes arrived
        assert r.header("X-Stray") is None
        assert await r.read() == b"ok"
        assert client.idle_connections() == 0, "a connection that received unsolicited bytes must not be reused"


async def test_a_reset_close_delimited_body_is_not_complete(client: UpstreamClient) -> None:
    """A body delimited by the connection's end that ends with a reset
    (ECONNRESET, connection_lost(exc)) is truncated, not complete; the
    client ignores ``exc`` and returns the partial body as the whole."""
    srv, port = await raw_server([b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npartial"], rst_after=True)
    async with srv:
        r = await client.post(f"http://127.0.0.1:{port}/", b"{}", [], connect_timeout=2, read_timeout=2)
        with pytest.raises(UpstreamBroken):
            await r.read()


def _answers_once_then_closes(heads: list[bytes], body: int) -> Any:
    """A server that answers a connection's first request, then reads the
    second (its head and ``body`` bytes) and closes without a byte of answer."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(body)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        try:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            await reader.readexactly(body)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.transport.abort()

    return handle


async def test_a_request_the_server_read_on_a_pooled_connection_is_never_sent_again(
    client: UpstreamClient,
) -> None:
    """A pooled connection the server closes after it read the request (what
    a pod killed mid-generation looks like): the client once re-sent the
    request on a fresh connection whenever a *reused* connection yielded no
    response byte, which ran the generation twice. Now the request, written
    whole, fails as SentNotAnswered and is not sent again (retry.py); the
    server saw it exactly once."""
    heads: list[bytes] = []
    srv = await asyncio.start_server(_answers_once_then_closes(heads, body=2), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        url = f"http://127.0.0.1:{port}/"
        assert await (await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)).read() == b"ok"
        assert client.idle_connections() == 1
        with pytest.raises(upstream_http.SentNotAnswered, match="not sent again"):
            await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)
        await asyncio.sleep(0.1)
    assert len(heads) == 2  # the first request and the second, once


async def test_a_get_lost_unanswered_on_a_reused_connection_is_sent_again_on_a_new_one(
        client: UpstreamClient) -> None:
    """The same server for the collector's scrapes: a GET is safe to repeat,
    so where a POST fails as SentNotAnswered the GET goes out once more on a
    new connection and gets its answer (a scrape is not lost to a keep-alive
    race)."""
    heads: list[bytes] = []
    srv = await asyncio.start_server(_answers_once_then_closes(heads, body=0), "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        url = f"http://127.0.0.1:{port}/metrics"
        assert await (await client.get(url, connect_timeout=2, read_timeout=2)).read() == b"ok"
        assert client.idle_connections() == 1
        assert await (await client.get(url, connect_timeout=2, read_timeout=2)).read() == b"ok"
    assert [h.split(b"\r\n")[0] for h in heads] == [b"GET /metrics HTTP/1.1"] * 3
    assert all(b"content-length" not in h.lower() for h in heads)  # a GET has no body


async def test_a_pooled_connection_the_server_already_closed_is_not_written_on(client: UpstreamClient) -> None:
    """The idle-close race: the server closed a pooled connection (its FIN is
    in the router's kernel, the event loop has not seen it yet). The client
    peeks before writing, drops that connection and sends on a new one:
    nothing was written on the closed one, so this is not a retry."""
    conns = []

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # an idle close, no Connection: close header

    srv = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        url = f"http://127.0.0.1:{port}/"
        assert await (await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)).read() == b"ok"
        assert client.idle_connections() == 1
        time.sleep(0.1)  # the FIN arrives; the loop does not run, so the client was not told
        r = await client.post(url, b"{}", [], connect_timeout=2, read_timeout=2)
        assert await r.read() == b"ok"
    assert len(conns) == 2


async def test_a_connection_lost_before_the_request_was_written_is_not_received(client: UpstreamClient) -> None:
    """A server that reads nothing and resets the connection while most of a
    large request is still in the router's write buffer: provably not
    received, so the caller may try elsewhere (NotFullyWritten, a
    ConnectFailed)."""
    async def reset_unread(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.2)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    srv = await asyncio.start_server(reset_unread, "127.0.0.1", 0, limit=1024)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        with pytest.raises(upstream_http.NotFullyWritten):
            await client.post(f"http://127.0.0.1:{port}/", b"x" * (64 * 1024 * 1024), [], connect_timeout=2,
                              read_timeout=5)


@pytest.mark.parametrize("head, tail", [
    # a header that never ends, endless small headers, endless trailers after the last chunk
    (b"HTTP/1.1 200 OK\r\nX-Big: ", b"a" * 4096),
    (b"HTTP/1.1 200 OK\r\n", b"a: b\r\n" * 700),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n", b"t: " + b"v" * 4093),
])
async def test_a_response_that_sends_headers_without_end_is_cut_off(
        client: UpstreamClient, head: bytes, tail: bytes) -> None:
    """llhttp holds a header whole and httptools keeps every header: an
    upstream (a scraped pod, a provider) sending headers or trailers without
    end grew the process by 100 MB a target in half a second. Past 64 KiB in a
    row without body the response fails, and the server is cut off."""
    sent = 0

    async def bomb(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        try:
            for _ in range(10_000):
                writer.write(tail)
                sent += len(tail)
                await writer.drain()
        except ConnectionError:
            return

    srv = await asyncio.start_server(bomb, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        with pytest.raises(UpstreamBroken, match="64 KiB"):
            r = await client.get(f"http://127.0.0.1:{port}/metrics", connect_timeout=2, read_timeout=5)
            await r.read()
        await asyncio.sleep(0.1)
    assert sent < 10_000 * len(tail) // 4  # cut off, not read to the end


async def test_a_long_stream_of_small_chunks_is_not_taken_for_endless_framing(client: UpstreamClient) -> None:
    """Every read that brings body resets the count: a long streamed answer
    (an SSE stream of tokens) has far more framing than 64 KiB in all."""
    body = b"".join(b"5\r\ntoken\r\n" for _ in range(20_000)) + b"0\r\n\r\n"

    async def stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(body), 4096):
            writer.write(body[i:i + 4096])
            await writer.drain()

    srv = await asyncio.start_server(stream, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    async with srv:
        r = await client.get(f"http://127.0.0.1:{port}/", connect_timeout=2, read_timeout=5)
        assert await r.read() == b"token" * 20_000
