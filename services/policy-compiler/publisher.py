"""Publishing compiled pools on NATS (ARCHITECTURE.md, NATS contract).

Each pool goes to the KV bucket ``kinference-config`` under ``<ns>.<pool>``
(a starting router reads them all at once) and to the subject
``kinference.config.<ns>.<pool>`` (running routers stay current). Only pools
whose revision changed are published. A removed pool is deleted from the
bucket and announced on its subject with an empty body.
"""

from __future__ import annotations

import nats
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KeyValue

from kinference_common import subjects
from kinference_common.compiled import CompiledPool, encode_pool


class ConfigPublisher:
    def __init__(self, nc: nats.NATS) -> None:
        self._nc = nc
        self._kv: KeyValue | None = None
        self._published: dict[tuple[str, str], str] = {}  # key -> revision

    async def start(self) -> None:
        js = self._nc.jetstream()
        try:
            self._kv = await js.key_value(subjects.CONFIG_BUCKET)
        except BucketNotFoundError:
            self._kv = await js.create_key_value(bucket=subjects.CONFIG_BUCKET, history=5)
        # Learn what is already there, so a restart publishes only changes and
        # removes pools that no longer exist.
        try:
            keys = await self._kv.keys()
        except nats.js.errors.NoKeysError:
            keys = []
        for key in keys:
            entry = await self._kv.get(key)
            if entry.value:
                try:
                    from kinference_common.compiled import decode_pool

                    pool = decode_pool(entry.value)
                    self._published[(pool.namespace, pool.name)] = pool.revision
                except Exception:  # an unreadable old value: overwrite or delete it
                    self._published[tuple(key.split(".", 1))] = ""  # type: ignore[assignment]

    async def publish(self, pools: dict[tuple[str, str], CompiledPool]) -> tuple[int, int]:
        """Publish what changed; return (published, deleted)."""
        assert self._kv is not None, "start() first"
        published = deleted = 0
        for key, pool in sorted(pools.items()):
            if self._published.get(key) == pool.revision:
                continue
            data = encode_pool(pool)
            await self._kv.put(subjects.config_key(*key), data)
            await self._nc.publish(subjects.config_subject(*key), data)
            self._published[key] = pool.revision
            published += 1
        for key in sorted(set(self._published) - set(pools)):
            await self._kv.delete(subjects.config_key(*key))
            await self._nc.publish(subjects.config_subject(*key), b"")
            del self._published[key]
            deleted += 1
        return published, deleted
