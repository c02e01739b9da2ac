"""An HTTP/1.1 client for the hot paths: keep-alive connection pools per
origin, requests written in one go, responses parsed by ``httptools``. The
router proxies requests to its upstreams with it, and the telemetry collector
scrapes its targets' pages with it.

Why not aiohttp's ``ClientSession`` (which both used first): on one core
it cost about 75-85 µs of CPU per proxied request, against about 10-13 µs for
this client on the same machine (``bench/router.py`` shows the effect on the
whole router), and about twice this client's CPU per scrape of a 45 KB page
(``make bench-collector``'s fetch row). Neither needs much of what
``ClientSession`` does per request (cookies, redirects, tracing signals, URL
building, multipart, proxy settings, decompression); the router serves its
clients with :mod:`kinference_router.http_server` for the same reason. The
HTTP parsing is ``httptools`` (llhttp, the parser of Node.js and uvicorn),
the TLS is asyncio's.

What it does:

- ``POST`` with a body and headers, ``GET`` with headers; the status and
  headers are available once they arrive; the body is read whole (:meth:`Response.read`) or as chunks as
  they arrive (:meth:`Response.chunks`), with chunked transfer encoding
  decoded and reading paused while the consumer is behind (no unbounded
  buffering of a stream).
- Timeouts: ``connect_timeout`` bounds the TCP (and TLS) connection;
  ``read_timeout`` bounds every wait for the next byte from the upstream
  (headers first, then each body chunk), like aiohttp's ``sock_read``.
- Keep-alive: a connection goes back to its origin's pool only when its
  response was read to the end and both sides allow keep-alive; it is closed
  when the caller stops early (a client that went away), on any error, and
  when it has been idle for ``idle_timeout`` (4 s by default, below the 5 s
  after which uvicorn, vLLM's server, closes idle connections, so that a
  request is not written onto a connection the server is closing).
- Errors say what happened: :class:`ConnectFailed` (nothing was received,
  so the caller may try another upstream), :class:`UpstreamTimeout`,
  :class:`SentNotAnswered` (the request was written whole, then the
  connection closed before any byte of the answer: it may have been
  received) and :class:`UpstreamBroken` (the connection dropped mid-answer,
  or the answer was not HTTP). A POST is sent twice only when provably not
  received (the router's :mod:`kinference_router.retry`): a pooled
  connection found closed before anything was written on it is dropped for
  another, and one lost while part of the request was still unwritten is
  tried once more on a new connection. A GET is safe to repeat: one written
  whole on a reused connection that then closed unanswered (the server
  closing it as the request went out) is sent once more on a new one.
- Header values with line breaks are refused before anything is written (no
  request smuggling through a forwarded header or a key file).
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httptools

#: why a request written whole was not sent again (the router's retry rule,
#: docs/hardening.md): in its errors, its 502 and its decision event
MAY_HAVE_BEEN_RECEIVED = "the request was written whole, so the upstream may have received it: not sent again"


def peer_closed(transport: Any) -> bool:
    """True when the peer has closed (or reset) this idle connection, or sent
    bytes nobody asked for: a zero-timeout poll of its socket finds it
    readable (end of file, data) or hung up, before the event loop has got
    round to telling the protocol. False when it looks alive (nothing to
    read) or cannot be checked. About a microsecond."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), _POLL_MASK)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


#: readable (end of file or stray bytes), peer hung up, error
_POLL_MASK = select.POLLIN | select.POLLPRI | getattr(select, "POLLRDHUP", 0)



class UpstreamError(Exception):
    """Anything that kept the upstream's response from arriving whole."""


class ConnectFailed(UpstreamError):
    """No connection (refused, unreachable, TLS failure, connect timeout):
    nothing of the request was sent."""


class UpstreamTimeout(UpstreamError):
    """The upstream sent nothing for ``read_timeout`` seconds."""


class UpstreamBroken(UpstreamError):
    """The connection dropped, or what came back was not an HTTP response."""


class SentNotAnswered(UpstreamBroken):
    """The request was written whole, then the connection closed before any
    byte of the answer: the upstream may have received it (a POST is never
    re-sent). ``reused``: it went out on a pooled connection."""

    def __init__(self, message: str, *, reused: bool = False) -> None:
        super().__init__(message)
        self.reused = reused


class NotFullyWritten(ConnectFailed):
    """The connection closed before the request was fully written: it was
    not received, so the caller may try another upstream."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL points, parsed once: the pool key and the request line's parts."""

    scheme: str
    host: str
    port: int
    path: str
    #: the ``Host`` header's value
    authority: str

    @classmethod
    def parse(cls, url: str) -> Target:
        try:
            u = httptools.parse_url(url.encode())
        except httptools.HttpParserInvalidURLError:
            raise ValueError(f"not a URL: {url!r}") from None
        scheme = (u.schema or b"").decode().lower()
        if scheme not in ("http", "https") or not u.host:
            raise ValueError(f"not an http(s) URL: {url!r}")
        host = u.host.decode()
        port = u.port or (443 if scheme == "https" else 80)
        path = (u.path or b"/").decode() + (f"?{u.query.decode()}" if u.query else "")
        default = (scheme == "http" and port == 80) or (scheme == "https" and port == 443)
        authority = (f"[{host}]" if ":" in host else host) + ("" if default else f":{port}")
        return cls(scheme, host, port, path, authority)


#: body bytes buffered per response before reading from the socket pauses
_HIGH_WATER = 256 * 1024
#: the most bytes a response may send in a row without a byte of body: the
#: status line and headers, a chunk's size line, the trailers (the parser
#: holds a header whole, and a hostile upstream could send one without end;
#: aiohttp refuses a header line over 8 KiB)
MAX_FRAMING = 64 * 1024


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection to an upstream, carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._paused = False
        self._parser = httptools.HttpResponseParser(self)
        self._reset()
        #: no exchange under way: anything the upstream sends now is stray
        self.complete = True

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._headers_done = False
        self._delimited = False  # has Content-Length or chunked framing
        if self._paused and self.transport is not None:
            self.transport.resume_reading()
        self._paused = False
        #: bytes of a response after the one under way (or while idle)
        self._stray = False
        #: any byte of the response has arrived
        self.got_bytes = False
        self._last_data = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._read_timeout = 0.0
        #: every byte of the request is with the kernel (not in our write buffer)
        self.fully_written = False
        #: body bytes so far, and bytes of the reads in a row that brought none
        self._body_bytes = 0
        self._framing = 0

    # ---------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # pause_writing() while any byte of a request is unwritten, resume_writing()
        # once all of it is with the kernel: how fully_written is known
        self.transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        self._last_data = self.loop.time()
        self.got_bytes = True
        body_before = self._body_bytes
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # pragma: no cover - we never ask to upgrade
            self._fail(UpstreamBroken("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBroken(f"malformed HTTP response: {exc}"))
        # reads that brought no body byte, in a row (a head, a chunk's size line
        # or trailers that do not end)
        self._framing = 0 if self._body_bytes > body_before else self._framing + len(data)
        if self._framing > MAX_FRAMING and not self.complete:
            self._fail(UpstreamBroken(f"the upstream sent over {MAX_FRAMING // 1024} KiB of headers or "
                                      "framing without body"))
        if self._stray:
            # the upstream sent more than the response it owed: the connection
            # cannot be trusted to frame the next one; the response already
            # complete stays as it was
            self.keep_alive = False
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.complete or self.error is not None:
            return
        if self._headers_done and not self._delimited and exc is None:
            # neither Content-Length nor chunked: the body ends with the connection
            self.complete = True
            self._wake()
            return
        what = "before the response" if not self._headers_done else "in the middle of the response"
        self._fail(UpstreamBroken(f"the upstream closed the connection {what}"))

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        self.fully_written = True

    # ------------------------------------------------- httptools callbacks

    def on_message_begin(self) -> None:
        if self.complete:
            self._stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._stray:
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._stray:
            return
        self.status = self._parser.get_status_code()
        if 100 <= self.status < 200:  # an interim response: the real one follows
            self.headers = []
            return
        self._headers_done = True
        for name, value in self.headers:
            lname = name.lower()
            if lname == b"content-length" or (lname == b"transfer-encoding" and b"chunked" in value.lower()):
                self._delimited = True
                break
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._stray:
            return
        self.body.append(body)
        self.buffered += len(body)
        self._body_bytes += len(body)
        if self.buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._stray or not self._headers_done:  # stray, or the end of an interim (1xx) response
            return
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()

    # ------------------------------------------------------------ waiting

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, err: UpstreamError) -> None:
        if self.error is None:
            self.error = err
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _check_timeout(self) -> None:
        self._timer = None
        if self.complete or self.error is not None or self.closed:
            return
        if self._paused:  # the consumer is behind, not the upstream
            self._timer = self.loop.call_at(self.loop.time() + self._read_timeout, self._check_timeout)
            return
        due = self._last_data + self._read_timeout
        if self.loop.time() >= due:
            self._fail(UpstreamTimeout(f"no data from the upstream for {self._read_timeout:g} s"))
        else:
            self._timer = self.loop.call_at(due, self._check_timeout)

    async def wait(self) -> None:
        """Until something new arrives (headers, body, the end, an error)."""
        if self.error is not None:
            raise self.error
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------- exchange

    def send(self, data: bytes, read_timeout: float) -> None:
        self._reset()
        assert self.transport is not None
        self._read_timeout = read_timeout
        self._last_data = self.loop.time()
        self._timer = self.loop.call_at(self._last_data + read_timeout, self._check_timeout)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() == 0:
            self.fully_written = True

    def take_body(self) -> bytes:
        data = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        self.body.clear()
        self.buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self._last_data = self.loop.time()  # the read timeout counts from now
            self.transport.resume_reading()
        return data

    def abort(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.abort()


class Response:
    """The upstream's status and headers; the body is read with :meth:`read`
    or :meth:`chunks`. Use as an async context manager (or call
    :meth:`close`): leaving before the end closes the connection."""

    __slots__ = ("status", "_headers", "_conn", "_client", "_pool_key", "_released")

    def __init__(self, conn: _Connection, client: UpstreamClient, pool_key: tuple[str, str, int]) -> None:
        self.status = conn.status
        self._headers = conn.headers
        self._conn = conn
        self._client = client
        self._pool_key = pool_key
        self._released = False

    def header(self, name: str, default: str | None = None) -> str | None:
        """A response header's value (the first of that name), or ``default``."""
        key = name.lower().encode()
        for n, v in self._headers:
            if n.lower() == key:
                return v.decode("latin-1")
        return default

    async def read(self) -> bytes:
        """The whole body (then the connection goes back to the pool)."""
        # taken as it comes, which keeps reading going past the high-water mark
        parts = [chunk async for chunk in self.chunks()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunks(self) -> _Chunks:
        """The body as it arrives (``async for``); each item is what came in
        since the last."""
        return _Chunks(self)

    def close(self) -> None:
        """Done with the response. A connection whose response was read to the
        end goes back to the pool; otherwise it is closed (the upstream sees
        the client go away)."""
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.complete and conn.keep_alive and not conn.closed and conn.error is None and not conn._paused:
            self._client._release(self._pool_key, conn)
        else:
            conn.abort()

    async def __aenter__(self) -> Response:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class _Chunks:
    """:meth:`Response.chunks`: an async iterator class rather than an async
    generator, which mypyc does not compile (``make bench-router-compiled``
    compiles this module with it); the response is closed at its end."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        response = self._response
        if response._released:  # read to the end (or closed): its connection may serve another request now
            raise StopAsyncIteration
        conn = response._conn
        while True:
            if conn.body:
                return conn.take_body()
            if conn.complete:
                response.close()
                raise StopAsyncIteration
            await conn.wait()


class UpstreamClient:
    """Keep-alive pools of upstream connections, one per (scheme, host, port)."""

    def __init__(self, *, idle_timeout: float = 4.0, max_idle_per_origin: int = 512,
                 ssl_context: ssl.SSLContext | None = None, max_urls: int = 4096) -> None:
        self.idle_timeout = idle_timeout
        #: parsed URLs kept (emptied when full): a router's upstreams, or a
        #: collector's targets' pages
        self.max_urls = max_urls
        self.max_idle_per_origin = max_idle_per_origin
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._closed = False
        self._sweeper: asyncio.TimerHandle | None = None

    def target(self, url: str) -> Target:
        """``url`` parsed (cached; bounded by the distinct upstream URLs seen)."""
        t = self._targets.get(url)
        if t is None:
            if len(self._targets) >= self.max_urls:
                self._targets.clear()
            t = self._targets[url] = Target.parse(url)
        return t

    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def post(self, url: str, body: bytes, headers: Iterable[tuple[str, str]], *,
                   connect_timeout: float, read_timeout: float) -> Response:
        """Send ``POST url`` and return once the response's headers are in.

        Raises :class:`ConnectFailed` when no connection could be made (nothing
        sent), :class:`UpstreamTimeout` when no byte came for ``read_timeout``,
        :class:`UpstreamBroken` when the connection dropped, and
        :class:`ValueError` for a bad URL or a header value with a line break.
        """
        return await self._exchange("POST", url, body, headers, connect_timeout, read_timeout)

    async def get(self, url: str, headers: Iterable[tuple[str, str]] = (), *,
                  connect_timeout: float, read_timeout: float) -> Response:
        """Send ``GET url`` and return once the response's headers are in;
        raises as :meth:`post` does. A GET is safe to repeat, so one lost
        unanswered on a reused connection (the server closed it as the
        request went out) is sent once more on a new one."""
        try:
            return await self._exchange("GET", url, None, headers, connect_timeout, read_timeout)
        except SentNotAnswered as exc:
            if not exc.reused:
                raise
        return await self._exchange("GET", url, None, headers, connect_timeout, read_timeout, pooled=False)

    async def _exchange(self, method: str, url: str, body: bytes | None, headers: Iterable[tuple[str, str]],
                        connect_timeout: float, read_timeout: float, pooled: bool = True) -> Response:
        if self._closed:
            raise RuntimeError("the upstream client is closed")
        t = self.target(url)
        head = [f"{method} {t.path} HTTP/1.1\r\nHost: {t.authority}\r\n"]
        if body is not None:
            head.append(f"Content-Length: {len(body)}\r\n")
        for name, value in headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name or ":" in name:
                raise ValueError(f"header {name!r} has a line break or colon in it; not sent")
            head.append(f"{name}: {value}\r\n")
        head.append("\r\n")
        # header values as the server side decoded them (UTF-8, undecodable
        # bytes kept as surrogates): the bytes the client sent go out again
        data = "".join(head).encode("utf-8", "surrogateescape")
        if body:
            data += body
        key = (t.scheme, t.host, t.port)
        conn = self._acquire(key) if pooled else None
        reused = conn is not None
        if conn is None:
            conn = await self._connect(t, connect_timeout)
        while True:
            try:
                conn.send(data, read_timeout)
                while not conn._headers_done:
                    await conn.wait()
            except UpstreamBroken as exc:
                conn.abort()
                if conn.got_bytes:
                    raise
                if not conn.fully_written:
                    # lost before the whole request left: provably not received
                    if reused:
                        reused = False
                        conn = await self._connect(t, connect_timeout)
                        continue
                    raise NotFullyWritten(f"{t.authority} closed the connection before the request was fully "
                                          "written") from None
                raise SentNotAnswered(f"{exc}; {MAY_HAVE_BEEN_RECEIVED}", reused=reused) from None
            except BaseException:
                conn.abort()
                raise
            return Response(conn, self, key)

    def _acquire(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if peer_closed(conn.transport):  # its close is on the way: never write on it
                conn.abort()
                continue
            if now - conn.idle_since > self.idle_timeout:
                conn.abort()
                continue
            return conn
        return None

    def _release(self, key: tuple[str, str, int], conn: _Connection) -> None:
        if self._closed:
            conn.abort()
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle_per_origin:
            conn.abort()
            return
        conn.idle_since = conn.loop.time()
        # the oldest idle connections are the likeliest to have expired: drop them now
        while idle and conn.idle_since - idle[0].idle_since > self.idle_timeout:
            idle.pop(0).abort()
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = conn.loop.call_later(self.idle_timeout, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for ``idle_timeout`` (also when no request
        comes to reuse them), again while any stay idle."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key in list(self._idle):
            idle = self._idle[key]
            keep = [c for c in idle if not c.closed and now - c.idle_since <= self.idle_timeout]
            for c in idle:
                if c.closed or now - c.idle_since > self.idle_timeout:
                    c.abort()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        if self._idle and not self._closed:
            self._sweeper = loop.call_later(self.idle_timeout / 2, self._sweep)

    async def _connect(self, t: Target, timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        ssl_ctx: ssl.SSLContext | None = None
        if t.scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            ssl_ctx = self._ssl
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), t.host, t.port, ssl=ssl_ctx,
                    server_hostname=t.host if ssl_ctx is not None else None)
        except TimeoutError:
            raise ConnectFailed(f"connecting to {t.authority} took over {timeout:g} s") from None
        except OSError as exc:  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(f"cannot connect to {t.authority}: {exc}") from None
        return conn

    async def close(self) -> None:
        """Close every idle connection; later requests are refused."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
