"""Fire-and-forget publishing of decision events and observations.

The request path only puts a message on a bounded queue (never awaits NATS);
a background task publishes. When NATS is away or slow and the queue fills,
new messages are dropped and counted: the response never waits for them.

The task lingers ``linger`` seconds (2 ms) after the first message of a batch
so that a busy router sends many messages per socket write to NATS instead of
one or two (a write to a local socket costs about as much CPU as building the
message); events reach subscribers at most that much later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import nats
import structlog
from prometheus_client import Counter

log = structlog.get_logger("router.events")


class EventPublisher:
    def __init__(self, nc: nats.NATS | None, dropped: Counter, capacity: int = 10_000,
                 linger: float = 0.002) -> None:
        self._nc = nc
        self._linger = linger
        self._pending: deque[tuple[str, bytes]] = deque()
        self._capacity = capacity
        self._wake = asyncio.Event()
        self._dropped = dropped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-publisher")

    async def stop(self, timeout: float = 1.0) -> None:
        """Stop the task; what is still queued is published (within
        ``timeout``) or counted as dropped, never silently lost."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._drain()
        if self._pending:
            self._dropped.inc(len(self._pending))
            self._pending.clear()

    def publish(self, subject: str, data: bytes) -> None:
        if len(self._pending) >= self._capacity:
            self._dropped.inc()
            return
        self._pending.append((subject, data))
        if len(self._pending) == 1:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if self._linger:
                # let a few more requests' messages join this batch: one
                # socket write to NATS carries them all
                await asyncio.sleep(self._linger)
            self._wake.clear()
            await self._drain()

    async def _drain(self) -> None:
        """Publish everything queued, in order; what cannot go is counted as dropped."""
        pending, nc = self._pending, self._nc
        while pending:
            subject, data = pending.popleft()
            if nc is None or not nc.is_connected:
                self._dropped.inc()
                continue
            try:
                await nc.publish(subject, data)
            except Exception:  # outbound buffer full, connection lost mid-publish
                self._dropped.inc()
