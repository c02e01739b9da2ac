"""Flow control (services/router/flow.py, RESOURCES.md "Flow control"): the
queue on its own, with decisions made up by the test, then through the
router on a real pool whose only endpoint is saturated."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import nats
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest

from kinference_common import bus, subjects
from kinference_common.compiled import CompiledFlowControl
from kinference_router.app import Router
from kinference_router.flow import FlowQueue, QueueTimeout, Shed

from .manifests import BIG_QUEUES, one_worker_set_pool


@dataclass
class Outcome:
    """What the queue reads of a decision."""

    routed: bool
    code: str | None = None


class World:
    """Capacity the test hands out: each attempt that finds a free slot takes it."""

    def __init__(self) -> None:
        self.free = 0
        self.attempts: list[str] = []
        self.placed: list[str] = []

    def attempt(self, name: str) -> Callable[[], Any]:
        def decide() -> Outcome:
            self.attempts.append(name)
            if self.free > 0:
                self.free -= 1
                self.placed.append(name)
                return Outcome(True)
            return Outcome(False, "no_capacity")
        return decide


SETTINGS = CompiledFlowControl(max_queue_wait_seconds=5.0, max_queued=100)


async def until(cond: Callable[[], bool], wait: float = 3.0) -> None:
    async with asyncio.timeout(wait):
        while not cond():
            await asyncio.sleep(0.005)


async def test_priority_first_then_flows_take_turns(queue: FlowQueue) -> None:
    world = World()
    arrivals = [("low-a", 0, "a"), ("a1", 5, "a"), ("a2", 5, "a"), ("a3", 5, "a"), ("b1", 5, "b"),
                ("high", 9, "c"), ("b2", 5, "b")]
    tasks = [asyncio.create_task(queue.wait(p, flow, SETTINGS, world.attempt(name))) for name, p, flow in arrivals]
    await until(lambda: len(queue) == len(arrivals))
    world.free = len(arrivals)
    queue.capacity_changed()
    await asyncio.wait_for(asyncio.gather(*tasks), 3)
    # priority 9, then priority 5 alternating between flows a and b (oldest first), then 0
    assert world.placed == ["high", "a1", "b1", "a2", "b2", "a3", "low-a"]
    assert len(queue) == 0


async def test_a_freed_slot_places_one_waiter(queue: FlowQueue) -> None:
    world = World()
    tasks = [asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt(f"r{i}"))) for i in range(3)]
    await until(lambda: len(queue) == 3)
    world.free = 1
    queue.slot_freed()
    await until(lambda: world.placed == ["r0"])
    await asyncio.sleep(0.05)
    assert world.attempts == ["r0"]  # nobody else was woken for a single slot
    assert len(queue) == 2
    world.free = 2
    queue.slot_freed()
    queue.slot_freed()
    await asyncio.wait_for(asyncio.gather(*tasks), 3)
    assert world.placed == ["r0", "r1", "r2"]


async def test_a_waiter_still_without_capacity_keeps_its_place(queue: FlowQueue) -> None:
    world = World()
    tasks = [asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt(f"r{i}"))) for i in range(2)]
    await until(lambda: len(queue) == 2)
    queue.capacity_changed()  # a rebuild, but nothing freed
    await until(lambda: len(world.attempts) == 2)
    assert world.placed == [] and len(queue) == 2
    world.free = 2
    queue.capacity_changed()
    await asyncio.wait_for(asyncio.gather(*tasks), 3)
    assert world.placed == ["r0", "r1"]


async def test_another_rejection_leaves_the_queue_with_it(queue: FlowQueue) -> None:
    task = asyncio.create_task(queue.wait(0, "t", SETTINGS, lambda: Outcome(False, "policy_rejected")))
    await until(lambda: len(queue) == 1)
    queue.capacity_changed()
    d = await asyncio.wait_for(task, 3)
    assert d.code == "policy_rejected" and len(queue) == 0


async def test_waiting_ends_at_max_queue_wait(queue: FlowQueue) -> None:
    world = World()
    settings = CompiledFlowControl(max_queue_wait_seconds=0.2, max_queued=10)
    started = time.monotonic()
    with pytest.raises(QueueTimeout):
        await queue.wait(0, "t", settings, world.attempt("r"))
    assert time.monotonic() - started >= 0.19
    assert len(queue) == 0


async def test_a_full_queue_sheds_the_lowest_priority_newest(queue: FlowQueue) -> None:
    world = World()
    settings = CompiledFlowControl(max_queued=3, max_queue_wait_seconds=5.0)
    old_low = asyncio.create_task(queue.wait(1, "t", settings, world.attempt("old-low")))
    await until(lambda: len(queue) == 1)
    new_low = asyncio.create_task(queue.wait(1, "t", settings, world.attempt("new-low")))
    mid = asyncio.create_task(queue.wait(5, "t", settings, world.attempt("mid")))
    await until(lambda: len(queue) == 3)
    # full: an arrival ranking no higher than the lowest waiting is the one shed
    with pytest.raises(Shed):
        await queue.wait(1, "t", settings, world.attempt("arrival-low"))
    # a higher-priority arrival takes the place of the newest lowest-priority waiter
    high = asyncio.create_task(queue.wait(9, "t", settings, world.attempt("high")))
    with pytest.raises(Shed):
        await asyncio.wait_for(new_low, 3)
    await until(lambda: len(queue) == 3)
    world.free = 3
    queue.capacity_changed()
    await asyncio.wait_for(asyncio.gather(old_low, mid, high), 3)
    assert world.placed == ["high", "mid", "old-low"]


async def test_a_client_that_goes_away_leaves_the_queue(queue: FlowQueue) -> None:
    depths: dict[int, int] = {}
    q = FlowQueue(on_depth=lambda p, n: depths.__setitem__(p, n))
    q.start()
    try:
        world = World()
        task = asyncio.create_task(q.wait(3, "t", SETTINGS, world.attempt("r")))
        await until(lambda: len(q) == 1)
        assert depths == {3: 1}
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(q) == 0 and depths == {3: 0}
        q.capacity_changed()  # nothing left to wake; must not fail
        await asyncio.sleep(0.02)
        assert world.attempts == []
    finally:
        await q.stop()


async def test_an_arrival_that_could_route_does_not_overtake_the_waiters(queue: FlowQueue) -> None:
    world = World()
    waiters = [asyncio.create_task(queue.wait(5, "t", SETTINGS, world.attempt(f"r{i}"))) for i in range(2)]
    await until(lambda: len(queue) == 2)
    assert queue.waiting_at_or_above(5, "") and queue.waiting_at_or_above(0, "") and not queue.waiting_at_or_above(6, "")
    # one slot came free and a newcomer saw it before the dispatcher's turn:
    # it queues, and the slot goes to the first in line
    world.free = 1
    arrival = asyncio.create_task(queue.wait(5, "new", SETTINGS, world.attempt("arrival"), capacity_seen=True))
    await until(lambda: world.placed == ["r0"])
    await asyncio.sleep(0.05)
    assert world.attempts == ["r0"] and len(queue) == 2  # one slot, one placement
    world.free = 2
    queue.slot_freed()
    queue.slot_freed()
    await asyncio.wait_for(asyncio.gather(*waiters, arrival), 3)
    # then flows take turns: flow t was just served, so the arrival's flow goes first
    assert world.placed == ["r0", "arrival", "r1"]


async def test_an_arrival_shed_from_a_full_queue_passes_the_capacity_it_saw_on(queue: FlowQueue) -> None:
    world = World()
    settings = CompiledFlowControl(max_queued=1, max_queue_wait_seconds=5.0)
    waiter = asyncio.create_task(queue.wait(0, "t", settings, world.attempt("waiter")))
    await until(lambda: len(queue) == 1)
    world.free = 1
    with pytest.raises(Shed):
        await queue.wait(0, "t", settings, world.attempt("arrival"), capacity_seen=True)
    await asyncio.wait_for(waiter, 3)
    assert world.placed == ["waiter"]


# ------------------------------------------------------- through the router

MANIFESTS = one_worker_set_pool("queued", policy="local-with-headroom", rule="local-unless-queued",
                                exclude=BIG_QUEUES, flow_control="{maxQueueWait: 1s, maxQueued: 2}")

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


class Env:
    """The pool served (tests/router/conftest.py) and the stub endpoint's address."""

    def __init__(self, served: Any, address: str) -> None:
        self.served, self.address = served, address
        self.router: Router = served.router
        self.nc: nats.NATS = served.nc
        self.url: str = served.url

    async def telemetry(self, queued: int, address: str | None = None) -> None:
        await self.served.endpoint("stub", "m", address or self.address, queued=queued)

    def metrics(self) -> str:
        return generate_latest(self.router.metrics.registry).decode()


COMPLETION = {"id": "x", "object": "chat.completion", "choices": [],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


async def stub_upstream(handler: Callable[[web.Request], Awaitable[web.Response]]) -> TestServer:
    """A stub endpoint whose chat completions ``handler`` answers."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def answering_upstream(hits: list[str] | None = None, name: str = "") -> TestServer:
    """A stub endpoint that answers every chat completion at once (and notes it in ``hits``)."""
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        if hits is not None:
            hits.append(name)
        return web.json_response(COMPLETION)

    return await stub_upstream(answer)


async def hanging_upstream() -> tuple[TestServer, asyncio.Event]:
    """A stub endpoint whose chat completions hang until the returned event is set."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response(COMPLETION)

    return await stub_upstream(hang), release


@pytest.fixture
async def env(start_pool: Any) -> AsyncIterator[Env]:
    upstream = await answering_upstream()
    served = await start_pool(MANIFESTS, "queued")
    assert served.router.keeper.pool is not None and served.router.keeper.pool.flow_control is not None
    e = Env(served, f"127.0.0.1:{upstream.port}")
    await e.telemetry(queued=10)  # saturated: every candidate excluded
    try:
        yield e
    finally:
        await upstream.close()


async def post(url: str, body: dict[str, Any] = BODY, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body, **kwargs) as r:
            return r.status, json.loads(await r.read())


def ask(env: Env, content: str, model: str = "m") -> Awaitable[tuple[int, dict[str, Any]]]:
    """Post a chat completion for ``model`` with one user message, ``content``."""
    return post(env.url, body={"model": model, "messages": [{"role": "user", "content": content}]})


@asynccontextmanager
async def decision_events(nc: nats.NATS) -> AsyncIterator[list[dict[str, Any]]]:
    """The decision events of the pool default/queued, collected while the block runs."""
    events: list[dict[str, Any]] = []

    async def on_event(msg: Any) -> None:
        events.append(json.loads(msg.data))

    sub = await nc.subscribe(subjects.decisions_subject("default", "queued"), cb=on_event)
    try:
        await bus.sync(nc)
        yield events
    finally:
        await sub.unsubscribe()


async def events_for(
        nc: nats.NATS, events: list[dict[str, Any]], decision_id: str) -> list[dict[str, Any]]:
    """The events for ``decision_id``, once the events under way have arrived."""
    await bus.sync(nc)
    await asyncio.sleep(0.2)
    return [e for e in events if e["decision_id"] == decision_id]


async def test_a_request_waits_for_capacity_instead_of_failing(env: Env) -> None:
    pending = asyncio.create_task(post(env.url))
    await until(lambda: len(env.router.flow) == 1)
    assert not pending.done()
    await env.telemetry(queued=0)  # capacity is back
    status, body = await asyncio.wait_for(pending, 3)
    assert status == 200, body
    assert len(env.router.flow) == 0


async def test_no_capacity_at_max_queue_wait_and_shedding_when_full(env: Env) -> None:
    first = asyncio.create_task(post(env.url))
    second = asyncio.create_task(post(env.url))
    await until(lambda: len(env.router.flow) == 2)
    status, body = await post(env.url)  # the queue holds 2: the newest of equal priority is shed
    assert status == 429 and body["error"]["code"] == "rate_limited", body
    for task in (first, second):
        status, body = await asyncio.wait_for(task, 3)
        assert status == 503 and body["error"]["code"] == "no_capacity", body
        assert "maxQueueWait" in body["error"]["message"]
    metrics = await env.router.metrics_page(None)  # type: ignore[arg-type]
    assert b'kinference_queue_depth{pool="default/queued",priority="0"} 0.0' in metrics.body


async def test_a_newcomer_does_not_overtake_a_queued_request(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Capacity comes back but the dispatcher has not had its turn yet (here:
    a rebuild that wakes nobody); a request arriving then queues behind the
    waiter and brings its capacity with it, so the waiter is answered first."""
    order: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        order.append((await request.json())["messages"][0]["content"])
        return web.json_response(COMPLETION)

    upstream = await stub_upstream(answer)
    try:
        await env.telemetry(queued=10, address=f"127.0.0.1:{upstream.port}")  # saturated
        first = asyncio.create_task(ask(env, "queued first"))
        await until(lambda: len(env.router.flow) == 1)
        monkeypatch.setattr(env.router.keeper, "on_rebuild", lambda: None)
        await env.telemetry(queued=0, address=f"127.0.0.1:{upstream.port}")  # capacity is back
        assert len(env.router.flow) == 1  # and nobody told the queue
        status, body = await ask(env, "arrived later")
        assert status == 200, body
        assert (await asyncio.wait_for(first, 3))[0] == 200
        assert order == ["queued first", "arrived later"]
    finally:
        await upstream.close()


async def test_a_newcomer_held_behind_a_waiter_until_max_queue_wait_is_published_as_rejected(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newcomer could route when it arrived, but the capacity went to the
    request queued before it, which never finishes. At maxQueueWait it gets
    503, and its decision event says no_capacity, not the pick it never got."""
    upstream, release = await hanging_upstream()
    first: asyncio.Task[Any] | None = None
    try:
        async with decision_events(env.nc) as events:
            await env.telemetry(queued=10, address=f"127.0.0.1:{upstream.port}")  # saturated
            first = asyncio.create_task(post(env.url))
            await until(lambda: len(env.router.flow) == 1)
            monkeypatch.setattr(env.router.keeper, "on_rebuild", lambda: None)
            # capacity for one more: the queued request takes it and then hangs
            await env.telemetry(queued=4, address=f"127.0.0.1:{upstream.port}")
            status, body = await post(env.url)
            assert status == 503 and body["error"]["code"] == "no_capacity", body
            assert "maxQueueWait" in body["error"]["message"]
            assert not first.done()  # placed, and still waiting for its answer
            mine = await events_for(env.nc, events, body["error"]["decision_id"])
            assert len(mine) == 1 and mine[0]["outcome"]["type"] != "Routed", events
    finally:
        release.set()
        if first is not None:
            await asyncio.gather(first, return_exceptions=True)
        await upstream.close()
