"""The router's view of the world, kept current from NATS.

At start the compiled pool and the telemetry come from the KV buckets (the
current state at once); afterwards the subjects carry changes. On reconnect
the buckets are read again. When NATS is away nothing changes here: the
router keeps deciding on the last snapshot, and telemetry turns stale by age
(the engine falls back to this router's own ledger for stale endpoints).

The engine's :class:`~kinference_common.engine.Snapshot` is rebuilt off the
request path: at most every ``rebuild_interval`` when something changed, and
at least every ``max_age`` so that ages (staleness) move on even when nothing
arrives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import nats
import structlog
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from kinference_common import bus, subjects
from kinference_common.compiled import CompiledPool, decode_pool
from kinference_common.engine import InFlightLedger, Snapshot, TTFTModel
from kinference_common.engine.candidates import endpoint_key
from kinference_common.engine.ttft import DEFAULT_TTFT_MODEL
from kinference_common.messages import EndpointState, ProviderState
from kinference_common.tasks import cancel_and_wait

log = structlog.get_logger("router.state")

_endpoint_decoder = msgspec.json.Decoder(EndpointState)
_provider_decoder = msgspec.json.Decoder(ProviderState)


class SnapshotKeeper:
    def __init__(
        self,
        namespace: str,
        pool: str,
        ledger: InFlightLedger,
        *,
        stale_after: float = 2.0,
        rebuild_interval: float = 0.05,
        max_age: float = 0.5,
        clock: Callable[[], float] = time.time,
        ejected: Callable[[], set[str]] = set,
        config_resync: float = 30.0,
        healthy: Callable[[str, float], None] | None = None,
        store_probe: float = 2.0,
    ) -> None:
        self.namespace, self.pool_name = namespace, pool
        self.ledger = ledger
        self.stale_after = stale_after
        self.rebuild_interval, self.max_age = rebuild_interval, max_age
        #: seconds between reads of the compiled pool from the KV bucket
        self.config_resync = config_resync
        self.clock = clock
        self.ejected = ejected
        #: told of each ready endpoint's last successful scrape (ends an older ejection)
        self.healthy = healthy
        self.pool: CompiledPool | None = None
        self.endpoints: dict[str, EndpointState] = {}
        self.providers: dict[str, ProviderState] = {}
        self.snapshot: Snapshot | None = None
        #: called after each rebuild (flow control's trigger)
        self.on_rebuild: Callable[[], None] | None = None
        #: PredictedTTFT's calibration factor for the next rebuild (the router learns it)
        self.calibration: Callable[[], float] = lambda: 1.0
        self._ttft_model = DEFAULT_TTFT_MODEL
        self._dirty = False
        self._built_at = 0.0
        self._nc: nats.NATS | None = None
        self._task: asyncio.Task[None] | None = None
        self._resyncing: asyncio.Task[bool] | None = None
        self._subs: list[object] = []
        self.updates = 0
        #: keep each snapshot's inputs for the decision records (recording.py)
        self.record_inputs = False
        self._version = 0
        #: the KV buckets answering: checked every ``store_probe`` seconds; an
        #: outage (a NATS cluster without a quorum) is said once, and once when over
        self.store_probe = store_probe
        self.store = bus.Availability("config_store", self._without_store, logger=log)

    def _without_store(self) -> str:
        """What the config bucket's outage means for this router, now."""
        if self.pool is None:
            return ("no configuration yet: requests are answered 503 (the router has no configuration yet) "
                    "until the bucket answers or the policy-compiler publishes the pool on its subject")
        return ("routing on the last snapshot; telemetry and configuration still arrive on their subjects, "
                "a restarted router would wait for the buckets")

    # ------------------------------------------------------------- inputs

    def set_pool(self, pool: CompiledPool | None) -> None:
        if pool is None or self.pool is None or pool.revision != self.pool.revision:
            if pool is not None and self.pool is None:  # once per unready -> ready
                log.info("configuration loaded", pool=f"{self.namespace}/{self.pool_name}", revision=pool.revision)
            self.pool = pool
            self.rebuild()

    def set_endpoint(self, state: EndpointState) -> None:
        record_endpoint(self.endpoints, self.ledger, self.healthy, state)
        self._dirty = True
        self.updates += 1

    def set_provider(self, state: ProviderState) -> None:
        self.providers[f"{state.namespace}/{state.name}"] = state
        self._dirty = True
        self.updates += 1

    def mark_dirty(self) -> None:
        self._dirty = True

    def rebuild(self) -> None:
        self._dirty = False
        self._built_at = time.monotonic()
        if self.pool is None:
            self.snapshot = None
            if self.on_rebuild is not None:
                self.on_rebuild()  # requests waiting for capacity learn the pool is gone
            return
        c = round(self.calibration(), 3)  # steps under 0.1% are not worth a new model
        if c != self._ttft_model.calibration:
            self._ttft_model = TTFTModel(calibration=c)
        endpoints, providers = self.endpoints, self.providers
        if self.record_inputs:  # the dictionaries change after this: the records need these
            endpoints, providers = dict(endpoints), dict(providers)
        prev = self.snapshot
        snap = None
        if prev is not None and prev.pool is self.pool and prev.stale_after == self.stale_after:
            # only what changed since the last snapshot is built again
            try:
                snap = prev.updated(endpoints, providers.values(), now=self.clock(),
                                    ejected=frozenset(self.ejected()), ttft_model=self._ttft_model)
            except Exception as exc:  # never stuck on the last snapshot: built whole instead
                log.error("incremental snapshot rebuild failed; building it whole",
                          pool=f"{self.namespace}/{self.pool_name}", error=f"{type(exc).__name__}: {exc}")
        if snap is None:
            snap = Snapshot.first(self.pool, endpoints, providers.values(), now=self.clock(),
                                  stale_after=self.stale_after, ejected=frozenset(self.ejected()),
                                  ttft_model=self._ttft_model)
        self._version += 1
        snap.version = self._version
        if self.record_inputs:
            snap.inputs = (endpoints, providers)
        self.snapshot = snap
        if self.on_rebuild is not None:
            self.on_rebuild()

    # --------------------------------------------------------------- NATS

    async def start(self, nc: nats.NATS) -> None:
        self._nc = nc
        await self._subscribe()
        failed = await self.resync()
        if failed is not None:  # the periodic configuration read and the subscriptions catch up
            log.warning("resync_failed", error=failed)
        self._task = asyncio.create_task(self._rebuild_loop(), name="snapshot-rebuild")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._resyncing is not None:
            await cancel_and_wait(self._resyncing)

    async def _subscribe(self) -> None:
        assert self._nc is not None
        nc = self._nc
        config = subjects.config_subject(self.namespace, self.pool_name)

        async def on_config(msg: nats.aio.msg.Msg) -> None:
            self._apply_config(msg.data)

        async def on_endpoint(msg: nats.aio.msg.Msg) -> None:
            self._apply(msg.data, _endpoint_decoder, self.set_endpoint)

        async def on_provider(msg: nats.aio.msg.Msg) -> None:
            self._apply(msg.data, _provider_decoder, self.set_provider)

        self._subs = [
            await nc.subscribe(config, cb=on_config),
            await nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=on_endpoint),
            await nc.subscribe(f"{subjects.TELEMETRY_PROVIDER_PREFIX}.>", cb=on_provider),
        ]

    def _apply_config(self, data: bytes) -> None:
        if not data:  # the pool was deleted
            log.warning("pool removed from configuration", pool=f"{self.namespace}/{self.pool_name}")
            self.set_pool(None)
            return
        try:
            self.set_pool(decode_pool(data))
        except msgspec.DecodeError as exc:
            log.warning("unreadable compiled pool ignored", error=str(exc))

    @staticmethod
    def _apply(data: bytes, decoder: msgspec.json.Decoder, apply: Callable[[object], None]) -> None:  # type: ignore[type-arg]
        try:
            apply(decoder.decode(data))
        except msgspec.DecodeError:
            log.warning("unreadable telemetry message ignored")

    async def resync(self) -> str | None:
        """Read the current state from the KV buckets (start, reconnect);
        what could not be read (None: all of it)."""
        if self._nc is None or not self._nc.is_connected:
            return "not connected"
        js = self._nc.jetstream()
        failed = None
        try:
            if not await self._read_config(js):
                log.info("no configuration yet", pool=f"{self.namespace}/{self.pool_name}")
        except Exception as exc:  # NATS went away mid-resync: resync_soon tries again
            failed = f"configuration: {bus.describe(exc)}"
        # telemetry is read whatever became of the configuration
        telemetry = await resync_telemetry(js, self.set_endpoint, self.set_provider, self.endpoints)
        failed = failed or telemetry
        self.rebuild()
        return failed

    def resync_soon(self) -> None:
        """After a reconnect: :meth:`resync` until it reads (see :func:`resync_until_read`)."""
        self._resyncing = resync_again(self._resyncing, self.resync)

    async def resync_config(self) -> None:
        """Read the compiled pool from the KV bucket (level-triggered: a
        missed or never-sent update is picked up here)."""
        if self._nc is None or not self._nc.is_connected:
            return
        try:
            await self._read_config(self._nc.jetstream())
        except Exception as exc:  # NATS away or JetStream not ready: the next period retries
            log.debug("configuration resync failed", error=str(exc))

    async def _read_config(self, js: Any) -> bool:
        """Apply the pool the config bucket holds; False when it holds none.
        A key gone while this router has a pool: the pool was deleted and its
        empty announcement missed (a reconnect), so it goes too. A bucket gone
        (NATS lost its storage): what the router has stays, the compiler
        writes it again. Other errors are the caller's."""
        try:
            kv = await js.key_value(subjects.CONFIG_BUCKET)
            entry = await kv.get(subjects.config_key(self.namespace, self.pool_name))
        except KeyNotFoundError:
            if self.pool is None:
                return False
            self._apply_config(b"")
            return True
        except BucketNotFoundError:
            return False
        if entry.value:
            self._apply_config(entry.value)
        return True

    async def probe_store(self) -> None:
        """Read this pool's key from the config bucket's stream (one request,
        answered only by the stream's leader: a cluster without a quorum has
        none, or one that steps down within seconds): :attr:`store` says when
        that stops and starts working. A missing key or bucket is an answer."""
        if self._nc is None or not self._nc.is_connected:
            return
        key = subjects.config_key(self.namespace, self.pool_name)
        try:
            await self._nc.jetstream(timeout=max(0.5, self.store_probe / 2)).get_last_msg(
                f"KV_{subjects.CONFIG_BUCKET}", f"$KV.{subjects.CONFIG_BUCKET}.{key}")
        except NotFoundError:
            pass
        except Exception as exc:
            self.store.failed(exc)
            return
        self.store.ok()

    async def _rebuild_loop(self) -> None:
        next_config = time.monotonic() + self.config_resync
        next_probe = time.monotonic() + self.store_probe
        reading: asyncio.Task[None] | None = None
        probing: asyncio.Task[None] | None = None
        try:
            while True:
                await asyncio.sleep(self.rebuild_interval)
                if self.store_probe and time.monotonic() >= next_probe and (probing is None or probing.done()):
                    next_probe = time.monotonic() + self.store_probe
                    probing = asyncio.create_task(self.probe_store(), name="config-store-probe")
                if time.monotonic() >= next_config and (reading is None or reading.done()):
                    # every config_resync, and every second while there is no pool; in
                    # its own task, so a slow JetStream never holds up the rebuilds
                    next_config = time.monotonic() + (self.config_resync if self.pool is not None else 1.0)
                    reading = asyncio.create_task(self.resync_config(), name="config-resync")
                age = time.monotonic() - self._built_at
                if self._dirty or age >= self.max_age:
                    try:
                        self.rebuild()
                    except Exception as exc:  # never let one bad state stop routing updates
                        log.error("snapshot rebuild failed", error=str(exc))
        finally:
            for task in (reading, probing):
                if task is not None and not task.done():
                    task.cancel()


# ------------------------------------------------------------ several pools

PoolKey = tuple[str, str]


class FedKeeper(SnapshotKeeper):
    """One pool's keeper in a router serving several pools: a
    :class:`PoolsFollower` feeds it (the compiled pool, and telemetry in
    dictionaries shared by every pool); it only rebuilds its snapshot."""

    async def start(self, nc: nats.NATS) -> None:
        self._nc = nc
        self.rebuild()
        self._task = asyncio.create_task(self._rebuild_loop(), name=f"snapshot-rebuild {self.namespace}/{self.pool_name}")

    async def resync(self) -> str | None:  # the follower resyncs for everyone
        self.rebuild()
        return None

    async def resync_config(self) -> None:  # the follower owns the configuration
        return

    async def probe_store(self) -> None:  # one follower for every pool: it resyncs on reconnect
        return


class PoolsFollower:
    """Every pool's compiled configuration and all telemetry, from NATS: the
    ``kinference.config.>`` and telemetry subjects, and on start and on
    reconnect the whole ``kinference-config`` and ``kinference-telemetry``
    buckets (a pool whose key is gone was deleted meanwhile). Each pool has a
    :class:`FedKeeper` (made by ``keeper_for``) sharing this follower's
    telemetry; ``on_pools`` is called whenever the set of pools or a pool's
    routes may have changed."""

    def __init__(self, make_keeper: Callable[[PoolKey], SnapshotKeeper], ledger: InFlightLedger) -> None:
        self.make_keeper = make_keeper
        self.ledger = ledger
        self.pools: dict[PoolKey, CompiledPool] = {}
        self.keepers: dict[PoolKey, SnapshotKeeper] = {}
        self.endpoints: dict[str, EndpointState] = {}
        self.providers: dict[str, ProviderState] = {}
        self.on_pools: Callable[[], None] = lambda: None
        #: told of each ready endpoint's last successful scrape (ends an older ejection)
        self.healthy: Callable[[str, float], None] | None = None
        #: True once the buckets were read at least once
        self.synced = False
        self._resyncing: asyncio.Task[bool] | None = None
        self._nc: nats.NATS | None = None
        self._subs: list[object] = []
        self.updates = 0
        #: pool -> (its revision, its destinations as (type, namespace, name))
        self._dests: dict[PoolKey, tuple[str, frozenset[tuple[str, str, str]]]] = {}

    def keeper_for(self, key: PoolKey) -> SnapshotKeeper:
        k = self.keepers.get(key)
        if k is None:
            k = self.keepers[key] = self.make_keeper(key)
            k.endpoints, k.providers = self.endpoints, self.providers  # shared, not copied
        return k

    # ------------------------------------------------------------- inputs

    def set_pool(self, key: PoolKey, pool: CompiledPool | None) -> None:
        old = self.pools.get(key)
        if pool is None:
            if old is None:
                return
            del self.pools[key]
            log.warning("pool removed from configuration", pool=f"{key[0]}/{key[1]}")
        else:
            if old is not None and old.revision == pool.revision:
                return
            self.pools[key] = pool
        self.keeper_for(key).set_pool(pool)
        self.on_pools()

    def set_endpoint(self, state: EndpointState) -> None:
        record_endpoint(self.endpoints, self.ledger, self.healthy, state)
        self._changed(("Local", state.namespace, state.worker_set))

    def set_provider(self, state: ProviderState) -> None:
        self.providers[f"{state.namespace}/{state.name}"] = state
        self._changed(("Provider", state.namespace, state.name))

    def _changed(self, dest: tuple[str, str, str]) -> None:
        """Only the pools with that destination rebuild for it (a rebuild costs
        time in the pool's endpoints: a fleet of many pools would otherwise
        rebuild every pool on every pod's update); a keeper without a pool yet
        is marked too (it has nothing to rebuild but its emptiness)."""
        self.updates += 1
        for key, k in self.keepers.items():
            if key not in self.pools or dest in self._destinations(key):
                k.mark_dirty()

    def _destinations(self, key: PoolKey) -> frozenset[tuple[str, str, str]]:
        pool = self.pools[key]
        memo = self._dests.get(key)
        if memo is None or memo[0] != pool.revision:
            memo = self._dests[key] = (pool.revision, frozenset(
                (d.type, d.namespace, d.name) for d in pool.destinations))
        return memo[1]

    def _apply_config(self, key: PoolKey, data: bytes) -> None:
        if not data:
            self.set_pool(key, None)
            return
        try:
            pool = decode_pool(data)
        except msgspec.DecodeError as exc:
            log.warning("unreadable compiled pool ignored", error=str(exc))
            return
        # the key escapes '.', the pool names itself exactly
        self.set_pool((pool.namespace, pool.name), pool)

    # --------------------------------------------------------------- NATS

    async def start(self, nc: nats.NATS) -> None:
        self._nc = nc

        async def on_config(msg: nats.aio.msg.Msg) -> None:
            parts = msg.subject.split(".")
            if len(parts) == 4:
                key = self._key_of(parts[2], parts[3])
                self._apply_config(key, msg.data)

        async def on_endpoint(msg: nats.aio.msg.Msg) -> None:
            SnapshotKeeper._apply(msg.data, _endpoint_decoder, self.set_endpoint)

        async def on_provider(msg: nats.aio.msg.Msg) -> None:
            SnapshotKeeper._apply(msg.data, _provider_decoder, self.set_provider)

        self._subs = [
            await nc.subscribe(f"{subjects.CONFIG_PREFIX}.>", cb=on_config),
            await nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=on_endpoint),
            await nc.subscribe(f"{subjects.TELEMETRY_PROVIDER_PREFIX}.>", cb=on_provider),
        ]
        failed = await self.resync()
        if failed is not None:  # the subscriptions catch up
            log.warning("resync_failed", error=failed)

    async def stop(self) -> None:
        if self._resyncing is not None:
            await cancel_and_wait(self._resyncing)
        for sub in self._subs:
            try:
                await sub.unsubscribe()  # type: ignore[attr-defined]
            except Exception:
                pass
        self._subs = []

    def _key_of(self, ns_token: str, pool_token: str) -> PoolKey:
        """The pool a subject or KV key names (tokens escape '.' as '_')."""
        for key in self.pools:
            if subjects.token(key[0]) == ns_token and subjects.token(key[1]) == pool_token:
                return key
        return (ns_token, pool_token)

    async def resync(self) -> str | None:
        """Read every pool and all telemetry from the KV buckets (start,
        reconnect); what could not be read (None: all of it)."""
        if self._nc is None or not self._nc.is_connected:
            return "not connected"
        js = self._nc.jetstream()
        failed = None
        try:
            kv = await js.key_value(subjects.CONFIG_BUCKET)
            seen: set[PoolKey] = set()
            # not the compiler's records of last good files
            async for k, value in bus.kv_items(kv, subjects.is_pool_key):
                try:
                    pool = decode_pool(value)
                except msgspec.DecodeError as exc:
                    log.warning("unreadable compiled pool ignored", key=k, error=str(exc))
                    continue
                seen.add((pool.namespace, pool.name))
                self.set_pool((pool.namespace, pool.name), pool)
            for key in [k for k in self.pools if k not in seen]:
                self.set_pool(key, None)
            self.synced = True
        except BucketNotFoundError:
            self.synced = True
            log.info("no configuration yet")
        except Exception as exc:  # NATS went away mid-resync: resync_soon tries again
            failed = f"configuration: {bus.describe(exc)}"
        # telemetry is read whatever became of the configuration
        telemetry = await resync_telemetry(js, self.set_endpoint, self.set_provider, self.endpoints)
        failed = failed or telemetry
        for k in self.keepers.values():
            k.rebuild()
        return failed

    def resync_soon(self) -> None:
        """After a reconnect: :meth:`resync` until it reads (see :func:`resync_until_read`)."""
        self._resyncing = resync_again(self._resyncing, self.resync)


def resync_again(running: asyncio.Task[bool] | None,
                 resync: Callable[[], Awaitable[str | None]]) -> asyncio.Task[bool]:
    """A new :func:`resync_until_read` task in place of ``running`` (a
    reconnect while one runs starts over)."""
    if running is not None and not running.done():
        running.cancel()
    return asyncio.create_task(resync_until_read(resync), name="resync")


async def resync_until_read(resync: Callable[[], Awaitable[str | None]], *, first_wait: float = 0.5,
                            longest_wait: float = 5.0, give_up_after: float = 120.0) -> bool:
    """``resync()`` until it reads everything: right after a reconnect a
    cluster may still be electing the buckets' leaders (reads time out for a
    few seconds). Said once each way, as every change of state is: one
    ``resync_failed`` warning with the first error, one ``resynced`` with
    the attempts and seconds it took, or one ``resync_given_up`` after
    ``give_up_after`` (the subscriptions and the periodic configuration read
    keep the state current meanwhile; the next reconnect tries again)."""
    start = time.monotonic()
    wait = first_wait
    attempts = 0
    while True:
        attempts += 1
        failed = await resync()
        if failed is None:
            if attempts > 1:
                log.info("resynced", attempts=attempts, after_s=round(time.monotonic() - start, 1))
            return True
        if attempts == 1:
            log.warning("resync_failed", error=failed, retrying=True)
        if time.monotonic() - start >= give_up_after:
            log.warning("resync_given_up", attempts=attempts, error=failed)
            return False
        await asyncio.sleep(wait)
        wait = min(longest_wait, wait * 2)


async def resync_telemetry(js: Any, set_endpoint: Callable[[object], None],
                           set_provider: Callable[[object], None],
                           held: Mapping[str, EndpointState] | None = None) -> str | None:
    """Read every endpoint and provider state in the telemetry bucket into
    ``set_endpoint`` / ``set_provider`` (what a (re)connecting router does;
    a missing bucket is no telemetry yet); what failed, None when read. An endpoint state older than the one ``held``
    (the subscription, open first, brought a newer one: the collector writes
    a key at most once a second, but every change on its subject) is not
    taken."""
    def newer(st: Any) -> None:
        old = held.get(endpoint_key(st.namespace, st.worker_set, st.pod)) if held is not None else None
        if old is None or st.scraped_at >= old.scraped_at:
            set_endpoint(st)

    try:
        kv = await js.key_value(subjects.TELEMETRY_BUCKET)
        async for key, value in bus.kv_items(kv):
            if key.startswith("endpoint."):
                SnapshotKeeper._apply(value, _endpoint_decoder, newer)
            elif key.startswith("provider."):
                SnapshotKeeper._apply(value, _provider_decoder, set_provider)
    except BucketNotFoundError:
        pass
    except Exception as exc:
        return f"telemetry: {bus.describe(exc)}"
    return None


def record_endpoint(endpoints: dict[str, EndpointState], ledger: Any,
                    healthy: Callable[[str, float], None] | None, state: EndpointState) -> None:
    """Keep an endpoint's latest state; a scraped one tells the in-flight
    ledger what telemetry has seen, and a ready one may end an ejection."""
    key = endpoint_key(state.namespace, state.worker_set, state.pod)
    endpoints[key] = state
    if state.scraped_at:
        ledger.observed(key, state.scraped_at)
        if state.ready and healthy is not None:
            healthy(key, state.scraped_at)
