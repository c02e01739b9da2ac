"""Connecting to NATS the way every Kinference service should.

- Never give up: reconnect forever (including the first connection), since a
  pod may start before NATS does and must survive NATS restarts.
- Log one line per problem, never a traceback, and at most once every
  ``quiet_seconds`` for repeated failures (the client retries twice a second).
- Callbacks for disconnect/reconnect so services can resynchronise.
- Stopping never waits on a server that does not answer (:func:`close`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
import structlog
from nats.js.errors import KeyNotFoundError, NoKeysError

log = structlog.get_logger("nats")

Callback = Callable[[], Awaitable[None]]


async def connect(
    url: str,
    *,
    name: str,
    on_disconnect: Callback | None = None,
    on_reconnect: Callback | None = None,
    quiet_seconds: float = 10.0,
    **options: object,
) -> nats.NATS:
    """``options``: more ``nats.connect`` arguments, e.g. credentials and TLS
    from :func:`kinference_common.natsauth.connect_options`."""
    last_logged: dict[str, float] = {}

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
        log.info("nats reconnected", url=url)
        if on_reconnect is not None:
            await on_reconnect()

    return await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        error_cb=error_cb,
        disconnected_cb=disconnected_cb,
        reconnected_cb=reconnected_cb,
        **options,  # type: ignore[arg-type]
    )


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
