"""Stopping background tasks for certain.

On Python 3.11, ``asyncio.wait_for`` swallows a cancellation that arrives in
the same loop iteration as the result it waits for (CPython gh-86296, fixed
in 3.12): the cancelled task goes on as if nothing happened. nats-py waits
for every PONG and reply with ``wait_for``, so a service loop cancelled
while it confirms a publish can swallow its cancel and go back to sleep;
``task.cancel(); await task`` then waits for ever (seen as router tests
hanging 120 s in teardown, the event publisher back at its wake-up event
with its cancel pending). :func:`cancel_and_wait` cancels again until the
task has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["cancel_and_wait", "unless_stopped"]

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[object] | asyncio.Future[object] | None,
                          retry_every: float = 0.1) -> None:
    """Cancel ``tasks`` (``None`` and finished ones are skipped) and return
    once every one has ended; one still running ``retry_every`` seconds
    after a cancel is cancelled again. What they raised is retrieved and
    dropped (a stopping service has no one to hand it to)."""
    pending = {t for t in tasks if t is not None and not t.done()}
    for t in pending:
        t.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=retry_every)
        for t in pending:
            t.cancel()
    for t in tasks:
        if t is not None and t.done() and not t.cancelled():
            with contextlib.suppress(BaseException):
                t.exception()


async def unless_stopped(aw: Awaitable[T], stop: asyncio.Event) -> asyncio.Future[T] | None:
    """Run ``aw`` until it ends or ``stop`` is set, whichever comes first: the
    ended future (its result or exception for the caller to read), or None
    once ``aw`` was cancelled and has ended. For a start that may wait for
    ever (nats-py's connect retries an unreachable server by itself, an API
    server may never answer) while a SIGTERM must still be heard."""
    running = asyncio.ensure_future(aw)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if running.done():
        return running
    await cancel_and_wait(running)
    return None
