"""The collector's connect loop retries an unreachable NATS, and nothing
else: the HA trial found a malformed ``--nats-url`` retried forever
(``nats_connect_failed`` with a ValueError every few seconds) while /healthz
said the collector was fine. A configuration error raises at once, so the
process exits and a pod crash-loops visibly."""

from __future__ import annotations

import asyncio

import pytest

from kinference_collector.service import connect_nats
from kinference_common import bus, natsserver

pytestmark = pytest.mark.nats


async def test_a_malformed_url_raises_at_once() -> None:
    stop = asyncio.Event()
    with pytest.raises(bus.NatsUrlError, match=r"--nats-url 'nats://127.0.0.1:99999': port 99999"):
        await asyncio.wait_for(connect_nats("nats://127.0.0.1:99999,nats://127.0.0.1:5932", stop), 5)


async def test_options_the_client_refuses_raise_at_once() -> None:
    stop = asyncio.Event()
    with pytest.raises(TypeError):
        await asyncio.wait_for(connect_nats(f"nats://127.0.0.1:{natsserver.free_port()}", stop,
                                            {"no_such_option": True}), 5)


async def test_an_unreachable_server_is_still_waited_for() -> None:
    port = natsserver.free_port()
    stop = asyncio.Event()
    connecting = asyncio.create_task(connect_nats(f"nats://127.0.0.1:{port}", stop))
    await asyncio.sleep(1.0)
    assert not connecting.done()
    with natsserver.start(port=port):
        nc = await asyncio.wait_for(connecting, 15)
        try:
            assert nc is not None and nc.is_connected  # type: ignore[attr-defined]
        finally:
            await bus.close(nc)  # type: ignore[arg-type]


async def test_a_stop_while_the_server_is_unreachable_ends_the_wait() -> None:
    """The client retries an unreachable server by itself, forever: a SIGTERM
    then went unheard (a trial's collector, started with NATS away, outlived
    ``kill -TERM`` until ``kill -9``). A stop now ends the wait."""
    port = natsserver.free_port()
    stop = asyncio.Event()
    connecting = asyncio.create_task(connect_nats(f"nats://127.0.0.1:{port}", stop))
    await asyncio.sleep(3.0)  # past the client's first attempts
    assert not connecting.done()
    stop.set()
    assert await asyncio.wait_for(connecting, 5) is None
