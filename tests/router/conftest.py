"""What the router tests share: serving a router's HTTP server on a free
port, and a router serving a pool compiled from manifests on a real
nats-server, with endpoint telemetry published as a collector would."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from kinference_common import bus, subjects
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text
from kinference_common.messages import EndpointState, encode
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import Router, RouterSettings
from kinference_router.flow import FlowQueue
from kinference_router.http_server import HttpServer
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles


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


@dataclass
class ServedPool:
    """A router (auth none) serving one pool compiled from manifests, its
    data port listening, its NATS connection shared with the test."""

    router: Router
    nc: nats.NATS
    server: HttpServer
    namespace: str

    @property
    def url(self) -> str:
        """The chat-completions URL."""
        return f"http://127.0.0.1:{self.server.port}/v1/chat/completions"

    async def endpoint(self, worker_set: str, model: str, address: str, *, pod: str = "stub-0",
                       settle: float = 0.15, **signals: Any) -> None:
        """Publish an endpoint's telemetry (fresh, idle unless ``signals`` say
        otherwise) and wait until the router's snapshot was rebuilt with it."""
        values = {"queued": 0, "running": 0, "kv_cache_usage": 0.1, "prefill_tokens_per_second": 10000.0,
                  **signals}
        state = EndpointState(namespace=self.namespace, worker_set=worker_set, pod=pod, address=address,
                              model=model, ready=True, scraped_at=time.time(), **values)
        await self.nc.publish(subjects.endpoint_subject(self.namespace, worker_set, pod), encode(state))
        await bus.sync(self.nc)
        await asyncio.sleep(settle)  # delivered, snapshot rebuilt (every 50 ms)

    async def close(self) -> None:
        await self.server.close()
        await self.router.stop()
        await self.nc.close()


@pytest.fixture
async def start_pool(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[ServedPool]]]:
    """``await start_pool(manifests, pool, **router_settings)``: compiled,
    published, served; closed after the test."""
    started: list[ServedPool] = []

    async def start(manifests: str, pool: str, *, namespace: str = "default", **settings: Any) -> ServedPool:
        res = compile_documents(load_text(manifests, pool))
        assert not res.errors, res.errors
        nc = await nats.connect(nats_server.url)
        publisher = ConfigPublisher(nc)
        await publisher.start()
        await publisher.publish(res.pools)
        router = Router(RouterSettings(namespace=namespace, pool=pool, **settings), Authenticator("none"),
                        SecretFiles(tmp_path / "secrets"), nc=nc)
        await router.start()
        server = router.data_server()
        await server.start("127.0.0.1", 0)
        served = ServedPool(router, nc, server, namespace)
        started.append(served)
        return served

    yield start
    for served in reversed(started):
        await served.close()


@pytest.fixture
async def queue() -> AsyncIterator[FlowQueue]:
    """A flow-control queue with its dispatcher running."""
    q = FlowQueue()
    q.start()
    try:
        yield q
    finally:
        await q.stop()
