"""Fire-and-forget publishing of decision events and observations.

The request path only puts a message on a bounded queue (never awaits NATS);
a background task publishes. When NATS is away or slow and the queue fills,
new messages are dropped and counted: the response never waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib

import nats
import structlog
from prometheus_client import Counter

log = structlog.get_logger("router.events")


class EventPublisher:
    def __init__(self, nc: nats.NATS | None, dropped: Counter, capacity: int = 10_000) -> None:
        self._nc = nc
        self._queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(capacity)
        self._dropped = dropped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-publisher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def publish(self, subject: str, data: bytes) -> None:
        try:
            self._queue.put_nowait((subject, data))
        except asyncio.QueueFull:
            self._dropped.inc()

    async def _run(self) -> None:
        while True:
            subject, data = await self._queue.get()
            nc = self._nc
            if nc is None or not nc.is_connected:
                self._dropped.inc()
                continue
            try:
                await nc.publish(subject, data)
            except Exception:  # outbound buffer full, connection lost mid-publish
                self._dropped.inc()
