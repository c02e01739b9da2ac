"""The router's transport with nothing on it: the ceiling of the router's request path in Python.

``python -m bench.null_router --port P --upstream HOST:PORT`` serves
``POST /v1/chat/completions`` with the router's own HTTP server
(:mod:`kinference_router.http_server`) and upstream client
(:mod:`kinference_common.upstream_http`), on uvloop as the router runs, and
does nothing but carry each request to the one upstream and its answer back:
the body as it came, the client's headers as the router passes them on
(``kinference_router.app.DROP_HEADERS``), a whole answer at once or a
stream chunk by chunk. No JSON parsing, no
decision, no accounting, no events, no metrics.

``make bench-router`` runs it as the target ``kinference-null``, pinned to
the router's core like every router: its figures are what any router built
on this transport reaches on that core whatever it decides, so the distance
to ``kinference`` is the price of everything the router does on the way
(parse, decide, account, publish) and the distance to vllm-router
``round_robin`` is the transport's own.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import uvloop

from kinference_common.upstream_http import UpstreamClient, UpstreamError
from kinference_router.app import DROP_HEADERS
from kinference_router.http_server import HttpServer, Request, Response


def _bad_gateway(exc: UpstreamError) -> Response:
    return Response(502, f'{{"error": "{type(exc).__name__}"}}'.encode())


class NullRouter:
    """One route, one upstream, nothing in between."""

    def __init__(self, upstream: str) -> None:
        self.url = f"http://{upstream}/v1/chat/completions"
        self.client = UpstreamClient()

    async def chat(self, request: Request) -> Response | None:
        # the router's own header handling: the client's connection and credentials stay here
        headers = [(k, v) for k, v in request.raw_headers if k.lower() not in DROP_HEADERS]
        headers.append(("Content-Type", "application/json"))
        try:
            upstream = await self.client.post(self.url, request.body, headers, connect_timeout=5.0,
                                              read_timeout=30.0)
        except UpstreamError as exc:
            return _bad_gateway(exc)
        async with upstream:
            ctype = upstream.header("Content-Type", "application/json") or "application/json"
            if ctype.startswith("text/event-stream"):
                request.start_stream(upstream.status, [("Content-Type", ctype)])
                try:
                    async for chunk in upstream.chunks():
                        await request.write(chunk)
                except UpstreamError:
                    request.abort()
                    return None
                request.end_stream()
                return None
            try:
                payload = await upstream.read()
            except UpstreamError as exc:
                return _bad_gateway(exc)
            return Response(upstream.status, payload, content_type=ctype)


async def healthy(_: Request) -> Response:
    return Response(200, b"ok\n", content_type="text/plain")


async def serve(port: int, upstream: str) -> None:
    router = NullRouter(upstream)
    server = HttpServer({"/v1/chat/completions": {"POST": router.chat}, "/health": {"GET": healthy}})
    await server.start("127.0.0.1", port)
    print(f"null router on 127.0.0.1:{server.port} -> {upstream}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close(grace=1.0)
    await router.client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.null_router", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="the port to listen on (127.0.0.1; 0: any free one)")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", help="where every request is sent")
    args = p.parse_args(argv)
    uvloop.run(serve(args.port, args.upstream))  # as the router runs
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
