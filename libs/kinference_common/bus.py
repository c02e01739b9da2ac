"""Connecting to NATS the way every Kinference service should.

- Never give up: reconnect forever (including the first connection), since a
  pod may start before NATS does and must survive NATS restarts.
- Log one line per problem, never a traceback, and at most once every
  ``quiet_seconds`` for repeated failures (the client retries twice a second).
- Callbacks for disconnect/reconnect so services can resynchronise.
- Stopping never waits on a server that does not answer (:func:`close`).
- A cluster: ``url`` may name every server, comma-separated
  (:func:`servers`); the client reconnects to any of them.
- KV buckets at the replicas asked for, healed when found with fewer where
  the server allows a stream update
  (:func:`open_kv`); an unavailable store said once (:class:`Availability`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import nats
import structlog
from nats.js.errors import KeyNotFoundError, NoKeysError

log = structlog.get_logger("nats")

Callback = Callable[[], Awaitable[None]]


def _guard_pongs() -> None:
    """Keep a connection reading after a flush was given up on.

    nats-py (2.16 and every release before it) keeps one future per PING in
    ``_pongs`` and sets the oldest one's result at each PONG. A flush that
    timed out or was cancelled (its task cancelled at shutdown, a
    ``wait_for`` around it) leaves its future cancelled in that list, and
    the PONG that answers it raises ``InvalidStateError`` in the read loop,
    which then stops for good: the connection still says connected, every
    later flush returns at once, and no message, reply or KV answer is read
    again. A router whose event confirmation timed out once under load
    stopped seeing configuration and telemetry; tests hung in teardown
    waiting on a reply that was never read (nats-io/nats.py#624 is the same
    defect in the flusher; this one has no upstream fix yet).

    The PONG still answers that PING, so its future is taken off the list in
    order; its result is set only when someone still waits for it."""
    from nats.aio.client import Client

    if getattr(Client._process_pong, "kinference_guarded", False):
        return

    async def _process_pong(self: Any) -> None:
        if self._pongs:
            future = self._pongs.pop(0)
            if not future.done():
                future.set_result(True)
            self._pongs_received += 1
            self._pings_outstanding = 0

    _process_pong.kinference_guarded = True  # type: ignore[attr-defined]
    Client._process_pong = _process_pong  # type: ignore[method-assign]


_guard_pongs()


def servers(url: str | Sequence[str]) -> list[str]:
    """The servers of ``--nats-url``: one URL, or several separated by commas
    (every server of a cluster; the client connects and reconnects to any)."""
    parts = [url] if isinstance(url, str) else list(url)
    found = [u.strip() for part in parts for u in part.split(",") if u.strip()]
    if not found:
        raise ValueError("no NATS server URL given")
    return found


async def connect(
    url: str | Sequence[str],
    *,
    name: str,
    on_disconnect: Callback | None = None,
    on_reconnect: Callback | None = None,
    quiet_seconds: float = 10.0,
    **options: object,
) -> nats.NATS:
    """``url``: one server or every server of a cluster (:func:`servers`).
    ``options``: more ``nats.connect`` arguments, e.g. credentials and TLS
    from :func:`kinference_common.natsauth.connect_options`."""
    last_logged: dict[str, float] = {}
    pool = servers(url)
    url = ",".join(pool)

    async def error_cb(exc: Exception) -> None:
        key = type(exc).__name__
        now = time.monotonic()
        if now - last_logged.get(key, -1e9) >= quiet_seconds:
            last_logged[key] = now
            log.warning("nats unavailable, retrying", url=url, error=str(exc) or key)

    async def disconnected_cb() -> None:
        log.warning("nats disconnected", url=url)
        if on_disconnect is not None:
            await on_disconnect()

    async def reconnected_cb() -> None:
        where = client[0].connected_url if client else None
        log.info("nats reconnected", url=url, server=where.netloc if where is not None else None)
        if on_reconnect is not None:
            await on_reconnect()

    client: list[nats.NATS] = []
    nc = await nats.connect(
        pool,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        error_cb=error_cb,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        **options,  # type: ignore[arg-type]
    )
    client.append(nc)
    return nc


async def sync(nc: nats.NATS, timeout: float = 10.0) -> None:
    """Return once the server has processed everything ``nc`` has sent so far
    (subscriptions and publishes alike).

    ``nc.flush()`` alone does not promise that with nats-py 2.16: it writes its
    PING straight to the socket, ahead of commands still waiting in the
    client's outgoing buffer for its flusher task, so its PONG can come back
    before a just-made SUB or PUB has left the process. Seen as a flaky test: a
    message published from another connection right after ``flush()`` missed a
    fresh subscription. The flusher was woken when those commands were
    buffered, so it writes them before the first PONG can be read; a second
    PING therefore follows them on the wire, and its PONG proves the server
    processed them.
    """
    await nc.flush(timeout=timeout)  # type: ignore[arg-type]
    await nc.flush(timeout=timeout)  # type: ignore[arg-type]


async def close(nc: nats.NATS, timeout: float = 2.0) -> None:
    """Drain ``nc`` (hand over what was received, flush what was published)
    when that finishes within ``timeout`` seconds, else close it outright.

    nats-py's ``drain()`` flushes each subscription and waits for the server's
    PONG, for up to its ``drain_timeout`` (30 s); cancelled, it still flushes
    (10 s more) before closing, and when the server goes away meanwhile it
    does not come back at all. Ctrl-C on ``make run`` stops nats-server and
    the router in the same instant, and the router hung until the stack
    killed it (a pod stopped during a NATS outage would wait out its grace
    period). So the drain runs as a task that is never waited on for longer
    than ``timeout``: closing the connection ends it."""

    async def bounded(aw: Awaitable[None]) -> bool:
        task = asyncio.ensure_future(aw)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()  # not awaited: a cancelled drain may still wait on the server
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, never logged
        return bool(done) and not task.cancelled() and task.exception() is None

    if nc.is_closed:
        return
    if not await bounded(nc.drain()) and not nc.is_closed:
        await bounded(nc.close())


async def kv_items(kv: Any, want: Callable[[str], bool] | None = None) -> AsyncIterator[tuple[str, bytes]]:
    """Every ``(key, value)`` of a JetStream KV bucket with a value, for the
    keys ``want`` accepts (all by default): an empty bucket is no items, and
    a key deleted between the listing and its read, or holding an empty
    value (a delete marker), is skipped. Other errors propagate."""
    try:
        keys = await kv.keys()
    except NoKeysError:
        return
    for key in keys:
        if want is not None and not want(key):
            continue
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        if entry.value:
            yield key, entry.value


# ------------------------------------------------------------------ KV buckets

#: nats-server's error codes met when creating a replicated stream
_NOT_CLUSTERED = 10074  # replicas > 1 not supported in non-clustered mode
_INSUFFICIENT = 10023  # insufficient resources (fewer servers up than replicas)


def add_kv_replicas_argument(parser: Any) -> None:
    """``--kv-replicas``: the replicas of the KV buckets a service creates."""
    parser.add_argument(
        "--kv-replicas", type=int, choices=range(1, 6), metavar="N",
        default=int(os.environ.get("KINFERENCE_KV_REPLICAS", "1")),
        help="replicas of the KV buckets this service creates, and heals a bucket found with fewer to "
             "(env KINFERENCE_KV_REPLICAS; default 1; 3 on a cluster of three NATS servers; "
             "one server: 1 whatever is asked)")


async def open_kv(js: Any, config: Any, *, heal: bool = True, on_created: Callable[[], None] | None = None) -> Any:
    """Open the KV bucket ``config`` (a ``nats.js.api.KeyValueConfig``)
    describes, creating it when missing, and return it.

    Replicas: created at ``config.replicas``; on a single server (which
    refuses more than one) at 1, said once in the log. A bucket found with
    fewer replicas than asked, or whose stream listens on other subjects than
    its own keys, is healed (``heal``): its stream's configuration is updated
    (JetStream copies the data to the new replicas itself). When healing is
    refused (fewer servers up than replicas, no permission) the bucket is
    used as it is and the next open tries again. ``on_created`` is called
    when the bucket had to be created (a NATS that lost its storage)."""
    from nats.js.api import StreamConfig
    from nats.js.errors import NotFoundError
    from nats.js.client import KV_PRE_TEMPLATE, KV_STREAM_TEMPLATE
    from nats.js.kv import KeyValue

    bucket = config.bucket
    stream = KV_STREAM_TEMPLATE.format(bucket=bucket)
    own = [f"$KV.{bucket}.>"]
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        info = None
    if info is None:
        kv = await _create_kv(js, config)
        if on_created is not None:
            on_created()
        return kv
    found: StreamConfig = info.config
    wrong_subjects = list(found.subjects or []) != own
    # a single server (no cluster, or one without a name) keeps one copy whatever the configuration says
    clustered = info.cluster is not None and bool(info.cluster.name)
    fewer = clustered and (found.num_replicas or 1) < config.replicas
    if heal and (fewer or wrong_subjects):
        if wrong_subjects:
            log.error("kv_bucket_subjects_reset", bucket=bucket, found=found.subjects, expected=own)
        try:
            updated = await js.update_stream(config=found.evolve(
                num_replicas=max(config.replicas if fewer else 1, found.num_replicas or 1), subjects=own))
            log.info("kv_bucket_healed", bucket=bucket, replicas_before=found.num_replicas or 1,
                     replicas=updated.config.num_replicas)
            found = updated.config
            _said.discard(f"heal {bucket}")
            await wait_current(js, stream)
        except Exception as exc:  # too few servers up now, or not allowed: used as it is, tried again later
            _once(f"heal {bucket}", "kv_bucket_not_healed", bucket=bucket, replicas=found.num_replicas or 1,
                  wanted=config.replicas, error=describe(exc))
    return KeyValue(name=bucket, stream=stream, pre=KV_PRE_TEMPLATE.format(bucket=bucket), js=js,
                    direct=bool(found.allow_direct))


async def wait_current(js: Any, stream: str, timeout: float = 10.0) -> bool:
    """After a change of replicas the stream elects a leader again and the new
    replicas copy the data (about a second); reads and writes meanwhile time
    out, and a leader lost before its followers are current leaves no one to
    take over. So wait until there is a leader and every follower is current
    (also how to tell that a restarted server caught up: its ``/healthz`` may
    answer before); False after ``timeout`` (the caller's next operation
    says what is wrong)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = await js.stream_info(stream)
            c = info.cluster
            followers = list(c.replicas or []) if c is not None else []
            if c is None or (c.leader and len(followers) >= (info.config.num_replicas or 1) - 1
                             and all(r.current for r in followers)):
                return True
        except Exception:
            pass
        await asyncio.sleep(0.1)
    return False


async def _create_kv(js: Any, config: Any) -> Any:
    from nats.js.errors import APIError

    replicas = config.replicas
    single = False
    while True:
        try:
            kv = await js.create_key_value(config.evolve(replicas=replicas))
        except APIError as exc:
            if exc.err_code == _NOT_CLUSTERED and replicas > 1:
                _once(f"single {config.bucket}", "kv_bucket_single_replica", bucket=config.bucket,
                      wanted=replicas, reason="NATS is a single server")
                replicas, single = 1, True
                continue
            if exc.err_code == _INSUFFICIENT and replicas > 1:
                # fewer servers up than asked: create it smaller, a later open heals it
                replicas -= 1
                continue
            raise
        if replicas < config.replicas and not single:
            log.warning("kv_bucket_created_with_fewer_replicas", bucket=config.bucket, replicas=replicas,
                        wanted=config.replicas)
        return kv


#: what :func:`_once` has said in this process (a heal that keeps failing is said once, not every open)
_said: set[str] = set()


def _once(key: str, event: str, **fields: object) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(event, **fields)


def describe(exc: BaseException) -> str:
    """One line about an error (its type when it has no message)."""
    text = str(exc).strip() or type(exc).__name__
    return text[:200]


class Availability:
    """Says once that something became unavailable and once that it is back,
    however many attempts fail in between (a KV bucket without a JetStream
    quorum: reads and writes time out until two of three servers are up).

    ``what`` names it in the log lines (``<what>_unavailable`` with
    ``consequence``, ``<what>_available`` with how long it was away);
    :attr:`available` is for a metric or a readiness condition."""

    def __init__(self, what: str, consequence: str, *, logger: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.consequence = what, consequence
        self._log = logger or log
        self._clock = clock
        self.available = True
        self.since = clock()
        #: times it went away
        self.outages = 0

    def failed(self, exc: BaseException | None = None) -> None:
        if self.available:
            self.available, self.since = False, self._clock()
            self.outages += 1
            self._log.warning(f"{self.what}_unavailable", consequence=self.consequence,
                              error=describe(exc) if exc is not None else None)

    def ok(self) -> None:
        if not self.available:
            away = self._clock() - self.since
            self.available, self.since = True, self._clock()
            self._log.info(f"{self.what}_available", unavailable_s=round(away, 2))
