"""NATS as a cluster of three (the ``nats_cluster`` fixture: three real
nats-servers routed on loopback): buckets at three replicas, a bucket found
with fewer healed, a single server given one replica, and a KV write that
still succeeds with any one server killed."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import KeyValueConfig, StreamConfig
from structlog.testing import capture_logs

from kinference_common import bus, natsserver
from kinference_router.recording import RecordSettings, ensure_stream

pytestmark = pytest.mark.nats


async def replicas(js, bucket: str) -> int:  # type: ignore[no-untyped-def]
    return (await js.stream_info(f"KV_{bucket}")).config.num_replicas


async def test_every_server_url_is_given_and_any_one_will_do(nats_cluster: natsserver.NatsCluster) -> None:
    assert bus.servers(nats_cluster.url) == nats_cluster.urls and len(nats_cluster.urls) == 3
    assert bus.servers(" nats://a:1 , nats://b:2,") == ["nats://a:1", "nats://b:2"]
    with pytest.raises(ValueError):
        bus.servers(" , ")
    nc = await bus.connect(nats_cluster.url, name="test")
    try:
        first = nc.connected_url.port
        nats_cluster.kill([s.port for s in nats_cluster.servers].index(first))
        for _ in range(100):  # reconnects to one of the other two
            if nc.is_connected and nc.connected_url.port != first:
                break
            await asyncio.sleep(0.1)
        assert nc.is_connected and nc.connected_url.port != first
    finally:
        await bus.close(nc)


async def test_buckets_get_three_replicas_and_a_smaller_one_is_healed(nats_cluster: natsserver.NatsCluster) -> None:
    nc = await bus.connect(nats_cluster.url, name="test")
    try:
        js = nc.jetstream()
        kv = await bus.open_kv(js, KeyValueConfig(bucket="made", history=1, replicas=3))
        await kv.put("k", b"v")
        assert await replicas(js, "made") == 3
        # a bucket made with one replica (an older version, a single server grown into a cluster)
        small = await js.create_key_value(KeyValueConfig(bucket="small", history=1, replicas=1))
        await small.put("k", b"kept")
        with capture_logs() as logs:
            kv = await bus.open_kv(js, KeyValueConfig(bucket="small", history=1, replicas=3))
        assert await replicas(js, "small") == 3
        assert (await kv.get("k")).value == b"kept"
        assert [e["event"] for e in logs] == ["kv_bucket_healed"]
        # asking for fewer never shrinks a bucket
        await bus.open_kv(js, KeyValueConfig(bucket="small", history=1, replicas=1))
        assert await replicas(js, "small") == 3
        # a stream made to listen on more than its keys gets its own subjects back
        await js.add_stream(StreamConfig(name="KV_wide", subjects=["$KV.wide.>", "kinference.classify.>"],
                                         max_msgs_per_subject=1, allow_direct=True, num_replicas=3))
        with capture_logs() as logs:
            await bus.open_kv(js, KeyValueConfig(bucket="wide", history=1, replicas=3))
        assert (await js.stream_info("KV_wide")).config.subjects == ["$KV.wide.>"]
        assert "kv_bucket_subjects_reset" in [e["event"] for e in logs]
    finally:
        await bus.close(nc)


async def test_a_single_server_gets_one_replica_whatever_is_asked(nats_server: natsserver.NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")
    try:
        js = nc.jetstream()
        with capture_logs() as logs:
            kv = await bus.open_kv(js, KeyValueConfig(bucket="alone", history=1, replicas=3))
            await bus.open_kv(js, KeyValueConfig(bucket="alone", history=1, replicas=3))
        await kv.put("k", b"v")
        assert (await kv.get("k")).value == b"v"
        assert await replicas(js, "alone") == 1  # never "healed" on a single server
        said = [e["event"] for e in logs if e["log_level"] in ("warning", "error")]
        assert said == ["kv_bucket_single_replica"]  # once
    finally:
        await bus.close(nc)


async def test_kill_any_one_server_and_the_bucket_stays_writable(nats_cluster: natsserver.NatsCluster) -> None:
    """The short version of ``make chaos``'s one-of-three fault: the stream's
    leader itself killed (the worst one), a write succeeds once the two left
    elect a new leader, and the server rejoins and catches up."""
    nc = await bus.connect(nats_cluster.url, name="test")
    try:
        js = nc.jetstream()
        kv = await bus.open_kv(js, KeyValueConfig(bucket="chaos", history=1, replicas=3))
        await kv.put("k", b"before")
        leader = (await js.stream_info("KV_chaos")).cluster.leader
        victim = int(leader.rsplit("-", 1)[1])
        nats_cluster.kill(victim)
        written = None
        deadline = asyncio.get_running_loop().time() + 30  # an election takes a few seconds, more when loaded
        while written is None and asyncio.get_running_loop().time() < deadline:
            try:
                written = await kv.put("k", b"during")
            except Exception:
                await asyncio.sleep(0.25)
        assert written is not None, "no write succeeded within 30 s with two of three servers up"
        assert (await kv.get("k")).value == b"during"
        nats_cluster.restart(victim)
        nats_cluster.wait_healthy(30)
        assert await bus.wait_current(js, "KV_chaos", 30)  # caught up: every replica current
        info = await js.stream_info("KV_chaos")
        assert info.cluster.leader and all(r.current for r in info.cluster.replicas or [])
        assert {info.cluster.leader, *(r.name for r in info.cluster.replicas)} == {"nats-0", "nats-1", "nats-2"}
    finally:
        await bus.close(nc)


async def test_the_records_stream_gets_three_replicas_and_a_smaller_one_is_healed(
        nats_cluster: natsserver.NatsCluster) -> None:
    """The router's decision records (kinfctl replay, audit) were one copy on
    one server of the three: killing that server lost every record published
    until it was back. Created at three replicas; a stream found with one is
    healed, its records kept, and never shrunk. (Records sent while the
    stream's leader dies: tests/router/test_events.py.)"""
    nc = await bus.connect(nats_cluster.url, name="test")
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="KINFERENCE_RECORDS", subjects=["kinference.record.>"],
                                         num_replicas=1, max_bytes=1 << 20))
        await js.publish("kinference.record.old", b"kept")
        settings = RecordSettings(max_bytes=2 << 20, max_age_seconds=3600, replicas=3)
        with capture_logs() as logs:
            assert await ensure_stream(nc, settings, attempts=3, wait=0.2)
            assert await ensure_stream(nc, settings, attempts=3, wait=0.2)  # nothing to change: no update
        info = await js.stream_info("KINFERENCE_RECORDS")
        assert info.config.num_replicas == 3 and info.config.max_bytes == 2 << 20 and info.state.messages == 1
        assert [e["event"] for e in logs] == ["stream_healed"]
        # asking for fewer never shrinks it
        assert await ensure_stream(nc, RecordSettings(max_bytes=2 << 20, max_age_seconds=3600), attempts=3, wait=0.2)
        assert (await js.stream_info("KINFERENCE_RECORDS")).config.num_replicas == 3
    finally:
        await bus.close(nc)


async def test_a_single_server_keeps_one_copy_of_the_records(nats_server: natsserver.NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")
    try:
        with capture_logs() as logs:
            assert await ensure_stream(nc, RecordSettings(replicas=3), attempts=3, wait=0.2)
            assert await ensure_stream(nc, RecordSettings(replicas=3), attempts=3, wait=0.2)
        assert (await nc.jetstream().stream_info("KINFERENCE_RECORDS")).config.num_replicas == 1
        assert [e["event"] for e in logs if e["log_level"] in ("warning", "error")] == ["stream_single_replica"]
    finally:
        await bus.close(nc)


def test_availability_is_said_once_each_way() -> None:
    now = [0.0]
    with capture_logs() as logs:
        a = bus.Availability("config_store", "serving from the last snapshot", clock=lambda: now[0])
        for _ in range(5):
            a.failed(TimeoutError())
        now[0] = 7.5
        a.ok()
        a.ok()
    assert [e["event"] for e in logs] == ["config_store_unavailable", "config_store_available"]
    assert logs[0]["consequence"] == "serving from the last snapshot" and logs[0]["error"] == "TimeoutError"
    assert logs[1]["unavailable_s"] == 7.5 and a.available and a.outages == 1


async def test_a_server_that_freezes_is_left_for_another_within_seconds(nats_cluster: natsserver.NatsCluster) -> None:
    """HA trial: a NATS server stopped with SIGSTOP (its node lost, its TCP
    connections left open) cut every service on it off for about 6 minutes
    (nats-py's default: a PING every 120 s) while the two others kept quorum.
    A client of bus.connect takes it for dead after two unanswered PINGs
    (2 s apart) and goes to another server."""
    import os
    import signal

    nc = await bus.connect(nats_cluster.url, name="test")
    frozen = None
    try:
        port = nc.connected_url.port
        frozen = next(s for s in nats_cluster.servers if s.port == port)
        assert frozen.proc is not None
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while nc.connected_url is None or nc.connected_url.port == port or not nc.is_connected:
            assert loop.time() - started < 20, "still on the frozen server"
            await asyncio.sleep(0.2)
        await bus.sync(nc, timeout=5)  # served by another server
        assert loop.time() - started < 20
    finally:
        if frozen is not None and frozen.proc is not None:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        await bus.close(nc)
