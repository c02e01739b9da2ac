"""The classifier stops when NATS stops answering at the same moment
(Ctrl-C on ``make run`` reaches nats-server and every service at once): its
stop is bounded instead of waiting on a drain that never ends."""

from __future__ import annotations

import asyncio
import signal

import pytest

from kinference_classifier.service import ClassifierService
from kinference_common.natsserver import NatsServer

pytestmark = pytest.mark.nats


async def test_stop_returns_when_nats_stopped_answering(nats_server: NatsServer) -> None:
    svc = ClassifierService(nats_url=nats_server.url, health_host="127.0.0.1", health_port=0)
    await svc.start()
    assert nats_server.proc is not None
    nats_server.proc.send_signal(signal.SIGSTOP)
    try:
        # a bare nc.drain() waits 30 s or for ever here
        await asyncio.wait_for(svc.stop(), 15.0)
        assert svc.nc is None
    finally:
        nats_server.proc.send_signal(signal.SIGCONT)
