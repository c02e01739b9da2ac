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
from nats.js.errors import KeyDeletedError, KeyNotFoundError

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


#: the schemes the NATS client connects with: plain, TLS, WebSocket
SCHEMES = ("nats", "tls", "ws", "wss")
_WEBSOCKET = ("ws", "wss")


class NatsUrlError(ValueError):
    """``--nats-url`` names no usable server. The message is one line:
    ``--nats-url '<entry>': <what is wrong>``, the entry at fault with any
    password in it masked."""


def servers(url: str | Sequence[str]) -> list[str]:
    """The servers of ``--nats-url``: one URL, or several separated by commas
    (every server of a cluster; the client connects and reconnects to any).

    Each is checked, so that a typo stops a service at start-up with one
    line (:class:`NatsUrlError`) instead of a retry loop or a traceback:
    ``scheme://host:port`` with a scheme of :data:`SCHEMES` (``host:port``
    alone is ``nats://host:port``, and without a port the client uses
    4222), a host, a port in 1-65535, nothing after the port but a
    WebSocket path, servers separated by commas only, and not WebSocket
    servers mixed with others (the client refuses that)."""
    from urllib.parse import urlsplit

    parts = [url] if isinstance(url, str) else list(url)
    given = ",".join(parts)
    # a password may hold a comma, which then cuts its URL in two: with any
    # "@" in the value no entry is shown beyond its scheme and host
    secret = "@" in given
    found = [_server(u.strip(), secret) for part in parts for u in part.split(",") if u.strip()]
    if not found:
        raise NatsUrlError(f"--nats-url {_masked(given, secret)!r}: no NATS server given "
                           "(nats://HOST:PORT, or a cluster's servers comma-separated)")
    websocket = {urlsplit(u).scheme.lower() in _WEBSOCKET for u in found}
    if len(websocket) > 1:
        raise NatsUrlError(f"--nats-url {_masked(','.join(found), secret)!r}: WebSocket servers (ws://, "
                           "wss://) cannot be mixed with nats:// or tls:// ones")
    return found


def check_url(url: str | Sequence[str]) -> str:
    """``--nats-url`` checked (:func:`servers`) and written out in full:
    what a service's or kinfctl's ``main`` keeps, at argument time."""
    return ",".join(servers(url))


def _server(entry: str, secret: bool = False) -> str:
    """One server of ``--nats-url``, checked; ``host:port`` made
    ``nats://host:port``. The host and port are read after the last ``@``
    (a password may hold ``/``, ``:`` or ``#``), and no message shows what
    comes before it."""
    from urllib.parse import urlsplit

    def bad(what: str) -> NatsUrlError:
        if secret and "@" not in entry:  # maybe a piece of a password: nothing of it in the message
            what = "not a server (a password cut by a comma? servers are separated by commas)"
        return NatsUrlError(f"--nats-url {_masked(entry, secret)!r}: {what}")

    for sep, name in ((";", "';'"), ("|", "'|'")):
        if sep in entry.rpartition("@")[2] or (sep in entry and entry.count("://") > 1):
            raise bad(f"separate servers with commas, not {name}")
    if any(c.isspace() for c in entry):
        raise bad("separate servers with commas, not spaces")
    if entry.count("://") > 1:
        raise bad("separate servers with commas")
    full = entry if "://" in entry else f"nats://{entry}"
    scheme_text, _, rest = full.partition("://")
    userinfo, at, location = rest.rpartition("@")
    scheme = scheme_text.lower()
    if scheme not in SCHEMES:
        raise bad(f"scheme {scheme_text + '://'!r} is not one of " + ", ".join(f"{s}://" for s in SCHEMES))
    try:
        parts = urlsplit(f"{scheme}://{location}")
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise bad(f"not a URL ({exc})") from None
    if not parts.hostname:
        raise bad("no host (scheme://HOST:PORT)")
    try:
        port = parts.port
    except ValueError:
        raw = parts.netloc.rpartition("]")[2].partition(":")[2]
        if raw.isdigit():
            raise bad(f"port {int(raw)} is outside 1-65535") from None
        raise bad(f"port {raw!r} is not a number in 1-65535") from None
    if port == 0:
        raise bad("port 0 is outside 1-65535")
    if scheme not in _WEBSOCKET and (parts.path not in ("", "/") or parts.query or parts.fragment):
        rest_after = location[len(parts.netloc):]
        raise bad(f"unexpected {rest_after!r} after the port (a NATS server is scheme://HOST:PORT)")
    return f"{scheme}://{userinfo}{at}{location}"  # the client knows its schemes in lower case only


def _masked(url: str, secret: bool = False) -> str:
    """``url`` (one entry or a list) as a message may show it: what comes
    before each entry's last ``@`` (a user and password, which may hold
    ``/``, ``:`` or ``,``) as ``***``; with ``secret`` (an ``@`` somewhere
    in the whole value) an entry without one is shown as its scheme only."""
    out = []
    for entry in url.split(","):
        scheme, sep, rest = entry.partition("://")
        if "@" in (rest if sep else entry):
            host = (rest if sep else entry).rpartition("@")[2]
            out.append(f"{scheme}{sep}***@{host}" if sep else f"***@{host}")
        elif secret:
            out.append(f"{scheme}://***" if sep else "***")
        else:
            out.append(entry)
    return ",".join(out)


#: how a client finds a server that stopped answering without closing the
#: connection (a node lost, a process stopped, a partition): a PING every 2 s,
#: and the connection is taken for dead, and another server of the cluster
#: tried, when two are unanswered (about 6 s). nats-py's defaults (120 s, 2)
#: left every service on a frozen server cut off for about 6 minutes while
#: the two others kept quorum (an HA trial with SIGSTOP).
KEEPALIVE: dict[str, Any] = {"ping_interval": 2, "max_outstanding_pings": 2}


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
        **{**KEEPALIVE, **options},  # type: ignore[arg-type]
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


async def kv_keys(kv: Any) -> list[str]:
    """The keys of a JetStream KV bucket that hold a message (a value or a
    delete marker), from one stream-info request: a snapshot of the stream's
    subjects. Not ``KeyValue.keys()``, whose watcher can end the listing
    before the last keys arrive (nats.py #842; #995, open): a policy compiler
    that restarted then missed a pool it had published, and never announced
    its deletion (a CI run, ``test_explain_names_the_pool_and_pools_come_and_go``)."""
    prefix = kv._pre  # "$KV.<bucket>."
    info = await kv._js.stream_info(kv._stream, subjects_filter=f"{prefix}>")
    return sorted(subject[len(prefix):] for subject in (info.state.subjects or {}))


async def kv_items(kv: Any, want: Callable[[str], bool] | None = None) -> AsyncIterator[tuple[str, bytes]]:
    """Every ``(key, value)`` of a JetStream KV bucket with a value, for the
    keys ``want`` accepts (all by default): an empty bucket is no items, and
    a deleted key (a delete marker, also one written between the listing
    and its read) or an empty value is skipped. Other errors propagate."""
    for key in await kv_keys(kv):
        if want is not None and not want(key):
            continue
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            continue
        if entry.value:
            yield key, entry.value


# ------------------------------------------------------------------ KV buckets

#: nats-server's error codes met when creating a replicated stream
_NOT_CLUSTERED = 10074  # replicas > 1 not supported in non-clustered mode
_INSUFFICIENT = 10023  # insufficient resources (fewer servers up than replicas)


def add_kv_replicas_argument(parser: Any) -> None:
    """``--kv-replicas``: the replicas of the KV buckets and streams a service creates."""
    parser.add_argument(
        "--kv-replicas", type=int, choices=range(1, 6), metavar="N",
        default=int(os.environ.get("KINFERENCE_KV_REPLICAS", "1")),
        help="replicas of the KV buckets and streams this service creates, and heals one found with fewer to "
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
    return await _at_replicas(lambda r: js.create_key_value(config.evolve(replicas=r)), config.replicas,
                              "kv_bucket", bucket=config.bucket)


async def _at_replicas(create: Callable[[int], Awaitable[Any]], wanted: int, kind: str, **name: str) -> Any:
    """``create(replicas)`` at ``wanted`` replicas; at 1 on a single server
    (said once: ``<kind>_single_replica``), at fewer when fewer servers are
    up (said: ``<kind>_created_with_fewer_replicas``; a later open heals it)."""
    from nats.js.errors import APIError

    replicas = wanted
    single = False
    key = " ".join(name.values())
    while True:
        try:
            made = await create(replicas)
        except APIError as exc:
            if exc.err_code == _NOT_CLUSTERED and replicas > 1:
                _once(f"single {key}", f"{kind}_single_replica", **name, wanted=replicas,
                      reason="NATS is a single server")
                replicas, single = 1, True
                continue
            if exc.err_code == _INSUFFICIENT and replicas > 1:
                # fewer servers up than asked: create it smaller, a later open heals it
                replicas -= 1
                continue
            raise
        if replicas < wanted and not single:
            log.warning(f"{kind}_created_with_fewer_replicas", **name, replicas=replicas, wanted=wanted)
        return made


async def ensure_stream(js: Any, config: Any) -> Any:
    """Create the stream ``config`` (a ``nats.js.api.StreamConfig``)
    describes at ``config.num_replicas``, as :func:`open_kv` creates a
    bucket (one copy on a single server, fewer when fewer servers are up);
    or bring an existing one to its subjects, limits and replicas: never
    fewer replicas than it has, more when it has fewer than asked (healed:
    JetStream copies its messages to the new replicas). A heal refused
    (fewer servers up than replicas, no permission) is said once
    (``stream_not_healed``) and the limits are still set. Returns the
    stream's configuration."""
    from nats.js.errors import NotFoundError

    name = config.name
    wanted = config.num_replicas or 1
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        made = await _at_replicas(lambda r: js.add_stream(config.evolve(num_replicas=r)), wanted, "stream",
                                  stream=name)
        return made.config
    found = info.config
    have = found.num_replicas or 1
    clustered = info.cluster is not None and bool(info.cluster.name)
    target = config.evolve(num_replicas=max(have, wanted) if clustered else have)
    if _stream_same(found, target):
        return found
    try:
        updated = await js.update_stream(config=target)
    except Exception as exc:
        if target.num_replicas == have:
            raise
        _once(f"heal {name}", "stream_not_healed", stream=name, replicas=have, wanted=wanted,
              error=describe(exc))
        return (await js.update_stream(config=config.evolve(num_replicas=have))).config
    if updated.config.num_replicas != have:
        log.info("stream_healed", stream=name, replicas_before=have, replicas=updated.config.num_replicas)
        _said.discard(f"heal {name}")
        await wait_current(js, name)
    return updated.config


def _stream_same(found: Any, target: Any) -> bool:
    """Nothing :func:`ensure_stream` sets differs (ages to the millisecond)."""
    return (list(found.subjects or []) == list(target.subjects or [])
            and (found.max_bytes or -1) == (target.max_bytes or -1)
            and abs((found.max_age or 0) - (target.max_age or 0)) < 1e-3
            and (found.num_replicas or 1) == (target.num_replicas or 1)
            and found.discard == target.discard)


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

    def __init__(self, what: str, consequence: str | Callable[[], str], *, logger: Any = None,
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
            consequence = self.consequence() if callable(self.consequence) else self.consequence
            self._log.warning(f"{self.what}_unavailable", consequence=consequence,
                              error=describe(exc) if exc is not None else None)

    def ok(self) -> None:
        if not self.available:
            away = self._clock() - self.since
            self.available, self.since = True, self._clock()
            self._log.info(f"{self.what}_available", unavailable_s=round(away, 2))
