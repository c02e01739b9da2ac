"""A NATS cluster that loses its quorum (two of three servers killed): the
router keeps its snapshot, says so once, and once again when the buckets
answer (services/router/state.py, ``SnapshotKeeper.store``)."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import KeyValueConfig
from structlog.testing import capture_logs

from kinference_common import bus, natsserver, subjects
from kinference_router.state import SnapshotKeeper
from kinference_common.engine import InFlightLedger

pytestmark = pytest.mark.nats


async def test_no_quorum_is_said_once_and_its_end_too(nats_cluster: natsserver.NatsCluster) -> None:
    admin = await bus.connect(nats_cluster.url, name="compiler")
    await bus.open_kv(admin.jetstream(), KeyValueConfig(bucket=subjects.CONFIG_BUCKET, history=5, replicas=3))
    leader = (await admin.jetstream().stream_info(f"KV_{subjects.CONFIG_BUCKET}")).cluster.leader
    await bus.close(admin)
    # the bucket's leader and one more killed; the router is on the third
    killed = [int(leader.rsplit("-", 1)[1])]
    killed.append(next(i for i in range(3) if i not in killed))
    stays = next(i for i in range(3) if i not in killed)
    nc = await bus.connect(nats_cluster.urls[stays], name="router")
    try:
        keeper = SnapshotKeeper("default", "pool", InFlightLedger(), store_probe=0.5)
        keeper._nc = nc  # probed by hand below (the rebuild loop does it every store_probe seconds)
        for _ in range(40):  # a bucket just made at three replicas answers on every server once it has a leader
            await keeper.probe_store()
            if keeper.store.available:
                break
            await asyncio.sleep(0.25)
        with capture_logs() as logs:
            await keeper.probe_store()
            assert keeper.store.available
            for i in killed:
                nats_cluster.kill(i)
            for _ in range(6):
                await keeper.probe_store()
            assert not keeper.store.available
            nats_cluster.restart(killed[1])
            for _ in range(80):  # the two elect a leader again
                await keeper.probe_store()
                if keeper.store.available:
                    break
                await asyncio.sleep(0.25)
        said = [e["event"] for e in logs if e["event"].startswith("config_store")]
        assert said == ["config_store_unavailable", "config_store_available"]
        # and the bucket is writable again
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        for _ in range(80):
            try:
                await kv.put("probe", b"x")
                break
            except Exception:
                await asyncio.sleep(0.25)
        assert (await kv.get("probe")).value == b"x"
    finally:
        await bus.close(nc)
