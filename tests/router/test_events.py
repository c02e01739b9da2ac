"""The router's event publisher (services/router/events.py)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter

from kinference_router.events import EventPublisher


class FakeNats:
    is_connected = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


async def test_stop_neither_loses_nor_hides_queued_messages() -> None:
    """stop() comes usually during the task's 2 ms linger: what is queued then
    (at shutdown, the last requests' observations) is published or counted in
    kinference_events_dropped_total, never lost silently (a review found it
    was)."""
    nc = FakeNats()
    dropped = Counter("dropped", "d", registry=CollectorRegistry())
    pub = EventPublisher(nc, dropped)  # type: ignore[arg-type]
    pub.start()
    await asyncio.sleep(0)
    for i in range(3):
        pub.publish("s", str(i).encode())
    await pub.stop()
    assert len(nc.sent) + dropped._value.get() == 3, (nc.sent, dropped._value.get())
