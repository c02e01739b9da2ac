"""Several collector replicas share the fleet: membership and assignment.

Membership lives in the NATS KV bucket ``kinference-collectors`` (NATS is
already every replica's dependency, in files mode as on a cluster, so one
mechanism serves the local stack, the suite and Kubernetes). Every
``heartbeat`` seconds each replica writes its key (its replica id) with the
wall time, then reads the bucket: the live members are the keys written
within ``ttl`` seconds (the replica itself always counts). A replica that
stops deletes its key (the others take its share at their next heartbeat);
one that dies is dropped ``ttl`` after its last heartbeat.

Assignment is rendezvous hashing (highest random weight, a form of
consistent hashing): a target belongs to the live member with the largest
``hash(member, target)``. Every replica computes it from the same members
and the same discovered targets, so each target has exactly one owner; a
member joining or leaving moves only the targets it gains or had (1/N of
them). DCGM exporters are targets like the others.

The leader (writer of the Kubernetes statuses and the provider states) is
the smallest live member id. While replicas' views differ (at most one
heartbeat), two may briefly both scrape a target, never none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterable

import msgspec
import structlog

from kinference_common import subjects
from kinference_common.bus import kv_items, open_kv

from .discovery import Target

log = structlog.get_logger("kinference.collector.shard")

MEMBERS_BUCKET = subjects.COLLECTORS_BUCKET


def _weight(member: str, key: tuple[str, ...]) -> int:
    h = hashlib.blake2b(("\x1f".join(key) + "\x1e" + member).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def owner(key: tuple[str, ...], members: Iterable[str]) -> str:
    """The member a target belongs to (pure; ``members`` not empty)."""
    return max(members, key=lambda m: (_weight(m, key), m))


def assign(targets: Iterable[Target], members: list[str]) -> dict[str, list[Target]]:
    """Every target under its owner (pure)."""
    out: dict[str, list[Target]] = {m: [] for m in members}
    for t in targets:
        out[owner(t.key, members)].append(t)
    return out


def default_replica_id() -> str:
    """The pod name on Kubernetes (``HOSTNAME``), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class _Beat(msgspec.Struct):
    id: str
    at: float


class Membership:
    """This replica's view of the live replicas, kept in NATS KV."""

    def __init__(self, nc: object, replica_id: str, *, heartbeat: float = 0.5, ttl: float = 1.5,
                 bucket: str = MEMBERS_BUCKET, replicas: int = 1,
                 clock: Callable[[], float] = time.time) -> None:
        self._nc = nc
        self.id = replica_id
        self.heartbeat, self.ttl = heartbeat, ttl
        self.bucket, self.replicas = bucket, replicas
        self._clock = clock
        self._kv: object | None = None
        self.members: list[str] = [replica_id]
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._enc = msgspec.json.Encoder()
        self._dec = msgspec.json.Decoder(_Beat)
        self._failing = False

    def on_change(self, cb: Callable[[], None]) -> None:
        self._listeners.append(cb)

    def owns(self, key: tuple[str, ...]) -> bool:
        return owner(key, self.members) == self.id

    @property
    def leader(self) -> bool:
        return self.members[0] == self.id

    async def _open(self) -> object:
        from nats.js.api import KeyValueConfig

        if self._kv is None:
            # entries older than a few TTLs are gone by themselves (a replica that died);
            # created at ``replicas``, healed when found with fewer
            self._kv = await open_kv(self._nc.jetstream(), KeyValueConfig(  # type: ignore[attr-defined]
                bucket=self.bucket, history=1, ttl=max(10.0, 10 * self.ttl), replicas=self.replicas))
        return self._kv

    async def beat(self) -> None:
        """Write this replica's heartbeat, read everyone's, update the view."""
        try:
            kv = await self._open()
            now = self._clock()
            await kv.put(self.id, self._enc.encode(_Beat(self.id, now)))  # type: ignore[attr-defined]
            live = {self.id}
            async for key, value in kv_items(kv):
                try:
                    b = self._dec.decode(value)
                except msgspec.DecodeError:
                    continue
                if now - b.at <= self.ttl:
                    live.add(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # NATS away: keep the last view (scrape too much, never too little)
            self._kv = None
            if not self._failing:
                self._failing = True
                log.warning("membership_unavailable", error=f"{type(exc).__name__}: {exc}"[:200])
            return
        if self._failing:
            self._failing = False
            log.info("membership_recovered")
        members = sorted(live)
        if members != self.members:
            log.info("membership_changed", replica=self.id, members=members, leader=members[0] == self.id)
            self.members = members
            for cb in self._listeners:
                cb()

    async def start(self) -> None:
        await self.beat()
        self._task = asyncio.create_task(self._run(), name="collector-membership")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await self.beat()

    async def stop(self) -> None:
        """Leave: the others take this replica's share at their next heartbeat."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._kv is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._kv.delete(self.id)  # type: ignore[attr-defined]
