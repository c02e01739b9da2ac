"""The NATS fixture starts a real server with JetStream, and KV works on it."""

from __future__ import annotations

import asyncio
import socket

import nats
import pytest

from kinference_common import bus, natsserver


async def test_publish_subscribe_and_kv_roundtrip(nats_server: natsserver.NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            if not got.done():
                got.set_result(msg.data)

        await nc.subscribe("kinference.test", cb=on_msg)
        await nc.publish("kinference.test", b"hello")
        assert await asyncio.wait_for(got, 5) == b"hello"

        js = nc.jetstream()
        kv = await js.create_key_value(bucket="kinference-test")
        await kv.put("default.pool", b"v1")
        entry = await kv.get("default.pool")
        assert entry.value == b"v1"
    finally:
        await nc.close()


async def test_kill_and_restart_keeps_port(nats_server: natsserver.NatsServer) -> None:
    nats_server.kill()
    with pytest.raises(OSError):
        socket.create_connection((nats_server.host, nats_server.port), timeout=1).close()
    nats_server.restart()
    nc = await nats.connect(nats_server.url)
    assert nc.is_connected
    await nc.close()


async def test_sync_means_the_server_has_a_fresh_subscription(nats_server: natsserver.NatsServer) -> None:
    """After ``bus.sync``, a message published from another connection reaches a
    subscription made just before it. (nats-py's ``flush()`` alone lets its PING
    overtake the buffered SUB; under load the message is then lost.)"""
    sub_side = await nats.connect(nats_server.url)
    pub_side = await nats.connect(nats_server.url)
    try:
        for i in range(100):
            got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            async def on_msg(msg: nats.aio.msg.Msg, got: asyncio.Future[bytes] = got) -> None:
                if not got.done():
                    got.set_result(msg.data)

            sub = await sub_side.subscribe(f"kinference.sync.{i}", cb=on_msg)
            await bus.sync(sub_side)
            await pub_side.publish(f"kinference.sync.{i}", b"%d" % i)
            await bus.sync(pub_side)
            assert await asyncio.wait_for(got, 5) == b"%d" % i, f"message {i} missed the subscription"
            await sub.unsubscribe()
    finally:
        await sub_side.close()
        await pub_side.close()


def test_free_ports_are_below_the_ephemeral_range_and_not_given_twice() -> None:
    """A port from bind(0) is an ephemeral one that any outgoing connection may
    take before the server binds it; free_port keeps below that range, and a
    caller asking for several before binding gets different ones."""
    from kinference_common import natsserver

    start = natsserver._ephemeral_start()
    ports = [natsserver.free_port() for _ in range(300)]
    assert len(set(ports)) == 300
    if start - natsserver._BELOW_EPHEMERAL >= 1_000:
        assert all(natsserver._BELOW_EPHEMERAL <= p < start for p in ports)
