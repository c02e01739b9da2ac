"""``cancel_and_wait`` ends a task that swallowed its cancel (Python 3.11's
``wait_for`` does so when the result arrives as the cancel does: the
router's event publisher then went back to sleep and its stop waited for
ever)."""

from __future__ import annotations

import asyncio

from kinference_common.tasks import cancel_and_wait


async def test_a_task_that_swallows_its_first_cancel_is_still_stopped() -> None:
    cancels: list[int] = []
    wake = asyncio.Event()

    async def loop() -> None:
        while True:
            try:
                await wake.wait()  # the service's "wait for work"
            except asyncio.CancelledError:
                cancels.append(1)
                if len(cancels) == 1:
                    continue  # swallowed, as wait_for does on 3.11
                raise

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.cancelled() and len(cancels) == 2


async def test_the_cancel_lost_in_wait_for_is_given_again() -> None:
    """The real case: the awaited result and the cancel in one iteration."""
    results: list[str] = []

    async def confirm_forever(futures: asyncio.Queue[asyncio.Future[str]]) -> None:
        while True:
            fut = await futures.get()
            results.append(await asyncio.wait_for(fut, 5))

    futures: asyncio.Queue[asyncio.Future[str]] = asyncio.Queue()
    task = asyncio.create_task(confirm_forever(futures))
    fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    await futures.put(fut)
    await asyncio.sleep(0.01)  # the task waits in wait_for
    fut.set_result("pong")
    stopping = asyncio.create_task(cancel_and_wait(task))
    await asyncio.wait_for(stopping, 5)
    assert task.done()


async def test_finished_none_and_failed_tasks_are_fine() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fail())
    await asyncio.sleep(0)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    await cancel_and_wait(None, failed, done)
    assert failed.done() and done.done()
