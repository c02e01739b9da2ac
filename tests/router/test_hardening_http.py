"""The HTTP server under abuse, on real sockets: partial headers and slow
bodies meet their deadlines (408, then the connection closes; a byte now
and then does not reset them), unfinished bodies across connections share
one memory cap (503), connections are capped (503 at connect), header
count and size are capped (431). Deadlines here are small and configured;
nothing asserts how fast anything is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from kinference_router.app import server_error
from kinference_router.http_server import HttpLimits, HttpServer, Request, Response


class Seen:
    def __init__(self) -> None:
        self.requests: list[Request] = []


async def start(limits: HttpLimits, seen: Seen) -> HttpServer:
    async def echo(req: Request) -> Response:
        seen.requests.append(req)
        return Response(200, req.body or b"ok", content_type="text/plain")

    s = HttpServer({"/echo": {"POST": echo, "GET": echo}}, max_body_bytes=10_000, limits=limits,
                   on_error=server_error)
    await s.start("127.0.0.1", 0)
    return s


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Any]]:
    started: list[HttpServer] = []
    seen = Seen()

    async def factory(**limits: Any) -> tuple[HttpServer, Seen]:
        s = await start(HttpLimits(**limits), seen)
        started.append(s)
        return s, seen

    yield factory
    for s in started:
        await s.close(grace=0.2)


async def connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the server closes the connection (bounded, so a bug fails instead of hanging)."""
    return await asyncio.wait_for(reader.read(), 10)


async def test_partial_headers_get_408_then_close(make: Any) -> None:
    server, seen = await make(header_timeout=0.2)
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\n")  # never the blank line
    raw = await read_all(reader)
    assert raw.startswith(b"HTTP/1.1 408 ") and b'"request_timeout"' in raw and b"Connection: close" in raw
    assert seen.requests == [] and server.rejected["header_timeout"] == 1
    writer.close()


async def test_headers_sent_a_byte_at_a_time_still_meet_the_deadline(make: Any) -> None:
    server, _ = await make(header_timeout=0.3, keepalive_timeout=30)
    reader, writer = await connect(server)

    async def dribble() -> None:
        for b in b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
            writer.write(bytes([b]))
            await asyncio.sleep(0.02)

    task = asyncio.create_task(dribble())
    raw = await read_all(reader)
    task.cancel()
    assert raw.startswith(b"HTTP/1.1 408 ")
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_silently(make: Any) -> None:
    server, _ = await make(header_timeout=0.2)
    reader, writer = await connect(server)
    assert await read_all(reader) == b""
    assert server.rejected["header_timeout"] == 1 and not server.connections
    writer.close()


async def test_a_slow_body_gets_408_then_close(make: Any) -> None:
    server, seen = await make(body_timeout=0.3, keepalive_timeout=30)
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")

    async def dribble() -> None:
        while True:
            writer.write(b"x")
            await asyncio.sleep(0.02)

    task = asyncio.create_task(dribble())
    raw = await read_all(reader)
    task.cancel()
    assert raw.startswith(b"HTTP/1.1 408 ") and b"body" in raw
    assert seen.requests == [] and server.rejected["body_timeout"] == 1
    assert server.pending_body_bytes == 0  # what it had sent is let go
    writer.close()


async def test_a_keep_alive_connection_is_not_timed_out_between_requests(make: Any) -> None:
    server, seen = await make(header_timeout=0.2, body_timeout=0.2, keepalive_timeout=30)
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"ok"), 5)
    await asyncio.sleep(0.6)  # idle between requests: the keep-alive timeout applies, not the deadlines
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    raw = await read_all(reader)
    assert raw.startswith(b"HTTP/1.1 200 ") and len(seen.requests) == 2
    writer.close()


async def test_unfinished_bodies_share_one_memory_cap(make: Any) -> None:
    server, seen = await make(max_pending_body_bytes=1000)
    r1, w1 = await connect(server)
    w1.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n" + b"a" * 800)
    for _ in range(100):
        if server.pending_body_bytes == 800:
            break
        await asyncio.sleep(0.02)
    assert server.pending_body_bytes == 800
    r2, w2 = await connect(server)
    w2.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n" + b"b" * 300)
    raw = await read_all(r2)
    assert raw.startswith(b"HTTP/1.1 503 ") and b'"overloaded"' in raw
    assert server.rejected["body_memory"] == 1
    # the first one was not harmed: it finishes and is answered
    w1.write(b"a" * 100)
    head = await asyncio.wait_for(r1.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert await asyncio.wait_for(r1.readexactly(900), 5) == b"a" * 900
    assert server.pending_body_bytes == 0 and len(seen.requests) == 1
    for w in (w1, w2):
        w.close()


async def test_connections_over_the_limit_get_503_and_close(make: Any) -> None:
    server, seen = await make(max_connections=2)
    held = [await connect(server) for _ in range(2)]
    for _ in range(100):
        if len(server.connections) == 2:
            break
        await asyncio.sleep(0.01)
    reader, writer = await connect(server)
    raw = await read_all(reader)
    assert raw.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in raw
    assert server.rejected["connection_limit"] == 1
    writer.close()
    # one of the held ones goes away: there is room again
    held[0][1].close()
    for _ in range(100):
        if len(server.connections) < 2:
            break
        await asyncio.sleep(0.01)
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{server.port}/echo") as r:
        assert r.status == 200
    held[1][1].close()


@pytest.mark.parametrize("head, limit", [
    (b"".join(b"X-H%d: v\r\n" % i for i in range(101)), "more than 100 header lines"),
    (b"X-Big: " + b"a" * 70_000 + b"\r\n", "over 65536 bytes"),
])
async def test_too_many_or_too_big_headers_get_431(make: Any, head: bytes, limit: str) -> None:
    server, seen = await make()
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
    raw = await read_all(reader)
    assert raw.startswith(b"HTTP/1.1 431 ") and limit.encode() in raw
    assert seen.requests == [] and server.rejected["header_limit"] == 1
    writer.close()


async def test_a_hundred_headers_are_fine(make: Any) -> None:
    server, seen = await make()
    reader, writer = await connect(server)
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(99))  # plus Host: 100
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n"[:0] + b"\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ") and len(seen.requests) == 1
    writer.close()


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="header_timeout"):
        HttpLimits(header_timeout=0)


async def test_the_router_exports_its_http_limits(start_pool: Any) -> None:
    from .manifests import one_worker_set_pool

    served = await start_pool(one_worker_set_pool("limits"), "limits", http=HttpLimits(header_timeout=0.2))
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    assert (await read_all(reader)).startswith(b"HTTP/1.1 408 ")
    writer.close()
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{served.server.port}/metrics") as r:
        text = await r.text()
    assert 'kinference_http_rejected_total{reason="header_timeout",server="data"} 1.0' in text
    assert 'kinference_http_connections{server="data"}' in text
    assert 'kinference_http_pending_body_bytes{server="data"} 0.0' in text


@pytest.mark.parametrize("argv, words", [
    (["--header-timeout", "0"], "--header-timeout must be positive"),
    (["--max-header-bytes", "-1"], "--max-header-bytes must be positive"),
    (["--max-connections", "0"], "--max-connections must be positive"),
    (["--provider-header", "X-Forwarded-For"], "--provider-header 'X-Forwarded-For' refused"),
])
async def test_the_router_refuses_bad_limit_flags_before_starting(argv: list[str], words: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from kinference_router.__main__ import parse_args, run

    assert await run(parse_args(["--nats-url", "nats://127.0.0.1:1", *argv])) == 1
    assert words in capsys.readouterr().err


def test_the_router_flags_reach_the_limits() -> None:
    from kinference_router.__main__ import parse_args

    args = parse_args(["--header-timeout", "2.5", "--body-timeout", "7", "--max-connections", "10",
                       "--max-pending-body-bytes", "1000", "--max-headers", "20", "--max-header-bytes", "4096",
                       "--provider-header", "OpenAI-Beta"])
    assert (args.header_timeout, args.body_timeout, args.max_connections, args.max_pending_body_bytes,
            args.max_headers, args.max_header_bytes, args.provider_header) == (
        2.5, 7.0, 10, 1000, 20, 4096, ["OpenAI-Beta"])
