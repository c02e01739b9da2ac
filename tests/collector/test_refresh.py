"""What a replica redoes every second, and what it may skip: the targets
re-read from discovery (a fleet of thousands, shared among replicas, costs a
millisecond to share out) and the GPU stats other replicas send again while
their exporters have not collected."""

from __future__ import annotations

import random
from typing import Any

from kinference_collector.derive import GpuStats, merge_gpu_stats
from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import Publisher
from kinference_collector.service import Collector, CollectorConfig, _Dcgm
from kinference_common.tasks import cancel_and_wait
from tests.collector.conftest import NullBus


class Shard:
    """Two replicas; this one takes every other target."""

    def __init__(self) -> None:
        self.id, self.members, self.leader = "a", ["a", "b"], True
        self.dropped: dict[str, int] = {}
        self.shared = 0

    def share(self, targets: list[Target]) -> list[Target]:
        self.shared += 1
        return targets[:: len(self.members)]


def pods(n: int, ready: bool = True) -> list[Target]:
    # port 9 on loopback: a scrape is refused at once (nothing here is about scraping)
    return [Target(namespace="ns", worker_set="ws", pod=f"p-{i}", address="127.0.0.1:9", ready=ready)
            for i in range(n)]


def collector(targets: list[Target]) -> tuple[Collector, ListDiscovery, Shard]:
    discovery, shard = ListDiscovery(targets), Shard()
    c = Collector(CollectorConfig(interval=60.0), discovery, Publisher(NullBus(), 1.0), shard=shard)  # type: ignore[arg-type]
    return c, discovery, shard


def counting_rebuilds(c: Collector) -> list[int]:
    """A list that grows by one at each rebuild of ``c``'s GPU index."""
    rebuilds: list[int] = []
    rebuild = c._rebuild_gpu_index

    def counted() -> None:
        rebuilds.append(1)
        rebuild()

    c._rebuild_gpu_index = counted  # type: ignore[method-assign]
    return rebuilds


async def _stop(c: Collector) -> None:
    await cancel_and_wait(*c._tasks.values())


async def test_the_same_targets_among_the_same_replicas_are_not_shared_out_again() -> None:
    c, discovery, shard = collector(pods(10))
    await c.refresh_targets()
    assert shard.shared == 1 and len(c.trackers) == 5
    for _ in range(3):
        await c.refresh_targets()
    assert shard.shared == 1  # nothing changed: nothing redone
    # a target changed (readiness): applied at the next refresh
    discovery.targets = pods(10, ready=False)
    await c.refresh_targets()
    assert shard.shared == 2
    assert all(not tr.target.ready for tr in c.trackers.values())
    # the replicas changed: the next refresh shares out again, even with the same targets
    shard.members = ["a"]
    await c.refresh_targets()
    assert shard.shared == 3 and len(c.trackers) == 10
    # a target gone
    discovery.targets = discovery.targets[:4]
    await c.refresh_targets()
    assert shard.shared == 4 and len(c.trackers) == 4
    await _stop(c)


def test_gpu_stats_sent_again_unchanged_keep_them_fresh_and_a_change_touches_its_pods_only() -> None:
    c, _, _ = collector([])
    t = [1000.0]
    c._clock = lambda: t[0]  # type: ignore[method-assign]
    rebuilds = counting_rebuilds(c)
    stats = {("ns", "p-0"): GpuStats(0.5, 0.25, 0, 8), ("ns", "p-1"): GpuStats(0.2, 0.25, 0, 8)}
    c.on_remote_gpu("10.0.0.1:9400", stats)
    c.on_remote_gpu("10.0.0.2:9400", {("ns", "p-9"): GpuStats(0.9, 0.9, 0, 8)})
    assert c._gpu_index[("ns", "p-0")].utilization == 0.5
    t[0] += 10
    c.on_remote_gpu("10.0.0.1:9400", dict(stats))  # the same stats, sent again: fresher
    assert c._remote_gpu["10.0.0.1:9400"][0] == 1010.0
    # changed: its pods' entries move (p-1 no longer reported), the other exporter's stay
    other = c._gpu_index[("ns", "p-9")]
    c.on_remote_gpu("10.0.0.1:9400", {("ns", "p-0"): GpuStats(0.75, 0.25, 0, 8)})
    assert c._gpu_index[("ns", "p-0")].utilization == 0.75 and ("ns", "p-1") not in c._gpu_index
    assert c._gpu_index[("ns", "p-9")] is other
    assert rebuilds == []  # no whole rebuild for any of it
    # aged out of the index (an exporter silent past dcgm_stale_after): the same stats
    # arriving again put it back
    t[0] += c.config.dcgm_stale_after + 1
    c.housekeeping()
    assert ("ns", "p-0") not in c._gpu_index and len(rebuilds) == 1
    c.on_remote_gpu("10.0.0.1:9400", {("ns", "p-0"): GpuStats(0.75, 0.25, 0, 8)})
    assert c._gpu_index[("ns", "p-0")].utilization == 0.75


def test_an_exporter_taken_over_does_not_keep_the_other_replicas_copy_until_its_first_scrape() -> None:
    """From review: this replica now scrapes an exporter another replica
    scraped; until its own first scrape succeeds, the other's copy no longer
    counts (a whole rebuild leaves such an exporter out)."""
    c, _, _ = collector([])
    t = [1000.0]
    c._clock = lambda: t[0]  # type: ignore[method-assign]
    c.on_remote_gpu("10.0.0.2:9400", {("ns", "p-9"): GpuStats(0.9, 0.9, 0, 8)})
    t[0] += 60
    c.on_remote_gpu("10.0.0.1:9400", {("ns", "p-0"): GpuStats(0.5, 0.5, 0, 8)})
    c._hold_dcgm(Target(kind="dcgm", address="10.0.0.1:9400"))
    c.housekeeping()
    assert set(c._gpu_index) == {("ns", "p-9")}


def test_the_gpu_index_kept_by_updates_is_the_one_a_whole_rebuild_makes() -> None:
    """Random exporters' stats (two may report the same pod), from this
    replica's own scrapes (some failing, some read a moment before the update)
    and from other replicas (new, or sent again), exporters taken over from
    another replica and handed back, time passing: whenever no rebuild is due
    the index is what a whole rebuild from every fresh exporter's stats would
    give, and after each round of housekeeping it is that. The oldest stats
    in it never outlive their age-out."""
    for seed in range(4):
        _random_gpu_walk(random.Random(seed))


def _whole_index(c: Collector, now: float) -> tuple[dict[tuple[str, str], GpuStats], float]:
    sources, oldest = c.gpu_sources_now(now)
    whole = {}
    for pod, by_address in sources.items():
        merged = None
        for st in by_address.values():
            merged = st if merged is None else merge_gpu_stats(merged, st)
        whole[pod] = merged
    return whole, oldest


def _random_gpu_walk(rng: random.Random) -> None:
    c, _, _ = collector([])
    t = [1000.0]
    c._clock = lambda: t[0]  # type: ignore[method-assign]
    addresses = [f"10.0.0.{i}:9400" for i in range(6)]

    def stats() -> dict[tuple[str, str], GpuStats]:
        pods = rng.sample(range(10), rng.randint(0, 4))
        return {("ns", f"p-{i}"): GpuStats(rng.choice([0.1, 0.5, None]), rng.random(), rng.choice([0, 43]), 8)
                for i in pods}

    for _ in range(500):
        op, address = rng.random(), rng.choice(addresses)
        key = ("dcgm", address, "", "")
        if op < 0.3:  # another replica's copy, new or the same again
            held = c._remote_gpu.get(address)
            c.on_remote_gpu(address, dict(held[1]) if held and rng.random() < 0.5 else stats())
        elif op < 0.55 and key in c._dcgm:  # this replica's own scrape of it (scrape_dcgm's update)
            d = c._dcgm[key]
            if rng.random() < 0.2:
                continue  # it failed: nothing read
            d.stats, d.last_success = stats(), t[0]
            t[0] += rng.choice([0.0, 0.01, 0.05])  # parsed and shared before the update
            c._gpu_update(address, d.stats, d.last_success)
        elif op < 0.65:  # taken over from another replica (apply_targets), not scraped yet
            if key not in c._dcgm:
                c._hold_dcgm(Target(kind="dcgm", address=address))
        elif op < 0.75:  # handed to another replica
            c._release_dcgm(key)
        else:
            t[0] += rng.choice([0.5, 5.0, 30.0, c.config.dcgm_stale_after])
        whole, oldest = _whole_index(c, t[0])
        if not c._gpu_dirty and t[0] < c._gpu_expires:  # no rebuild due: the kept index is the whole one,
            assert c._gpu_index == whole  # and a rebuild falls due when its oldest stats age out
            assert c._gpu_expires <= oldest + c.config.dcgm_stale_after or not c._gpu_index
        c.housekeeping()
        assert c._gpu_index == whole


def test_housekeeping_rebuilds_the_gpu_index_only_when_stats_age_out_of_it() -> None:
    """Every round of housekeeping (twice a second) rebuilt the index of every
    exporter's stats: 1,000 entries at 1,000 pods, in every replica. Now only
    when the oldest stats in it age out (or something arrived meanwhile)."""
    c, _, _ = collector([])
    t = [1000.0]
    c._clock = lambda: t[0]  # type: ignore[method-assign]
    rebuilds = counting_rebuilds(c)
    c.on_remote_gpu("10.0.0.1:9400", {("ns", "p-0"): GpuStats(0.5, 0.25, 0, 8)})
    t[0] += 5
    c.on_remote_gpu("10.0.0.2:9400", {("ns", "p-1"): GpuStats(0.1, 0.1, 0, 8)})
    assert rebuilds == []  # each update touched its pods only
    for _ in range(20):  # ten seconds of rounds, nothing aged out: nothing rebuilt
        t[0] += 0.5
        c.housekeeping()
    assert rebuilds == [] and set(c._gpu_index) == {("ns", "p-0"), ("ns", "p-1")}
    # the first exporter's stats age out (its replica stopped sending them): dropped
    t[0] = 1000.0 + c.config.dcgm_stale_after + 1
    c.housekeeping()
    assert len(rebuilds) == 1 and set(c._gpu_index) == {("ns", "p-1")}
    c.housekeeping()
    assert len(rebuilds) == 1  # the next to age out is the second, 5 s later
    t[0] += 5
    c.housekeeping()
    assert len(rebuilds) == 2 and c._gpu_index == {}
    c.housekeeping()
    assert len(rebuilds) == 2  # nothing left to age out
