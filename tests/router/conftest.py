"""What the router tests share: serving a router's HTTP server on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from kinference_router.http_server import HttpServer


class Served:
    """An :class:`HttpServer` listening on a free port, with a client
    session that takes paths (``await served.post("/v1/models")``)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.session: aiohttp.ClientSession | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    async def start(self) -> Served:
        await self.server.start("127.0.0.1", 0)
        self.session = aiohttp.ClientSession(base_url=self.url)
        return self

    def post(self, path: str, **kwargs: Any) -> Any:
        assert self.session is not None
        return self.session.post(path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        assert self.session is not None
        return self.session.get(path, **kwargs)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        await self.server.close(grace=1.0)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[HttpServer], Awaitable[Served]]]:
    """``await serve(router.data_server())``: started now, closed after the test."""
    started: list[Served] = []

    async def start(server: HttpServer) -> Served:
        served = await Served(server).start()
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        await served.close()
