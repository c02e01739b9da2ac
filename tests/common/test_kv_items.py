"""``bus.kv_items`` reads every key of a bucket. nats.py's ``KeyValue.keys()``
can end its listing before the last keys arrive (its watcher's first
"nothing pending"); a policy compiler that restarted then missed a pool it
had published and never announced its deletion (a CI run of
``test_explain_names_the_pool_and_pools_come_and_go``). The listing comes
from the stream's own subjects instead."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.api import KeyValueConfig

from kinference_common import bus
from kinference_common.natsserver import NatsServer

pytestmark = pytest.mark.nats


async def _items(kv: Any, want: Any = None) -> dict[str, bytes]:
    return {k: v async for k, v in bus.kv_items(kv, want)}


async def test_every_key_with_a_value_is_read_whatever_keys_would_list(nats_server: NatsServer) -> None:
    nc = await bus.connect(nats_server.url, name="test")
    try:
        kv = await bus.open_kv(nc.jetstream(), KeyValueConfig(bucket="t", history=5))
        assert await _items(kv) == {}  # an empty bucket: no items
        for key in ("team-a.pool", "team-b.pool", "gone.pool", "_sources.x"):
            await kv.put(key, key.encode())
        await kv.put("team-a.pool", b"second")  # the latest value of a key
        await kv.delete("gone.pool")  # a delete marker: not an item
        await kv.put("empty.pool", b"")  # nor an empty value

        async def one_key(*_: Any, **__: Any) -> list[str]:
            return ["team-a.pool"]  # a listing that ended early

        kv.keys = one_key
        assert await _items(kv) == {"team-a.pool": b"second", "team-b.pool": b"team-b.pool",
                                    "_sources.x": b"_sources.x"}
        assert await _items(kv, lambda k: k.endswith(".pool")) == {"team-a.pool": b"second",
                                                                    "team-b.pool": b"team-b.pool"}
        assert await bus.kv_keys(kv) == ["_sources.x", "empty.pool", "gone.pool", "team-a.pool", "team-b.pool"]
    finally:
        await bus.close(nc)
