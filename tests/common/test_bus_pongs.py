"""A flush given up on does not stop the connection from reading.

nats-py sets the result of the oldest PING's future at each PONG; a flush
that timed out or was cancelled leaves that future cancelled, and its PONG
used to raise in the read loop, which then stopped for good: the client
still said connected but never read a message or a reply again (seen as
router tests hanging in teardown on a loaded machine). ``kinference_common.bus``
guards against it; these tests give up on a flush both ways and check that
messages and JetStream replies still arrive on the same connection."""

from __future__ import annotations

import asyncio
import signal

import pytest

from kinference_common import bus
from kinference_common.natsserver import NatsServer

pytestmark = pytest.mark.nats


async def _stopped(pid: int) -> None:
    """Return once the process is stopped (a signal is delivered later than sent)."""
    for _ in range(200):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop")


async def _still_reads(nc: object, subject: str) -> None:
    got: list[bytes] = []

    async def on(msg: object) -> None:
        got.append(msg.data)  # type: ignore[attr-defined]

    await nc.subscribe(subject, cb=on)  # type: ignore[attr-defined]
    await bus.sync(nc)  # type: ignore[arg-type]
    await nc.publish(subject, b"after")  # type: ignore[attr-defined]
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.02)
    assert got == [b"after"], "the connection stopped reading after a flush was given up on"
    # a request's reply is read too (JetStream's API is request/reply)
    info = await nc.jetstream().account_info()  # type: ignore[attr-defined]
    assert info.streams >= 0


async def test_a_cancelled_flush_leaves_the_connection_reading(nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")
    try:
        flush = asyncio.create_task(nc.flush(5))
        await asyncio.sleep(0)  # its PING is on the wire, its PONG on the way
        flush.cancel()
        await asyncio.gather(flush, return_exceptions=True)
        await asyncio.sleep(0.1)  # the PONG arrives for a future nobody waits on
        assert nc._reading_task is not None and not nc._reading_task.done()
        await _still_reads(nc, "pongs.cancelled")
    finally:
        await bus.close(nc)


async def test_a_timed_out_flush_leaves_the_connection_reading(nats_server: NatsServer) -> None:
    """The server paused (SIGSTOP) makes the flush time out for sure; its
    PONG comes once the server runs again."""
    nc = await bus.connect(nats_server.url, name="test")
    assert nats_server.proc is not None
    try:
        nats_server.proc.send_signal(signal.SIGSTOP)
        try:
            await _stopped(nats_server.proc.pid)
            with pytest.raises(Exception):
                await nc.flush(0.3)
        finally:
            nats_server.proc.send_signal(signal.SIGCONT)
        await bus.sync(nc)  # answered after the late PONG
        assert nc._reading_task is not None and not nc._reading_task.done()
        await _still_reads(nc, "pongs.timed-out")
    finally:
        await bus.close(nc)
