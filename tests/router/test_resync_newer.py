"""A router's resync from the telemetry bucket keeps what its subscription
already brought when that is newer (the collector writes a key at most once a
second, every change goes on the subject); after a reconnect it is tried
until it reads, and said once each way."""

from __future__ import annotations

from typing import Any

import nats
import pytest
from nats.js.api import KeyValueConfig
from structlog.testing import capture_logs

from kinference_common import subjects
from kinference_common.engine import InFlightLedger
from kinference_common.messages import EndpointState, encode
from kinference_router.state import SnapshotKeeper, resync_until_read

pytestmark = pytest.mark.nats


def state(pod: str, queued: int, scraped_at: float) -> EndpointState:
    return EndpointState(namespace="default", worker_set="ws-a", pod=pod, address=f"{pod}:8000",
                         queued=queued, scraped_at=scraped_at, ready=True)


async def test_resync_keeps_the_newer_of_the_bucket_and_the_subscription(nats_server: Any) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(KeyValueConfig(bucket=subjects.TELEMETRY_BUCKET, history=1))
        for st in (state("p0", 1, 100.0), state("p1", 2, 100.0), state("p2", 3, 100.0)):
            await kv.put(subjects.endpoint_key(st.namespace, st.worker_set, st.pod), encode(st))
        k = SnapshotKeeper("default", "pool", InFlightLedger())
        k._nc = nc
        k.set_endpoint(state("p0", 9, 100.5))  # from the subject, after the bucket's copy
        k.set_endpoint(state("p1", 8, 99.0))   # older than the bucket's copy
        await k.resync()
        assert k.endpoints["default/ws-a/p0"].queued == 9, "a newer state from the subject was overwritten"
        assert k.endpoints["default/ws-a/p1"].queued == 2
        assert k.endpoints["default/ws-a/p2"].queued == 3
    finally:
        await nc.close()


async def test_a_resync_after_a_reconnect_is_tried_until_it_reads_and_said_once_each_way() -> None:
    """After a NATS server's death the router reconnects at once, but the
    buckets' leaders may still be in election: its one resync failed, logged
    "configuration resync failed" / "telemetry resync failed" after the store
    was said available again, and never said it had read them."""
    answers = iter(["configuration: nats: timeout", "telemetry: nats: timeout", "telemetry: nats: timeout", None])
    calls = 0

    async def resync() -> str | None:
        nonlocal calls
        calls += 1
        return next(answers)

    with capture_logs() as logs:
        assert await resync_until_read(resync, first_wait=0.01, longest_wait=0.02)
    assert calls == 4
    assert [(e["event"], e["log_level"]) for e in logs] == [("resync_failed", "warning"), ("resynced", "info")]
    assert logs[0]["error"] == "configuration: nats: timeout" and logs[1]["attempts"] == 4

    async def never() -> str | None:
        return "telemetry: nats: timeout"

    with capture_logs() as logs:
        assert not await resync_until_read(never, first_wait=0.01, longest_wait=0.01, give_up_after=0.05)
    assert [e["event"] for e in logs] == ["resync_failed", "resync_given_up"]


async def test_a_resync_that_cannot_read_says_what(nats_server: Any) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().create_key_value(KeyValueConfig(bucket=subjects.TELEMETRY_BUCKET, history=1))
        k = SnapshotKeeper("default", "pool", InFlightLedger())
        k._nc = nc
        assert await k.resync() is None  # no configuration yet is an answer
        await nc.close()
        assert await k.resync() == "not connected"
    finally:
        if not nc.is_closed:
            await nc.close()


async def test_a_configuration_read_that_fails_does_not_skip_the_telemetry(nats_server: Any) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=subjects.TELEMETRY_BUCKET, history=1))
        st = state("p0", 4, 100.0)
        await kv.put(subjects.endpoint_key(st.namespace, st.worker_set, st.pod), encode(st))

        class ConfigTimesOut:
            def __getattr__(self, name: str) -> Any:
                return getattr(js, name)

            async def key_value(self, bucket: str) -> Any:
                if bucket == subjects.CONFIG_BUCKET:
                    raise TimeoutError("nats: timeout")
                return await js.key_value(bucket)

        k = SnapshotKeeper("default", "pool", InFlightLedger())
        k._nc = nc
        nc.jetstream = lambda **kw: ConfigTimesOut()  # type: ignore[method-assign]
        assert (await k.resync() or "").startswith("configuration:")
        assert k.endpoints["default/ws-a/p0"].queued == 4  # read all the same
    finally:
        await nc.close()


async def test_a_pool_deleted_while_the_router_did_not_hear_it_goes_at_its_next_read(nats_server: Any) -> None:
    """Second review: a pool deleted while a single-pool router was away (its
    empty announcement missed) was kept for good: a missing key was taken for
    "no configuration yet". A router that has a pool and finds its key gone
    drops it; a bucket that is gone (NATS lost its storage) keeps it."""
    from pathlib import Path

    from kinference_common.compiled import encode_pool
    from kinference_common.compiler import compile_paths

    examples = Path(__file__).resolve().parents[2] / "deploy" / "examples"
    pool = compile_paths([examples]).pools[("default", "inference-all")]

    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=subjects.CONFIG_BUCKET, history=1))
        await kv.put(subjects.config_key("default", "inference-all"), encode_pool(pool))
        k = SnapshotKeeper("default", "inference-all", InFlightLedger())
        k._nc = nc
        await k.resync_config()
        assert k.pool is not None and k.pool.revision == pool.revision
        await js.delete_key_value(subjects.CONFIG_BUCKET)  # storage lost: keep what we have
        await k.resync_config()
        assert k.pool is not None
        kv = await js.create_key_value(KeyValueConfig(bucket=subjects.CONFIG_BUCKET, history=1))
        await kv.put(subjects.config_key("default", "inference-all"), encode_pool(pool))
        await kv.delete(subjects.config_key("default", "inference-all"))  # deleted, unheard
        with capture_logs() as logs:
            await k.resync_config()
        assert k.pool is None
        assert any(e["event"] == "pool removed from configuration" for e in logs)
    finally:
        await nc.close()
