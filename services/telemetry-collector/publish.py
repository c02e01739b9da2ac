"""Publishing state: what changed at once, everything at a minimum rate.

Each endpoint and provider state goes to its subject (live updates) and to
its key in the ``kinference-telemetry`` KV bucket (so a starting router builds
its snapshot from KV, then stays current from the subjects). A state is sent
when it differs from the last one sent (ignoring ``scrapedAt``/``updatedAt``,
which move on every scrape) or when ``min_interval`` has passed since, so a
consumer can also tell a quiet endpoint from a dead collector.

Every send goes on the subject; the KV key is written at most once per
``min_interval`` (and at once when an endpoint's readiness changes): a pod
scraped every 100 ms whose load moves at every scrape would otherwise cost
NATS ten replicated writes a second, for a copy only a starting router reads
(and that router keeps the newer of the copy and what its subscription
already brought).

The :class:`Publisher` never blocks the scrape loops: ``offer_*`` only
records the latest state per key; one flusher task sends them. A state that
could not be sent (NATS away) stays pending and is retried; only the newest
state of a key is ever kept. The KV writes go on beside the flusher: the
routers follow the subjects, and the next states need not wait for the
acknowledgements of the last batch's writes (one write per key at a time,
at most ``max_storing`` in flight; a key whose write failed is written
again at its next send).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import msgspec
import structlog

from kinference_common import subjects
from kinference_common.messages import EndpointState, ProviderState, encode

log = structlog.get_logger("kinference.collector.publish")


class Bus(Protocol):
    """Where states go. :class:`NatsBus` in production; tests and benches may use others."""

    async def put(self, subject: str, key: str, data: bytes) -> None:
        """``data`` (the state of ``key``) on ``subject``."""
        ...

    async def store(self, key: str, data: bytes) -> None:
        """``data`` in the KV bucket under ``key`` (acknowledged)."""
        ...

    async def delete(self, subject: str, key: str, data: bytes) -> None:
        """``data`` (a last, not ready state) on ``subject``; ``key`` deleted from the bucket."""
        ...


class NatsBus:
    """Subject publish plus KV put, on a connected nats-py client."""

    def __init__(self, nc: object, bucket: str = subjects.TELEMETRY_BUCKET, replicas: int = 1) -> None:
        self._nc = nc
        self._bucket = bucket
        #: the bucket's replicas (3 on a cluster of three NATS servers; one found with fewer healed where allowed)
        self.replicas = replicas
        self._kv: object | None = None
        self._opened_once = False
        self._opening = asyncio.Lock()  # the flusher sends many keys at once: one of them opens
        #: times the bucket had to be created again after it was seen (NATS lost its storage)
        self.recreated = 0

    async def start(self) -> None:
        """Open the KV bucket, creating it when missing (at start, or when a
        NATS restarted with empty storage lost it: said once in the log)."""
        from nats.js.api import KeyValueConfig

        from kinference_common.bus import open_kv

        def created() -> None:
            if self._opened_once:
                self.recreated += 1
                log.warning("telemetry_bucket_recreated", bucket=self._bucket,
                            reason="missing after reconnect (NATS lost its storage)")

        async with self._opening:
            if self._kv is not None:  # opened by a concurrent put meanwhile
                return
            kv = await open_kv(self._nc.jetstream(), KeyValueConfig(  # type: ignore[attr-defined]
                bucket=self._bucket, history=1, replicas=self.replicas), on_created=created)
            self._kv = kv
            self._opened_once = True

    def reopen(self) -> None:
        """Open the bucket again before the next write (after a reconnect)."""
        self._kv = None

    async def put(self, subject: str, key: str, data: bytes) -> None:
        await self._nc.publish(subject, data)  # type: ignore[attr-defined]

    async def store(self, key: str, data: bytes) -> None:
        if self._kv is None:
            await self.start()
        kv = self._kv
        try:
            await kv.put(key, data)  # type: ignore[union-attr]
        except Exception:
            if self._kv is kv:  # the stream may be gone ("no response from stream"): open or create it again
                self._kv = None
            raise

    async def delete(self, subject: str, key: str, data: bytes) -> None:
        if self._kv is None:
            await self.start()
        await self._nc.publish(subject, data)  # type: ignore[attr-defined]
        kv = self._kv
        try:
            await kv.delete(key)  # type: ignore[union-attr]
        except Exception:
            if self._kv is kv:
                self._kv = None
            raise


class NullBus:
    """Drops everything (benchmarks of scraping alone); counts puts."""

    def __init__(self) -> None:
        self.puts = 0

    async def put(self, subject: str, key: str, data: bytes) -> None:
        self.puts += 1

    async def store(self, key: str, data: bytes) -> None:
        pass

    async def delete(self, subject: str, key: str, data: bytes) -> None:
        pass


class _Entry:
    __slots__ = ("subject", "kind", "data", "fingerprint", "sent_fingerprint", "sent_at", "pending", "deleted",
                 "ready", "stored_at", "stored_ready", "store_again")

    def __init__(self, subject: str, kind: str) -> None:
        self.subject = subject
        self.kind = kind
        self.data = b""
        self.fingerprint = b""
        self.sent_fingerprint: bytes | None = None
        self.sent_at = float("-inf")
        self.pending = False
        self.deleted = False
        #: the readiness of ``data`` (None for a provider), and when and with
        #: what readiness the KV key was last written
        self.ready: bool | None = None
        self.stored_at = float("-inf")
        self.stored_ready: bool | None = None
        #: a send wanted the KV copy written while a write of it was in flight:
        #: written again, with the newest state, once that one ends
        self.store_again = False


class Publisher:
    """Change-or-rate publishing of endpoint and provider states."""

    def __init__(self, bus: Bus, min_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, batch: float = 0.02,
                 max_storing: int = 4096) -> None:
        self._bus = bus
        #: KV writes in flight, by key (one per key), at most ``max_storing``
        self._storing: dict[str, asyncio.Task[None]] = {}
        self.max_storing = max_storing
        self._store_failing = False
        self.min_interval = min_interval
        #: seconds a flush waits after the first offer, so the states of scrapes
        #: spread over the interval go out together (one socket write, their
        #: acks read together) rather than one at a time
        self.batch = batch
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        #: keys with a state to send (an ordered set), and (sent_at, key) of every
        #: send in time order, so a flush costs what is due, not every key held
        self._pending: dict[str, None] = {}
        self._sent: deque[tuple[float, str]] = deque()
        self._wake = asyncio.Event()
        #: when :meth:`run` last flushed (its clock)
        self._flushed_at = float("-inf")
        #: sends by kind (``endpoint``, ``provider``), and KV writes among them
        self.sent_by_kind: dict[str, int] = {"endpoint": 0, "provider": 0}
        self.stored = 0
        #: sends that failed (retried after ``retry_delay``), and KV writes that
        #: failed (written again at the key's next send; they never slow the sends)
        self.failures = 0
        self.store_failures = 0
        self._failing = False  # logs once per outage, not once per key and pass

    # ----------------------------------------------------------------- offers

    def offer_endpoint(self, st: EndpointState) -> None:
        key = subjects.endpoint_key(st.namespace, st.worker_set, st.pod)
        subject = subjects.endpoint_subject(st.namespace, st.worker_set, st.pod)
        data = encode(st)
        fp = encode(msgspec.structs.replace(st, scraped_at=0.0))
        self._offer(key, subject, data, fp, "endpoint", st.ready)

    def offer_provider(self, st: ProviderState) -> None:
        key = subjects.provider_key(st.namespace, st.name)
        subject = subjects.provider_subject(st.namespace, st.name)
        data = encode(st)
        fp = encode(msgspec.structs.replace(st, updated_at=0.0))
        self._offer(key, subject, data, fp, "provider", None)

    def remove_endpoint(self, st: EndpointState) -> None:
        """The endpoint is gone: a last (not ready) state on its subject, its KV key deleted."""
        key = subjects.endpoint_key(st.namespace, st.worker_set, st.pod)
        e = self._entries.get(key)
        if e is None:
            return
        e.data = encode(msgspec.structs.replace(st, ready=False))
        e.deleted = True
        self._mark(key, e)

    def forget(self, key: str) -> None:
        """Another replica publishes ``key`` now: send nothing more for it."""
        self._entries.pop(key, None)

    def _offer(self, key: str, subject: str, data: bytes, fp: bytes, kind: str, ready: bool | None) -> None:
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry(subject, kind)
        e.data, e.fingerprint, e.deleted, e.ready = data, fp, False, ready
        if fp != e.sent_fingerprint or self._clock() - e.sent_at >= self.min_interval:
            self._mark(key, e)

    def _mark(self, key: str, e: _Entry) -> None:
        if not e.pending:
            e.pending = True
            self._pending[key] = None
            self._wake.set()

    # ------------------------------------------------------------------ flush

    def _take_due(self, now: float) -> list[str]:
        """Keys to send now: changed ones, and those not sent for ``min_interval``
        (from the head of the send log; a record a later send superseded is dropped)."""
        keys = dict.fromkeys(self._pending)
        self._pending.clear()
        sent, cutoff = self._sent, now - self.min_interval
        while sent and sent[0][0] <= cutoff:
            at, key = sent.popleft()
            e = self._entries.get(key)
            if e is not None and e.sent_at == at and not e.pending:
                keys[key] = None  # once, though two sends of the same instant both left a record
        return list(keys)

    async def flush(self, wait_stored: bool = True) -> int:
        """Send every due state once; returns how many were sent. With
        ``wait_stored`` also wait for the KV writes in flight (the flusher
        task does not: the next states go out meanwhile)."""
        now = self._clock()
        keys = self._take_due(now)
        sent = await asyncio.gather(*(self._send(k, now) for k in keys)) if keys else []
        if wait_stored:
            await self.stored_all()
        return sum(sent)

    async def stored_all(self) -> None:
        """Wait for the KV writes in flight."""
        if self._storing:
            await asyncio.gather(*self._storing.values(), return_exceptions=True)

    def cancel_stores(self) -> None:
        """Give up the KV writes still in flight (stopping)."""
        for t in self._storing.values():
            t.cancel()
        self._storing.clear()

    def _store(self, key: str, e: _Entry, data: bytes, ready: bool | None, now: float) -> None:
        """Write ``key``'s copy in the bucket beside the flusher (see the module docstring)."""
        if key in self._storing:
            e.store_again = True  # once this write ends (a readiness change must not wait a second)
            return
        if len(self._storing) >= self.max_storing:
            return  # NATS far behind: written at the key's next send
        e.store_again = False

        async def write() -> None:
            try:
                await self._bus.store(key, data)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS away, a slow stream: its next send writes it again
                self.store_failures += 1
                if not self._store_failing:
                    self._store_failing = True
                    log.warning("kv_write_failed", key=key, error=f"{type(exc).__name__}: {exc}"[:200])
                return
            finally:
                if self._storing.get(key) is task:
                    del self._storing[key]
                    if e.store_again and self._entries.get(key) is e and not e.deleted:
                        self._store(key, e, e.data, e.ready, self._clock())
            if self._store_failing:
                self._store_failing = False
                log.info("kv_write_recovered")
            self.stored += 1
            if self._entries.get(key) is e and now >= e.stored_at:
                e.stored_at, e.stored_ready = now, ready

        task = self._storing[key] = asyncio.create_task(write())

    async def _send(self, key: str, now: float) -> bool:
        e = self._entries.get(key)
        if e is None:
            return False
        data, fp, deleted, ready = e.data, e.fingerprint, e.deleted, e.ready
        store = not deleted and (ready != e.stored_ready or now - e.stored_at >= self.min_interval)
        e.pending = False
        try:
            if deleted:
                writing = self._storing.get(key)
                if writing is not None:  # the delete goes after the last write, never before it
                    e.store_again = False
                    await asyncio.gather(writing, return_exceptions=True)
                await self._bus.delete(e.subject, key, data)
            else:
                await self._bus.put(e.subject, key, data)
        except asyncio.CancelledError:  # stopping mid-send: still to send, as it was
            e.pending = True
            self._pending[key] = None
            raise
        except Exception as exc:  # NATS away, timeouts: retry on the next pass
            self.failures += 1
            e.pending = True
            self._pending[key] = None
            if not self._failing:
                self._failing = True
                log.warning("publish_failed", key=key, error=f"{type(exc).__name__}: {exc}"[:200])
            return False
        if self._failing:
            self._failing = False
            log.info("publish_recovered")
        if deleted:
            if self._entries.get(key) is e and e.deleted:
                del self._entries[key]
        elif self._entries.get(key) is e:
            e.sent_fingerprint, e.sent_at = fp, now
            self._sent.append((now, key))
            if store:
                self._store(key, e, data, ready, now)
        self.sent_by_kind[e.kind] += 1
        return True

    @property
    def published(self) -> int:
        """States sent, of every kind."""
        return sum(self.sent_by_kind.values())

    def _next_due(self, tick: float) -> float | None:
        """Seconds until the oldest send is due again, but not before a
        ``tick`` after the last flush (the republishes due meanwhile go out
        together, at most a tick late); None when nothing was sent (nothing
        falls due until something is offered); 0 while a failed send waits
        to be tried again."""
        if self._pending:
            return 0.0
        if not self._sent:
            return None
        due = max(self._sent[0][0] + self.min_interval, self._flushed_at + tick)
        return max(0.0, due - self._clock())

    async def run(self, stop: asyncio.Event, retry_delay: float = 0.2) -> None:
        """Flush ``batch`` seconds after something is offered, and when
        states fall due again (``min_interval`` after their last send, on a
        grain of ``min_interval / 4``); asleep while nothing is held."""
        tick = max(0.01, self.min_interval / 4)
        stopping = asyncio.ensure_future(stop.wait())  # ``stop`` wakes the wait below
        stopping.add_done_callback(lambda _: self._wake.set())
        try:
            await self._run(stop, tick, retry_delay)
        finally:
            stopping.cancel()

    async def _run(self, stop: asyncio.Event, tick: float, retry_delay: float) -> None:
        while not stop.is_set():
            try:
                # asyncio.timeout, not wait_for: no task is made per wait
                async with asyncio.timeout(self._next_due(tick)):
                    await self._wake.wait()
                if self.batch > 0:
                    await asyncio.sleep(self.batch)
            except TimeoutError:
                pass
            self._wake.clear()
            failures = self.failures
            self._flushed_at = self._clock()
            await self.flush(wait_stored=False)
            if self.failures > failures:
                await asyncio.sleep(retry_delay)
