"""Fixtures for the collector's tests: small aiohttp servers serving metric pages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from kinference_collector import pages


class NullBus:
    """A publisher's bus that sends nothing (tests of what is offered and when)."""

    async def put(self, subject: str, key: str, data: bytes) -> None:
        pass

    async def store(self, key: str, data: bytes) -> None:
        pass

    async def delete(self, subject: str, key: str, data: bytes) -> None:
        pass


class PageServer:
    """An aiohttp server on localhost serving ``/metrics`` from a mutable page.

    ``mode`` picks a behaviour: ``ok`` (the rendered page), ``huge`` (a body
    over any sane cap, with Content-Length), ``huge_chunked`` (the same,
    streamed without a length), ``slow`` (never answers in time), ``garbage``
    (random bytes), ``http500``, ``gzip`` (claims a compressed body),
    ``drip`` (headers at once, then a byte at a time).
    """

    def __init__(self, page: pages.VllmPage | None = None, mode: str = "ok") -> None:
        self.page = page or pages.VllmPage()
        self.mode = mode
        self.requests = 0
        self.text: str | None = None  # overrides the rendered page (DCGM pages, etc.)
        self.max_model_len = 32768
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        mode = self.mode
        if mode == "ok":
            body = self.text if self.text is not None else pages.render_vllm(self.page)
            return web.Response(text=body, content_type="text/plain")
        if mode == "huge":
            return web.Response(body=b"vllm:num_requests_running 1\n" * 400_000)
        if mode == "huge_chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            chunk = b"vllm:num_requests_running 1\n" * 10_000
            for _ in range(200):
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        if mode == "slow":
            await asyncio.sleep(30)
            return web.Response(text="")
        if mode == "drip":
            resp = web.StreamResponse()
            await resp.prepare(request)
            for _ in range(300):
                await resp.write(b"#")
                await asyncio.sleep(0.05)
            return resp
        if mode == "garbage":
            return web.Response(body=bytes(range(256)) * 100)
        if mode == "http500":
            return web.Response(status=500, text="boom")
        if mode == "gzip":
            return web.Response(body=b"\x1f\x8b" + b"\x00" * 100, headers={"Content-Encoding": "gzip"})
        raise AssertionError(mode)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.page.model, "object": "model", "max_model_len": self.max_model_len}]})

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@pytest.fixture
async def page_server() -> AsyncIterator[Callable[..., Awaitable[PageServer]]]:
    started: list[PageServer] = []

    async def make(page: pages.VllmPage | None = None, mode: str = "ok") -> PageServer:
        s = PageServer(page, mode)
        await s.start()
        started.append(s)
        return s

    yield make
    for s in started:
        await s.stop()
