"""When a collector scrapes: each target at its own phase of the interval."""

from __future__ import annotations

import asyncio

from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import NullBus, Publisher
from kinference_collector.service import Collector, CollectorConfig, batch_phase, next_slot, phase


def test_next_slot_keeps_the_phase() -> None:
    interval, offset = 0.1, 0.037
    # the steady state: one interval after the slot that began the last scrape
    assert abs(next_slot(10.037, 10.05, interval, offset) - 10.137) < 1e-9
    # a scrape that ran past its next slot skips to the one after, never to the past
    assert abs(next_slot(10.037, 10.2, interval, offset) - 10.237) < 1e-9
    # woken 60 ms late for the slot of 10.0 and done at 10.065: the next is 10.1, not 10.2
    # (counted from the scrape's start, a loop late by more than half an interval skipped a slot)
    assert abs(next_slot(10.0, 10.065, interval, 0.0) - 10.1) < 1e-9
    # the first scrape (at any time): the next slot at least half an interval on
    for started in (5.0, 5.01, 5.06, 5.099):
        got = next_slot(started, started + 0.001, interval, offset)
        assert started + interval / 2 <= got < started + 1.5 * interval + 1e-9
        assert abs(((got - offset) / interval) - round((got - offset) / interval)) < 1e-6


def test_an_interval_of_zero_scrapes_back_to_back() -> None:
    # make bench-collector's throughput run; a division by the interval killed every target's loop
    assert next_slot(10.0, 10.3, 0.0, phase("k", 0.0)) == 10.3


def test_phases_spread_over_the_interval() -> None:
    phases = [phase(f"vllm/ns/ws/pod-{i}", 1.0) for i in range(1000)]
    assert all(0.0 <= p < 1.0 for p in phases)
    tenths = [sum(1 for p in phases if k / 10 <= p < (k + 1) / 10) for k in range(10)]
    assert min(tenths) > 60 and max(tenths) < 140, tenths
    assert phase("vllm/ns/ws/pod-1", 1.0) == phase("vllm/ns/ws/pod-1", 1.0)


def test_batches_put_about_n_targets_in_a_slot() -> None:
    interval = 2.5
    phases = [phase(f"vllm/ns/ws/pod-{i}", interval) for i in range(1000)]
    slots = [batch_phase(p, interval, 1000, 8) for p in phases]
    # each on a grid of 2.5 * 8 / 1000 = 20 ms, never later than its own phase
    assert all(0.0 <= p - s < 0.02 + 1e-12 for p, s in zip(phases, slots))
    assert all(abs(s / 0.02 - round(s / 0.02)) < 1e-6 for s in slots)
    distinct = len(set(slots))
    assert 110 <= distinct <= 125, distinct  # about 1,000 / 8 wake-ups an interval, not 1,000
    # the same key keeps its slot while the replica holds as many targets
    assert batch_phase(phases[0], interval, 1000, 8) == slots[0]
    # a batch of 1 leaves every phase alone; a replica with few targets scrapes them together
    assert [batch_phase(p, interval, 1000, 1) for p in phases] == phases
    assert {batch_phase(p, interval, 8, 8) for p in phases[:8]} == {0.0}
    assert batch_phase(0.3, 0.0, 1000, 8) == 0.3  # make bench-collector's back-to-back runs


class Timed(Collector):
    """A collector whose scrapes only note when they began."""

    def __init__(self, *a: object, **kw: object) -> None:
        super().__init__(*a, **kw)  # type: ignore[arg-type]
        self.starts: dict[str, list[float]] = {}

    async def scrape_endpoint(self, tr) -> None:  # type: ignore[no-untyped-def,override]
        self.starts.setdefault(tr.target.pod, []).append(asyncio.get_running_loop().time())


async def test_a_replicas_scrapes_do_not_start_together() -> None:
    """200 targets started at once: after the first round their scrapes fall
    at their own phases, each target's one interval apart (the old loop kept
    every target's scrapes in the same instant, and a thousand of them queued
    their parses and publishes behind each other)."""
    interval = 0.2
    targets = [Target(namespace="ns", worker_set="ws", pod=f"pod-{i}", address=f"127.0.0.1:{10000 + i}")
               for i in range(200)]
    c = Timed(CollectorConfig(interval=interval), ListDiscovery(targets), Publisher(NullBus()))
    await c.start()
    try:
        await asyncio.sleep(6 * interval)
    finally:
        await c.stop()
    assert len(c.starts) == 200
    later = [t for ts in c.starts.values() for t in ts[1:3]]  # after the start of the replica
    t0 = min(later)
    tenths = [sum(1 for t in later if k / 10 <= ((t - t0) % interval) / interval < (k + 1) / 10) for k in range(10)]
    assert max(tenths) < 0.3 * len(later), f"scrapes bunched in one tenth of the interval: {tenths}"
    for pod, ts in c.starts.items():
        gaps = [b - a for a, b in zip(ts[1:], ts[2:])]
        # one slot apart (a loop woken late shortens the gap after it, never skips a slot)
        assert gaps and all(0.0 < g < 1.5 * interval for g in gaps), (pod, gaps)


def _wakeups(starts: dict[str, list[float]], round_: int) -> int:
    """Distinct instants (1 ms apart or more) at which one round's scrapes began."""
    times = sorted(ts[round_] for ts in starts.values() if len(ts) > round_)
    return 1 + sum(1 for a, b in zip(times, times[1:]) if b - a > 0.001)


async def test_a_replica_wakes_once_for_a_batch_of_scrapes() -> None:
    """200 targets, batches of 8: a round's scrapes start at about 25 instants
    (200 with batches of 1), each target still one interval apart."""
    interval = 0.4
    targets = [Target(namespace="ns", worker_set="ws", pod=f"pod-{i}", address=f"127.0.0.1:{10000 + i}")
               for i in range(200)]
    got = {}
    for batch in (8, 1):
        c = Timed(CollectorConfig(interval=interval, scrape_batch=batch), ListDiscovery(targets),
                  Publisher(NullBus()))
        await c.start()
        try:
            await asyncio.sleep(3.5 * interval)
        finally:
            await c.stop()
        got[batch] = _wakeups(c.starts, 2)
        for pod, ts in c.starts.items():
            gaps = [b - a for a, b in zip(ts[1:], ts[2:])]
            assert gaps and all(0.5 * interval < g < 1.5 * interval for g in gaps), (batch, pod, gaps)
    assert got[8] <= 30, got
    assert got[1] >= 100, got


async def test_a_change_in_the_targets_held_moves_slots_by_less_than_an_interval() -> None:
    """The grid moves with the number of targets held (a replica joining or
    leaving): each target's next scrape still comes half an interval to one
    and a half after its last, never a skipped interval, never two at once."""
    interval = 0.4
    targets = [Target(namespace="ns", worker_set="ws", pod=f"pod-{i}", address=f"127.0.0.1:{10000 + i}")
               for i in range(200)]
    discovery = ListDiscovery(targets)
    c = Timed(CollectorConfig(interval=interval, scrape_batch=8), discovery, Publisher(NullBus()))
    await c.start()
    try:
        await asyncio.sleep(2.2 * interval)
        discovery.targets = targets[:90]
        c.apply_targets(targets[:90])  # the grid's grain goes from 16 ms to 36 ms
        # 3.5 intervals after the change: at least three gaps per target even on
        # a loaded machine (2.5 left some targets with two, CI's run of e7c5f04)
        await asyncio.sleep(3.5 * interval)
    finally:
        await c.stop()
    assert c._held["vllm"] == 90
    for pod, ts in c.starts.items():
        if int(pod.split("-")[1]) >= 90:
            continue
        gaps = [b - a for a, b in zip(ts[1:], ts[2:])]
        assert len(gaps) >= 3 and all(0.45 * interval < g < 1.55 * interval for g in gaps), (pod, gaps)
