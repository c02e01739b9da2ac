"""Shared by the classifier's service tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from kinference_common.natsserver import NatsServer
from nats.aio.client import Client as NATS


@pytest.fixture
async def nc(nats_server: NatsServer) -> AsyncIterator[NATS]:
    """A client connection to the test's own nats-server."""
    conn = await nats.connect(nats_server.url)
    yield conn
    await conn.close()
