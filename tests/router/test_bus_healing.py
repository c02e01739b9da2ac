"""Routers converge from any bus state: a router started after NATS lost its
storage becomes ready once the compiler has given the bus its desired state
again, without anyone restarting anything by hand."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import nats
import pytest

from kinference_common import bus
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.service import PolicyCompilerService, Settings
from kinference_router.app import Router, RouterSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.nats


async def ready(router: Router, timeout: float = 15.0) -> bool:
    async with asyncio.timeout(timeout):
        while router.keeper.snapshot is None:
            await asyncio.sleep(0.05)
    return True


async def start_router(url: str, tmp_path: Path) -> tuple[Router, nats.NATS]:
    router: Router | None = None

    async def reconnected() -> None:
        if router is not None:
            await router.keeper.resync()

    nc = await bus.connect(url, name="test-router", on_reconnect=reconnected)
    router = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path / "secrets"), nc=nc)
    await router.start()
    return router, nc


async def test_router_started_after_nats_lost_its_storage_becomes_ready(nats_server: NatsServer,
                                                                       tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    compiler = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05))
    await compiler.start()
    routers: list[tuple[Router, nats.NATS]] = []
    try:
        early = await start_router(nats_server.url, tmp_path)
        routers.append(early)
        assert await ready(early[0])

        nats_server.kill()
        nats_server.restart(wipe=True)
        late = await start_router(nats_server.url, tmp_path)  # may start before the compiler republished
        routers.append(late)
        assert await ready(late[0])
        assert early[0].keeper.snapshot is not None  # kept its pool throughout

        # compiler away too while the bus loses everything: a new router waits, then is ready
        await compiler.stop()
        nats_server.kill()
        nats_server.restart(wipe=True)
        waiting = await start_router(nats_server.url, tmp_path)
        routers.append(waiting)
        await asyncio.sleep(0.5)
        assert waiting[0].keeper.snapshot is None  # nothing to serve yet
        compiler = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05))
        await compiler.start()
        assert await ready(waiting[0])
    finally:
        for router, nc in routers:
            await router.stop()
            await nc.close()
        await compiler.stop()
