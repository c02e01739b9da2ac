"""Fire-and-forget publishing of decision events and observations.

The request path only puts a message on a bounded queue (never awaits NATS);
a background task publishes. When NATS is away or slow and the queue fills,
new messages are dropped and counted: the response never waits for them.

A server's death loses nothing (a cluster of NATS servers, docs/operations.md):
each batch is confirmed (the server answered a PING sent after it, so it
handed the messages on); a batch not confirmed, because the connection broke
under it, stays queued and goes again once the client is connected to
another server, as does everything queued while it reconnects. So decision
events are delivered at least once: around a server's death a subscriber
may see one twice (the same ``decision_id``). Only a closed connection or
a full queue drops messages (counted).

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
from nats.errors import MaxPayloadError
from prometheus_client import Counter

from kinference_common import bus
from kinference_common.tasks import cancel_and_wait

log = structlog.get_logger("router.events")


class EventPublisher:
    def __init__(self, nc: nats.NATS | None, dropped: Counter, capacity: int = 10_000,
                 linger: float = 0.002, confirm_timeout: float = 2.0) -> None:
        self._nc = nc
        self._confirm = confirm_timeout
        #: messages published again because their batch was not confirmed
        self.resent = 0
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
            await cancel_and_wait(self._task)
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
        """Publish everything queued, in order, batch by confirmed batch;
        while the client reconnects, wait (new messages queue up to
        ``capacity``); with no connection for good, count them as dropped."""
        pending, nc = self._pending, self._nc
        while pending:
            if nc is None or nc.is_closed:
                self._dropped.inc(len(pending))
                pending.clear()
                return
            if not nc.is_connected:  # reconnecting (to another server of the cluster)
                await asyncio.sleep(0.02)
                continue
            batch = [pending.popleft() for _ in range(min(len(pending), 1000))]
            sent = 0
            try:
                for subject, data in batch:
                    await nc.publish(subject, data)
                    sent += 1
                await bus.sync(nc, timeout=self._confirm)
            except MaxPayloadError:  # this message can never go
                self._dropped.inc()
                pending.extendleft(reversed(batch[sent + 1:]))
            except Exception:  # the connection broke under the batch: all of it again once connected
                self.resent += len(batch)
                pending.extendleft(reversed(batch))
                await asyncio.sleep(0.02)
