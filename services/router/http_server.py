"""The router's HTTP/1.1 server: ``httptools`` (llhttp) under an asyncio
protocol, serving a fixed table of routes.

Why not aiohttp's web server (which the router used first): on one core,
aiohttp's server (its application, request and response objects and writer)
cost about 60 µs of CPU per proxied request on this machine, against about
30 µs for this server with the same upstream client and the same handler
(measured side by side; ``make bench-router`` shows the effect on the whole
router). The router's answers come in two shapes only, a JSON body or a
server-sent-event stream passed through, so it needs little of a web
framework: no middlewares, cookies, multipart, compression, static files or
websockets. The parsing is ``httptools``, the parser of uvicorn and of the
router's upstream client (:mod:`kinference_common.upstream_http`).

What it does:

- HTTP/1.1 (and 1.0) with keep-alive; pipelined requests are answered in
  order, one at a time (reading pauses when several are queued), and what
  one of them needs (closing after it, a ``100 Continue``, the 400 for bytes
  that follow it and are not HTTP) waits for its turn.
- Limits (:class:`HttpLimits`, each a router flag; docs/hardening.md): the
  request line and headers together to ``max_head_bytes`` (64 KiB) and to
  ``max_headers`` header lines (100): over either, 431 and the connection
  closes. Trailers of a chunked body are dropped, never taken for headers.
  A request's line and headers must arrive within ``header_timeout``
  seconds of its first byte, and its body within ``body_timeout`` of its
  headers: late, 408 and the connection closes (a new connection that
  sends nothing at all is closed after ``header_timeout``, silently).
  Bodies not yet handed to a handler (being received, or parsed and queued
  behind a pipelined request) hold at most ``max_pending_body_bytes``
  across all connections: the body that would pass it is refused with 503
  and its connection closes. At most ``max_connections`` connections are
  open: one more is answered 503 and closed at once. Each refusal is
  counted in :attr:`HttpServer.rejected` by reason.
- Request bodies by ``Content-Length`` or chunked. Over ``max_body_bytes``
  the handler is called at once with ``body_too_large`` set (it answers 413
  in its own error format) and the connection closes after the answer,
  without reading the rest of the body. ``Expect: 100-continue`` is answered
  ``100 Continue`` only for a body within the limit.
- Routes are exact paths with their methods, or prefixes written
  ``/prefix/*`` (any longer path under it; the handler reads ``path``);
  ``HEAD`` is served by the
  ``GET`` handler without the body. An unknown path is 404, a known path
  with another method 405 (with ``Allow``), a request that is not HTTP 400,
  and the connection closes after a 400.
- A handler returns a :class:`Response`, or streams: ``start_stream``, then
  ``await write(chunk)`` (chunked framing; waits while the client's socket
  buffer is full, so a slow client slows its upstream instead of filling
  memory), then ``end_stream``, or ``abort`` to cut the connection.
- A client that disconnects (or half-closes) cancels its handler, as
  aiohttp's ``handler_cancellation`` did: the router's upstream request is
  closed with it (the connection is cut at once, even when the answer under
  way is stuck in a full socket buffer).
- A handler that raises answers 500 (logged by exception type, never the
  message: it could quote the request); mid-stream the connection is cut.
- Connections idle for ``keepalive_timeout`` seconds (between requests, or
  stuck part-way through a request that stopped arriving) are closed by a
  sweep once a second (more often when a deadline is under 4 s).
- :meth:`HttpServer.close` stops accepting, closes idle connections, lets
  requests under way finish and their answers be written for up to ``grace``
  seconds, then cancels the handlers left, waits for them to unwind, and
  cuts their connections.

Not here: TLS (terminated in front of the router), HTTP/2, protocol upgrades
(a request asking for one, ``h2c`` from ``curl --http2`` for instance, is
answered over HTTP/1.1 with its ``Content-Length`` body, then the connection
closes).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, replace
from collections.abc import Awaitable, Callable, Iterable, Mapping
from email.utils import formatdate
from http import HTTPStatus

import httptools
import structlog

log = structlog.get_logger("router.http")

_REASONS = {s.value: s.phrase for s in HTTPStatus}
#: pipelined requests parsed ahead of the one being answered before reading pauses
_MAX_PIPELINE = 8
#: seconds a connection closing after an error answer keeps reading (and dropping) what the client sends
_LINGER = 1.0


@dataclass(frozen=True)
class HttpLimits:
    """What one client may make the server hold (the router's flags of the same names)."""

    #: open connections; one more is answered 503 and closed
    max_connections: int = 4096
    #: seconds from a request's first byte to the end of its headers (408)
    header_timeout: float = 10.0
    #: seconds from a request's headers to the end of its body (408)
    body_timeout: float = 30.0
    #: bytes of request bodies not yet handed to a handler, across connections (503)
    max_pending_body_bytes: int = 64 * 1024 * 1024
    #: header lines of one request (431)
    max_headers: int = 100
    #: bytes of the request line and headers together (431)
    max_head_bytes: int = 64 * 1024
    #: seconds a connection may stay idle between requests
    keepalive_timeout: float = 75.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "header_timeout", "body_timeout", "max_pending_body_bytes", "max_headers",
                     "max_head_bytes", "keepalive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


#: the reasons counted in HttpServer.rejected
REJECT_REASONS = ("connection_limit", "header_timeout", "body_timeout", "body_memory", "header_limit")


class Response:
    """A whole answer: status, body and headers (``Content-Type`` first)."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int = 200, body: bytes = b"", headers: Iterable[tuple[str, str]] = (), *,
                 content_type: str = "application/json") -> None:
        self.status = status
        self.body = body
        self.headers = [("Content-Type", content_type), *headers]


#: a handler answers with a Response, or None after streaming (or aborting)
Handler = Callable[["Request"], Awaitable["Response | None"]]
#: builds the answer to an error the server finds itself (unknown path, bad request, a handler that failed)
ErrorResponder = Callable[[int, str, str], Response]


def plain_error(status: int, code: str, message: str) -> Response:
    """The default :data:`ErrorResponder`: the message as text."""
    return Response(status, f"{message}\n".encode(), content_type="text/plain; charset=utf-8")


def route_methods(routes: Mapping[str, Mapping[str, Handler]], path: str) -> Mapping[str, Handler] | None:
    """The methods of ``path`` in ``routes``: its exact route, else the
    ``/prefix/*`` route it is under; None when no route has it."""
    found = routes.get(path)
    return found if found is not None else prefix_methods(routes, path)


def prefix_methods(routes: Mapping[str, Mapping[str, Handler]], path: str) -> Mapping[str, Handler] | None:
    """The methods of the ``/prefix/*`` route ``path`` is under, if any."""
    for route, methods in routes.items():
        if route.endswith("/*") and path.startswith(route[:-1]) and len(path) > len(route) - 1:
            return methods
    return None


def handler_for(methods: Mapping[str, Handler], method: str) -> Handler | None:
    """The handler of ``method`` (``HEAD`` is served by ``GET``'s), if any."""
    return methods.get(method) or (methods.get("GET") if method == "HEAD" else None)


def refusal(path: str, method: str, methods: Iterable[str] | None) -> tuple[int, str, str, list[tuple[str, str]]]:
    """``(status, code, message, headers)`` of the answer to ``method`` on
    ``path`` when no handler takes it (``methods``: the path's, None when no
    route has it): 404 ``not_found``, or 405 ``method_not_allowed`` with
    ``Allow``. The router's data port and its Endpoint Picker both answer so."""
    if methods is None:
        return 404, "not_found", f"no route for {path}", []
    allowed = sorted({*methods, *(["HEAD"] if "GET" in methods else [])})
    return (405, "method_not_allowed", f"{path} takes {', '.join(allowed)}, not {method}",
            [("Allow", ", ".join(allowed))])


_NEW, _STREAMING, _DONE = 0, 1, 2
#: what a stream's held head may gather before it is written (then the
#: client's pace, write_paused, applies as to any write)
_HOLD_BYTES = 64 * 1024
_HOLD_PIECES = 16


class Request:
    """One request, its body already read."""

    __slots__ = ("method", "path", "query", "version", "headers", "raw_headers", "body", "body_too_large",
                 "keep_alive", "_conn", "_state", "_chunked", "_head_only", "_held", "_out")

    def __init__(self, conn: _Connection, method: str, path: str, query: str, version: str,
                 raw_headers: list[tuple[str, str]], keep_alive: bool) -> None:
        self._conn = conn
        self.method = method
        self.path = path
        self.query = query
        self.version = version
        #: as received, names in their own case
        self.raw_headers = raw_headers
        #: lower-cased names; a repeated header's values joined with ", "
        self.headers: dict[str, str] = {}
        for name, value in raw_headers:
            key = name.lower()
            self.headers[key] = f"{self.headers[key]}, {value}" if key in self.headers else value
        self.body = b""
        self.body_too_large = False
        self.keep_alive = keep_alive
        self._state = _NEW
        self._chunked = True
        self._head_only = method == "HEAD"
        #: body bytes counted in the server's pending total until a handler takes it
        self._held = 0
        #: a streamed answer's head and what followed it in the same turn of
        #: the event loop, not yet written (:meth:`start_stream`)
        self._out: list[bytes] | None = None

    # ----------------------------------------------------------- streaming

    def start_stream(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        """Send the status and headers of a streamed answer; the body follows
        with :meth:`write`. HTTP/1.0 clients get it close-delimited."""
        if self._state != _NEW:
            raise RuntimeError("the answer was already started")
        conn = self._conn
        if conn.transport is None:
            raise ConnectionResetError("the client went away")
        extra = "Transfer-Encoding: chunked\r\n"
        if conn.server.closing:
            self.keep_alive = False
        if self.version == "1.0":
            self._chunked = False
            self.keep_alive = False
            extra = ""
        # held until the end of this turn of the event loop: a body (and its
        # end) written in the same turn leave in one write with the head
        self._out = [conn.head(status, headers, extra, self.keep_alive, self.version)]
        conn.loop.call_soon(self._flush)
        self._state = _STREAMING

    def _flush(self) -> None:
        """Write what :meth:`start_stream` held, if it still is."""
        out, self._out = self._out, None
        if out and self._conn.transport is not None:
            self._conn.transport.write(b"".join(out) if len(out) > 1 else out[0])

    async def write(self, data: bytes) -> None:
        """Send one piece of a streamed answer; waits while the client is behind."""
        if self._state != _STREAMING:
            raise RuntimeError("write() before start_stream() or after end_stream()")
        transport = self._conn.transport
        # is_closing(): a send that failed (the client reset the connection)
        # closes the transport at once but calls connection_lost only on the
        # loop's next turn; until then writes would vanish without an error,
        # and a handler that never waits on anything else would spin for ever
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client went away")
        if data and not self._head_only:
            piece = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
            out = self._out
            if out is not None:
                out.append(piece)
                # held only while small: past that, written, and the client's pace applies
                if len(out) < _HOLD_PIECES and sum(map(len, out)) < _HOLD_BYTES:
                    return
                self._flush()
            else:
                transport.write(piece)
            if self._conn.write_paused:
                await self._conn.drain()
            elif transport.is_closing():
                raise ConnectionResetError("the client went away")

    def end_stream(self) -> None:
        """Finish a streamed answer (the terminating chunk)."""
        if self._state != _STREAMING:
            raise RuntimeError("end_stream() without start_stream()")
        conn = self._conn
        if self._chunked and not self._head_only:
            if self._out is not None:
                self._out.append(b"0\r\n\r\n")
            elif conn.transport is not None:
                conn.transport.write(b"0\r\n\r\n")
        self._flush()
        self._state = _DONE

    def abort(self) -> None:
        """Cut the connection now: a stream ends without its terminating
        chunk, so the client can tell it apart from a finished one."""
        self._state = _DONE
        self.keep_alive = False
        self._flush()  # the head held this turn: the client sees the answer start, then the cut
        if self._conn.transport is not None:
            self._conn.transport.abort()


class _HeadTooLarge(Exception):
    """The request line and headers are over a limit (raised inside the parser)."""


#: what a connection is receiving: nothing expected (between requests, or a
#: request refused), a request's line and headers, or its body
_IDLE, _HEAD, _BODY = 0, 1, 2


class _Connection(asyncio.Protocol):
    """One client connection: parses requests and answers them in order.

    Requests parsed while an earlier one is being answered wait in
    ``pipeline``; :meth:`_advance` starts them one at a time. Whatever must
    wait for the queue to drain (a ``100 Continue``, the 400 for bytes that
    are not HTTP) is kept on the connection and written by :meth:`_advance`.
    """

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        #: requests parsed and waiting for the one being answered
        self.pipeline: deque[Request] = deque()
        #: the handler under way
        self.task: asyncio.Task[None] | None = None
        self.last_activity = self.loop.time()
        self.write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        #: the 400 (or 431) to write once the requests before the bad bytes are answered
        self._error: tuple[int, str, str] | None = None
        #: the request being parsed asked for 100 Continue, to send when it is next
        self._continue = False
        # the request being parsed
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._size = 0
        self._req: Request | None = None
        #: the request being parsed was already handed over (its body is refused)
        self._dispatched = False
        #: an Upgrade request whose body the parser skipped: (request, bytes still to read)
        self._upgrade: tuple[Request, int] | None = None
        self._header_count = 0
        #: why the head was refused (431), set inside the parser
        self._head_error = ""
        #: what is being received, since when (the deadlines), and whether any byte of it came
        self.phase = _HEAD
        self.phase_since = self.loop.time()
        self.begun = False
        #: body bytes of the request being parsed counted in the server's pending total
        self._held = 0
        #: refused at connect (over max_connections): nothing is read
        self._refused = False
        #: an error answer was written: what arrives is read and dropped (_linger)
        self._discard = False

    # ---------------------------------------------------------- transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        if len(server.connections) >= server.limits.max_connections:
            self._refused = True
            server.rejected["connection_limit"] += 1
            resp = server.on_error(503, "overloaded", f"the server has {server.limits.max_connections} connections "
                                   "open, its limit; try again")
            resp.headers.append(("Retry-After", "1"))
            self._write(resp, False, False)
            self._linger()
            return
        server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.connections.discard(self)
        self._release(self._held + sum(r._held for r in self.pipeline))
        self._held = 0
        self.pipeline.clear()
        if self.task is not None:
            self.task.cancel()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client went away"))

    def eof_received(self) -> bool:
        # the client closed its side: nobody will read an answer under way,
        # and a full socket buffer would keep close() waiting for ever
        if (self.task is not None or self.pipeline) and self.transport is not None:
            self.transport.abort()
        return False

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("the client went away")
        if self._drain_waiter is None:
            self._drain_waiter = self.loop.create_future()
        await asyncio.shield(self._drain_waiter)

    def data_received(self, data: bytes) -> None:
        if self._discard:
            return
        self.last_activity = self.loop.time()
        if self._error is not None or self._refused:
            return  # the connection closes once the answers before the error are written
        if self._upgrade is not None:
            self._upgrade_body(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgrade_requested(data[exc.args[0]:] if exc.args else b"")
        except httptools.HttpParserError:
            if self._head_error:
                self.server.rejected["header_limit"] += 1
                self._fail(431, "request_header_fields_too_large", self._head_error)
            else:
                self._fail(400, "bad_request", "the request is not valid HTTP/1.1")

    # ----------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        self.phase, self.phase_since, self.begun = _HEAD, self.loop.time(), True
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._header_count = 0
        self._body = []
        self._size = 0
        self._req = None
        self._dispatched = False
        self._continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._req is not None:
            return  # a chunked body's trailer: not a header of the request
        self._count_head(len(name) + len(value))
        self._header_count += 1
        if self._header_count > self.server.limits.max_headers:
            self._head_error = f"more than {self.server.limits.max_headers} header lines"
            raise _HeadTooLarge
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def _count_head(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.server.max_head_bytes:
            self._head_error = f"request line and headers over {self.server.max_head_bytes} bytes"
            raise _HeadTooLarge  # the parser stops; data_received answers 431

    def on_headers_complete(self) -> None:
        self.phase, self.phase_since = _BODY, self.loop.time()
        p = self.parser
        path, _, query = self._url.decode("utf-8", "surrogateescape").partition("?")
        req = self._req = Request(self, p.get_method().decode("ascii", "replace"), path, query,
                                  p.get_http_version(), self._headers, p.should_keep_alive())
        limit = self.server.max_body_bytes
        declared = req.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self._refuse_body(req)
        elif req.headers.get("expect", "").lower() == "100-continue":
            self._continue = True
            if self.task is None and not self.pipeline:
                self._send_continue()

    def on_body(self, body: bytes) -> None:
        if self._dispatched or self._error is not None:
            return
        self._size += len(body)
        if self._size > self.server.max_body_bytes:
            assert self._req is not None
            self._body = []
            self._refuse_body(self._req)
            return
        server = self.server
        if server.pending_body_bytes + len(body) > server.limits.max_pending_body_bytes:
            server.rejected["body_memory"] += 1
            self._fail(503, "overloaded", "the server holds its limit of unfinished request bodies; try again")
            return
        server.pending_body_bytes += len(body)
        self._held += len(body)
        self._body.append(body)

    def on_message_complete(self) -> None:
        req = self._req
        self._continue = False
        if req is None or self._dispatched or self._error is not None:
            return
        if self.parser.should_upgrade():
            return  # the parser skipped its body: data_received reads it (_upgrade_requested)
        self.phase, self.begun = _IDLE, False
        req.body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        req._held, self._held = self._held, 0
        self._dispatch(req)

    def _release(self, n: int) -> None:
        if n:
            self.server.pending_body_bytes -= n

    # ------------------------------------------------------------ requests

    def _refuse_body(self, req: Request) -> None:
        """Hand over a request whose body is over the limit, unread; the
        connection closes after its answer and reads nothing more."""
        req.body_too_large = True
        req.keep_alive = False
        self.phase = _IDLE
        self._release(self._held)
        self._held = 0
        self._dispatched = True
        self._continue = False
        self._pause_reading()
        self._dispatch(req)

    def _upgrade_requested(self, rest: bytes) -> None:
        """A request asked to switch protocols: it is answered over HTTP/1.1,
        then the connection closes. The parser leaves its body to us."""
        req = self._req
        self._pause_reading()
        if req is None or self._dispatched:
            return
        req.keep_alive = False
        if "chunked" in req.headers.get("transfer-encoding", "").lower():
            self._fail(400, "bad_request", "a chunked body with an Upgrade request is not supported")
            return
        declared = req.headers.get("content-length", "0")
        self._upgrade = (req, int(declared) if declared.isdigit() else 0)
        self._resume_reading()
        self._upgrade_body(rest)

    def _upgrade_body(self, data: bytes) -> None:
        assert self._upgrade is not None
        req, missing = self._upgrade
        if data and missing:
            self._body.append(data[:missing])
            missing -= min(missing, len(data))
        self._upgrade = (req, missing)
        if missing == 0 and not self._dispatched:
            self.phase = _IDLE
            self._dispatched = True
            req.body = b"".join(self._body)
            self._body = []
            self._pause_reading()  # nothing after it is read
            self._dispatch(req)

    def _dispatch(self, req: Request) -> None:
        self.pipeline.append(req)
        if len(self.pipeline) >= _MAX_PIPELINE:
            self._pause_reading()
        if self.task is None:
            self._advance()

    def _advance(self) -> None:
        """Answer the queued requests in order, until one needs its handler to run."""
        while self.task is None and self.transport is not None:
            if not self.pipeline:
                self._idle()
                return
            req = self.pipeline.popleft()
            if req._held:  # the handler has the body now
                self._release(req._held)
                req._held = 0
            if self._reading_paused and len(self.pipeline) < _MAX_PIPELINE // 2 and req.keep_alive \
                    and self._upgrade is None and self._error is None:
                self._resume_reading()
            handler = self._route(req)
            if handler is not None:
                self.task = self.loop.create_task(self._run(req, handler))
                return
            if not req.keep_alive:
                self.transport.close()
                return

    def _idle(self) -> None:
        """Nothing queued and no handler under way: what was waiting for this."""
        assert self.transport is not None
        if self._error is not None:
            resp = self.server.on_error(*self._error)
            self._write(resp, False, False)
            self._linger()
        elif self.server.closing:
            self.transport.close()
        elif self._continue:
            self._send_continue()

    def _linger(self) -> None:
        """Close after an error answer without losing it: a client still
        sending (a slow body, a request after a refusal) would otherwise get
        a reset that can destroy the answer before it is read. Our side is
        shut (the client reads the answer, then end-of-file); what the client
        still sends is read and dropped for up to :data:`_LINGER` seconds."""
        transport = self.transport
        assert transport is not None
        self._discard = True
        self._resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(_LINGER, transport.abort)
        else:  # pragma: no cover - TCP can always half-close
            transport.close()

    def _send_continue(self) -> None:
        self._continue = False
        self.phase_since = self.loop.time()  # the body deadline counts from the go-ahead
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _route(self, req: Request) -> Handler | None:
        """The handler for ``req``; None once the server answered it itself (404, 405)."""
        methods = self.server.routes.get(req.path) or self.server.prefix_route(req.path)
        if methods is not None:
            handler = handler_for(methods, req.method)
            if handler is not None:
                return handler
        status, code, message, headers = refusal(req.path, req.method, methods)
        resp = self.server.on_error(status, code, message)
        resp.headers += headers
        self._answer(req, resp)
        return None

    async def _run(self, req: Request, handler: Handler) -> None:
        try:
            resp = await handler(req)
        except asyncio.CancelledError:
            # the client went away (or the server is closing and its grace ran out)
            self.task = None
            if self.transport is not None:
                self.transport.abort()
            return
        except Exception as exc:
            self.task = None
            if self.transport is None or self.transport.is_closing():
                # the client went away mid-answer (a write that found the
                # connection reset raises before connection_lost has run):
                # nobody to tell, and nothing wrong with the handler
                log.debug("handler ended without a client", path=req.path, error=type(exc).__name__)
                if self.transport is not None:
                    self.transport.abort()
                return
            # never the message or traceback text: it could quote the request
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
            log.error("handler failed", path=req.path, error=type(exc).__name__, at=where)
            resp = self.server.on_error(500, "internal_error", "the router failed on this request")
        self.task = None
        if self.transport is None:
            return
        if req._state == _STREAMING:  # the handler returned (or failed) mid-stream
            req.abort()
            return
        if req._state == _NEW:
            self._answer(req, resp)
        if not req.keep_alive:
            self.transport.close()
            return
        self.last_activity = self.loop.time()
        self._advance()

    def _answer(self, req: Request, resp: Response | None) -> None:
        """Write a whole answer (for HEAD, without its body)."""
        if resp is None:
            resp = self.server.on_error(500, "internal_error", "the router gave no answer")
        if self.server.closing:
            req.keep_alive = False
        try:
            self._write(resp, req.keep_alive, req._head_only, req.version)
        except ValueError:
            log.error("answer not sent: a header has a line break", path=req.path)
            self._write(self.server.on_error(500, "internal_error", "the router built an invalid answer"),
                        req.keep_alive, req._head_only, req.version)
        req._state = _DONE

    def _write(self, resp: Response, keep_alive: bool, head_only: bool, version: str = "1.1") -> None:
        assert self.transport is not None
        head = self.head(resp.status, resp.headers, f"Content-Length: {len(resp.body)}\r\n", keep_alive, version)
        self.transport.write(head if head_only or not resp.body else head + resp.body)

    def _fail(self, status: int, code: str, message: str) -> None:
        """Bytes that are not a request: answer ``status`` once the requests
        before them are answered, then close."""
        self._error = (status, code, message)
        self._continue = False
        self.phase = _IDLE
        self._body = []
        self._release(self._held)
        self._held = 0
        self._pause_reading()
        if self.task is None:
            self._advance()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def head(self, status: int, headers: Iterable[tuple[str, str]], extra: str, keep_alive: bool,
             version: str = "1.1") -> bytes:
        """The status line and headers; ValueError for a header with a line
        break (or one that cannot be encoded)."""
        parts = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"]
        for name, value in headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name!r} has a line break in it")
            parts.append(f"{name}: {value}\r\n")
        parts.append(extra)
        parts.append(self.server.date_header())
        if not keep_alive:
            parts.append("Connection: close\r\n")
        elif version == "1.0":
            parts.append("Connection: keep-alive\r\n")
        parts.append("\r\n")
        try:
            return "".join(parts).encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise ValueError(f"a header cannot be encoded: {exc.reason}") from None


class HttpServer:
    """Serves ``routes`` (path -> method -> handler) on one listening socket."""

    def __init__(self, routes: Mapping[str, Mapping[str, Handler]], *, max_body_bytes: int = 4 * 1024 * 1024,
                 max_head_bytes: int | None = None, keepalive_timeout: float | None = None,
                 limits: HttpLimits | None = None, on_error: ErrorResponder = plain_error) -> None:
        limits = limits or HttpLimits()
        if max_head_bytes is not None:
            limits = replace(limits, max_head_bytes=max_head_bytes)
        if keepalive_timeout is not None:
            limits = replace(limits, keepalive_timeout=keepalive_timeout)
        self.limits = limits
        self.routes = {path: dict(methods) for path, methods in routes.items()}
        self.max_body_bytes = max_body_bytes
        #: the request line and headers together; over it, 431 and the connection closes
        self.max_head_bytes = limits.max_head_bytes
        self.keepalive_timeout = limits.keepalive_timeout
        #: refusals by reason (REJECT_REASONS), for the metrics
        self.rejected = dict.fromkeys(REJECT_REASONS, 0)
        #: bytes of request bodies not yet handed to a handler, across connections
        self.pending_body_bytes = 0
        #: how often the sweep runs: a second, or a quarter of the shortest deadline
        self._sweep_every = max(0.01, min(1.0, limits.header_timeout / 4, limits.body_timeout / 4))
        self.on_error = on_error
        self.connections: set[_Connection] = set()
        self.closing = False
        #: set by start(); the connections use it
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._date_second = 0
        self._date = ""
        self._port = 0

    def prefix_route(self, path: str) -> Mapping[str, Handler] | None:
        """The methods of the ``/prefix/*`` route ``path`` is under, if any
        (looked up only when no exact route matched; routes may be added after
        construction)."""
        return prefix_methods(self.routes, path)

    @property
    def port(self) -> int:
        """The port listened on (useful after ``start(port=0)``)."""
        return self._port

    async def start(self, host: str, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: _Connection(self), host, port, reuse_address=True,
                                                     backlog=1024)
        # uvloop's server gives a list where typeshed says a tuple: read untyped, so that a
        # build compiled with mypyc (make bench-router-compiled) does not check it
        sockets = getattr(self._server, "sockets")  # noqa: B009
        self._port = int(sockets[0].getsockname()[1])
        self._sweeper = self.loop.call_later(self._sweep_every, self._sweep)

    def date_header(self) -> str:
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date = f"Date: {formatdate(now, usegmt=True)}\r\n"
        return self._date

    def _sweep(self) -> None:
        """Close connections idle (or stalled mid-request) for
        ``keepalive_timeout``; answer 408 to requests past their header or
        body deadline."""
        now = self.loop.time()
        cutoff = now - self.keepalive_timeout
        limits = self.limits
        for conn in list(self.connections):
            if conn.transport is None:
                continue
            if conn.task is None and not conn.pipeline and conn.last_activity < cutoff:
                conn.transport.close()
                continue
            if conn._error is not None or conn._reading_paused or conn.phase == _IDLE or conn._continue:
                continue  # answered already, not reading by its own choice, or owing a 100 Continue
            if conn.phase == _HEAD and now - conn.phase_since > limits.header_timeout:
                self.rejected["header_timeout"] += 1
                if not conn.begun and conn.task is None and not conn.pipeline:
                    conn.transport.close()  # a connection that never sent a byte: nobody to tell
                else:
                    conn._fail(408, "request_timeout",
                               f"the request line and headers did not arrive within {limits.header_timeout:g} s")
            elif conn.phase == _BODY and now - conn.phase_since > limits.body_timeout:
                self.rejected["body_timeout"] += 1
                conn._fail(408, "request_timeout", f"the request body did not arrive within {limits.body_timeout:g} s")
        self._sweeper = self.loop.call_later(self._sweep_every, self._sweep)

    async def close(self, grace: float = 5.0) -> None:
        """Stop accepting; requests under way get ``grace`` seconds to be
        answered (and their answers to be written out), then their handlers
        are cancelled and awaited, and what is left is cut."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.task is None and not conn.pipeline and conn.transport is not None:
                conn.transport.close()  # idle: closes once anything written is flushed
        deadline = self.loop.time() + grace
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        tasks = [c.task for c in self.connections if c.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
