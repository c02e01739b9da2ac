"""Edge cases of flow control (services/router/flow.py and its use in
app.py), from a review: races between the dispatcher, cancellation and
timeouts, round robin over several passes, counting, and a retry after a
refused connection (which once restarted maxQueueWait; now the wait is one
deadline per request)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kinference_common.natsserver import free_port
from kinference_router.flow import FlowQueue

from .test_flow import (
    MANIFESTS,
    SETTINGS,
    Env,
    Outcome,
    World,
    answering_upstream,
    decision_events,
    post,
    until,
)


# ------------------------------------------------------------------ queue


async def test_round_robin_across_single_slot_passes(queue: FlowQueue) -> None:  # guard
    world = World()
    arrivals = [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c")]
    tasks = [asyncio.create_task(queue.wait(0, f, SETTINGS, world.attempt(n))) for n, f in arrivals]
    await until(lambda: len(queue) == 5)
    for i in range(5):
        world.free = 1
        queue.slot_freed()
        await until(lambda: len(world.placed) == i + 1)
        if i == 0:  # a new flow arrives once a was served (a is at the back by then)
            tasks.append(asyncio.create_task(queue.wait(0, "d", SETTINGS, world.attempt("d1"))))
            await until(lambda: len(queue) == 5)
    world.free = 1
    queue.slot_freed()
    await asyncio.wait_for(asyncio.gather(*tasks), 3)
    # a served -> back of the line: b, c, then a (moved to the back before d arrived), then d
    assert world.placed == ["a1", "b1", "c1", "a2", "d1", "a3"]


async def test_attempt_that_raises_leaves_the_queue_and_the_slot_goes_on(queue: FlowQueue) -> None:  # guard
    world = World()
    depths: dict[int, int] = {}
    q = FlowQueue(on_depth=lambda p, n: depths.__setitem__(p, n))
    q.start()
    try:
        def boom() -> Outcome:
            raise RuntimeError("snapshot vanished")

        bad = asyncio.create_task(q.wait(0, "a", SETTINGS, boom))
        good = asyncio.create_task(q.wait(0, "b", SETTINGS, world.attempt("good")))
        await until(lambda: len(q) == 2)
        world.free = 1
        q.slot_freed()  # one slot: the raising waiter must not swallow it
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(bad, 3)
        await asyncio.wait_for(good, 3)
        assert world.placed == ["good"] and len(q) == 0 and depths == {0: 0}
    finally:
        await q.stop()


async def test_cancelled_waiter_later_in_a_pass_does_not_hang_the_dispatcher(queue: FlowQueue) -> None:  # guard
    world = World()
    tasks: dict[str, asyncio.Task[Any]] = {}

    def r0_attempt() -> Outcome:
        tasks["r1"].cancel()  # r1 goes away while the pass is under way
        return world.attempt("r0")()

    tasks["r0"] = asyncio.create_task(queue.wait(0, "t", SETTINGS, r0_attempt))
    tasks["r1"] = asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt("r1")))
    tasks["r2"] = asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt("r2")))
    await until(lambda: len(queue) == 3)
    queue.capacity_changed()  # everyone; nobody placed
    await until(lambda: world.attempts == ["r0", "r2"])
    world.free = 1
    queue.slot_freed()
    await until(lambda: world.placed == ["r0"])
    world.free = 1
    queue.slot_freed()
    await asyncio.wait_for(tasks["r2"], 3)
    assert len(queue) == 0


async def test_many_freed_slots_while_a_pass_runs_place_that_many(queue: FlowQueue) -> None:  # guard
    world = World()
    tasks = [asyncio.create_task(queue.wait(0, "t", SETTINGS, world.attempt(f"r{i}"))) for i in range(4)]
    await until(lambda: len(queue) == 4)
    world.free = 3
    for _ in range(3):
        queue.slot_freed()
    await until(lambda: len(world.placed) == 3)
    await asyncio.sleep(0.05)
    assert world.placed == ["r0", "r1", "r2"] and world.attempts == ["r0", "r1", "r2"]
    world.free = 1
    queue.slot_freed()
    await asyncio.wait_for(asyncio.gather(*tasks), 3)


# ------------------------------------------------------- through the router


@pytest.fixture
async def make_env(start_pool: Any) -> Callable[[str], Awaitable[Env]]:
    """A router on the saturated flow-control pool of test_flow, its endpoint at ``address``."""
    async def make(address: str) -> Env:
        e = Env(await start_pool(MANIFESTS, "queued"), address)
        await e.telemetry(queued=10)  # saturated
        return e
    return make


async def test_retry_after_connect_failure_does_not_wait_past_max_queue_wait(make_env: Any) -> None:
    # the endpoint refuses connections; maxQueueWait is 1s
    env: Env = await make_env(f"127.0.0.1:{free_port()}")
    started = time.monotonic()
    pending = asyncio.create_task(post(env.url))
    await until(lambda: len(env.router.flow) == 1)
    await asyncio.sleep(0.6)
    await env.telemetry(queued=0)  # placed at ~0.75s, the connection is refused, retried
    await asyncio.sleep(max(0.0, 1.45 - (time.monotonic() - started)))
    # 1.45s after arrival the request has been waiting past its 1s maxQueueWait
    assert pending.done(), (f"still waiting {time.monotonic() - started:.2f}s after arrival "
                            f"(in queue: {len(env.router.flow)})")
    status, body = await asyncio.wait_for(pending, 3)
    assert status in (502, 503), body


async def test_queued_request_is_proxied_on_its_decision_and_counted_once(make_env: Any) -> None:  # guard
    hits: list[str] = []
    old = await answering_upstream(hits, "old")
    new = await answering_upstream(hits, "new")
    try:
        env: Env = await make_env(f"127.0.0.1:{old.port}")
        async with decision_events(env.nc) as events:
            pending = asyncio.create_task(post(env.url))
            await until(lambda: len(env.router.flow) == 1)
            await env.telemetry(queued=0, address=f"127.0.0.1:{new.port}")  # capacity, on a new address
            status, body = await asyncio.wait_for(pending, 3)
            assert status == 200, body
            assert hits == ["new"]
            await asyncio.sleep(0.2)
        assert len(events) == 1 and events[0]["outcome"]["type"] == "Routed", events
        text = env.metrics()
        lines = [ln for ln in text.splitlines() if ln.startswith("kinference_requests_total{")]
        assert len(lines) == 1 and lines[0].endswith(" 1.0") and 'outcome="routed"' in lines[0], lines
        assert 'kinference_queue_depth{pool="default/queued",priority="0"} 0.0' in text
    finally:
        await old.close()
        await new.close()


async def test_client_that_disconnects_while_queued_leaves_the_queue(make_env: Any) -> None:  # guard
    env: Env = await make_env(f"127.0.0.1:{free_port()}")
    pending = asyncio.create_task(post(env.url))
    await until(lambda: len(env.router.flow) == 1)
    pending.cancel()
    await asyncio.gather(pending, return_exceptions=True)
    await until(lambda: len(env.router.flow) == 0, 1.0)  # well before maxQueueWait (1s)
    assert 'kinference_queue_depth{pool="default/queued",priority="0"} 0.0' in env.metrics()
