"""A minimal, fast OpenAI-compatible upstream for the router benchmarks.

``python -m bench.stub_upstream --port N`` serves, over HTTP/1.1 with
keep-alive, on a bare asyncio protocol (uvloop when installed) so that the
stub is never what a benchmark measures:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: a small JSON
  completion at once, or, when the body asks for ``"stream": true``, a short
  server-sent-event stream (chunked transfer encoding): ``--chunks`` content
  chunks, a usage chunk and ``data: [DONE]``. With ``--chunk-interval`` > 0
  the chunks are spaced that many seconds apart (the load test's long
  streams); with 0 (the default) the whole stream is written at once.
- any ``GET`` (``/health``, ``/v1/models``, ...): 200 with a model list, so
  that routers that probe their workers find this one healthy.

The content chunks carry ``"content": "tok<i>"``, so that a client can check
that a stream arrived whole (every chunk, in order, then ``[DONE]``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys

MODEL = "bench-model"
_STREAM = re.compile(rb'"stream"\s*:\s*true')

_PLAIN_BODY = json.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1700000000, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello from the stub!"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14},
}, separators=(",", ":")).encode()


def _event(obj: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def stream_events(chunks: int) -> list[bytes]:
    """The SSE events of one stream, each already framed as an HTTP chunk."""
    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000, "model": MODEL}
    events = [_event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "finish_reason": None}]})]
    for i in range(chunks):
        events.append(_event({**base, "choices": [{"index": 0, "delta": {"content": f"tok{i}"},
                                                   "finish_reason": None}]}))
    events.append(_event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    events.append(_event({**base, "choices": [],
                          "usage": {"prompt_tokens": 9, "completion_tokens": chunks, "total_tokens": 9 + chunks}}))
    events.append(b"data: [DONE]\n\n")
    return [_chunked(e) for e in events]


_MODELS_BODY = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}).encode()


def _head(status: str, ctype: bytes, length: int | None, close: bool) -> bytes:
    lines = [b"HTTP/1.1 " + status.encode(), b"Content-Type: " + ctype]
    if length is None:
        lines.append(b"Transfer-Encoding: chunked")
        lines.append(b"Cache-Control: no-cache")
    else:
        lines.append(b"Content-Length: %d" % length)
    lines.append(b"Connection: close" if close else b"Connection: keep-alive")
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Stub:
    def __init__(self, chunks: int, interval: float) -> None:
        self.interval = interval
        self.events = stream_events(chunks)
        self.stream_whole = b"".join(self.events) + b"0\r\n\r\n"
        self.requests = 0


class HttpProtocol(asyncio.Protocol):
    """One connection: requests are answered in order, one at a time."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a slow stream is being written
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._process()

    def _process(self) -> None:
        while self.transport is not None and not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, path, version = lines[0].split(" ", 2)
            except ValueError:
                self._reply("400 Bad Request", b"text/plain", b"bad request\n", close=True)
                return
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            pos = end + 4
            if headers.get("transfer-encoding", "").lower() == "chunked":
                body = bytearray()
                while True:
                    eol = self.buf.find(b"\r\n", pos)
                    if eol < 0:
                        return  # wait for more
                    size = int(bytes(self.buf[pos:eol]).split(b";")[0], 16)
                    if len(self.buf) < eol + 2 + size + 2:
                        return
                    body += self.buf[eol + 2:eol + 2 + size]
                    pos = eol + 2 + size + 2
                    if size == 0:
                        break
                body = bytes(body)
            else:
                length = int(headers.get("content-length") or 0)
                if len(self.buf) < pos + length:
                    return
                body = bytes(self.buf[pos:pos + length])
                pos += length
            del self.buf[:pos]
            close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
            self.stub.requests += 1
            if method == "POST" and path.split("?")[0].endswith("/completions"):
                if _STREAM.search(body):
                    self._stream(close)
                else:
                    self._reply("200 OK", b"application/json", _PLAIN_BODY, close)
            elif method == "GET":
                self._reply("200 OK", b"application/json", _MODELS_BODY, close)
            else:
                self._reply("404 Not Found", b"application/json", b'{"error":{"message":"not found"}}', close)

    def _reply(self, status: str, ctype: bytes, body: bytes, close: bool) -> None:
        assert self.transport is not None
        self.transport.write(_head(status, ctype, len(body), close) + body)
        if close:
            self.transport.close()
            self.transport = None

    def _stream(self, close: bool) -> None:
        assert self.transport is not None
        head = _head("200 OK", b"text/event-stream", None, close)
        if self.stub.interval <= 0:
            self.transport.write(head + self.stub.stream_whole)
            if close:
                self.transport.close()
                self.transport = None
            return
        self.busy = True
        self.task = asyncio.get_running_loop().create_task(self._slow(head, close))

    async def _slow(self, head: bytes, close: bool) -> None:
        events = self.stub.events
        try:
            self.transport.write(head + events[0])  # type: ignore[union-attr]
            for ev in events[1:]:
                await asyncio.sleep(self.stub.interval)
                if self.transport is None:
                    return
                self.transport.write(ev)
            if self.transport is None:
                return
            self.transport.write(b"0\r\n\r\n")
            if close:
                self.transport.close()
                self.transport = None
        except asyncio.CancelledError:
            return
        finally:
            self.busy = False
            self.task = None
        if self.buf:
            self._process()


async def serve(host: str, port: int, chunks: int, interval: float) -> None:
    stub = Stub(chunks, interval)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HttpProtocol(stub), host, port, backlog=4096, reuse_address=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub upstream on http://{host}:{port} (chunks={chunks}, interval={interval}s)", file=sys.stderr,
          flush=True)
    await stop.wait()
    server.close()
    print(f"stub upstream: {stub.requests} requests", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stub_upstream", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=3, help="content chunks per stream (default 3)")
    p.add_argument("--chunk-interval", type=float, default=0.0,
                   help="seconds between stream chunks (default 0: the whole stream at once)")
    args = p.parse_args(argv)
    coro = serve(args.host, args.port, args.chunks, args.chunk_interval)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
