"""Router replicas share what they learn: in-flight sends and prefix picks.

Operators run two or three router replicas behind one Service; each sees
only its own sends, so each replica's in-flight ledger and prefix index know
a part of the traffic (docs/operations.md, "Several router replicas"). This
module carries that knowledge between replicas over NATS; the merging is the
engine's (:meth:`InFlightLedger.merge_peer`, :meth:`PrefixIndex.record_peer`),
the decision itself is unchanged.

- **Publish** (:meth:`ReplicaSync._run`): a send or a first token (the
  ledger's ``on_change``; a request's end waits for the next message) publishes a :class:`ReplicaSync` message on
  ``kinference.router.<ns>.<pool>.sync`` (``kinference.router.all.sync`` for
  a router of several pools) at once when the last one is ``interval``
  (:data:`DEFAULT_INTERVAL`, 5 ms) old, else at the end of the interval; with no change, a heartbeat
  every ``heartbeat`` (0.5 s). The message holds the full in-flight state
  (so a lost message is healed by the next) and the prefix-index picks since
  the previous message (a lost one is a prefix the peers do not learn).
  A replica that hears no peer (it runs alone, or its peers went quiet)
  sends only the heartbeat, without its picks: one router pays for the
  sync a message every 0.5 s and nothing per request. A peer's first
  message wakes it, and its state goes out within the interval (with the
  picks made from then on; the ones made alone are never sent).
- **Receive** (:meth:`ReplicaSync.receive`): its own messages are ignored
  (told by their sender alone, :class:`ReplicaSyncHead`, without decoding the rest);
  a message that does not decode, or is older than ``ttl`` by its
  ``sentAt``, or not newer than the last one of its replica, is counted and
  dropped, never raised. A replica silent for ``ttl`` (2 s) is forgotten
  (its sends no longer count).
- **No prompt leaves the router**: endpoint keys, counts, token counts, times
  and block hashes only. Block hashes are keyed BLAKE2b
  (:func:`~kinference_common.engine.tokens.block_hashes` with a key) whose
  key is derived from the router's NATS password (:func:`hash_key`), which
  every replica holds and no other NATS user does: without it, a hash of a
  guessed prompt cannot be compared with the published ones.

Interface used by ``app.py`` / ``pools.py``: ``ReplicaSync(subject, ledger,
prefix, metrics, hash_key=...)``, ``await start(nc)``, ``await stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from kinference_common import subjects
from kinference_common.engine import InFlightLedger, PrefixIndex
from kinference_common.messages import (PrefixRecord, ReplicaEndpoint, ReplicaSync as SyncMessage, ReplicaSyncHead,
                                        decoder, encode)
from kinference_common.tasks import cancel_and_wait

log = structlog.get_logger("kinference.router.replica_sync")

#: seconds between two messages of a replica at the most (a send or a first
#: token publishes at once when the last message is this old). Peers that
#: learn of each other's sends later route as apart: with 50 ms, three
#: replicas' TTFT p99 was 1.27x one router's on ``chat`` and 1.16x on
#: ``shared_prefix_long`` in the fleet benchmark; with 5 ms, 1.12x and 1.03x
#: (docs/routing-benchmark.md, fix 15). Each message costs its sender and
#: every peer a few microseconds per pod (``python -m bench.hotpath``), so
#: the bound, 200 messages a second per pool and replica, costs each
#: replica about 1% of a core at the most.
DEFAULT_INTERVAL = 0.005

#: at most this many prefix records / hashes per record are taken from one message
MAX_RECORDS = 4096
MAX_HASHES = 8192

#: v2: each block's hash chains the previous digest (tokens.block_hashes), not
#: a running BLAKE2b state; a v1 replica's hashes match none of v2's, and the
#: key id tells them apart (key_mismatch) during a rolling upgrade
_KEY_CONTEXT = b"kinference-prefix-blocks-v2"


def hash_key(secret: str | bytes | None) -> bytes:
    """The block-hash key every replica derives alike from the router's NATS
    password (``secret``; None without NATS authentication: a fixed key,
    which is no secret, on a bus anyone may read anyway)."""
    raw = secret.encode() if isinstance(secret, str) else (secret or b"")
    return hashlib.blake2b(raw, key=_KEY_CONTEXT, digest_size=32).digest()


def key_id(key: bytes) -> str:
    """Names a key in messages without revealing it."""
    return hashlib.blake2b(key, digest_size=6, person=b"kinf-key-id").hexdigest()


def default_replica_id() -> str:
    """The pod name (or host name) and a random suffix (a restarted pod is a new replica)."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "router"
    return f"{base}-{secrets.token_hex(3)}"


class ReplicaSync:
    """Publishes this replica's ledger summary and prefix picks; merges the peers'."""

    def __init__(self, subject: str, ledger: InFlightLedger, prefix: PrefixIndex, metrics: Any, *,
                 hash_key: bytes, replica_id: str | None = None, interval: float = DEFAULT_INTERVAL,
                 heartbeat: float = 0.5, ttl: float = 2.0, clock: Callable[[], float] = time.time) -> None:
        self.subject = subject
        self.ledger, self.prefix, self.metrics = ledger, prefix, metrics
        self.hash_key = hash_key
        self.key_id = key_id(hash_key)
        self.replica_id = replica_id or default_replica_id()
        self.interval, self.heartbeat, self.ttl = interval, heartbeat, ttl
        self.clock = clock
        self._seq = 0
        self._decoder = decoder(SyncMessage)
        self._head = decoder(ReplicaSyncHead)
        self._wake = asyncio.Event()
        self._nc: Any = None
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._last_publish = -1e18  # loop time
        self._warned: set[str] = set()

    # ------------------------------------------------------------ lifecycle

    def attach(self) -> None:
        """Make the ledger and the prefix index keep what the peers are told
        (no I/O; :meth:`start` does it before subscribing)."""
        self.ledger.sharing = True
        self.prefix.start_journal()
        self.ledger.on_change = self._changed

    async def start(self, nc: Any) -> None:
        self._nc = nc
        self.attach()
        self._sub = await nc.subscribe(self.subject, cb=self._on_msg)
        with contextlib.suppress(Exception):  # the server has the subscription before the first publish
            await nc.flush(timeout=2)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="replica-sync")
        log.info("replica sync on", subject=self.subject, replica=self.replica_id)

    async def stop(self) -> None:
        self.ledger.on_change = None
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    # -------------------------------------------------------------- publish

    def _changed(self) -> None:
        """The ledger's ``on_change``: a send or a first token. Published only
        where a peer listens (alone, the heartbeat carries the state)."""
        if self.ledger.has_peers:
            self._wake.set()

    def build(self) -> bytes:
        """The next message: the ledger's summary and the journal since the
        last (alone: the journal dropped, nobody would merge it)."""
        now = self.clock()
        self._seq += 1
        endpoints = [ReplicaEndpoint(key=e.key, in_flight=e.in_flight, pending=e.pending, prefilled=e.prefilled,
                                     more_count=e.more_count, more_tokens=e.more_tokens)
                     for e in self.ledger.summary(now)]
        journal = self.prefix.take_journal()
        records = [PrefixRecord(key=k, block_hashes=list(h), max_blocks=cap, kv_usage=kv)
                   for k, h, cap, kv in journal] if self.ledger.has_peers else []
        return encode(SyncMessage(replica=self.replica_id, seq=self._seq, sent_at=now, endpoints=endpoints,
                                  prefix=records, hash_key_id=self.key_id))

    async def publish(self) -> None:
        self._wake.clear()
        self._last_publish = asyncio.get_running_loop().time()
        data = self.build()
        if not getattr(self._nc, "is_connected", True):
            # NATS gone: not buffered (the next publish after the reconnect carries the full state)
            self.metrics.sync_messages.labels("out", "failed").inc()
            return
        try:
            await self._nc.publish(self.subject, data)
            self.metrics.sync_messages.labels("out", "sent").inc()
        except Exception as exc:  # NATS gone: the next publish carries the full state again
            self.metrics.sync_messages.labels("out", "failed").inc()
            self._warn_once("publish", "replica sync publish failed", error=type(exc).__name__)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat / 2):
                    await self._wake.wait()
            self.expire()
            changed = self._wake.is_set()
            since = loop.time() - self._last_publish
            if not changed and since < self.heartbeat:
                continue
            if since < self.interval:
                await asyncio.sleep(self.interval - since)
            await self.publish()

    # -------------------------------------------------------------- receive

    async def _on_msg(self, msg: Any) -> None:
        self.receive(msg.data)

    def receive(self, data: bytes) -> str:
        """Merge one message; the outcome (also counted in
        ``kinference_replica_sync_messages_total{direction="in"}``)."""
        outcome = self._receive(data)
        self.metrics.sync_messages.labels("in", outcome).inc()
        return outcome

    def _receive(self, data: bytes) -> str:
        try:
            if self._head.decode(data).replica == self.replica_id:
                return "own"
            msg = self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._warn_once("garbled", "replica sync message dropped: it does not decode",
                            subject=self.subject, error=str(exc)[:200])
            return "garbled"
        now = self.clock()
        if now - msg.sent_at > self.ttl:
            return "stale"
        alone = not self.ledger.has_peers
        try:
            for e in msg.endpoints:
                if e.in_flight < 0 or e.more_count < 0 or e.more_tokens < 0 or any(t < 0 for _, t in e.pending):
                    raise ValueError(f"endpoint {e.key}: negative count")
            if not self.ledger.merge_peer(msg.replica, msg.seq, msg.endpoints, now):
                return "old"
            if alone:  # the first peer: it gets this replica's state within the interval,
                self.prefix.take_journal()  # and the picks from now on (not the last heartbeat's worth)
                self._wake.set()
        except Exception as exc:  # never let a peer's message break the router
            self.ledger.forget_peer(msg.replica)
            self._warn_once("garbled", "replica sync message dropped", replica=msg.replica, error=str(exc)[:200])
            return "garbled"
        finally:
            self.metrics.sync_peers.set(len(self.ledger.peers))
        if msg.prefix and msg.hash_key_id != self.key_id:
            self._warn_once("key", "replica sync: a peer hashes prompts with another key (a different NATS "
                                   "password, or a router version that chains block hashes differently, as "
                                   "during a rolling upgrade); its prefix picks are ignored", replica=msg.replica)
            return "key_mismatch"
        for rec in msg.prefix[:MAX_RECORDS]:
            if rec.block_hashes:
                # a prompt cut here does not end at its last hash kept (PrefixIndex.continued_on)
                self.prefix.record_peer(rec.key, rec.block_hashes[:MAX_HASHES], rec.max_blocks, rec.kv_usage,
                                        whole=len(rec.block_hashes) <= MAX_HASHES)
        return "merged"

    def expire(self) -> None:
        gone = self.ledger.expire_peers(self.clock(), self.ttl)
        if gone:
            self.metrics.sync_expired.inc(len(gone))
            log.info("replica sync: peers went quiet, forgotten", peers=gone)
        self.metrics.sync_peers.set(len(self.ledger.peers))

    def _warn_once(self, kind: str, message: str, **kw: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, **kw)


def for_router(settings: Any, ledger: InFlightLedger, prefix: PrefixIndex, metrics: Any,
               subject: str | None = None) -> ReplicaSync | None:
    """The sync of a router owning ``ledger`` (None with ``--no-replica-sync``):
    on its pool's subject, or ``subject`` (a router of several pools)."""
    if not settings.replica_sync:
        return None
    return ReplicaSync(subject or subjects.replica_sync_subject(settings.namespace, settings.pool), ledger, prefix,
                       metrics, hash_key=settings.prefix_key or hash_key(None))
