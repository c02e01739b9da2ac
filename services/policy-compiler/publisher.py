"""Publishing compiled pools on NATS (ARCHITECTURE.md, NATS contract).

Each pool goes to the KV bucket ``kinference-config`` under ``<ns>.<pool>``
(a starting router reads them all at once) and to the subject
``kinference.config.<ns>.<pool>`` (running routers stay current). A removed
pool is deleted from the bucket and announced on its subject with an empty
body.

Level-triggered: what the bucket holds is *read*, not remembered. Before the
first write, after any failure, on every reconnect and on every periodic
resync (:meth:`ConfigPublisher.resync`) the bucket is opened again (created
when missing: a NATS restarted with empty storage) and its keys are read;
then only the differences from the desired state are written. So a bus that
lost everything is given everything again, and one that kept everything is
given nothing. The bucket is made with ``replicas`` copies (3 on a cluster
of three NATS servers); one found with fewer is healed when opened where
the server allows it, and under the deployed authentication (no service may
update a stream) is said once and used as it is
(:func:`kinference_common.bus.open_kv`).

Next to the pools, the bucket keeps the last good text of every manifest
file (``_sources.<sha256 of the file's name>``, a JSON object ``{file,
text}``), so a compiler restarted while a file is broken compiles that
file's last good version instead of deleting what it published. A record is
removed only when its file is removed.
"""

from __future__ import annotations

import hashlib

import msgspec
import nats
import structlog
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from kinference_common import bus, subjects
from kinference_common.compiled import CompiledPool, decode_pool, encode_pool

log = structlog.get_logger("policy-compiler.publisher")


class SourceRecord(msgspec.Struct, frozen=True):
    """One manifest file's last good version, as stored in the config bucket."""

    file: str
    text: str
    #: the file's place in the order the files came in force (an object defined
    #: in two files is taken from the earlier: see source.py); absent in old records
    order: int = 0


_record_decoder = msgspec.json.Decoder(SourceRecord)


def source_digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:32]


class ConfigPublisher:
    def __init__(self, nc: nats.NATS, replicas: int = 1) -> None:
        self._nc = nc
        self.replicas = replicas
        self._kv: KeyValue | None = None
        #: what the bucket held when last read, plus what was written since
        self._published: dict[tuple[str, str], str] = {}  # pool key -> revision
        #: what went on the pools' subjects (pool key -> revision), whatever the bucket holds
        self._announced: dict[tuple[str, str], str] = {}
        self._sources: dict[str, tuple[str, int]] = {}  # file name -> (text, order)
        self._stale = True  # read the bucket again before the next write
        self._opened_once = False
        #: times the bucket had to be created again after it was seen (bus lost its storage)
        self.recreated = 0
        self.syncs = 0

    def resync(self) -> None:
        """Read the bucket again before the next write (reconnect, periodic),
        and announce every pool on its subject again: a router that started
        while the bucket had no quorum waits for its pool, and gets it so
        within a resync (the others ignore a revision they have)."""
        self._stale = True
        self._announced.clear()

    async def start(self) -> dict[str, str]:
        """Open (or create) the bucket and read it; returns the stored last
        good texts by file name, for the source to restore, in the order the
        files came in force."""
        await self._sync()
        # the bucket holds what the routers were last told: a restart announces nothing again
        self._announced = dict(self._published)
        return {name: text for name, (text, _) in sorted(self._sources.items(), key=lambda kv: (kv[1][1], kv[0]))}

    async def _sync(self) -> None:
        def created() -> None:
            if self._opened_once:
                self.recreated += 1
                log.warning("config bucket was missing (NATS lost its storage): recreated, republishing",
                            bucket=subjects.CONFIG_BUCKET, pools=len(self._published))

        kv = await bus.open_kv(self._nc.jetstream(), KeyValueConfig(
            bucket=subjects.CONFIG_BUCKET, history=5, replicas=self.replicas), on_created=created)
        self._kv = kv
        self._opened_once = True
        published: dict[tuple[str, str], str] = {}
        sources: dict[str, tuple[str, int]] = {}
        async for key, value in bus.kv_items(kv):
            if not subjects.is_pool_key(key):
                if key.startswith(subjects.CONFIG_SOURCE_PREFIX + "."):
                    try:
                        rec = _record_decoder.decode(value)
                        sources[rec.file] = (rec.text, rec.order)
                    except msgspec.DecodeError:
                        pass  # unreadable: overwritten or deleted by the next publish
                continue
            try:
                pool = decode_pool(value)
                published[(pool.namespace, pool.name)] = pool.revision
            except Exception:  # an unreadable old value: overwrite or delete it
                published[tuple(key.split(".", 1))] = ""  # type: ignore[assignment]
        self._published, self._sources = published, sources
        self._stale = False
        self.syncs += 1

    async def publish(self, pools: dict[tuple[str, str], CompiledPool],
                      last_good: dict[str, str] | None = None) -> tuple[int, int]:
        """Write what differs from the bucket; return (pools published, pools
        deleted). ``last_good``: file name -> text of its last good version,
        in the order the files came in force (None: the source keeps no such
        records)."""
        try:
            await self._announce(pools)
            if self._stale or self._kv is None:
                await self._sync()
            return await self._write(pools, last_good)
        except BaseException:
            self._stale = True  # a half-done pass: read the bucket before trusting memory again
            raise

    async def _announce(self, pools: dict[tuple[str, str], CompiledPool]) -> None:
        """Each pool that changed since it was last announced, on its
        subject, before anything touches the bucket: routers follow the
        subjects, and core NATS carries them through any server left, where
        the bucket needs its quorum (with two servers of three down an edit
        reached no router until quorum was back, HA trial; and once a KV
        write had failed, the next pass stopped at reading the bucket, so a
        second edit did not go out either). A pool gone is announced empty."""
        for key, pool in sorted(pools.items()):
            if self._announced.get(key) != pool.revision:
                await self._nc.publish(subjects.config_subject(*key), encode_pool(pool))
                self._announced[key] = pool.revision
        for key in sorted(set(self._announced) - set(pools)):
            await self._nc.publish(subjects.config_subject(*key), b"")
            del self._announced[key]

    async def _write(self, pools: dict[tuple[str, str], CompiledPool],
                     last_good: dict[str, str] | None) -> tuple[int, int]:
        assert self._kv is not None
        published = deleted = 0
        for key, pool in sorted(pools.items()):
            if self._published.get(key) == pool.revision:
                continue
            # on its subject already (_announce); a failed write fails the pass, tried again
            data = encode_pool(pool)
            await self._kv.put(subjects.config_key(*key), data)
            # and again once written: a router that read the bucket in between (a reconnect, a
            # start) took the older pool there, and would keep it until its next resync (a review)
            await self._nc.publish(subjects.config_subject(*key), data)
            self._published[key] = pool.revision
            published += 1
        if last_good is not None:
            for order, (name, text) in enumerate(last_good.items()):
                if self._sources.get(name) == (text, order):
                    continue
                await self._kv.put(subjects.config_source_key(source_digest(name)),
                                   msgspec.json.encode(SourceRecord(name, text, order)))
                self._sources[name] = (text, order)
        for key in sorted(set(self._published) - set(pools)):
            await self._nc.publish(subjects.config_subject(*key), b"")  # also one gone before a restart
            await self._kv.delete(subjects.config_key(*key))
            del self._published[key]
            deleted += 1
        if last_good is not None:
            for name in sorted(set(self._sources) - set(last_good)):
                await self._kv.delete(subjects.config_source_key(source_digest(name)))
                del self._sources[name]
        return published, deleted
