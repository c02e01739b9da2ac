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

Decision records (``stored``: a subject prefix and the JetStream stream
that keeps it, ``KINFERENCE_RECORDS``) must also reach the stream, which
stores only what arrives while it has a leader: on a cluster of three, the
leader's death leaves it without one for a few seconds, and what was sent
meanwhile was lost (a trial: every record of 4.5 s of traffic). So at most
every ``confirm_every`` seconds the publisher asks the stream for its
leader and last sequence (:meth:`EventPublisher._confirm_stored` says when
records count as stored, and when they are kept and sent again, once).
Those the stream had stored before its leader died are then stored twice (a ``Nats-Msg-Id``
header would let the stream drop them, for about 10 us of the router's CPU
a record, three a request: measured by ``make bench-router``); kinfctl
reads each record once. A stream that does not exist is no outage (the router
could not create it and said so: records are not kept). Records waiting for
the stream count against ``capacity`` like queued messages.

The task lingers ``linger`` seconds (2 ms) after the first message of a batch
so that a busy router sends many messages per socket write to NATS instead of
one or two (a write to a local socket costs about as much CPU as building the
message); events reach subscribers at most that much later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
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
                 linger: float = 0.002, confirm_timeout: float = 2.0,
                 stored: tuple[str, str] | None = None, confirm_every: float = 0.05) -> None:
        self._nc = nc
        self._confirm = confirm_timeout
        #: messages published again because their batch was not confirmed
        self.resent = 0
        #: (subject prefix, stream): messages under the prefix must reach that stream
        self._stored = stored
        self._confirm_every = confirm_every
        #: stored messages sent since the stream last answered (sent again if it does not)
        self._unconfirmed: list[tuple[str, bytes]] = []
        self._checked = 0.0
        #: records sent again because the stream had no leader when they were sent
        self.resent_stored = 0
        self._stream_away = False
        #: the leader the last answer of the stream named ("": a single server; None: no answer yet)
        self._leader: str | None = None
        #: of the records sent again, those of the current (or last) outage
        self._resent_outage = 0
        #: the stream's last sequence at the last answer, and since when it has stood still
        #: while records waited (a leader that stores nothing)
        self._seq: int | None = None
        self._frozen_since: float | None = None
        self._linger = linger
        self._pending: deque[tuple[str, bytes]] = deque()
        self._capacity = capacity
        self._wake = asyncio.Event()
        self._dropped = dropped
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-publisher")

    def storing(self) -> bool:
        """False while the records' stream is taken to store nothing (no
        leader, no answer, a leader without its quorum)."""
        return not self._stream_away

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
        if self._unconfirmed and self._stream_away:  # held for a stream that stores nothing: lost, counted
            self._dropped.inc(len(self._unconfirmed))
            self._unconfirmed = []

    def publish(self, subject: str, data: bytes) -> None:
        if len(self._pending) + len(self._unconfirmed) >= self._capacity:
            self._dropped.inc()
            return
        self._pending.append((subject, data))
        if len(self._pending) == 1:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            if self._unconfirmed:  # records not confirmed yet: ask the stream when traffic stops
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._confirm_every)
                if not self._wake.is_set():
                    nc = self._nc
                    if nc is not None and nc.is_connected:
                        await self._confirm_stored(nc)
                    if self._pending:
                        await self._drain()
                    continue
            elif not self._pending:  # (a check at the end of a drain may have queued records again)
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
            prefix = self._stored[0] if self._stored is not None else None
            connection = nc.stats["reconnects"]
            try:
                for item in batch:
                    subject, data = item
                    await nc.publish(subject, data)
                    if prefix is not None and subject.startswith(prefix):
                        self._unconfirmed.append(item)
                    sent += 1
                await self._confirmed(nc, connection)
                if self._unconfirmed and time.monotonic() - self._checked >= self._confirm_every:
                    await self._confirm_stored(nc)
            except MaxPayloadError:  # this message can never go
                self._dropped.inc()
                pending.extendleft(reversed(batch[sent + 1:]))
            except Exception:  # the connection broke under the batch: all of it again once connected
                self.resent += len(batch)
                if prefix is not None:  # the batch's records go again with the batch, not twice
                    sent_here = {id(m) for m in batch}
                    self._unconfirmed = [m for m in self._unconfirmed if id(m) not in sent_here]
                pending.extendleft(reversed(batch))
                await asyncio.sleep(0.02)
        if self._unconfirmed and nc is not None and nc.is_connected \
                and time.monotonic() - self._checked >= self._confirm_every:
            await self._confirm_stored(nc)

    async def _confirmed(self, nc: nats.NATS, connection: int) -> None:
        """Return once the server has the batch just written on this
        connection; raise if the connection was replaced meanwhile (the batch
        must go again). A server that is only slow, or frozen with its
        connection open, is waited for on the same connection, never sent the
        batch again there: a frozen server handed the copies on when it woke,
        and a follower saw each decision up to 23 times (HA trial). A frozen
        server is left within seconds (``bus.KEEPALIVE``), and then the
        batch goes again on the new connection."""
        while True:
            try:
                await bus.sync(nc, timeout=self._confirm)
                return
            except Exception:
                # closed, replaced, or reconnecting: what was written may be lost with the old socket
                if nc.is_closed or not nc.is_connected or nc.stats["reconnects"] != connection:
                    raise
                # still this connection: what was written is on its way, once
                await asyncio.sleep(0.05)

    async def _confirm_stored(self, nc: nats.NATS) -> None:
        """Ask the records' stream for its leader and last sequence. The
        records sent since the last answer are taken for stored when this
        answer names the leader the last one named and the sequence has moved
        on (the stream stores: a leader left without its quorum still names
        itself for a while, and its sequence stands still). While it names no
        leader (a server left alone answers so), does not answer, or stores
        nothing, they are kept and the publisher says so once; once a leader
        answers again, or another leader than the last (an election in
        between), or a sequence that started over (the stream made again),
        they are sent again, once. A stream that is not there, or NATS
        without JetStream, keeps nothing: the router said so when it could
        not make the stream."""
        assert self._stored is not None
        from nats.js.errors import NotFoundError

        self._checked = time.monotonic()
        try:
            leader, seq = await self._ask_stream(nc)
        except NotFoundError:  # no such stream: records are not kept at all (the router said so)
            self._unconfirmed = []
            self._leader = self._seq = None
            return
        except Exception as exc:  # no leader (an election, no quorum), or NATS away: keep them
            self._away(bus.describe(exc))
            self._leader = None
            await asyncio.sleep(0.25)
            return
        if self._seq is not None and seq < self._seq:
            self._leader = None  # the stream was made again (or purged): its sequence started over
        if self._leader is not None and leader == self._leader:
            if self._unconfirmed and seq == self._seq:
                # the same leader stores nothing (one left without its quorum still names itself
                # for a while): keep them; they are stored when the sequence moves on, or go again
                # when another leader answers
                now = time.monotonic()
                self._frozen_since = self._frozen_since or now
                if now - self._frozen_since >= 1.0:
                    self._away(f"its leader {leader or '(one server)'} stores nothing (the sequence "
                               f"stands at {seq})")
                return
            self._unconfirmed = []  # the same leader before and after they were sent, storing: stored
        elif self._unconfirmed and (self._leader is not None or self._stream_away):
            # an election since the last answer, or the first answer after an outage: what was sent
            # meanwhile may be lost; once more (the same leader answers the next check)
            self.resent_stored += len(self._unconfirmed)
            self._resent_outage += len(self._unconfirmed)
            self._pending.extendleft(reversed(self._unconfirmed))
            self._unconfirmed = []
        else:
            self._unconfirmed = []  # the first answer since start: nothing was seen to fail
        self._leader, self._seq, self._frozen_since = leader, seq, None
        if self._stream_away:
            self._stream_away = False
            log.info("records_stream_available", stream=self._stored[1], leader=leader or "(one server)",
                     resent=self._resent_outage)

    async def _ask_stream(self, nc: nats.NATS) -> tuple[str, int]:
        """The records stream's leader ("" for a single server) and last
        sequence; NotFoundError when there is no such stream or NATS has no
        JetStream (the router routes on, unrecorded, and said so); an error
        when it has no leader (a server left alone answers for a stream it
        cannot store into, with the leader empty) or does not answer."""
        from nats.js.errors import NotFoundError, ServiceUnavailableError

        assert self._stored is not None
        try:
            info = await nc.jetstream(timeout=min(self._confirm, 0.5)).stream_info(self._stored[1])
        except ServiceUnavailableError as exc:
            if getattr(exc, "err_code", None) is None and getattr(exc, "description", None) is None:
                # no responders: no JetStream at all (a cluster without quorum answers with a code)
                raise NotFoundError() from exc
            raise
        leader = "" if info.cluster is None else (info.cluster.leader or None)
        if leader is None:
            raise RuntimeError("the stream has no leader (its servers have no quorum)")
        return leader, int(info.state.last_seq or 0)

    def _away(self, why: str) -> None:
        if not self._stream_away:
            self._stream_away = True
            self._resent_outage = 0
            assert self._stored is not None
            log.warning("records_stream_unavailable", stream=self._stored[1], error=why,
                        held=len(self._unconfirmed), consequence="records held, sent again once it stores")
