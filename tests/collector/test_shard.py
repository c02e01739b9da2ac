"""Several collector replicas share the fleet (:mod:`kinference_collector.shard`):
a real nats-server for the membership, real aiohttp pages to scrape."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from typing import Any

import msgspec
import nats
import pytest

from kinference_collector import pages
from kinference_collector.derive import DeriveConfig
from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import NatsBus, Publisher
from kinference_collector.service import Collector, CollectorConfig
from kinference_collector.shard import Membership, assign, owners
from kinference_common import subjects
from kinference_common.messages import EndpointState
from kinference_common.tasks import cancel_and_wait

PODS = 9
INTERVAL = 0.1
HEARTBEAT = 0.1
TTL = 0.5
#: rebalance after a death: the TTL plus a heartbeat; a pod's telemetry may be
#: two intervals plus that old, and is not ready only past ``stale_after``
#: (a margin above that bound, for a noisy machine)
STALE_AFTER = 2 * INTERVAL + TTL + HEARTBEAT + 1.0
PATIENCE = 15.0


def targets(n: int, ns: str = "ns") -> list[Target]:
    return [Target(namespace=ns, worker_set="ws", pod=f"p-{i}", address=f"10.0.0.{i}:8000") for i in range(n)]


# ------------------------------------------------------------------ pure part


def test_every_target_has_exactly_one_owner_shares_are_equal_and_a_join_moves_about_its_share() -> None:
    ts = targets(1000)
    # replica ids as Kubernetes names a Deployment's pods
    names = ["telemetry-collector-5c9d7b8f4-x2kqp", "telemetry-collector-5c9d7b8f4-7wzrm",
             "telemetry-collector-5c9d7b8f4-bq9lh", "telemetry-collector-5c9d7b8f4-m4tcv"]
    for n in (1, 2, 3, 4):
        shares = assign(ts, names[:n])
        assert sorted(t.pod for m in shares.values() for t in m) == sorted(t.pod for t in ts)
        # each of N replicas does 1/N of the scrapes, to within one target (plain rendezvous
        # hashing was 16% off at 1,000 pods over 4 replicas for some names)
        assert max(len(v) for v in shares.values()) - min(len(v) for v in shares.values()) <= 1, n
    keys = [t.key for t in ts]
    for before, after in ((names[:3], names[:4]), (names[:4], names[:3]), (names[:2], names[:3])):
        a, b = owners(keys, before), owners(keys, after)
        moved = sum(a[k] != b[k] for k in keys) / len(keys)
        ideal = abs(1 / len(before) - 1 / len(after)) * min(len(before), len(after))
        assert ideal <= moved <= ideal * 1.25, (before, after, moved, ideal)
    # the members' order and the targets' order do not matter: every replica computes the same
    assert owners(keys, names[:3]) == owners(list(reversed(keys)), list(reversed(names[:3])))
    # DCGM exporters are balanced apart from the engine pods
    dcgm = [Target(kind="dcgm", address=f"10.1.0.{i}:9400") for i in range(8)]
    shares = assign([*ts[:6], *dcgm], names[:2])
    assert sorted(sum(t.kind == "dcgm" for t in v) for v in shares.values()) == [4, 4]
    with pytest.raises(ValueError, match="no members"):
        owners(keys, [])


# ------------------------------------------------------------- with NATS


class Replica:
    def __init__(self, name: str, url: str, ts: list[Target]) -> None:
        self.name, self.url, self.targets = name, url, ts

    async def start(self) -> None:
        self.nc = await nats.connect(self.url, reconnect_time_wait=0.1, max_reconnect_attempts=-1)
        bus = NatsBus(self.nc)
        await bus.start()
        self.shard = Membership(self.nc, self.name, heartbeat=HEARTBEAT, ttl=TTL)
        # discovery is not re-read during the test: only a membership change moves targets
        cfg = CollectorConfig(interval=INTERVAL, timeout=0.3, housekeeping_interval=0.1, discovery_interval=60.0,
                              derive=DeriveConfig(window=5.0, stale_after=STALE_AFTER))
        self.collector = Collector(cfg, ListDiscovery(self.targets), Publisher(bus, 0.5), shard=self.shard)
        self.shard.on_change(self.collector.reassign)
        await self.shard.start()
        await self.collector.start()
        await self.shard.set_ready()  # as the service does once its discovery has listed the targets

    def owned(self) -> set[str]:
        return {k[3] for k in self.collector.trackers}

    async def leave(self) -> None:
        """As the service stops: leave, scrape one more heartbeat, stop."""
        await self.shard.stop()
        await asyncio.sleep(HEARTBEAT + 0.1)
        await self.collector.stop()
        await self.nc.close()

    async def crash(self) -> None:
        """As kill -9: heartbeats and scrapes stop at once, nothing said on the bus."""
        assert self.shard._task is not None
        self.shard._task.cancel()
        for t in [*self.collector._tasks.values(), *self.collector._background]:
            t.cancel()
        self.collector.running = False
        if self.collector._http is not None:  # the process's sockets die with it
            await self.collector._http.close()
        await self.nc.close()


class NotReadyWatch:
    def __init__(self) -> None:
        self.not_ready: list[str] = []
        self.dec = msgspec.json.Decoder(EndpointState)

    async def cb(self, msg: Any) -> None:
        st = self.dec.decode(msg.data)
        if not st.ready:
            self.not_ready.append(st.pod)


async def _until(pred: Any) -> None:
    async with asyncio.timeout(PATIENCE):
        while not pred():
            await asyncio.sleep(0.05)


@pytest.fixture
async def fleet(page_server: Any) -> list[Target]:
    out = []
    for i in range(PODS):
        srv = await page_server(pages.VllmPage(running=1))
        out.append(Target(namespace="ns", worker_set="ws", pod=f"p-{i}", address=srv.address,
                          model=srv.page.model))
    return out


@pytest.fixture
async def watcher(nats_server: Any) -> Any:
    nc = await nats.connect(nats_server.url)
    w = NotReadyWatch()
    await nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=w.cb)
    yield w
    await nc.drain()


@pytest.fixture
async def replicas(nats_server: Any, fleet: list[Target]) -> Any:
    made: list[Replica] = []

    async def make(name: str) -> Replica:
        r = Replica(name, nats_server.url, fleet)
        await r.start()
        made.append(r)
        return r

    yield make
    for r in made:
        if r.collector.running:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await r.leave()


def _exactly_once(live: list[Replica]) -> bool:
    owned = Counter(p for r in live for p in r.owned())
    return sorted(owned) == sorted(f"p-{i}" for i in range(PODS)) and set(owned.values()) == {1}


pytestmark = pytest.mark.nats


async def test_three_replicas_scrape_each_pod_once_and_survive_a_kill(
        replicas: Any, watcher: NotReadyWatch, page_server: Any) -> None:
    names = ["collector-0", "collector-1", "collector-2"]
    rs = [await replicas(n) for n in names]
    await _until(lambda: all(r.shard.members == names for r in rs) and _exactly_once(rs))
    assert sum(1 for r in rs if r.collector.leader) == 1 and rs[0].collector.leader
    assert all(r.owned() for r in rs)  # 9 pods over 3 replicas: each has a share
    # steady state: no pod scraped twice (each pod's page is read by one replica)
    await asyncio.sleep(0.5)
    scrapes = {r.name: r.collector.scrapes for r in rs}
    owned = {r.name: len(r.owned()) for r in rs}
    await asyncio.sleep(1.0)
    for r in rs:
        per_pod = (r.collector.scrapes - scrapes[r.name]) / owned[r.name]
        assert per_pod <= 1.0 / INTERVAL * 1.5, (r.name, per_pod)
    assert _exactly_once(rs)

    dead = rs[1]
    orphans = dead.owned()
    await dead.crash()
    live = [rs[0], rs[2]]
    await _until(lambda: all(r.shard.members == [names[0], names[2]] for r in live) and _exactly_once(live))
    # the orphans are scraped again by their new owners, and no router ever saw a pod not ready
    before = {p: tr.last_success for r in live for (_, _, _, p), tr in r.collector.trackers.items() if p in orphans}
    await _until(lambda: all(tr.last_success and tr.last_success != before.get(p) for r in live
                             for (_, _, _, p), tr in r.collector.trackers.items() if p in orphans))
    await asyncio.sleep(STALE_AFTER)  # had a pod been left behind, it would be not ready by now
    assert watcher.not_ready == []


async def test_scale_one_three_one_without_a_gap(replicas: Any, watcher: NotReadyWatch) -> None:
    a = await replicas("collector-0")
    await _until(lambda: _exactly_once([a]))
    b, c = await replicas("collector-1"), await replicas("collector-2")
    await _until(lambda: len(a.shard.members) == 3 and _exactly_once([a, b, c]))
    assert len(a.owned()) < PODS and a.collector.handed_off > 0
    await b.leave()
    await c.leave()
    await _until(lambda: a.shard.members == ["collector-0"] and _exactly_once([a]))
    await asyncio.sleep(STALE_AFTER)
    assert watcher.not_ready == []


async def _members(url: str, name: str, bucket: str, heartbeat: float, ttl: float,
                   skew: float = 0.0) -> Membership:
    nc = await nats.connect(url)
    m = Membership(nc, name, heartbeat=heartbeat, ttl=ttl, bucket=bucket, clock=lambda: time.time() + skew)
    m.ready = True
    return m


async def test_a_join_and_a_leave_move_the_members_at_once_not_at_the_next_heartbeat(nats_server: Any) -> None:
    # heartbeats 30 s apart: only the watch can bring the change within the test's patience
    a = await _members(nats_server.url, "collector-a", "test-members-join", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-join", 30.0, 90.0)
    changes: list[list[str]] = []
    a.on_change(lambda: changes.append(list(a.members)))
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    await b.stop()
    await _until(lambda: a.members == ["collector-a"])
    assert changes == [["collector-a", "collector-b"], ["collector-a"]]
    await a.stop()


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
async def test_a_replica_whose_wall_clock_is_off_is_alive_while_it_beats_and_dead_after_ttl(
        nats_server: Any, skew: float) -> None:
    """Ages count on the reader's clock from a beat's arrival: with the
    writer's wall time, a clock an hour ahead kept a dead replica alive for an
    hour (its share scraped by nobody), and one an hour behind was never alive."""
    bucket = f"test-members-skew-{int(skew > 0)}"
    a = await _members(nats_server.url, "collector-a", bucket, 0.1, 0.4)
    b = await _members(nats_server.url, "collector-b", bucket, 0.1, 0.4, skew=skew)
    await a.beat()
    for _ in range(5):  # b beats for a while, a beats too (and checks ages)
        await b.beat()
        await a.beat()
        assert a.members == ["collector-a", "collector-b"]
        await asyncio.sleep(0.1)
    # b dies: no more beats, nothing said
    await _until_beating(a, lambda: a.members == ["collector-a"])
    await a.stop()


@pytest.mark.parametrize("skew", [0.0, 3600.0])
async def test_a_beat_written_before_the_watch_opened_counts_by_the_servers_time(
        nats_server: Any, skew: float) -> None:
    """What the watch replays on opening is as old as the NATS server's time
    of the write says: a replica that died before this one listened is not
    taken for alive, even when its clock ran an hour ahead (aged by the
    writer's clock it was, and its share went unscraped for a ttl)."""
    bucket = f"test-members-replay-{int(skew)}"
    old = await _members(nats_server.url, "collector-old", bucket, 0.1, 0.4, skew=skew)
    await old.beat()  # its last beat: then it dies
    await asyncio.sleep(0.6)
    a = await _members(nats_server.url, "collector-a", bucket, 0.1, 0.4)
    await a.beat()
    await asyncio.sleep(0.2)  # the replay has been read
    assert a.members == ["collector-a"]
    await a.stop()


async def _until_beating(m: Membership, pred: Any) -> None:
    async with asyncio.timeout(PATIENCE):
        while not pred():
            await m.beat()
            await asyncio.sleep(0.05)


async def test_a_replica_not_ready_yet_takes_no_share_from_the_others(nats_server: Any) -> None:
    """A replica starting (its discovery not listed yet, its informers not
    synced) beats as not ready: the others keep its share until it says it
    scrapes, so nothing goes unscraped while it starts. It counts the ready
    ones, and leads nothing."""
    a = await _members(nats_server.url, "collector-a", "test-members-ready", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-ready", 30.0, 90.0)
    b.ready = False
    await a.beat()
    await b.start()
    assert b.members == ["collector-a", "collector-b"] and not b.leader
    await asyncio.sleep(0.3)
    assert a.members == ["collector-a"] and a.leader  # b has taken nothing yet
    await b.set_ready()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    await b.stop()
    await a.stop()


async def test_a_watch_opened_again_does_not_age_the_members_it_knows(nats_server: Any) -> None:
    """A replica whose clock is an hour behind: its beats, replayed when a
    watch opens again (after NATS went away), said it was an hour old, and
    the member was dropped and taken back at every reopen."""
    a = await _members(nats_server.url, "collector-a", "test-members-reopen", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-reopen", 30.0, 90.0, skew=-3600.0)
    changes: list[list[str]] = []
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    a.on_change(lambda: changes.append(list(a.members)))
    a._kv = None  # as after a failed put: the next beat opens the bucket and its watch again
    await a.beat()
    await asyncio.sleep(0.3)
    assert a.members == ["collector-a", "collector-b"] and changes == []
    await a.stop()


async def test_a_listener_that_raises_leaves_the_membership_running(nats_server: Any) -> None:
    a = await _members(nats_server.url, "collector-a", "test-members-listener", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-listener", 30.0, 90.0)
    seen: list[list[str]] = []

    def broken() -> None:
        raise RuntimeError("a bug in a listener")

    a.on_change(broken)
    a.on_change(lambda: seen.append(list(a.members)))
    await a.beat()
    await b.beat()
    await _until(lambda: seen == [["collector-a", "collector-b"]])
    await b.stop()
    await _until(lambda: seen[-1] == ["collector-a"])  # the watch still runs
    await a.stop()


async def test_a_watch_that_brings_nothing_back_is_opened_again(nats_server: Any) -> None:
    """Puts that land while the watch brings none of them back (the bucket
    made again after the servers lost it; the watch's consumer waits for a
    sequence the new stream has not reached): a peer's beats went unseen, the
    peer was dropped, and this replica led beside the real leader. The watch
    is opened again once its own beat has not come back for ttl and a
    heartbeat."""
    a = await _members(nats_server.url, "collector-a", "test-members-deaf", 0.1, 0.4)
    b = await _members(nats_server.url, "collector-b", "test-members-deaf", 0.1, 0.4)
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    assert a._watcher is not None
    await a._watcher.stop()  # a deaf watch: its consumer gone, its task waiting for ever
    a._follow = asyncio.create_task(asyncio.Event().wait())
    for _ in range(12):  # both keep beating; a must keep seeing b
        await asyncio.sleep(0.1)
        await b.beat()
        await a.beat()
    assert a.members == ["collector-a", "collector-b"]
    await a.stop()
    await b.stop()


async def test_a_replica_killed_is_dropped_within_a_probe_or_two_not_a_ttl(nats_server: Any) -> None:
    """kill -9: the process's socket closes with it, and NATS answers a probe
    of its alive subject with "no responders" at once. Its neighbour deletes
    its key and every replica drops it, long before the ttl (here 90 s). A
    replica that only stopped beating but is still connected is kept."""
    names = ["collector-a", "collector-b", "collector-c"]
    ms = []
    for n in names:
        m = await _members(nats_server.url, n, "test-members-probe", 30.0, 90.0)
        # a timeout of 0.2 s: a loaded machine's pauses do not take c, which answers, for dead
        m.probe_every, m.probe_timeout = 0.05, 0.2
        await m.start()
        ms.append(m)
    a, b, c = ms
    for m in ms:
        await m.beat()
    await _until(lambda: all(m.members == names for m in ms))
    # c stops beating but stays connected and answers the probes: it stays
    assert c._task is not None
    await cancel_and_wait(c._task)
    await asyncio.sleep(0.5)
    assert a.members == names and b.members == names
    # b is killed: no leave, its connection simply gone
    for t in (b._task, b._probe, b._follow):
        if t is not None:
            await cancel_and_wait(t)
    await b._nc.close()  # type: ignore[attr-defined]
    async with asyncio.timeout(2.0):  # a probe or two, not the 90 s ttl
        while not (a.members == ["collector-a", "collector-c"] and c.members == ["collector-a", "collector-c"]):
            await asyncio.sleep(0.02)
    await a.stop()
    await c.stop()


async def _three_probing(url: str, bucket: str, probe_misses: int) -> list[Membership]:
    """collector-a, -b and -c probing every 50 ms with a 0.2 s timeout (a
    loaded machine's pauses are not misses), heartbeats 30 s apart and a 90 s
    ttl: within the test only a probe can drop a member."""
    names = ["collector-a", "collector-b", "collector-c"]
    ms = []
    for n in names:
        m = await _members(url, n, bucket, 30.0, 90.0)
        m.probe_every, m.probe_timeout, m.probe_misses = 0.05, 0.2, probe_misses
        await m.start()
        ms.append(m)
    for m in ms:
        await m.beat()
    await _until(lambda: all(m.members == names for m in ms))
    return ms


async def _freeze(m: Membership) -> None:
    """As a node gone with its connection half-open, or a frozen process: its
    alive subject is still subscribed (NATS has responders) but nothing answers,
    and it beats no more."""
    assert m._task is not None and m._alive_sub is not None
    await cancel_and_wait(m._task)

    async def mute(msg: Any) -> None:
        return None

    # the mute one first: never a moment without responders (that would be "disconnected")
    answering = m._alive_sub
    m._alive_sub = await m._nc.subscribe(f"{subjects.COLLECTOR_ALIVE_PREFIX}.{m.id}", cb=mute)  # type: ignore[attr-defined]
    await answering.unsubscribe()


async def test_a_replica_that_answers_no_probe_while_connected_is_dropped_within_a_few_probes(
        nats_server: Any) -> None:
    """A node gone without closing its connection: NATS still holds the
    subscription, so only the unanswered probes tell. b probes c; two misses
    in a row drop it everywhere (b deletes its key), long before the 90 s
    ttl; its next beat brings it back."""
    a, b, c = await _three_probing(nats_server.url, "test-members-frozen", probe_misses=2)
    await _freeze(c)
    t0 = time.monotonic()
    async with asyncio.timeout(5.0):  # a few probes, not the 90 s ttl
        while not (a.members == b.members == ["collector-a", "collector-b"]):
            await asyncio.sleep(0.01)
    assert time.monotonic() - t0 < 5.0
    assert b.dropped["unanswered"] >= 1 and b.dropped["disconnected"] == 0  # b probes c
    assert a.dropped["disconnected"] == 0  # a heard it through its watch
    # it was only slow after all: its next beat brings it back to every replica
    await c.beat()
    await _until(lambda: a.members == b.members == ["collector-a", "collector-b", "collector-c"])
    for m in (a, b, c):
        await m.stop()


async def test_with_probe_misses_0_an_unanswering_replica_waits_for_the_ttl(nats_server: Any) -> None:
    a, b, c = await _three_probing(nats_server.url, "test-members-frozen-off", probe_misses=0)
    await _freeze(c)
    await asyncio.sleep(1.0)  # four probes' timeouts
    assert a.members == b.members == ["collector-a", "collector-b", "collector-c"]
    assert b.dropped == {"disconnected": 0, "unanswered": 0}
    for m in (a, b, c):
        await m.stop()


class _StallsInEveryRequest:
    """A NATS connection whose holder's event loop stalls 0.25 s just after
    each request is sent: the probe's 0.2 s timer is due before the answer is
    read."""

    def __init__(self, nc: Any) -> None:
        self._nc = nc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        asyncio.get_running_loop().call_soon(time.sleep, 0.25)
        return await self._nc.request(*args, **kwargs)


async def test_a_probe_that_timed_out_because_the_prober_stalled_proves_nothing(nats_server: Any) -> None:
    """The prober's own event loop stalled past the probe's timeout while the
    probe was out: that timeout is not a miss, so c, which answers every probe,
    is kept however many of b's probes time out that way."""
    a, b, c = await _three_probing(nats_server.url, "test-members-stalled", probe_misses=2)
    real = b._nc
    b._nc = _StallsInEveryRequest(real)
    await asyncio.sleep(1.5)  # five of b's probes, each stalled
    b._nc = real
    assert a.members == b.members == ["collector-a", "collector-b", "collector-c"]
    assert b.dropped["unanswered"] == 0
    for m in (a, b, c):
        await m.stop()


async def test_only_the_leader_follows_every_endpoint_state_and_a_new_one_waits_for_a_whole_view(
        replicas: Any) -> None:
    """On Kubernetes the leader writes the statuses of every pod, from the
    others' published states: it alone follows them (each replica following
    every state of the fleet cost each a decode per state). A replica that
    becomes the leader writes nothing until it has followed for a republish
    interval, so never from half a fleet."""
    from kinference_collector.service import share_between_replicas

    names = ["collector-0", "collector-1", "collector-2"]
    rs = [await replicas(n) for n in names]
    followers = []
    for r in rs:
        (_, follower) = await share_between_replicas(r.nc, r.collector, status=True)
        followers.append(follower)
    a, b, c = rs
    await _until(lambda: all(r.shard.members == names for r in rs) and _exactly_once(rs))
    pods = {f"p-{i}" for i in range(PODS)}

    def viewed(r: Replica) -> set[str]:
        return {k[3] for k in r.collector.status_trackers()}

    await _until(lambda: a.collector.status_view_complete() and viewed(a) == pods)
    for r in (b, c):  # the others follow nothing, and would write nothing
        assert r.collector.state_follower is not None and r.collector.state_follower.since is None
        assert r.collector._remote_states == {} and not r.collector.status_view_complete()
        assert viewed(r) == r.owned()
    # the leader leaves: collector-1 leads, and follows collector-2's states
    await followers[0].unsubscribe()
    await a.leave()
    await _until(lambda: b.shard.members == names[1:] and b.collector.state_follower.since is not None)
    assert not b.collector.status_view_complete()  # not a republish interval yet
    await _until(lambda: b.collector.status_view_complete())
    await _until(lambda: _exactly_once([b, c]))
    assert viewed(b) == pods  # its own pods, and collector-2's from their states
    assert c.collector.state_follower.since is None
    for f in followers[1:]:
        await f.unsubscribe()


async def test_the_state_follower_acts_when_leadership_changes_and_does_not_poll(nats_server: Any) -> None:
    """The leader's follower of every endpoint state is told when the members
    or this replica's readiness change (``Membership.on_leadership``): it
    subscribes as soon as this replica leads with others beside it, and stops
    when another leads. It checked leadership ten times a second, on every
    replica, for changes that come a few times in a replica's life."""
    from types import SimpleNamespace

    from kinference_collector.service import StateFollower

    a = await _members(nats_server.url, "collector-a", "test-members-follow", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-follow", 30.0, 90.0)
    a.ready = False  # not ready: leads nothing yet
    forgotten: list[bool] = []
    collector = SimpleNamespace(shard=a, config=SimpleNamespace(min_publish_interval=1.0),
                                forget_remote_states=lambda: forgotten.append(True),
                                on_remote_endpoint=lambda st: None)
    follower = StateFollower(a._nc, collector)  # type: ignore[arg-type]
    checks = 0
    real_check = follower.check

    async def counted() -> None:
        nonlocal checks
        checks += 1
        await real_check()

    follower.check = counted  # type: ignore[method-assign]
    follower.start()
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    await asyncio.sleep(0.1)  # the check that change asked for
    settled = checks
    await asyncio.sleep(0.5)
    assert checks == settled and follower.since is None  # nothing changed: no check (polling made 5)
    await a.set_ready()  # the smallest ready member of two: it leads, and follows at once
    await _until(lambda: follower.since is not None)
    await b.stop()  # alone: nobody else's states to follow
    await _until(lambda: follower.since is None and forgotten == [True])
    await follower.unsubscribe()
    await a.stop()


async def test_a_watch_opened_after_nats_was_away_longer_than_ttl_drops_no_live_member(nats_server: Any) -> None:
    """NATS away (a bucket's leader elected again) for longer than ``ttl``:
    the first beat that worked again aged every other member out before the
    reopened watch had replayed their beats, and each replica led alone for
    a moment beside the real leader (seen on a cluster of three: 0.1-0.4 s,
    both replicas scraping every pod)."""
    a = await _members(nats_server.url, "collector-a", "test-members-away", 0.1, 0.3)
    b = await _members(nats_server.url, "collector-b", "test-members-away", 0.1, 0.3)
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    changes: list[list[str]] = []
    a.on_change(lambda: changes.append(list(a.members)))
    await a._unwatch()  # a's link to the bucket is down: it hears nothing ...
    a._kv = None
    for _ in range(6):  # ... for twice the ttl, while b beats on
        await b.beat()
        await asyncio.sleep(0.1)
    await a.beat()  # back: the watch opens again and replays b's newer beats
    await asyncio.sleep(0.15)
    await b.beat()
    await a.beat()
    assert a.members == ["collector-a", "collector-b"] and changes == []
    await b.stop()
    await _until_beating(a, lambda: a.members == ["collector-a"])  # a member gone is still dropped
    await a.stop()


async def test_after_an_outage_of_everyone_the_first_back_keeps_the_others(nats_server: Any) -> None:
    """NATS away for both replicas (a bucket's leader elected again): the
    first back replayed the other's last beat, older than the ttl, and
    dropped it at once: two leaders until its next beat."""
    a = await _members(nats_server.url, "collector-a", "test-members-all-away", 0.1, 0.3)
    b = await _members(nats_server.url, "collector-b", "test-members-all-away", 0.1, 0.3)
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == b.members == ["collector-a", "collector-b"])
    changes: list[list[str]] = []
    a.on_change(lambda: changes.append(list(a.members)))
    b.on_change(lambda: changes.append(list(b.members)))
    for m in (a, b):  # both lose the bucket: no beat written, none heard
        await m._unwatch()
        m._kv = None
    await asyncio.sleep(0.7)  # over twice the ttl
    await b.beat()  # b first, then a
    await asyncio.sleep(0.05)
    await a.beat()
    await asyncio.sleep(0.15)
    await b.beat()
    await a.beat()
    assert a.members == b.members == ["collector-a", "collector-b"] and changes == []
    assert [m.leader for m in (a, b)] == [True, False]
    await a.stop()
    await _until_beating(b, lambda: b.members == ["collector-b"])  # one that left still goes
    await b.stop()


async def test_replicas_started_with_different_ttls_do_not_drop_each_other_between_beats(nats_server: Any) -> None:
    """The heartbeat follows each replica's own --member-ttl: one started with
    a longer TTL beats less often than the others' TTL. Its beats say its TTL,
    and the others wait that long before they take it for dead (a trial saw
    such a replica dropped and added back twenty times in 22 s)."""
    a = await _members(nats_server.url, "collector-a", "test-members-ttls", 0.2, 0.6)
    b = await _members(nats_server.url, "collector-b", "test-members-ttls", 1.0, 3.0)
    changes: list[list[str]] = []
    a.on_change(lambda: changes.append(list(a.members)))
    await a.start()
    await b.start()
    await a.set_ready()
    await b.set_ready()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    joined = len(changes)
    await asyncio.sleep(3.5)  # three of b's beats, each over a's own TTL after the last
    assert a.members == ["collector-a", "collector-b"] and len(changes) == joined
    await b.stop()
    await _until(lambda: a.members == ["collector-a"])  # a leave still moves it at once
    await a.stop()
