"""``bus.close`` stops a connection whose server no longer answers. The
trial's Ctrl-C on ``make run`` stopped nats-server and the router at once;
the router's ``nc.drain()`` then waited forever (1 run in 4 here), until the
stack killed it. A paused server (SIGSTOP) makes that case deterministic:
the TCP connection stays up and no PONG ever comes."""

from __future__ import annotations

import asyncio
import signal

import pytest

from kinference_common import bus
from kinference_common.natsserver import NatsServer

pytestmark = pytest.mark.nats


async def test_close_returns_when_the_server_stopped_answering(nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")

    async def ignore(msg: object) -> None:
        pass

    await nc.subscribe("x.>", cb=ignore)
    await bus.sync(nc)
    assert nats_server.proc is not None
    nats_server.proc.send_signal(signal.SIGSTOP)
    try:
        # a bare nc.drain() here waits for its drain_timeout (30 s) or longer
        await asyncio.wait_for(bus.close(nc, timeout=0.5), 10.0)
        assert nc.is_closed
    finally:
        nats_server.proc.send_signal(signal.SIGCONT)


async def test_close_drains_a_healthy_connection(nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")
    got: list[bytes] = []

    async def on_msg(msg: object) -> None:
        got.append(msg.data)  # type: ignore[attr-defined]

    other = await bus.connect(nats_server.url, name="other")
    await other.subscribe("y", cb=on_msg)
    await bus.sync(other)
    await nc.publish("y", b"last words")
    await bus.close(nc)  # drained: the publish was flushed before closing
    assert nc.is_closed
    await bus.sync(other)
    await other.close()
    assert got == [b"last words"]
