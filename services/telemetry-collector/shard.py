"""Several collector replicas share the fleet: membership and assignment.

Membership lives in the NATS KV bucket ``kinference-collectors`` (NATS is
already every replica's dependency, in files mode as on a cluster, so one
mechanism serves the local stack, the suite and Kubernetes). Every
``heartbeat`` seconds each replica writes its key (its replica id) with the
wall time; one watch of the bucket, for the replica's life, brings it
everyone's beats: the live members are those whose newest beat arrived
under ``ttl`` seconds ago (the replica itself always counts). A beat's age
is counted on the reader's own monotonic clock from when the watch brought
it, so replicas whose wall clocks disagree still see each other alive; the
entries the watch replays when it opens (written before this replica was
listening) are aged by the NATS server's time of the write, and a replay
never ages a member already known.

A replica counts for the others once it is ready: its beats say
``ready: false`` until its discovery has listed the targets and it scrapes
(on Kubernetes, once its informers have synced), and until then the others
keep its share while it scrapes its own view of it (twice, never none). A
replica that becomes ready, and one that stops (it writes a last beat at
time 0 and deletes its key), changes every other replica's members as soon
as the watch brings that write: the shares move within a round trip to
NATS, not at the next heartbeat. One that dies is found by its neighbour's
probe (:meth:`Membership._probe_loop`, every ``probe_every`` seconds), which
deletes its key: at once when NATS answers "no responders" (its connection
is gone: a process killed), and after ``probe_misses`` probes in a row that
it left unanswered where NATS cannot tell (a node gone with its connection
half-open, a process frozen). A probe that timed out while the prober itself
was busy, or whose own connection failed a round trip, proves nothing and
is not counted. A replica that is only slow
for that long is taken for dead wrongly: the others then scrape its share
as well until its next beat brings it back (work done twice, never none).
Without probes (or with ``probe_misses`` 0) a replica is dropped ``ttl``
after its last heartbeat (checked at every heartbeat). Keep ``ttl`` a few
heartbeats and above the longest stall a replica's event loop may have
(CPU throttling under a pod's limit stalls a process for up to the rest of
a 100 ms period).

Assignment is rendezvous hashing with bounded loads (consistent hashing
that also balances): every target ranks the live members by
``hash(member, target)``; taken in the order of their own hash, each target
goes to the first member of its ranking that holds fewer than
``ceil(targets / members)``. Plain rendezvous hashing gives each member a
binomial share (at 1,000 pods over 4 replicas one member in ten is more than
10% off its quarter); the bound makes the shares equal to within one
target, and a member joining or leaving still moves little more than the
share it gains or had (measured: 26% of 1,000 targets on a 3 -> 4 join, the
ideal being 25%). Engine pods and DCGM exporters are balanced separately
(their scrapes differ in rate and size). Every replica computes the same
assignment from the same members and the same discovered targets, so each
target has exactly one owner.

The leader (writer of the Kubernetes statuses and the provider states) is
the smallest live member id, once it is ready. While replicas' views differ (at most one
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
from typing import Any

import msgspec
import structlog

from kinference_common import subjects
from kinference_common.bus import open_kv
from kinference_common.tasks import cancel_and_wait

from .discovery import Target

log = structlog.get_logger("kinference.collector.shard")

MEMBERS_BUCKET = subjects.COLLECTORS_BUCKET


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def _weight(member: str, key: tuple[str, ...]) -> int:
    return _hash("\x1f".join(key) + "\x1e" + member)


def owners(keys: Iterable[tuple[str, ...]], members: Iterable[str]) -> dict[tuple[str, ...], str]:
    """Each key's member: rendezvous ranking, loads bounded to ``ceil(keys / members)``
    (pure; deterministic in the sets of keys and members, not their order)."""
    ms = sorted(set(members))
    if not ms:
        raise ValueError("owners: no members")
    ks = sorted(set(keys), key=lambda k: (_hash("\x1f".join(k)), k))
    cap = -(-len(ks) // len(ms))
    load = dict.fromkeys(ms, 0)
    out: dict[tuple[str, ...], str] = {}
    for k in ks:
        for m in sorted(ms, key=lambda m: (_weight(m, k), m), reverse=True):
            if load[m] < cap:
                load[m] += 1
                out[k] = m
                break
    return out


def assign(targets: Iterable[Target], members: list[str]) -> dict[str, list[Target]]:
    """Every target under its owner, engine pods and DCGM exporters balanced apart (pure)."""
    ts = list(targets)
    own: dict[tuple[str, ...], str] = {}
    for kind in ("vllm", "dcgm"):
        own.update(owners((t.key for t in ts if t.kind == kind), members))
    out: dict[str, list[Target]] = {m: [] for m in members}
    for t in ts:
        out[own[t.key]].append(t)
    return out


def default_replica_id() -> str:
    """The pod name on Kubernetes (``HOSTNAME``), else host and process id."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class _Beat(msgspec.Struct):
    id: str
    at: float
    #: it scrapes: its discovery has listed the targets (the others count only
    #: ready replicas, so a starting one takes nothing from them before it
    #: can scrape); a beat without the field is from a replica that is
    ready: bool = True
    #: the GPU shares it reads: 2, several exporters a message; a beat without
    #: the field is from a replica that reads one exporter a message only
    #: (before 2026-12-06), which the others keep sending while it is a member
    gpu_shares: int = 1
    #: how long it may go silent (its ``--member-ttl``; its beats are paced by
    #: it): the others wait at least that long before they take it for dead,
    #: so replicas started with different TTLs do not drop each other between
    #: beats (0: not said, a replica before 2026-12-06)
    ttl: float = 0.0


#: what this version's beats say of the GPU shares it reads (:class:`_Beat`)
GPU_SHARES_BATCHED = 2


class Membership:
    """This replica's view of the live replicas, kept in NATS KV."""

    def __init__(self, nc: object, replica_id: str, *, heartbeat: float = 0.5, ttl: float = 1.5,
                 bucket: str = MEMBERS_BUCKET, replicas: int = 1, probe_every: float | None = None,
                 probe_misses: int = 2, clock: Callable[[], float] = time.time) -> None:
        self._nc = nc
        self.id = replica_id
        self.heartbeat, self.ttl = heartbeat, ttl
        #: seconds between two probes of the next member (None: never probe)
        self.probe_every = None if probe_every is None else max(0.05, probe_every)
        #: a probe's timeout: half the period, at least 50 ms (a live replica answers
        #: within a millisecond or two), so ``probe_misses`` 2 find a frozen replica
        #: within about two periods of its last answer
        self.probe_timeout = max(0.05, (probe_every or 0.0) / 2)
        #: probes in a row the next member leaves unanswered (timed out while it
        #: is still connected) before it is taken for dead; 0: only ``ttl`` finds it
        self.probe_misses = probe_misses
        #: members this replica's probes took for dead, by cause ("disconnected", "unanswered")
        self.dropped: dict[str, int] = {"disconnected": 0, "unanswered": 0}
        self._alive_sub: Any = None
        self._probe: asyncio.Task[None] | None = None
        self.bucket, self.replicas = bucket, replicas
        self._clock = clock
        self._kv: object | None = None
        self.members: list[str] = [replica_id]
        self._listeners: list[Callable[[], None]] = []
        #: called when what :attr:`leader` and the member count say may have changed
        #: (the members, or this replica's readiness)
        self._leadership: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._enc = msgspec.json.Encoder()
        self._dec = msgspec.json.Decoder(_Beat)
        self._failing = False
        #: this replica scrapes (:meth:`set_ready`); until then the others keep its share
        self.ready = False
        #: the watch has brought what the bucket held when it opened
        self._caught_up = asyncio.Event()
        #: when the watch last brought this replica's own beat back (monotonic)
        self._own_seen = 0.0
        self._memo: tuple[object, set[tuple[str, ...]]] | None = None
        #: member -> when its newest beat arrived (the event loop's monotonic clock)
        self._beats: dict[str, float] = {}
        #: member -> the KV revision of its newest beat seen (a drop deletes that one only)
        self._revisions: dict[str, int] = {}
        #: member -> its newest beat (what it says of itself: its TTL, the GPU shares it reads)
        self._said: dict[str, _Beat] = {}
        self._watcher: Any = None
        self._follow: asyncio.Task[None] | None = None

    def batched_gpu_shares(self) -> bool:
        """Every other member reads GPU shares of several exporters a message
        (during a rolling upgrade from a version before, some do not)."""
        return all(self._said[m].gpu_shares >= GPU_SHARES_BATCHED
                   for m in self.members if m != self.id and m in self._said)

    def _ttl_of(self, member: str) -> float:
        """How long ``member`` may be silent: the longer of its own TTL, as its
        beats say, and this replica's."""
        said = self._said.get(member)
        return self.ttl if said is None else max(self.ttl, said.ttl)

    def on_change(self, cb: Callable[[], None]) -> None:
        """``cb()`` whenever the members change."""
        self._listeners.append(cb)

    def on_leadership(self, cb: Callable[[], None]) -> None:
        """``cb()`` whenever the members or this replica's readiness change
        (what :attr:`leader` depends on), so that a follower of leadership
        need not poll it."""
        self._leadership.append(cb)

    def _tell(self, listeners: list[Callable[[], None]]) -> None:
        for cb in listeners:
            try:
                cb()
            except Exception:  # a listener's bug must not stop the watch or the heartbeats
                log.exception("membership_listener_failed", replica=self.id)

    def share(self, targets: list[Target]) -> list[Target]:
        """This replica's share of ``targets`` under the current members (the
        last answer is kept while neither the targets nor the members change)."""
        memo = (tuple(self.members), tuple(t.key for t in targets))
        if self._memo is None or self._memo[0] != memo:
            mine = {t.key for t in assign(targets, self.members).get(self.id, [])}
            self._memo = (memo, mine)
        mine = self._memo[1]
        return [t for t in targets if t.key in mine]

    @property
    def leader(self) -> bool:
        """The smallest ready member (a replica not ready yet leads nothing)."""
        return self.ready and self.members[0] == self.id

    async def _open(self) -> object:
        from nats.js.api import KeyValueConfig

        if self._kv is None:
            await self._unwatch()
            # entries older than a few TTLs are gone by themselves (a replica that died);
            # created at ``replicas``, healed when found with fewer where allowed
            kv = await open_kv(self._nc.jetstream(), KeyValueConfig(  # type: ignore[attr-defined]
                bucket=self.bucket, history=1, ttl=max(10.0, 10 * self.ttl), replicas=self.replicas))
            # the members known before the watch went down get a ttl from now to be
            # heard again: while it was down this replica heard no one, which says
            # nothing of them (NATS was away for everyone, or for this replica)
            now = asyncio.get_running_loop().time()
            for key, at in self._beats.items():
                self._beats[key] = max(at, now)
            # one watch for the replica's life: every beat is pushed to it (reading the
            # bucket at each beat made a consumer per beat, and its listing missed keys
            # being rewritten)
            self._watcher = await kv.watchall()  # type: ignore[attr-defined]
            self._own_seen = asyncio.get_running_loop().time()
            self._follow = asyncio.create_task(self._follow_beats(self._watcher), name="collector-members-watch")
            self._kv = kv
        return self._kv

    async def _follow_beats(self, watcher: Any) -> None:
        """Keep ``_beats`` from the watch: when each ready member's newest beat
        arrived (monotonic); a beat at time 0 (a replica leaving), a beat
        that is not ready and a deleted key drop it. A member appearing or
        leaving changes the members at once.

        When the watch opens it first replays the bucket: a member already
        known keeps its arrival time (a replay says nothing newer of it than
        the reopening below), and one not known is as old as the server's
        time of its write says (not the writer's clock). A watch opened again (after NATS was away, for this replica or
        for all: a bucket's leader elected again) gives every member it knew a
        ``ttl`` from then to be heard: aged by the last beat heard before,
        every other member was taken for dead and this replica led alone for
        a moment, beside the real leader. A member that died meanwhile goes a
        ``ttl`` later (a killed one at once, by the probes)."""
        caught_up = False
        loop = asyncio.get_running_loop()
        async for entry in watcher:
            if entry is None:  # caught up with the bucket: what comes next is written now
                caught_up = True
                self._caught_up.set()
                continue
            key = entry.key
            if key == self.id:  # this replica's own beat came back: the watch works
                self._own_seen = loop.time()
                continue
            known = key in self._beats
            b: _Beat | None = None
            if entry.operation is None and entry.value:  # not deleted or purged
                try:
                    b = self._dec.decode(entry.value)
                except msgspec.DecodeError:
                    continue
            if b is None:  # deleted: no revision to keep (replica ids come and go with pods)
                self._revisions.pop(key, None)
                self._said.pop(key, None)
            else:
                self._said[key] = b
                if entry.revision:
                    self._revisions[key] = entry.revision
            if b is None or b.at <= 0 or not b.ready:  # gone, leaving, or not scraping yet
                self._beats.pop(key, None)
            elif caught_up:
                self._beats[key] = loop.time()
            elif not known:
                written = entry.created.timestamp() if entry.created is not None else b.at
                age = max(0.0, self._clock() - written)
                if age <= self._ttl_of(key):  # else it died before this replica listened
                    self._beats[key] = loop.time() - age
            if known != (key in self._beats):
                self._update_members()

    async def _unwatch(self) -> None:
        follow, watcher = self._follow, self._watcher
        self._follow = self._watcher = None
        if follow is not None:
            await cancel_and_wait(follow)
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def beat(self) -> None:
        """Write this replica's heartbeat and drop the members whose last beat
        arrived over ``ttl`` ago."""
        try:
            kv = await self._open()
            await kv.put(self.id, self._enc.encode(  # type: ignore[attr-defined]
                _Beat(self.id, self._clock(), self.ready, GPU_SHARES_BATCHED, self.ttl)))
            if self._follow is not None and self._follow.done():  # the watch ended: open it again
                raise RuntimeError("the watch of the members bucket ended")
            if asyncio.get_running_loop().time() - self._own_seen > self.ttl + self.heartbeat:
                # puts land but the watch brings none of them back (the bucket was
                # made again after the servers lost it, and the watch's consumer
                # waits for a sequence the new stream has not reached): open it again
                raise RuntimeError("the watch of the members bucket brings nothing back")
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
        now = asyncio.get_running_loop().time()
        for key in [k for k, at in self._beats.items() if now - at > self._ttl_of(k)]:
            del self._beats[key]
            self._revisions.pop(key, None)
        self._update_members()

    def _update_members(self) -> None:
        """The members are this replica and those whose beats are held; tell
        the listeners when that changed."""
        members = sorted({self.id, *self._beats})
        if members != self.members:
            log.info("membership_changed", replica=self.id, members=members,
                     leader=self.ready and members[0] == self.id)
            self.members = members
            self._tell(self._listeners)
            self._tell(self._leadership)

    async def start(self) -> None:
        """Answer on this replica's alive subject, beat (not ready yet) and
        wait until the watch has brought what the bucket holds (at most a
        heartbeat): the first targets are then this replica's share among the
        ready replicas. Call :meth:`set_ready` once it scrapes."""
        if self.probe_every is not None:
            async def answer(msg: Any) -> None:
                with contextlib.suppress(Exception):
                    await msg.respond(b"")

            try:
                self._alive_sub = await self._nc.subscribe(  # type: ignore[attr-defined]
                    f"{subjects.COLLECTOR_ALIVE_PREFIX}.{self.id}", cb=answer)
            except Exception as exc:  # NATS away: beats and the ttl still work
                log.warning("alive_subject_unavailable", error=f"{type(exc).__name__}: {exc}"[:200])
            self._probe = asyncio.create_task(self._probe_loop(), name="collector-members-probe")
        await self.beat()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.heartbeat):
                await self._caught_up.wait()
        self._task = asyncio.create_task(self._run(), name="collector-membership")

    async def set_ready(self) -> None:
        """This replica scrapes its share: say so now (the others give it its
        share as soon as they hear it)."""
        if not self.ready:
            self.ready = True
            self._tell(self._leadership)
            await self.beat()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            await self.beat()

    def _next_member(self) -> str | None:
        """The member after this one in id order (a ring: each replica probes one)."""
        ms = self.members  # sorted, this replica among them
        return ms[(ms.index(self.id) + 1) % len(ms)] if len(ms) > 1 else None

    async def _probe_loop(self) -> None:
        """Every ``probe_every`` seconds ask the next member whether it is
        alive, on its alive subject (each replica answers while connected):

        - NATS answers "no responders" at once when its connection is gone
          (a process killed: its socket closed with it): it is dropped now;
        - a probe that times out while NATS still holds its subscription (a
          node gone with the connection half-open, a process frozen, or one
          only slow) is a miss; ``probe_misses`` misses in a row drop it.

        A timeout proves something of the peer only when this replica was
        itself awake and connected. So it is not counted when its timer ran
        late (this replica's loop was busy as the timeout fell due: an answer
        may be waiting unread, and the timer runs first), nor when a round
        trip to NATS right after it fails or is slow (this replica's own
        connection is what is broken, or it reconnected meanwhile).

        Dropping deletes the member's key, unless a newer beat of it was
        written meanwhile, and every replica's watch brings that as a leave.
        A replica taken for dead wrongly (slow for that long, or caught
        between two NATS servers while it reconnects) is back at its next
        beat; its share is scraped twice meanwhile, never not at all."""
        from nats.errors import NoRespondersError

        assert self.probe_every is not None
        loop = asyncio.get_running_loop()
        misses, probed, first_miss = 0, None, 0.0
        while True:
            if not misses:  # after a miss the next probe goes at once: the timeout was the wait
                await asyncio.sleep(self.probe_every)
            peer = self._next_member()
            if peer != probed:
                misses, probed = 0, peer
            if peer is None:
                continue
            sent = loop.time()
            try:
                await self._nc.request(f"{subjects.COLLECTOR_ALIVE_PREFIX}.{peer}", b"",  # type: ignore[attr-defined]
                                       timeout=self.probe_timeout)
                misses = 0
            except NoRespondersError:
                misses = 0
                await self._drop(peer, "disconnected", "NATS has no connection of it")
            except asyncio.CancelledError:
                raise
            except TimeoutError:
                late = loop.time() - sent - self.probe_timeout
                if not self.probe_misses or late > max(0.01, self.probe_timeout / 5) \
                        or not await self._connected():
                    misses = 0  # not counted: this replica was busy, or its own link is the problem
                    continue
                if not misses:
                    first_miss = sent
                misses += 1
                if misses >= self.probe_misses:
                    misses = 0
                    await self._drop(peer, "unanswered", f"it answered none of {self.probe_misses} probes in a row "
                                           f"(each within {self.probe_timeout:g} s) while connected",
                                     since=first_miss)
            except Exception:  # NATS away: nothing learnt (and no probe at once after it)
                misses = 0
                continue

    async def _connected(self) -> bool:
        """A round trip to NATS within a probe's timeout, from this replica's side."""
        nc = self._nc
        if not getattr(nc, "is_connected", True):
            return False
        try:
            await nc.flush(timeout=self.probe_timeout)  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            raise
        except Exception:
            return False
        return True

    async def _drop(self, peer: str, cause: str, why: str, since: float | None = None) -> None:
        """Take ``peer`` for dead: drop it here and delete its key, so every
        replica's watch brings a leave (its own next beat brings it back). A
        beat of it that arrived after ``since`` (loop time) says it is alive:
        nothing is done; the delete is of the revision last seen, so a beat
        written meanwhile is kept."""
        if peer not in self._beats or (since is not None and self._beats[peer] > since):
            return
        log.warning("member_gone", replica=self.id, member=peer, why=f"{why}: taking its share now")
        self.dropped[cause] += 1
        self._beats.pop(peer, None)
        self._update_members()
        kv, rev = self._kv, self._revisions.get(peer)
        if kv is not None:
            with contextlib.suppress(Exception):
                await kv.delete(peer, last=rev)  # type: ignore[attr-defined]

    async def stop(self) -> None:
        """Leave: the others take this replica's share as soon as they hear it."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._probe is not None:
            await cancel_and_wait(self._probe)
            self._probe = None
        if self._kv is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._kv.put(self.id, self._enc.encode(_Beat(self.id, 0.0, gpu_shares=GPU_SHARES_BATCHED)))  # type: ignore[attr-defined]
                    await self._kv.delete(self.id)  # type: ignore[attr-defined]
        if self._alive_sub is not None:
            with contextlib.suppress(Exception):
                await self._alive_sub.unsubscribe()
            self._alive_sub = None
        await self._unwatch()
