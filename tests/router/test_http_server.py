"""The router's HTTP server (kinference_router.http_server) on real sockets:
what its docstring promises, byte by byte where a client library would hide it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kinference_router.http_server import Handler, HttpServer, Request, Response


class Calls:
    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.wrote = 0
        self.error: BaseException | None = None


@pytest.fixture
def calls() -> Calls:
    return Calls()


def routes(calls: Calls) -> dict[str, Any]:
    async def echo(req: Request) -> Response:
        calls.seen.append(req)
        return Response(200, req.body or req.path.encode(), [("x-query", req.query)], content_type="text/plain")

    async def slow(req: Request) -> Response:
        calls.seen.append(req)
        try:
            await calls.release.wait()
        except asyncio.CancelledError:
            calls.cancelled.set()
            raise
        return Response(200, b"slow done")

    async def stream(req: Request) -> None:
        req.start_stream(200, [("Content-Type", "text/event-stream")])
        for i in range(3):
            await req.write(f"data: {i}\n\n".encode())
        req.end_stream()

    def bulk(pieces: int, piece: bytes) -> Handler:
        async def handler(req: Request) -> None:
            req.start_stream(200, [("Content-Type", "application/octet-stream")])
            try:
                for _ in range(pieces):  # nothing awaited but write()
                    await req.write(piece)
                    calls.wrote += 1
            except asyncio.CancelledError:
                calls.cancelled.set()
                raise
            req.end_stream()
        return handler

    big_stream = bulk(400, b"x" * 65536)  # 400 x 64 KiB: far more than the socket buffers hold
    many_small = bulk(20_000, b"y" * 1024)  # 1 KiB pieces, 20 MiB

    async def counted(req: Request) -> None:
        # every write to the client's socket counted
        transport = req._conn.transport
        write = transport.write

        def counting(data: bytes) -> None:
            calls.wrote += 1
            write(data)
        transport.write = counting  # type: ignore[method-assign]
        try:
            await stream(req)
        finally:
            transport.write = write  # type: ignore[method-assign]

    async def late(req: Request) -> None:
        req.start_stream(200, [("Content-Type", "text/event-stream")])
        await calls.release.wait()  # the first token takes its time
        await req.write(b"data: late\n\n")
        req.end_stream()

    async def boom(req: Request) -> Response:
        raise KeyError("a secret prompt")

    async def cut(req: Request) -> None:
        req.start_stream(200, [])
        await req.write(b"partial")
        req.abort()

    async def bad_header(req: Request) -> Response:
        return Response(200, b"x", [("x-evil", "a\r\nSet-Cookie: pwned=1")])

    async def write_after_reset(req: Request) -> None:
        # the server does not notice the reset on its reading side (reading
        # paused here, as it would be if the loop were busy): only a write does
        req._conn.transport.pause_reading()
        req.start_stream(200, [])
        calls.seen.append(req)
        await calls.release.wait()  # the client has reset the connection
        try:
            for _ in range(1000):  # a handler that never waits on anything but write()
                await req.write(b"x" * 1024)
                calls.wrote += 1
        except Exception as exc:
            calls.error = exc
            raise

    return {"/echo": {"POST": echo, "GET": echo}, "/slow": {"POST": slow}, "/stream": {"POST": stream},
            "/counted": {"POST": counted}, "/late": {"GET": late}, "/many-small": {"GET": many_small},
            "/big": {"GET": big_stream}, "/boom": {"GET": boom}, "/cut": {"GET": cut},
            "/bad-header": {"GET": bad_header}, "/write-after-reset": {"GET": write_after_reset}}


@pytest.fixture
async def server(calls: Calls) -> AsyncIterator[HttpServer]:
    s = HttpServer(routes(calls), max_body_bytes=1000, keepalive_timeout=1.0)
    await s.start("127.0.0.1", 0)
    try:
        yield s
    finally:
        await s.close(grace=0.5)


async def exchange(server: HttpServer, data: bytes, *, until_close: bool = True, wait: float = 5.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    await writer.drain()
    try:
        if until_close:
            return await asyncio.wait_for(reader.read(), wait)
        return await asyncio.wait_for(reader.read(65536), wait)
    finally:
        writer.close()


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each Content-Length answer in ``raw``, in order."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        out.append((status, rest[:length]))
        raw = rest[length:]
    return out


async def test_keep_alive_serves_many_requests_on_one_connection(server: HttpServer, calls: Calls) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        for i in range(5):
            async with s.post(f"http://127.0.0.1:{server.port}/echo?n={i}", data=f"body {i}".encode()) as r:
                assert r.status == 200
                assert await r.read() == f"body {i}".encode()
                assert r.headers["x-query"] == f"n={i}"
                assert "Date" in r.headers
    assert len(calls.seen) == 5
    assert len({id(req._conn) for req in calls.seen}) == 1  # one connection carried them all


async def test_pipelined_requests_are_answered_in_order(server: HttpServer) -> None:
    data = (b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\none"
            b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nthree")
    got = answers(await exchange(server, data))
    assert [s for s, _ in got] == [200, 404, 200, 200]
    assert [got[0][1], got[2][1], got[3][1]] == [b"one", b"two", b"three"]


async def test_a_request_arriving_byte_by_byte(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    for byte in b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello":
        writer.write(bytes([byte]))
        await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answers(raw) == [(200, b"hello")]


async def test_chunked_request_body(server: HttpServer) -> None:
    data = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    assert answers(await exchange(server, data)) == [(200, b"hello world")]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_over_the_limit_reaches_the_handler_unread_and_the_connection_closes(
        server: HttpServer, calls: Calls, framing: str) -> None:
    big = b"y" * 1500
    if framing == "content-length":
        data = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1500\r\n\r\n" + big
    else:
        data = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"".join(b"%x\r\n%s\r\n" % (300, big[i:i + 300]) for i in range(0, 1500, 300)) + b"0\r\n\r\n")
    raw = await exchange(server, data)  # read() returns: the server closed the connection
    assert len(calls.seen) == 1 and calls.seen[0].body_too_large and calls.seen[0].body == b""
    assert b"Connection: close" in raw


async def test_expect_continue_only_within_the_limit(server: HttpServer, calls: Calls) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"ok")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert await reader.readexactly(2) == b"ok"
    writer.close()
    raw = await exchange(server, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                                 b"Expect: 100-continue\r\n\r\n")
    assert b"100 Continue" not in raw and calls.seen[-1].body_too_large


async def test_unknown_path_wrong_method_and_head(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{server.port}"
        async with s.get(f"{base}/nope") as r:
            assert r.status == 404
        async with s.delete(f"{base}/echo") as r:
            assert r.status == 405
            assert r.headers["Allow"] == "GET, HEAD, POST"
        async with s.head(f"{base}/echo") as r:
            assert r.status == 200
            assert r.headers["Content-Length"] == str(len(b"/echo"))
            assert await r.read() == b""


async def test_not_http_is_a_400_and_closes(server: HttpServer) -> None:
    raw = await exchange(server, b"HELLO THERE\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 ") and b"Connection: close" in raw


async def test_streamed_answer_is_chunked_and_complete(server: HttpServer) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://127.0.0.1:{server.port}/stream", data=b"{}") as r:
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            assert await r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_a_stream_written_in_one_turn_leaves_in_one_write(server: HttpServer, calls: Calls) -> None:
    # head, chunks and the terminating chunk: one write, not five system calls
    raw = await exchange(server, b"POST /counted HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                                 b"Connection: close\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in head
    assert body == b"9\r\ndata: 0\n\n\r\n9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    assert calls.wrote == 1


async def test_the_head_of_a_stream_leaves_before_its_first_chunk(server: HttpServer, calls: Calls) -> None:
    # a client sees the answer start (status, headers) while the upstream prefills
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /late HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and not calls.release.is_set()
        calls.release.set()
        assert await asyncio.wait_for(reader.read(), 5) == b"c\r\ndata: late\n\n\r\n0\r\n\r\n"
    finally:
        writer.close()


async def test_stream_to_http10_client_is_close_delimited(server: HttpServer) -> None:
    raw = await exchange(server, b"POST /stream HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close" in head
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_an_aborted_stream_has_no_terminating_chunk(server: HttpServer) -> None:
    raw = await exchange(server, b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.endswith(b"7\r\npartial\r\n")  # cut: no 0\r\n\r\n


async def slow_client(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client whose receive buffer is fixed small before it connects, so what
    the path holds does not depend on the kernel's autotuning."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", server.port))
    return await asyncio.open_connection(sock=sock, limit=65536)


async def test_slow_reader_holds_the_writer_back(server: HttpServer, calls: Calls) -> None:
    reader, writer = await slow_client(server)
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await asyncio.sleep(0.3)
    assert 0 < calls.wrote < 400  # paused: the socket buffers are full, the handler waits
    received = 0
    while received < 400 * 65536:
        chunk = await asyncio.wait_for(reader.read(1 << 20), 5)
        assert chunk
        received += len(chunk)
    assert calls.wrote == 400
    writer.close()


async def test_small_pieces_after_the_head_are_held_back_by_a_slow_reader_too(server: HttpServer,
                                                                               calls: Calls) -> None:
    # the head is held to the end of the turn with what follows it; that must not
    # let a handler that never waits on anything else pile megabytes in memory
    reader, writer = await slow_client(server)
    writer.write(b"GET /many-small HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    await asyncio.sleep(0.3)
    assert 0 < calls.wrote < 20_000 // 4  # paused long before the end
    tail = b""
    while not tail.endswith(b"\r\n0\r\n\r\n"):  # read to the terminating chunk: the rest follows
        chunk = await asyncio.wait_for(reader.read(1 << 20), 5)
        assert chunk
        tail = (tail + chunk)[-16:]
    writer.close()
    assert calls.wrote == 20_000


async def test_a_write_to_a_reset_connection_fails_instead_of_dropping_data(server: HttpServer, calls: Calls) -> None:
    """A send that fails closes the transport at once, but tells the
    protocol only on the loop's next turn; a handler writing again before
    that must get ConnectionResetError, not spin on writes that go nowhere."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /write-after-reset HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.transport.abort()  # RST: the client has gone
    await asyncio.sleep(0.2)
    calls.release.set()
    for _ in range(300):
        if calls.error is not None:
            break
        await asyncio.sleep(0.01)
    assert isinstance(calls.error, ConnectionResetError), (calls.error, calls.wrote)
    assert calls.wrote <= 1


async def test_client_going_away_cancels_the_handler(server: HttpServer, calls: Calls) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    for _ in range(100):
        if calls.seen:
            break
        await asyncio.sleep(0.01)
    writer.close()
    await asyncio.wait_for(calls.cancelled.wait(), 5)
    for _ in range(100):
        if not server.connections:
            break
        await asyncio.sleep(0.01)
    assert not server.connections


async def test_a_failing_handler_answers_500_without_its_message(server: HttpServer, capsys: Any) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{server.port}/boom") as r:
            assert r.status == 500
            assert "secret" not in await r.text()
        async with s.get(f"http://127.0.0.1:{server.port}/echo") as r:  # the server is fine
            assert r.status == 200
    out = capsys.readouterr()
    # the exception's message, not the word (the log names the test file, whose path may hold it)
    assert "KeyError" in out.out + out.err and "secret prompt" not in out.out + out.err


async def test_a_header_with_a_line_break_is_never_sent(server: HttpServer) -> None:
    raw = await exchange(server, b"GET /bad-header HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 500 ") and b"pwned" not in raw


async def test_idle_connections_are_swept(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"/echo"), 5)
    # keepalive_timeout is 1 s and the sweep runs every second: closed within about 2 s
    assert await asyncio.wait_for(reader.read(), 4) == b""
    writer.close()


async def slow_request_under_way(calls: Calls) -> tuple[HttpServer, asyncio.StreamReader, asyncio.StreamWriter]:
    """A server of its own (the test closes it) with a /slow request being handled."""
    s = HttpServer(routes(calls))
    await s.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    writer.write(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    while not calls.seen:
        await asyncio.sleep(0.01)
    return s, reader, writer


async def test_close_lets_a_request_under_way_finish(calls: Calls) -> None:
    s, reader, writer = await slow_request_under_way(calls)
    closing = asyncio.create_task(s.close(grace=5.0))
    await asyncio.sleep(0.1)
    with pytest.raises(OSError):  # no longer accepting
        await asyncio.open_connection("127.0.0.1", s.port)
    calls.release.set()
    raw = await asyncio.wait_for(reader.read(), 5)
    await closing
    assert raw.startswith(b"HTTP/1.1 200 ") and raw.endswith(b"slow done") and b"Connection: close" in raw
    writer.close()


async def test_close_cancels_what_outlives_the_grace(calls: Calls) -> None:
    s, _, writer = await slow_request_under_way(calls)
    await asyncio.wait_for(s.close(grace=0.2), 5)
    assert calls.cancelled.is_set()
    writer.close()
