"""The collector: scrape loops, DCGM attachment, provider aggregation, publishing.

:class:`Collector` owns one HTTP client (:func:`.scrape.new_client`) and one task per
target. Each target's task scrapes, sleeps until its next slot, and
scrapes again, so scrapes of one target never overlap and a slow target
delays only itself. A target's slots sit at its own phase of the interval
(from a hash of its key), so a replica's scrapes are spread over the
interval instead of starting together: a thousand scrapes begun at once
queue their parses and publishes behind each other, and the last state
reaches the routers most of an interval late. Parsing and derivation are
the pure functions of :mod:`.promparse` and :mod:`.derive`; every failure of one target is caught in
its own task and counted against that target alone.

:func:`run_service` wires it to NATS and the HTTP server for ``__main__``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from dataclasses import dataclass, field

import msgspec
import structlog
from aiohttp import web

from kinference_common import subjects
from kinference_common.bus import close as close_nats
from kinference_common.bus import KEEPALIVE as NATS_KEEPALIVE
from kinference_common.bus import servers as nats_servers
from kinference_common.messages import EndpointState, Observation, ProviderKeyReport
from kinference_common.tasks import cancel_and_wait, unless_stopped
from kinference_common.upstream_http import UpstreamClient

from .derive import DeriveConfig, EndpointTracker, GpuStats, gpu_stats_by_pod, merge_gpu_stats
from .discovery import Discovery, Target
from .metrics import ENDPOINT_STATES, CollectorMetrics, http_app
from .promparse import VllmReader, parse_dcgm
from .providers import ProviderAggregator, ProviderConfig, ProviderKeyReports
from .publish import Bus, NatsBus, Publisher
from .scrape import ScrapeError, context_window, describe, fetch, new_client
from .shard import Membership as Shard
from .shard import default_replica_id

log = structlog.get_logger("kinference.collector")

#: seconds between two full parses of an endpoint's page (the others follow its
#: shape; a series the page gains is read from the next full parse)
FULL_PARSE_EVERY = 1.0
#: seconds between two whole rebuilds of the GPU index while exporters leave this
#: replica (an exporter's new stats update the index for its own pods only)
GPU_INDEX_EVERY = 0.1
#: an unchanged DCGM page's stats are shared with the other replicas every this
#: fraction of ``dcgm_stale_after`` (after which they drop an exporter's stats):
#: 30 s by default, so two shares can be lost before the stats age out. An
#: exporter collects every 30 s by default, and a changed page is shared at once,
#: which counts as a refresh: at every 10 s, most shares between four replicas
#: sharing 1,000 pods were the same stats again
GPU_SHARE_UNCHANGED_FRACTION = 1 / 3
#: the GPU stats a replica shares within this many seconds go out in one message
#: (each message wakes every other replica: one per exporter woke each of four
#: replicas sharing 125 exporters about ten times a second), cut in as many as
#: the server's largest message needs
GPU_SHARE_BATCH = 0.05


def phase(key: str, interval: float) -> float:
    """Where in each interval a target's slots fall: ``[0, interval)``, from a
    hash of its key (the same in every process and run)."""
    return zlib.crc32(key.encode()) / 2**32 * interval


def batch_phase(offset: float, interval: float, held: int, batch: int) -> float:
    """A target's phase (``offset``) rounded down to a grid of
    ``interval * batch / held``: the ``held`` targets of one kind a replica
    scrapes fall in slots of about ``batch`` each, so the replica wakes about
    ``held / batch`` times an interval rather than once per target. Each
    wake-up has a cost of its own beyond the scrape (the loop's return from
    ``epoll``, caches gone cold while idle), the larger the longer the pause
    before it: spreading 250 scrapes over 2.5 s cost a replica 1.4x the CPU per
    scrape of one spreading 1,000 (``make bench-scale``). Batches of 16 (the
    default; 12% less CPU per scrape than 8 for four replicas sharing 1,000
    pods, run side by side) keep what a slot's last scrape waits behind its
    first to a few milliseconds.
    A replica holding no more than ``batch`` targets scrapes them together.
    ``batch`` of 1 (or less) leaves every target at its own phase."""
    if batch <= 1 or held <= 1 or interval <= 0:
        return offset
    grain = min(interval, interval * batch / held)
    return math.floor(offset / grain) * grain


def next_slot(previous: float, now: float, interval: float, offset: float) -> float:
    """The time of a target's next scrape: the first of its slots
    (``offset + k * interval``) at least half an interval after ``previous``
    (the slot the last scrape was for; the first scrape's start) and not in
    the past. In the steady state that is exactly one interval after the last
    slot, also when the loop woke late for it; a scrape that ran past its next
    slot skips to the one after, as Prometheus does. An interval of 0
    (``make bench-collector``'s "as fast as it goes") is now, back to back."""
    if interval <= 0:
        return now
    earliest = max(previous + interval / 2, now)
    return offset + math.ceil((earliest - offset) / interval) * interval


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    #: seconds between the starts of two scrapes of one endpoint
    interval: float = 0.1
    #: per-scrape timeout (connect, headers and body)
    timeout: float = 0.5
    max_body_bytes: int = 8 << 20
    dcgm_interval: float = 1.0
    dcgm_timeout: float = 2.0
    #: GPU data older than this is dropped (DCGM collects every 30 s by default)
    dcgm_stale_after: float = 90.0
    discovery_interval: float = 1.0
    min_publish_interval: float = 1.0
    housekeeping_interval: float = 0.5
    #: targets of a kind scraped together at one wake-up (:func:`batch_phase`)
    scrape_batch: int = 16
    derive: DeriveConfig = field(default_factory=DeriveConfig)
    providers: ProviderConfig = field(default_factory=ProviderConfig)


@dataclass(slots=True)
class _Dcgm:
    target: Target
    last_success: float | None = None
    stats: dict[tuple[str, str], GpuStats] = field(default_factory=dict)
    errors: int = 0
    #: ``hash()`` of the last page parsed, and when its stats were last shared
    digest: int | None = None
    shared_at: float = float("-inf")


class _Remote:
    """Another replica's endpoint, as a status reads a tracker."""

    __slots__ = ("state", "stale_after", "last_success", "scrape_errors")

    def __init__(self, st: EndpointState, stale_after: float) -> None:
        self.state, self.stale_after = st, stale_after
        self.last_success = st.scraped_at or None
        self.scrape_errors = 0 if st.scraped_at else 1

    def ready(self, now: float) -> bool:
        return bool(self.state.ready and self.last_success is not None
                    and now - self.last_success <= self.stale_after)


_KEYS_PREFIX = subjects.PROVIDER_KEYS_PREFIX + "."


class Collector:
    """Scrapes, derives and offers states to a :class:`Publisher`."""

    def __init__(
        self,
        config: CollectorConfig,
        discovery: Discovery,
        publisher: Publisher,
        metrics: CollectorMetrics | None = None,
        clock: Callable[[], float] = time.time,
        shard: Shard | None = None,
    ) -> None:
        self.config = config
        self.discovery = discovery
        self.publisher = publisher
        #: the publisher's counts already added to the metrics
        self._counted: dict[str, int] = {}
        self.metrics = metrics or CollectorMetrics()
        self.providers = ProviderAggregator(config.providers)
        #: the routers' reports of provider keys they cannot read (for the providers' status)
        self.provider_keys = ProviderKeyReports()
        self._keys_decoder = msgspec.json.Decoder(ProviderKeyReport)
        self._clock = clock
        self.trackers: dict[tuple[str, str, str, str], EndpointTracker] = {}
        self._dcgm: dict[tuple[str, str, str, str], _Dcgm] = {}
        self._gpu_index: dict[tuple[str, str], GpuStats] = {}
        #: an exporter left this replica since the index was last built whole (at ``_gpu_built``)
        self._gpu_dirty = False
        self._gpu_built = float("-inf")
        #: when the oldest stats in the GPU index age out of it (the clock's time)
        self._gpu_expires = float("inf")
        #: what each exporter (by address) puts in the index, by pod: the index is
        #: updated for the pods of an exporter whose stats changed, not rebuilt
        self._gpu_sources: dict[tuple[str, str], dict[str, GpuStats]] = {}
        #: the pods each exporter (by address) has in the index
        self._gpu_pods_of: dict[str, set[tuple[str, str]]] = {}
        self._tasks: dict[tuple[str, str, str, str], asyncio.Task[None]] = {}
        #: one page in this many of an endpoint is parsed in full, the rest read from
        #: its shape (:class:`.promparse.VllmReader`): a full parse about once a second
        interval = config.interval
        self._full_every = max(1, round(FULL_PARSE_EVERY / interval)) if interval > 0 else 10
        #: targets held per kind ("vllm", "dcgm"): the grid of their slots (:func:`batch_phase`)
        self._held: dict[str, int] = {}
        self._aux: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._http: UpstreamClient | None = None
        self._stop = asyncio.Event()
        self._obs_decoder = msgspec.json.Decoder(Observation)
        self.scrapes = 0
        self.running = False
        #: several replicas share the fleet (:mod:`.shard`); None = this one scrapes everything
        self.shard = shard
        self._discovered: list[Target] = []
        #: the replicas the targets were last shared among (None: never applied)
        self._applied_members: tuple[str, ...] | None = None
        #: DCGM exporters another replica scrapes: their GPU stats as it shared them
        self._remote_gpu: dict[str, tuple[float, dict[tuple[str, str], GpuStats]]] = {}
        #: set by the service: shares one DCGM exporter's GPU stats with the other replicas
        self.share_gpu: Callable[[str, dict[tuple[str, str], GpuStats]], None] | None = None
        self.handed_off = 0
        self._remote_states: dict[tuple[str, str, str, str], EndpointState] = {}
        #: follows the other replicas' states while this replica leads (Kubernetes statuses)
        self.state_follower: StateFollower | None = None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._http = new_client()
        self._stop.clear()
        self.running = True
        await self.refresh_targets()
        self._background = [
            asyncio.create_task(self._discovery_loop(), name="collector-discovery"),
            asyncio.create_task(self._housekeeping_loop(), name="collector-housekeeping"),
            asyncio.create_task(self.publisher.run(self._stop), name="collector-publisher"),
        ]
        log.info("collector_started", targets=len(self._tasks), interval=self.config.interval)

    async def stop(self, flush_timeout: float = 2.0) -> None:
        """Stop scraping, send what is pending (bounded), close the client."""
        if not self.running:
            return
        self.running = False
        self._stop.set()
        tasks = [*self._tasks.values(), *self._aux, *self._background]
        await cancel_and_wait(*tasks)
        self._tasks.clear()
        self._applied_members = None  # started again, the targets are applied again
        self._dcgm.clear()  # (and the exporters held again; their stats leave the index meanwhile)
        self._gpu_dirty = True
        self._aux.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(flush_timeout):
                await self.publisher.flush()  # and the KV writes the flusher left in flight
        self.publisher.cancel_stores()
        if self._http is not None:
            await self._http.close()
            self._http = None
        log.info("collector_stopped")

    # ------------------------------------------------------------ discovery

    async def refresh_targets(self) -> None:
        try:
            targets = await self.discovery.endpoints()
        except Exception as exc:  # keep the current targets
            log.warning("discovery_failed", error=describe(exc))
            return
        # the same targets among the same replicas: nothing to do (a replica's share of a
        # fleet of thousands costs a millisecond to work out, and this runs every second)
        if targets == self._discovered and self._members() == self._applied_members:
            return
        self.apply_targets(targets)

    def _members(self) -> tuple[str, ...]:
        return tuple(self.shard.members) if self.shard is not None else ()

    def reassign(self) -> None:
        """The replicas changed: take this replica's share of the last discovered
        targets, and share every exporter's stats it holds again now (a replica
        that just joined has none of the others' yet, and would publish its
        pods without them until their next scrape)."""
        if self.running:
            self.apply_targets(self._discovered)
        if self.share_gpu is not None:
            now = self._clock()
            for d in self._dcgm.values():
                if d.last_success is not None and d.stats:
                    d.shared_at = now
                    self.share_gpu(d.target.address, d.stats)

    def apply_targets(self, targets: list[Target]) -> None:
        """Start tasks for new targets, stop removed ones, update changed ones.
        With a shard, only this replica's share is scraped; a target now owned
        by another replica is dropped without a word on the bus (its new owner
        publishes it), one gone from discovery is published as removed."""
        self._discovered = list(targets)
        self._applied_members = None  # until applied in full (a raise below: the next refresh tries again)
        if self.shard is not None:
            discovered = {t.key for t in targets}
            targets = self.shard.share(targets)
        wanted = {t.key: t for t in targets}
        held = {"vllm": 0, "dcgm": 0}
        for t in targets:
            held["dcgm" if t.kind == "dcgm" else "vllm"] += 1
        self._held = held
        now = self._clock()
        for key in list(self._tasks):
            if key not in wanted and self.shard is not None and key in discovered:
                self._tasks.pop(key).cancel()
                tr = self.trackers.pop(key, None)
                if tr is not None:
                    t = tr.target
                    self.publisher.forget(subjects.endpoint_key(t.namespace, t.worker_set, t.pod))
                self._release_dcgm(key)
                self.handed_off += 1
                continue
            if key not in wanted:
                self._tasks.pop(key).cancel()
                tr = self.trackers.pop(key, None)
                if tr is not None:
                    self.publisher.remove_endpoint(tr.state(now))
                    log.info("endpoint_removed", pod=tr.target.pod, namespace=tr.target.namespace)
                self._release_dcgm(key)
        for key, t in wanted.items():
            if t.kind == "dcgm":
                if key not in self._tasks:
                    d = self._hold_dcgm(t)
                    self._tasks[key] = asyncio.create_task(
                        self._on_slots(t, "dcgm", self.config.dcgm_interval, lambda d=d: self.scrape_dcgm(d)),
                        name=f"dcgm {t.address}")
                continue
            tr = self.trackers.get(key)
            if tr is not None and tr.target.address == t.address:
                if tr.target != t:  # readiness or model changed: no new scrape state
                    tr.target = t
                    self.emit(tr, now)  # now, not at the next scrape
                continue
            if key in self._tasks:
                self._tasks.pop(key).cancel()
            tr = self.trackers[key] = EndpointTracker(t, self.config.derive, VllmReader(self._full_every))
            self._tasks[key] = asyncio.create_task(
                self._on_slots(t, "vllm", self.config.interval, lambda tr=tr: self.scrape_endpoint(tr)),
                name=f"scrape {t.pod}")
            log.info("endpoint_added", pod=t.pod, namespace=t.namespace, address=t.address)
        self._applied_members = self._members()

    def _hold_dcgm(self, t: Target) -> _Dcgm:
        """This replica scrapes the exporter ``t`` from now on: until its first
        scrape, another replica's copy of its stats no longer counts (as in a
        whole rebuild of the GPU index, which the next emit makes)."""
        d = self._dcgm[t.key] = _Dcgm(t)
        if t.address in self._gpu_pods_of:
            self._gpu_dirty = True
        return d

    def _release_dcgm(self, key: tuple[str, str, str, str]) -> None:
        """This replica no longer scrapes the exporter ``key``: its stats leave
        the GPU index (another replica's copy takes over) at the next rebuild."""
        if self._dcgm.pop(key, None) is not None:
            self._gpu_dirty = True

    async def _discovery_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.discovery_interval)
            await self.refresh_targets()

    # ------------------------------------------------------------- scraping

    async def _on_slots(self, target: Target, kind: str, interval: float,
                        scrape: Callable[[], Awaitable[None]]) -> None:
        """``scrape`` now, then at each of the target's slots (its phase of the
        interval, on the grid of its kind's batches, which moves with the
        number of targets this replica holds)."""
        loop = asyncio.get_running_loop()
        own = phase("/".join(target.key), interval)
        batch = self.config.scrape_batch
        slot = loop.time()
        while True:
            await scrape()
            offset = batch_phase(own, interval, self._held.get(kind, 0), batch)
            slot = next_slot(slot, loop.time(), interval, offset)
            await asyncio.sleep(max(0.0, slot - loop.time()))

    async def scrape_endpoint(self, tr: EndpointTracker) -> None:
        """One scrape of one endpoint: fetch, parse, derive, offer. Never raises."""
        assert self._http is not None
        t0 = time.perf_counter()
        try:
            body = await fetch(self._http, tr.target.base_url + "/metrics",
                               self.config.timeout, self.config.max_body_bytes)
            sample = tr.reader.parse(body)
            if not sample.looks_like_vllm:
                raise ScrapeError("no vLLM metrics on the page")
            tr.observe(sample, self._clock())
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            tr.fail(describe(exc), self._clock())
            self.metrics.scrape_errors_vllm.inc()
            if tr.scrape_errors == 1:
                log.warning("scrape_failed", pod=tr.target.pod, namespace=tr.target.namespace,
                            error=tr.last_error)
        self.scrapes += 1
        self.metrics.scrape_seconds_vllm.observe(time.perf_counter() - t0)
        now = self._clock()
        if tr.last_success is not None and now >= tr.models_due:
            tr.models_due = float("inf")  # one fetch at a time
            task = asyncio.create_task(self._fetch_models(tr))
            self._aux.add(task)
            task.add_done_callback(self._aux.discard)
        self.emit(tr, now)

    def emit(self, tr: EndpointTracker, now: float) -> None:
        t = tr.target
        if self._gpu_dirty:
            self._gpu_changed()
        self.publisher.offer_endpoint(tr.state(now, self._gpu_index.get((t.namespace, t.pod))))

    async def _fetch_models(self, tr: EndpointTracker) -> None:
        assert self._http is not None
        cw: int | None = None
        try:
            body = await fetch(self._http, tr.target.base_url + "/v1/models",
                               max(self.config.timeout, 1.0), 1 << 20)
            cw = context_window(body, tr.target.model)
        except ScrapeError:
            pass
        tr.set_context_window(cw, self._clock())

    async def scrape_dcgm(self, d: _Dcgm) -> None:
        assert self._http is not None
        t0 = time.perf_counter()
        fresh = False  # new stats were read
        try:
            body = await fetch(self._http, d.target.base_url + "/metrics",
                               self.config.dcgm_timeout, self.config.max_body_bytes)
            now = self._clock()
            # the exporter serves its last collection until the next one (every
            # 30 s by default): a page the same as the last one parsed, while
            # that one is in the index, is not parsed again
            digest = hash(body)
            changed = not (digest == d.digest and d.last_success is not None
                           and now - d.last_success <= self.config.dcgm_stale_after)
            if changed:
                gpus = parse_dcgm(body)
                if not gpus:
                    raise ScrapeError("no DCGM metrics on the page")
                d.stats, d.digest, fresh = gpu_stats_by_pod(gpus), digest, True
            else:
                self.metrics.dcgm_unchanged.inc()
            d.last_success = now
            d.errors = 0
            refresh = self.config.dcgm_stale_after * GPU_SHARE_UNCHANGED_FRACTION
            if self.share_gpu is not None and (changed or now - d.shared_at >= refresh):
                d.shared_at = now
                self.share_gpu(d.target.address, d.stats)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            d.errors += 1
            self.metrics.scrape_errors_dcgm.inc()
            if d.errors == 1:
                log.warning("dcgm_scrape_failed", address=d.target.address, error=describe(exc))
        self.metrics.scrape_seconds_dcgm.observe(time.perf_counter() - t0)
        if fresh:
            self._gpu_update(d.target.address, d.stats, d.last_success or self._clock())

    def _gpu_changed(self) -> None:
        """Exporters left this replica: rebuild the index, at most every
        ``GPU_INDEX_EVERY`` seconds; what arrives in between is taken in by
        the next scrape's :meth:`emit` after that. (Rebuilding it at every
        exporter's update made the collector's cost grow with the square of
        the exporters: 1,250 exporters of 8 GPUs, 10,000 pods, would be 12
        million merges a second; an update now touches its own pods.)"""
        if time.monotonic() - self._gpu_built >= GPU_INDEX_EVERY:
            self._rebuild_gpu_index()
        else:
            self._gpu_dirty = True

    def _gpu_update(self, address: str, new: Mapping[tuple[str, str], GpuStats], at: float) -> None:
        """The exporter at ``address`` reported ``new`` (read at ``at``): the
        index entries of its pods, those it reported and those it reports,
        only (a pod's entry merges every exporter that reports it, which
        should be one)."""
        sources = self._gpu_sources
        old = self._gpu_pods_of.get(address, set())
        for key in old:
            if key not in new and key in sources:
                sources[key].pop(address, None)
        for key, st in new.items():
            sources.setdefault(key, {})[address] = st
        self._gpu_pods_of[address] = set(new)
        self._gpu_expires = min(self._gpu_expires, at + self.config.dcgm_stale_after)
        for key in {*old, *new}:
            self._gpu_merge(key)

    def _gpu_merge(self, key: tuple[str, str]) -> None:
        by_address = self._gpu_sources.get(key)
        if not by_address:
            self._gpu_sources.pop(key, None)
            self._gpu_index.pop(key, None)
            return
        stats = iter(by_address.values())
        merged = next(stats)
        for st in stats:
            merged = merge_gpu_stats(merged, st)
        self._gpu_index[key] = merged

    def _rebuild_gpu_index(self) -> None:
        """The index from every exporter's stats that have not aged out: when
        the oldest age out, and after an exporter left this replica."""
        self._gpu_dirty, self._gpu_built = False, time.monotonic()
        sources, oldest = self.gpu_sources_now(self._clock())
        self._gpu_sources, self._gpu_index, self._gpu_pods_of = sources, {}, {}
        for key, by_address in sources.items():
            self._gpu_merge(key)
            for address in by_address:
                self._gpu_pods_of.setdefault(address, set()).add(key)
        self._gpu_expires = oldest + self.config.dcgm_stale_after

    def gpu_sources_now(self, now: float) -> tuple[dict[tuple[str, str], dict[str, GpuStats]], float]:
        """Every exporter's stats that have not aged out by ``now``, by pod and
        exporter (this replica's own scrape of an exporter before another's
        copy), and when the oldest of them was read."""
        sources: dict[tuple[str, str], dict[str, GpuStats]] = {}
        held = [(d.target.address, d.last_success, d.stats) for d in self._dcgm.values()]
        held.extend((addr, at, stats) for addr, (at, stats) in self._remote_gpu.items()
                    if not self._scrapes_dcgm(addr))
        oldest = float("inf")
        for address, last_success, stats in held:
            if last_success is None or now - last_success > self.config.dcgm_stale_after:
                continue
            oldest = min(oldest, last_success)
            for key, st in stats.items():
                sources.setdefault(key, {})[address] = st
        return sources, oldest

    def _scrapes_dcgm(self, address: str) -> bool:
        return Target(kind="dcgm", address=address).key in self._dcgm

    def on_remote_endpoint(self, st: EndpointState) -> None:
        """An endpoint state on the bus (this replica's or another's): the
        leader's status of pods it does not scrape itself comes from these."""
        self._remote_states[("vllm", st.namespace, st.worker_set, st.pod)] = st

    def forget_remote_states(self) -> None:
        """No longer the leader: the other replicas' states are not followed."""
        self._remote_states.clear()

    def status_view_complete(self) -> bool:
        """Statuses may be written: this replica alone scrapes the fleet, or it
        has followed every other replica's states for a republish interval."""
        if self.shard is None or len(self.shard.members) == 1:
            return True
        return self.state_follower is not None and self.state_follower.complete()

    def status_trackers(self) -> Mapping[tuple[str, str, str, str], Any]:
        """What :mod:`.kube_status` reads per target: this replica's trackers,
        and for the other replicas' share their last published states."""
        if self.shard is None or len(self.shard.members) == 1:
            return self.trackers
        out: dict[tuple[str, str, str, str], Any] = {
            k: _Remote(st, self.config.derive.stale_after) for k, st in self._remote_states.items()}
        out.update(self.trackers)
        return out

    def on_remote_gpu(self, address: str, stats: dict[tuple[str, str], GpuStats]) -> None:
        """Another replica scraped the DCGM exporter at ``address``. The same
        stats again (sent every ``GPU_SHARE_UNCHANGED_FRACTION`` of ``dcgm_stale_after`` while the exporter
        has not collected) only keep them fresh: the index is updated when they
        changed, or had aged out of it."""
        now = self._clock()
        held = self._remote_gpu.get(address)
        self._remote_gpu[address] = (now, stats)
        if self._scrapes_dcgm(address):  # scraped here too (a hand-off): its own stats count
            return
        if held is None or held[1] != stats or now - held[0] > self.config.dcgm_stale_after:
            self._gpu_update(address, stats, now)

    # ------------------------------------------------------------ providers

    @property
    def leader(self) -> bool:
        """This replica publishes provider states and writes statuses (every replica aggregates)."""
        return self.shard is None or self.shard.leader

    def on_observation(self, data: bytes) -> None:
        """One message of ``kinference.observations.>``; bad ones are counted and dropped."""
        try:
            obs = self._obs_decoder.decode(data)
        except msgspec.DecodeError:
            self.metrics.observations.labels("invalid").inc()
            return
        self.metrics.observations.labels("ok").inc()
        now = self._clock()
        key = self.providers.observe(obs, now)
        if key is not None and self.leader:
            self.publisher.offer_provider(self.providers.state(key, now))

    def on_routers_message(self, subject: str, data: bytes) -> None:
        """One message of ``kinference.observations.>``: a router's key report or an observation."""
        if subject.startswith(_KEYS_PREFIX):
            self.on_key_report(data)
        else:
            self.on_observation(data)

    def on_key_report(self, data: bytes) -> None:
        """One router's ``kinference.observations._keys.<router>`` report; bad ones are counted and dropped."""
        try:
            report = self._keys_decoder.decode(data)
        except msgspec.DecodeError:
            self.metrics.observations.labels("invalid").inc()
            return
        self.provider_keys.receive(report, self._clock())

    # ---------------------------------------------------------- housekeeping

    def housekeeping(self) -> None:
        """Provider windows slide and endpoint counts move even with no new data."""
        now = self._clock()
        self.providers.prune(now)
        self.provider_keys.prune(now)
        if self.leader:
            for key in self.providers.keys():
                self.publisher.offer_provider(self.providers.state(key, now))
        # stats that aged out leave the index, and exporters that left (those that change
        # or come back update it as they arrive): not a rebuild of every exporter's stats
        # at every round
        if self._gpu_dirty or now >= self._gpu_expires:
            self._rebuild_gpu_index()
        # readiness turns false on time even when a target's scrapes are slower
        # than the staleness bound (unchanged states are not re-sent); a target
        # not scraped even once yet (just taken over from another replica) waits
        # for its first scrape rather than say "not ready". A target scraped
        # lately was offered by that scrape and reads the same now (its age is
        # under the staleness bound): only the late and the failing are offered
        # again (at 1,000 pods that is 2,000 states a second fewer to build)
        late = min(2 * self.config.interval, self.config.derive.stale_after / 2)
        for tr in self.trackers.values():
            if tr.scrape_errors or (tr.last_success is not None and now - tr.last_success > late):
                self.emit(tr, now)
        self.update_gauges()

    def update_gauges(self) -> None:
        """``kinference_endpoints{state}`` from the trackers, now; the publish
        counters up to the publisher's counts."""
        pub, m = self.publisher, self.metrics
        for kind, n in pub.sent_by_kind.items():
            m.published.labels(kind).inc(n - self._counted.get(kind, 0))
            self._counted[kind] = n
        m.kv_writes.inc(pub.stored - self._counted.get("stored", 0))
        self._counted["stored"] = pub.stored
        if self.shard is not None:
            m.members.set(len(self.shard.members))
            for cause, n in self.shard.dropped.items():
                m.members_dropped.labels(cause).inc(n - self._counted.get(f"dropped:{cause}", 0))
                self._counted[f"dropped:{cause}"] = n
        else:
            m.members.set(1)
        now = self._clock()
        counts = dict.fromkeys(ENDPOINT_STATES, 0)
        for tr in self.trackers.values():
            counts[tr.health(now)] += 1
        for s, n in counts.items():
            self.metrics.endpoints.labels(s).set(n)

    async def _housekeeping_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.housekeeping_interval)
            try:
                self.housekeeping()
            except Exception:  # pragma: no cover - a bug; keep the collector alive
                log.exception("housekeeping_failed")


# --------------------------------------------------------------- the service


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    nats_url: str = "nats://127.0.0.1:4222"
    http_host: str = "0.0.0.0"
    #: 0 = no HTTP server
    http_port: int = 9090
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    #: credentials and TLS (:func:`kinference_common.natsauth.connect_options`)
    nats_options: dict = field(default_factory=dict)
    #: this replica's name among the collectors sharing the fleet (default: pod name, else host-pid)
    replica_id: str = ""
    #: seconds between heartbeats; a replica silent for ``member_ttl`` is dead (:mod:`.shard`)
    heartbeat: float = 0.5
    member_ttl: float = 1.5
    #: probes in a row a connected replica leaves unanswered before it is taken for dead (0: never)
    probe_misses: int = 2
    #: replicas of the buckets this service creates (3 on a three-server NATS cluster)
    kv_replicas: int = 1


class NatsLog:
    """What the collector says about its NATS connection: one line per state
    change (disconnected, reconnected, a kind of error not yet said), and while NATS stays
    away one summary every ``summary_every`` seconds, not one line per retry
    (the client retries twice a second)."""

    def __init__(self, url: str, summary_every: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.summary_every = summary_every
        self._clock = clock
        self.down_since: float | None = None
        #: the kinds of error said since the last reconnect: each is said once per outage,
        #: even when they alternate (refused, then a handshake cut while the server starts)
        self._said: set[str] = set()
        self._errors = 0
        self._last_summary = 0.0

    def error(self, exc: Exception) -> None:
        now = self._clock()
        what = describe(exc)
        self._errors += 1
        if what not in self._said:
            self._said.add(what)
            log.warning("nats_error", url=self.url, error=what)
        elif self.down_since is not None and now - self._last_summary >= self.summary_every:
            self._last_summary = now
            log.warning("nats_still_unavailable", url=self.url, down_seconds=round(now - self.down_since, 1),
                        errors=self._errors, error=what)

    def disconnected(self) -> None:
        if self.down_since is None:
            self.down_since = self._last_summary = self._clock()
            self._errors = 0
            log.warning("nats_disconnected", url=self.url)

    def reconnected(self) -> None:
        down = None if self.down_since is None else round(self._clock() - self.down_since, 1)
        self.down_since = None
        self._said.clear()
        log.info("nats_reconnected", url=self.url, down_seconds=down, errors=self._errors)


async def connect_nats(url: str, stop: asyncio.Event, options: dict | None = None,
                       on_reconnect: Callable[[], None] | None = None) -> object | None:
    """Connect (retrying until ``stop``); reconnects forever once connected.

    A NATS that cannot be reached (or refuses for now) is retried; a
    malformed ``url`` (:class:`~kinference_common.bus.NatsUrlError`) or
    options the client refuses (``TypeError``, ``ValueError``) raise at
    once, so that the process exits and a pod crash-loops visibly instead
    of serving /healthz without ever connecting."""
    import nats

    pool = nats_servers(url)  # raises NatsUrlError, naming the entry at fault
    state = NatsLog(url)

    async def on_error(exc: Exception) -> None:
        state.error(exc)

    async def on_disconnected() -> None:
        state.disconnected()

    async def on_reconnected() -> None:
        state.reconnected()
        if on_reconnect is not None:
            on_reconnect()

    delay = 0.5
    failures = 0
    while not stop.is_set():
        # the client itself retries an unreachable server for as long as it may
        # reconnect (forever): a stop (SIGTERM) must not wait for it
        connecting = await unless_stopped(nats.connect(
            pool, name="kinference-telemetry-collector", max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, connect_timeout=2, error_cb=on_error,
            disconnected_cb=on_disconnected, reconnected_cb=on_reconnected,
            **{**NATS_KEEPALIVE, **(options or {})},
        ), stop)
        if connecting is None:
            return None
        try:
            return connecting.result()
        except (TypeError, ValueError):  # options the client refuses: no retry makes them right
            raise
        except Exception as exc:  # unreachable, restarting, refusing for now: retried
            failures += 1
            if failures == 1 or failures % 10 == 0:  # once, then a summary every ~50 s
                log.warning("nats_connect_failed", url=url, error=describe(exc), attempts=failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            delay = min(delay * 2, 5.0)
    return None


_gpu_enc = msgspec.json.Encoder()


_GpuPods = list[tuple[str, str, float | None, float | None, int | None, int]]


class _GpuShare(msgspec.Struct, array_like=True):
    """One exporter's stats, the only form replicas before 2026-12-06 read and
    send: still read, and sent while such a replica is a member (its beat has
    no ``gpu_shares``), so that a rolling upgrade loses no share either way."""
    replica: str
    address: str
    #: (namespace, pod, utilization, memory usage, xid, gpus)
    pods: _GpuPods


class _GpuShares(msgspec.Struct, array_like=True):
    """The stats of the exporters a replica scraped within ``GPU_SHARE_BATCH``."""
    replica: str
    #: (exporter address, its pods as in :class:`_GpuShare`)
    exporters: list[tuple[str, _GpuPods]]


def _gpu_pods(stats: Mapping[tuple[str, str], GpuStats]) -> _GpuPods:
    return [(ns, pod, g.utilization, g.memory_usage, g.xid_error, g.gpus) for (ns, pod), g in stats.items()]


def gpu_share_messages(me: str, batch: list[tuple[str, _GpuPods]], batched: bool, limit: int) -> list[bytes]:
    """The messages that carry ``batch`` (exporter address, its pods): one for
    all, halved until each fits in ``limit`` bytes, or with ``batched`` False
    (a member reads one exporter a message) one per exporter. An exporter
    whose own stats exceed ``limit`` is left out (:class:`GpuShareTooLarge`
    says which, once the others are sent)."""
    out: list[bytes] = []
    big: list[str] = []
    if not batched:
        for address, pods in batch:
            data = _gpu_enc.encode(_GpuShare(me, address, pods))
            if len(data) <= limit:
                out.append(data)
            else:
                big.append(address)
        if big:
            raise GpuShareTooLarge(out, big, limit)
        return out
    data = _gpu_enc.encode(_GpuShares(me, batch))
    if len(data) <= limit:
        return [data]
    if len(batch) == 1:
        raise GpuShareTooLarge([], [batch[0][0]], limit)
    half = len(batch) // 2
    for part in (batch[:half], batch[half:]):
        try:
            out.extend(gpu_share_messages(me, part, batched, limit))
        except GpuShareTooLarge as exc:
            out.extend(exc.sendable)
            big.extend(exc.exporters)
    if big:
        raise GpuShareTooLarge(out, big, limit)
    return out


class GpuShareTooLarge(Exception):
    """Exporters whose stats alone exceed the server's largest message."""

    def __init__(self, sendable: list[bytes], exporters: list[str], limit: int) -> None:
        super().__init__(f"the GPU stats of {len(exporters)} exporter(s) ({', '.join(exporters[:3])}"
                         f"{', ...' if len(exporters) > 3 else ''}) exceed the NATS server's max_payload "
                         f"({limit} bytes): not shared with the other replicas")
        self.sendable, self.exporters = sendable, exporters


async def share_between_replicas(nc: Any, collector: Collector, *, status: bool) -> list[Any]:
    """Wire a sharded collector to the others: GPU stats of the DCGM exporters
    each replica scrapes go to every replica (an engine pod and its node's
    exporter may belong to different replicas), those it reads within
    :data:`GPU_SHARE_BATCH` in one message (one per exporter while a member
    of a version before reads no other form), and with ``status`` (the
    leader writes the Kubernetes statuses) every endpoint state is followed
    while this replica leads (:class:`StateFollower`)."""
    assert collector.shard is not None
    shard = collector.shard
    me = shard.id
    dec, dec_one = msgspec.json.Decoder(_GpuShares), msgspec.json.Decoder(_GpuShare)
    loop = asyncio.get_running_loop()
    sending: set[asyncio.Task[None]] = set()
    waiting: dict[str, dict[tuple[str, str], GpuStats]] = {}
    flush_at: list[asyncio.TimerHandle] = []
    failing = [False]  # a failed share is logged once until one goes out again

    def failed(error: str) -> None:
        if not failing[0]:
            failing[0] = True
            log.warning("gpu_share_failed", error=error[:300])

    def sent(t: asyncio.Task[None]) -> None:
        sending.discard(t)
        if t.cancelled():
            return
        exc = t.exception()
        if exc is not None:
            failed(f"{type(exc).__name__}: {exc}")
        elif failing[0]:
            failing[0] = False
            log.info("gpu_share_recovered")

    def flush() -> None:
        flush_at.clear()
        batch = [(address, _gpu_pods(stats)) for address, stats in waiting.items()]
        waiting.clear()
        # the server's largest message, less room for the protocol's header
        limit = max(1024, int(getattr(nc, "max_payload", 0) or 1 << 20) - 512)
        try:
            messages = gpu_share_messages(me, batch, shard.batched_gpu_shares(), limit)
        except GpuShareTooLarge as exc:
            messages = exc.sendable
            failed(str(exc))
        for data in messages:
            t = asyncio.create_task(nc.publish(subjects.COLLECTOR_GPU_SUBJECT, data))
            sending.add(t)
            t.add_done_callback(sent)

    def share(address: str, stats: dict[tuple[str, str], GpuStats]) -> None:
        if len(shard.members) == 1:
            return
        waiting[address] = stats
        if not flush_at:
            flush_at.append(loop.call_later(GPU_SHARE_BATCH, flush))

    def take(address: str, pods: _GpuPods) -> None:
        collector.on_remote_gpu(address, {(ns, pod): GpuStats(u, mem, x, n) for ns, pod, u, mem, x, n in pods})

    async def on_gpu(msg: Any) -> None:
        try:
            m = dec.decode(msg.data)
        except msgspec.DecodeError:
            try:
                one = dec_one.decode(msg.data)
            except msgspec.DecodeError:
                return
            if one.replica != me:
                take(one.address, one.pods)
            return
        if m.replica != me:
            for address, pods in m.exporters:
                take(address, pods)

    collector.share_gpu = share
    subs: list[Any] = [await nc.subscribe(subjects.COLLECTOR_GPU_SUBJECT, cb=on_gpu)]
    if status:
        follower = collector.state_follower = StateFollower(nc, collector)
        follower.start()
        subs.append(follower)
    return subs


class StateFollower:
    """Every endpoint state of the fleet, followed while this replica leads
    (the leader writes the statuses, of the pods the others scrape too, from
    them) and among other replicas: each following every state cost every
    replica a decode per state of the fleet (10,000 a second at 1,000 pods
    and 100 ms, 100,000 at 10,000). A new leader writes no status until it
    has followed for a republish interval (every state is sent at least that
    often), so it never writes from half a fleet. It acts when the shard
    says its members or this replica's readiness changed
    (:meth:`.shard.Membership.on_leadership`), not on a timer; a subscription
    that failed (NATS away) is tried again every ``retry_every`` seconds.
    ``unsubscribe()`` stops it, as :func:`run_service` stops the other
    subscriptions."""

    def __init__(self, nc: Any, collector: Collector, retry_every: float = 0.5) -> None:
        self._nc, self.collector, self.retry_every = nc, collector, retry_every
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._changed.set()  # the first check: this replica may lead already
        if collector.shard is not None:
            collector.shard.on_leadership(self._changed.set)
        self._dec = msgspec.json.Decoder(EndpointState)
        #: when the subscription began (loop time); None while not following
        self.since: float | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="collector-state-follower")

    def wanted(self) -> bool:
        shard = self.collector.shard
        return shard is not None and shard.leader and len(shard.members) > 1

    def complete(self) -> bool:
        """It has followed every replica's states for a republish interval (and
        half a second more for the last ones in flight)."""
        return self.since is not None and asyncio.get_running_loop().time() - self.since >= \
            self.collector.config.min_publish_interval + 0.5

    async def _on_state(self, msg: Any) -> None:
        with contextlib.suppress(msgspec.DecodeError):
            self.collector.on_remote_endpoint(self._dec.decode(msg.data))

    async def _run(self) -> None:
        failing = False
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.check()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away: tried again shortly (said once)
                if not failing:
                    log.warning("state_follow_failed", error=describe(exc))
                failing = True
                self._changed.set()
                await asyncio.sleep(self.retry_every)

    async def check(self) -> None:
        """Follow, or stop following, as this replica's leadership says."""
        if self.wanted() and self._sub is None:
            self._sub = await self._nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=self._on_state)
            self.since = asyncio.get_running_loop().time()
            log.info("following_endpoint_states", why="this replica leads: it writes the statuses")
        elif not self.wanted() and self._sub is not None:
            sub, self._sub, self.since = self._sub, None, None
            self.collector.forget_remote_states()
            await sub.unsubscribe()
            log.info("endpoint_states_no_longer_followed", why="another replica leads")

    async def unsubscribe(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
        if self._sub is not None:
            sub, self._sub, self.since = self._sub, None, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def run_service(config: ServiceConfig, discovery: Discovery,
                      stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); then drain and close everything."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    metrics = CollectorMetrics()
    collector: Collector | None = None
    runner: web.AppRunner | None = None
    if config.http_port:
        runner = web.AppRunner(
            http_app(metrics, lambda: collector is not None and collector.running,
                     before_render=lambda: collector.update_gauges() if collector is not None else None),
            access_log=None,
        )
        await runner.setup()
        await web.TCPSite(runner, config.http_host, config.http_port).start()
        log.info("http_listening", host=config.http_host, port=config.http_port)
    reopen: list[Callable[[], None]] = []
    nc = await connect_nats(config.nats_url, stop, config.nats_options, on_reconnect=lambda: [f() for f in reopen])
    if nc is None:
        if runner is not None:
            await runner.cleanup()
        return 0
    bus: Bus = NatsBus(nc, replicas=config.kv_replicas)
    reopen.append(bus.reopen)  # type: ignore[attr-defined]  # the server may have lost the bucket
    try:
        await bus.start()  # type: ignore[attr-defined]
    except Exception as exc:
        log.warning("kv_bucket_unavailable", error=describe(exc))  # retried on the first put
    publisher = Publisher(bus, config.collector.min_publish_interval)
    # a dead replica's share is taken within a probe or two (``probe_misses`` where NATS
    # still holds its connection): one probe a scrape interval
    shard = Shard(nc, config.replica_id or default_replica_id(), heartbeat=config.heartbeat,
                  ttl=config.member_ttl, replicas=config.kv_replicas, probe_every=config.collector.interval,
                  probe_misses=config.probe_misses)
    collector = Collector(config.collector, discovery, publisher, metrics, shard=shard)
    shard.on_change(collector.reassign)
    subs = [*await share_between_replicas(nc, collector, status=hasattr(discovery, "attach"))]

    async def on_msg(msg: object) -> None:
        collector.on_routers_message(msg.subject, msg.data)  # type: ignore[attr-defined, union-attr]

    sub = await nc.subscribe(f"{subjects.OBSERVATIONS_PREFIX}.>", cb=on_msg)  # type: ignore[attr-defined]
    await shard.start()  # the first view of the replicas before the first targets
    await collector.start()
    # a discovery with watches of its own (Kubernetes) runs beside the collector
    attach = getattr(discovery, "attach", None)
    attached = asyncio.create_task(attach(collector), name="discovery") if attach is not None else None

    async def ready() -> None:
        """Count among the replicas sharing the fleet once this one scrapes:
        the others keep its share until then (their view lacks it), so a
        replica starting, or waiting on an API server, leaves nothing unscraped."""
        wait_synced = getattr(discovery, "wait_synced", None)
        if wait_synced is not None:
            await wait_synced()
            await collector.refresh_targets()
        await shard.set_ready()

    becoming_ready = asyncio.create_task(ready(), name="collector-ready")
    try:
        await stop.wait()
        log.info("draining")
    finally:
        await cancel_and_wait(becoming_ready)
        if attached is not None:
            await cancel_and_wait(attached)
        # leave first and scrape one more heartbeat, so the others take over with no gap
        await shard.stop()
        if len(shard.members) > 1:
            await asyncio.sleep(config.heartbeat + 0.1)
        for s in (sub, *subs):
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        await collector.stop()
        # bounded: a drain (even a cancelled one) can outlast wait_for by its 10 s flush
        await close_nats(nc)  # type: ignore[arg-type]
        if runner is not None:
            await runner.cleanup()
    return 0
