"""Review of the commits since 90cd687: "no cutting in line" in flow control
(services/router/flow.py, app.py ``_route``/``_wait_for_capacity``) and
``Request.write()`` raising on a closing transport (http_server.py).

Tests without ``# guard`` each failed on the code under review (their
docstrings say what was wrong and what is expected; all six are fixed).
``# guard`` tests pin behaviour that was already right."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import structlog
from kinference_router.flow import FlowQueue, QueueTimeout
from kinference_router.http_server import HttpServer, Request

from .test_flow import (
    MANIFESTS,
    SETTINGS,
    Env,
    Outcome,
    World,
    answering_upstream,
    ask,
    decision_events,
    events_for,
    hanging_upstream,
    post,
    until,
)

# ------------------------------------------------------------------ queue


async def test_capacity_seen_arrival_past_its_deadline_still_passes_its_placement_on(queue: FlowQueue) -> None:
    """``wait(capacity_seen=True)`` promises "one placement is made for it at
    once", and the Shed path keeps that promise. The early ``QueueTimeout``
    (deadline already passed, e.g. ``maxQueueWait: 0s`` after a config change
    while older waiters still wait) raises before the placement is added: the
    capacity the arrival saw is lost, and the waiter ahead of it is not
    placed although a slot is free. Expected: the waiter is placed at once."""
    world = World()
    waiter = asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt("waiter")))
    await until(lambda: len(queue) == 1)
    world.free = 1  # a slot is free; the dispatcher has not been told
    loop = asyncio.get_running_loop()
    with pytest.raises(QueueTimeout):
        await queue.wait(0, "new", SETTINGS, world.attempt("arrival"), deadline=loop.time(),
                         capacity_seen=True)
    try:
        await until(lambda: world.placed == ["waiter"], 1.0)
    except TimeoutError:
        pass
    try:
        assert world.placed == ["waiter"], "the capacity the arrival saw was lost: nobody was placed"
    finally:
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


async def test_capacity_seen_arrival_cancelled_before_its_turn_passes_its_placement_on(queue: FlowQueue) -> None:  # guard
    """A client that goes away while queued with ``capacity_seen`` must not take
    the placement it brought with it: the first waiter still gets it."""
    world = World()
    waiter = asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt("waiter")))
    await until(lambda: len(queue) == 1)
    world.free = 1
    arrival = asyncio.create_task(queue.wait(0, "new", SETTINGS, world.attempt("arrival"), capacity_seen=True))
    await asyncio.sleep(0)  # queued, budget added
    arrival.cancel()
    await asyncio.gather(arrival, return_exceptions=True)
    await asyncio.wait_for(waiter, 3)
    assert world.placed == ["waiter"] and len(queue) == 0


async def test_capacity_seen_arrival_whose_turn_comes_before_a_stuck_waiter_is_placed(queue: FlowQueue) -> None:  # guard
    """A waiter ahead that still has no capacity (another model, say) keeps its
    place; the placement goes on to the arrival that saw capacity."""
    world = World()
    stuck = asyncio.create_task(queue.wait(5, "a", SETTINGS, lambda: Outcome(False, "no_capacity")))
    await until(lambda: len(queue) == 1)
    world.free = 1
    arrival = asyncio.create_task(queue.wait(5, "b", SETTINGS, world.attempt("arrival"), capacity_seen=True))
    await asyncio.wait_for(arrival, 3)
    assert world.placed == ["arrival"] and len(queue) == 1
    assert queue.waiting_at_or_above(5, "") and not queue.waiting_at_or_above(6, "")
    stuck.cancel()
    await asyncio.gather(stuck, return_exceptions=True)
    assert len(queue) == 0 and not queue.waiting_at_or_above(0, "")  # levels emptied by the removal


# ------------------------------------------------------- through the router


@pytest.fixture
async def make_env(start_pool: Any) -> Callable[..., Awaitable[Env]]:
    async def make(address: str, manifests: str = MANIFESTS) -> Env:
        e = Env(await start_pool(manifests, "queued"), address)
        await e.telemetry(queued=10)  # saturated
        return e
    return make


async def test_an_arrival_shed_with_429_is_not_published_as_routed(
        make_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue (maxQueued 2) is full; capacity came back but the dispatcher
    has not had its turn (the rebuild's wake-up held back, as in test_flow).
    A newcomer that could route queues "not to cut in line", finds the queue
    full and is shed: the client gets 429 rate_limited. On that ApiError,
    ``_route`` replaces the routed decision with a fresh one, decided on the
    same unchanged state, which routes again: the decision event for a
    request answered 429 says ``Routed`` (with a backend it never reached).
    Expected: the event for a shed request is not ``Routed``."""
    upstream = await answering_upstream()
    env: Env = await make_env(f"127.0.0.1:{upstream.port}")
    waiters: list[asyncio.Task[Any]] = []
    try:
        async with decision_events(env.nc) as events:
            waiters = [asyncio.create_task(ask(env, f"queued {i}")) for i in range(2)]
            await until(lambda: len(env.router.flow) == 2)
            monkeypatch.setattr(env.router.keeper, "on_rebuild", lambda: None)
            await env.telemetry(queued=0)  # capacity is back, nobody told the queue
            status, body = await ask(env, "newcomer")
            assert status == 429 and body["error"]["code"] == "rate_limited", body
            await asyncio.gather(*waiters, return_exceptions=True)
            mine = await events_for(env.nc, events, body["error"]["decision_id"])
            assert len(mine) == 1, events
            assert mine[0]["outcome"]["type"] != "Routed", mine[0]["outcome"]
    finally:
        await cancel_all(waiters)
        await upstream.close()


TWO_MODELS = MANIFESTS.replace("""    - {kind: InferenceWorkerSet, name: stub}
""", """    - {kind: InferenceWorkerSet, name: stub}
    - {kind: InferenceWorkerSet, name: stub2}
""") + """
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: stub2, namespace: default}
spec:
  model: {name: m2, servedName: m2, contextWindow: 32768}
  engine: vLLM
  selector: {matchLabels: {app: stub2}}
  port: 8000
"""


@asynccontextmanager
async def two_model_env(
        make_env: Any, manifests: str = TWO_MODELS) -> AsyncIterator[tuple[Env, list[str]]]:
    """A two-model pool, m's endpoint saturated and m2's idle, and which endpoint answered each call."""
    hits: list[str] = []
    m_upstream = await answering_upstream(hits, "m")
    m2_upstream = await answering_upstream(hits, "m2")
    try:
        env: Env = await make_env(f"127.0.0.1:{m_upstream.port}", manifests)
        await env.served.endpoint("stub2", "m2", f"127.0.0.1:{m2_upstream.port}", pod="stub2-0", queued=0)
        yield env, hits
    finally:
        await m_upstream.close()
        await m2_upstream.close()


async def cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel the requests still under way and wait for them to end."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_request_for_an_idle_model_is_not_shed_behind_waiters_for_a_saturated_one(make_env: Any) -> None:
    """Pool with two models: m's only endpoint is saturated, m2's is idle.
    Two requests for m fill the queue (maxQueued 2). A request for m2 routes
    at once, but ``waiting_at_or_above`` only looks at priorities, so it
    "joins the line" behind requests that wait for another model, finds the
    queue full and is shed with 429, while m2's endpoint sits idle (the
    placement it passes on goes to m waiters that cannot use it). The
    flow.py docstring promises "the number of requests placed is the same
    as if it had gone straight through"; before this change it got 200.
    Expected: 200 from m2's endpoint."""
    waiters: list[asyncio.Task[Any]] = []
    async with two_model_env(make_env) as (env, hits):
        try:
            assert (await ask(env, "warm-up", "m2"))[0] == 200  # m2 is idle and routes while nobody waits
            waiters = [asyncio.create_task(ask(env, f"for m {i}")) for i in range(2)]
            await until(lambda: len(env.router.flow) == 2)
            status, body = await ask(env, "for m2", "m2")
            assert status == 200, body
            assert hits == ["m2", "m2"]
        finally:
            await cancel_all(waiters)


async def test_a_request_for_an_idle_model_behind_waiters_for_a_saturated_one_still_routes(make_env: Any) -> None:  # guard
    """Same pool, queue not full: the m2 request queues with its placement, the
    m waiter's turn finds no capacity, and the placement reaches the m2 request."""
    async with two_model_env(make_env) as (env, hits):
        waiter = asyncio.create_task(ask(env, "for m"))
        try:
            await until(lambda: len(env.router.flow) == 1)
            status, body = await asyncio.wait_for(ask(env, "for m2", "m2"), 3)
            assert status == 200, body
            assert hits == ["m2"] and len(env.router.flow) == 1
        finally:
            await cancel_all([waiter])


# ------------------------------------------------------------ http server


class Stream:
    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.error: BaseException | None = None
        self.finished = False


def stream_routes(st: Stream) -> dict[str, Any]:
    async def write_after_reset(req: Request) -> None:
        req._conn.transport.pause_reading()  # type: ignore[union-attr]  # only a write sees the reset
        req.start_stream(200, [])
        st.started.set()
        await st.release.wait()
        try:
            for _ in range(1000):
                await req.write(b"x" * 1024)
        except BaseException as exc:
            st.error = exc
            raise

    async def slow_stream(req: Request) -> None:
        req.start_stream(200, [("Content-Type", "text/event-stream")])
        st.started.set()
        await st.release.wait()
        for i in range(5):
            await req.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.05)
        req.end_stream()
        st.finished = True

    return {"/write-after-reset": {"GET": write_after_reset}, "/slow-stream": {"GET": slow_stream}}


@pytest.fixture
async def stream_server() -> AsyncIterator[tuple[HttpServer, Stream]]:
    st = Stream()
    s = HttpServer(stream_routes(st))
    await s.start("127.0.0.1", 0)
    try:
        yield s, st
    finally:
        st.release.set()
        await s.close(grace=0.5)


async def test_a_client_reset_mid_stream_is_not_logged_as_a_handler_failure(
        stream_server: tuple[HttpServer, Stream]) -> None:
    """write() now raises ConnectionResetError as soon as the transport is
    closing, i.e. before ``connection_lost`` has run. The exception reaches
    ``_Connection._run`` while ``self.transport`` is still set, so a client
    that simply went away mid-stream is logged at error level as "handler
    failed" (the router's ``_send`` re-raises ConnectionResetError as it
    should). Before the change the task was cancelled by ``connection_lost``
    and nothing was logged. Expected: no error-level "handler failed" for a
    client that reset its connection (the "no client" debug line at most)."""
    server, st = stream_server
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /write-after-reset HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.transport.abort()  # RST
    await asyncio.sleep(0.2)
    with structlog.testing.capture_logs() as logs:
        st.release.set()
        await until(lambda: st.error is not None, 5)
        await until(lambda: not server.connections, 5)
    assert isinstance(st.error, ConnectionResetError), st.error
    errors = [e for e in logs if e.get("log_level") == "error"]
    assert errors == [], errors


async def test_a_stream_under_way_finishes_within_a_graceful_close(stream_server: tuple[HttpServer, Stream]) -> None:  # guard
    """server.close(grace) must not make write() raise on a streaming answer
    under way: its transport is not closed until the handler is done."""
    server, st = stream_server
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /slow-stream HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(st.started.wait(), 5)
    closing = asyncio.create_task(server.close(grace=5.0))
    await asyncio.sleep(0.05)
    st.release.set()
    data = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    await asyncio.wait_for(closing, 8)
    writer.close()
    assert st.finished
    assert data.endswith(b"0\r\n\r\n") and data.count(b"data: ") == 5, data


async def test_a_request_for_an_idle_model_does_not_re_decide_every_waiter_for_another_model(
        make_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same two-model pool, queue large enough (maxQueued 100). 20 requests for
    the saturated model m wait. One request for the idle model m2 routes on
    arrival but, as requests of its priority wait, joins the line with its
    one placement; the dispatcher then gives every m waiter ahead of it a
    turn (a full policy decision each, one loop turn each) before it reaches
    the m2 request. Every request for an idle model now costs O(queue
    length) decisions (up to maxQueued, 1000 by default) and waits that
    long, although none of those waiters can use m2's capacity.
    Expected: the m waiters are not decided again because of an m2 request."""
    manifests = TWO_MODELS.replace("flowControl: {maxQueueWait: 1s, maxQueued: 2}",
                                   "flowControl: {maxQueueWait: 5s, maxQueued: 100}")
    waiters: list[asyncio.Task[Any]] = []
    async with two_model_env(make_env, manifests) as (env, hits):
        try:
            waiters = [asyncio.create_task(ask(env, f"for m {i}")) for i in range(20)]
            await until(lambda: len(env.router.flow) == 20)
            decided: list[str] = []
            real = env.router._decide

            def counting(req: Any, snap: Any, avoid: Any) -> Any:
                decided.append(req.model)
                return real(req, snap, avoid)

            monkeypatch.setattr(env.router, "_decide", counting)
            status, body = await asyncio.wait_for(ask(env, "for m2", "m2"), 5)
            assert status == 200, body
            assert hits == ["m2"]
            # from its arrival to its placement: decided once, nobody else decided
            # (its finishing afterwards frees a slot, which gives waiters turns, as
            # any finished request does)
            upto = decided[:decided.index("m2") + 1]
            assert upto == ["m2"], f"{upto.count('m')} decisions for m waiters because of the m2 request"
        finally:
            await cancel_all(waiters)


async def test_a_newcomer_timed_out_in_the_queue_is_not_published_as_routed(
        make_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like test_flow's newcomer held behind a hanging waiter until
    maxQueueWait, except that capacity for one more comes back shortly
    before the timeout and the dispatcher has not given the newcomer a turn
    yet (the rebuild's wake-up held back, standing in for a rebuild just
    before the timer fires). The client gets 503 no_capacity, but the event
    is "a fresh decision on the state it failed in", which now routes: the
    decision event says ``Routed`` for a request answered 503. Expected: the
    event of a request that timed out in the queue is never ``Routed``."""
    upstream, release = await hanging_upstream()
    first: asyncio.Task[Any] | None = None
    env: Env = await make_env(f"127.0.0.1:{upstream.port}")
    try:
        async with decision_events(env.nc) as events:
            first = asyncio.create_task(post(env.url))
            await until(lambda: len(env.router.flow) == 1)
            monkeypatch.setattr(env.router.keeper, "on_rebuild", lambda: None)
            await env.telemetry(queued=4)  # room for one: the queued request takes it and hangs
            newcomer = asyncio.create_task(post(env.url))
            await until(lambda: len(env.router.flow) == 1
                        and env.router.metrics.inflight.get("Local/stub") == 1)
            await env.telemetry(queued=3)  # room for one more; the queue is not told
            status, body = await asyncio.wait_for(newcomer, 5)
            assert status == 503 and body["error"]["code"] == "no_capacity", body
            mine = await events_for(env.nc, events, body["error"]["decision_id"])
            assert len(mine) == 1, events
            assert mine[0]["outcome"]["type"] != "Routed", mine[0]["outcome"]
    finally:
        release.set()
        if first is not None:
            await asyncio.gather(first, return_exceptions=True)
        await upstream.close()
