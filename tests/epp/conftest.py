"""The Endpoint Picker tests share the router tests' pool (tests/router/test_router.py's
``env``: the example manifests on a real nats-server, three recording pods
and a recording provider) and serve its Router's EPP on a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from kinference_router.egress import Egress, EgressTokens
from kinference_router.epp import EppServer, EppSettings
from tests.epp.client import EppClient
from tests.router.conftest import serve, start_pool  # noqa: F401 - fixtures
from tests.router.test_router import Env, classifier, env  # noqa: F401 - fixtures


@dataclass
class Epp:
    env: Env
    server: EppServer
    client: EppClient
    session: aiohttp.ClientSession
    settings: EppSettings
    egress_port: int = 0


@pytest.fixture
async def start_epp(env: Env) -> AsyncIterator[Any]:  # noqa: F811
    """``await start_epp(**EppSettings fields, egress=True)``: the env's router
    serving the EPP (and, with ``egress``, the provider egress) on free ports."""
    started: list[Any] = []

    async def start(*, egress: bool = False, **kw: Any) -> Epp:
        settings = EppSettings(**kw)
        egress_server = None
        if egress:
            tokens = EgressTokens(b"k" * 32)
            # the address is known once listening: bind, then name it
            eg = Egress(env.router, tokens, "")
            egress_server = eg.server()
            await egress_server.start("127.0.0.1", 0)
            eg.address = f"127.0.0.1:{egress_server.port}"
            settings.egress, settings.egress_address = tokens, eg.address
            started.append(egress_server)
        server = EppServer(env.router, settings)
        await server.start("127.0.0.1", 0)
        started.append(server)
        e = Epp(env, server, EppClient(server.port), aiohttp.ClientSession(), settings,
                egress_server.port if egress_server else 0)
        started.append(e)
        return e

    yield start
    for s in reversed(started):
        if isinstance(s, Epp):
            await s.client.close()
            await s.session.close()
        else:
            await s.close()
