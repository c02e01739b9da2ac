"""A router's resync from the telemetry bucket keeps what its subscription
already brought when that is newer (the collector writes a key at most once a
second, every change goes on the subject)."""

from __future__ import annotations

from typing import Any

import nats
import pytest
from nats.js.api import KeyValueConfig

from kinference_common import subjects
from kinference_common.engine import InFlightLedger
from kinference_common.messages import EndpointState, encode
from kinference_router.state import SnapshotKeeper

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
