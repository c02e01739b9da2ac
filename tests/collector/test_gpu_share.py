"""GPU stats shared between collector replicas: what goes on the wire and when.

Every message on the share subject wakes every other replica, so the stats of
the exporters a replica reads within 50 ms go out together, and stats that
did not change go out again only as often as the receivers need to keep them
(a third of ``dcgm_stale_after``), or at once when the replicas change."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import nats
import pytest

from kinference_collector import pages
from kinference_collector.derive import GpuStats
from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import Publisher
from kinference_collector.service import (Collector, CollectorConfig, GpuShareTooLarge, _Dcgm, _GpuShare, _GpuShares,
                                          gpu_share_messages, share_between_replicas)
from kinference_common import subjects
from tests.collector.conftest import NullBus
from tests.collector.test_shard import _members

PATIENCE = 10.0


class Shard:
    def __init__(self, me: str) -> None:
        self.id, self.members, self.leader = me, ["a", "b"], me == "a"
        self.dropped: dict[str, int] = {}
        self.batched = True  # every other member reads several exporters a message

    def batched_gpu_shares(self) -> bool:
        return self.batched

    def share(self, targets: list[Target]) -> list[Target]:
        return targets


def replica(me: str, clock: Any = None, **config: Any) -> Collector:
    cfg = CollectorConfig(interval=60.0, **config)
    kw = {"clock": clock} if clock is not None else {}
    return Collector(cfg, ListDiscovery([]), Publisher(NullBus(), 1.0), shard=Shard(me), **kw)  # type: ignore[arg-type]


def stats(exporter: int, util: float) -> dict[tuple[str, str], GpuStats]:
    return {("ns", f"p-{exporter}-{g}"): GpuStats(util, 0.5, 0, 1) for g in range(8)}


@pytest.fixture
async def wire(nats_server: Any) -> AsyncIterator[tuple[Any, list[bytes]]]:
    """A connection for the replicas, and every message on the share subject."""
    nc = await nats.connect(nats_server.url)
    seen: list[bytes] = []

    async def cb(msg: Any) -> None:
        seen.append(msg.data)

    await nc.subscribe(subjects.COLLECTOR_GPU_SUBJECT, cb=cb)
    yield nc, seen
    await nc.drain()


async def _until(pred: Any) -> None:
    async with asyncio.timeout(PATIENCE):
        while not pred():
            await asyncio.sleep(0.01)


async def test_shares_within_the_batch_time_are_one_message_and_every_exporter_reaches_the_others(
        wire: tuple[Any, list[bytes]]) -> None:
    nc, seen = wire
    a, b = replica("a"), replica("b")
    subs = [*await share_between_replicas(nc, a, status=False), *await share_between_replicas(nc, b, status=False)]
    assert a.share_gpu is not None
    for k in range(5):  # five exporters scraped in one turn
        a.share_gpu(f"10.0.0.{k}:9400", stats(k, 0.1 * k))
    await _until(lambda: len(b._gpu_index) == 40)
    await asyncio.sleep(0.2)  # anything else on its way
    assert len(seen) == 1  # one message, not one per exporter
    assert b._gpu_index[("ns", "p-3-0")].utilization == pytest.approx(0.3)
    assert a._gpu_index == {}  # a replica ignores its own shares
    for s in subs:
        await s.unsubscribe()


def test_a_batch_is_cut_to_the_servers_largest_message_and_an_exporter_too_large_is_named() -> None:
    pods = [(f"10.1.0.{k}:9400", [("ns", f"p-{k}-{g}", 0.5, 0.5, None, 1) for g in range(8)]) for k in range(40)]
    whole = gpu_share_messages("a", pods, True, 1 << 20)
    assert len(whole) == 1
    limit = len(whole[0]) // 5
    cut = gpu_share_messages("a", pods, True, limit)
    assert 5 <= len(cut) <= 16 and all(len(m) <= limit for m in cut)
    got = [e for m in cut for e in msgspec.json.decode(m, type=_GpuShares).exporters]
    assert [a for a, _ in got] == [a for a, _ in pods]  # every exporter once, in order
    huge = ("10.9.9.9:9400", [("ns", f"p-{g}", 0.5, 0.5, None, 1) for g in range(400)])
    with pytest.raises(GpuShareTooLarge, match=r"10\.9\.9\.9:9400\) exceed the NATS server's max_payload") as exc:
        gpu_share_messages("a", [*pods[:3], huge, *pods[3:6]], True, limit)
    sent = [e for m in exc.value.sendable for e in msgspec.json.decode(m, type=_GpuShares).exporters]
    assert [a for a, _ in sent] == [a for a, _ in pods[:6]]  # the others still go out


async def test_while_a_member_reads_one_exporter_a_message_each_goes_alone_in_its_form(
        wire: tuple[Any, list[bytes]]) -> None:
    """A rolling upgrade: a replica of a version before reads one exporter a
    message only (its beat says so): the others send it that form until it
    leaves."""
    nc, seen = wire
    a, b = replica("a"), replica("b")
    subs = [*await share_between_replicas(nc, a, status=False), *await share_between_replicas(nc, b, status=False)]
    a.shard.batched = False  # type: ignore[union-attr]
    for k in range(3):
        a.share_gpu(f"10.0.0.{k}:9400", stats(k, 0.5))  # type: ignore[misc]
    await _until(lambda: len(b._gpu_index) == 24)
    await asyncio.sleep(0.2)
    old = [msgspec.json.decode(m, type=_GpuShare) for m in seen]  # what a replica before reads
    assert sorted(m.address for m in old) == [f"10.0.0.{k}:9400" for k in range(3)]
    for s in subs:
        await s.unsubscribe()


async def test_a_beat_without_the_share_form_marks_a_member_of_a_version_before(nats_server: Any) -> None:
    a = await _members(nats_server.url, "collector-a", "test-members-forms", 30.0, 90.0)
    b = await _members(nats_server.url, "collector-b", "test-members-forms", 30.0, 90.0)
    await a.beat()
    await b.beat()
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    assert a.batched_gpu_shares()
    other = await nats.connect(nats_server.url)
    kv = await other.jetstream().key_value("test-members-forms")
    # a beat as replicas before 2026-12-06 write it
    await kv.put("collector-old", msgspec.json.encode({"id": "collector-old", "at": time.time(), "ready": True}))
    # each replica watches the bucket on its own: wait for both to have seen the old beat
    await _until(lambda: "collector-old" in a.members and "collector-old" in b.members)
    assert not a.batched_gpu_shares() and not b.batched_gpu_shares()
    await kv.delete("collector-old")
    await _until(lambda: a.members == ["collector-a", "collector-b"])
    assert a.batched_gpu_shares()
    await other.drain()
    for m in (a, b):
        await m.stop()
        await m._nc.close()  # type: ignore[attr-defined]


async def test_a_share_in_the_one_exporter_form_of_earlier_replicas_is_still_read(
        wire: tuple[Any, list[bytes]]) -> None:
    """During a rolling upgrade the replicas not upgraded yet send one message
    per exporter: their stats still count."""
    nc, _ = wire
    b = replica("b")
    subs = await share_between_replicas(nc, b, status=False)
    old = msgspec.json.encode(["a", "10.0.0.9:9400", [["ns", "p-9", 0.25, 0.5, None, 8]]])
    await nc.publish(subjects.COLLECTOR_GPU_SUBJECT, old)
    await nc.publish(subjects.COLLECTOR_GPU_SUBJECT, b"not a share")  # ignored
    await _until(lambda: ("ns", "p-9") in b._gpu_index)
    assert b._gpu_index[("ns", "p-9")] == GpuStats(0.25, 0.5, None, 8)
    for s in subs:
        await s.unsubscribe()


async def test_unchanged_stats_are_shared_again_at_a_third_of_the_staleness_bound(page_server: Any) -> None:
    dcgm = await page_server()
    dcgm.text = pages.render_dcgm([pages.Gpu(0, "GPU-0", "ns", "p-0", util_percent=40)],
                                  hostname_label="hostname", pod_label="pod_name", namespace_label="pod_namespace")
    now = [1000.0]
    c = replica("a", clock=lambda: now[0], dcgm_stale_after=90.0)
    shared: list[float] = []
    c.share_gpu = lambda address, st: shared.append(now[0])
    d = _Dcgm(Target(kind="dcgm", address=dcgm.address))
    await c.start()
    try:
        for t in (0.0, 10.0, 20.0, 29.0, 30.0, 45.0, 59.0, 60.0):
            now[0] = 1000.0 + t
            await c.scrape_dcgm(d)
        assert [s - 1000.0 for s in shared] == [0.0, 30.0, 60.0]  # the page never changed
        dcgm.text = pages.render_dcgm([pages.Gpu(0, "GPU-0", "ns", "p-0", util_percent=70)],
                                      hostname_label="hostname", pod_label="pod_name",
                                      namespace_label="pod_namespace")
        now[0] = 1061.0
        await c.scrape_dcgm(d)  # a new page: at once
        assert shared[-1] == 1061.0
        # the replicas changed: shared again at once, for a replica that just joined
        c._dcgm[d.target.key] = d
        now[0] = 1061.5
        c.reassign()
        assert shared[-1] == 1061.5
        n = len(shared)
        now[0] = 1062.0
        await c.scrape_dcgm(d)
        assert len(shared) == n  # and not again at the next scrape
    finally:
        await c.stop()
