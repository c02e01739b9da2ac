"""``make run`` as a supervisor: a dead process is restarted with backoff and
the restart is said; stopping still stops everything. And its port layout:
two stacks whose offsets are different multiples of 100 never share a port."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from kinference_simulators.stack import PORTS, Proc, Stack


def test_offsets_that_are_multiples_of_100_never_collide() -> None:
    stacks = {offset: set(Stack(Path("/nonexistent"), offset)._ports()) for offset in range(0, 56_100, 100)}
    assert all(len(ports) == len(PORTS) for ports in stacks.values())  # no port twice within a stack
    offsets = sorted(stacks)
    for i, a in enumerate(offsets):
        for b in offsets[i + 1:]:
            assert not stacks[a] & stacks[b], (a, b, sorted(stacks[a] & stacks[b]))
    assert max(stacks[50_000]) < 65_536  # the make-run offsets used here stay valid ports
    assert Stack(Path("/x"), 0).port(PORTS["router"]) == 8080  # the README's address is unchanged
    # every option's ports too (Envoy, the NATS cluster and its second collector): none
    # ends in the same two digits as another, so the same rule holds for them
    every = set(Stack(Path("/x"), 0, envoy=True, nats_cluster=True)._ports())
    assert len({p % 100 for p in every}) == len(every), sorted(every)
    assert 9094 in every  # telemetry-collector-1 on a cluster


async def test_a_dead_process_is_restarted_with_backoff_and_stop_stops_it(tmp_path: Path) -> None:
    stack = Stack(tmp_path, 0)
    (tmp_path / "logs").mkdir()
    sleeper = Proc("sleeper", [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"])
    crasher = Proc("crasher", [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"])
    for p in (sleeper, crasher):
        await stack.spawn(p)
        stack.procs.append(p)
    said: list[str] = []
    stop = asyncio.Event()
    task = asyncio.create_task(stack.supervise(stop, initial=0.1, longest=0.4, stable=60,
                                               say=lambda m, **_: said.append(m)))
    try:
        first = sleeper.process
        assert first is not None
        log = tmp_path / "logs" / "sleeper.log"
        async with asyncio.timeout(10):
            while "up" not in log.read_text():
                await asyncio.sleep(0.05)
        await stack.kill("sleeper")  # kill -9
        async with asyncio.timeout(10):
            while sleeper.restarts < 1:
                await asyncio.sleep(0.05)
        assert sleeper.process is not first and sleeper.process.returncode is None  # type: ignore[union-attr]
        async with asyncio.timeout(10):
            while log.read_text().count("up") < 2:  # appended to, not truncated
                await asyncio.sleep(0.05)
        # the crasher keeps dying: each delay doubles, capped
        async with asyncio.timeout(20):
            while crasher.restarts < 4:
                await asyncio.sleep(0.05)
        assert crasher.backoff == 0.4
        # a held process stays down (the chaos suite keeps something down on purpose)
        sleeper.held = True
        await stack.kill("sleeper")
        await asyncio.sleep(0.5)
        assert sleeper.restarts == 1 and sleeper.process.returncode == -signal.SIGKILL  # type: ignore[union-attr]
    finally:
        stop.set()
        await task
        await stack.stop(grace=2)
    assert any(m.startswith("sleeper exited (code -9)") for m in said), said
    assert any("restarted sleeper" in m and "restart #1" in m for m in said), said
    assert any("crasher exited (code 3)" in m and "boom" in m for m in said), said  # with its log's tail
    assert all(p.process is None or p.process.returncode is not None for p in (sleeper, crasher))


async def test_children_are_out_of_the_terminals_process_group(tmp_path: Path) -> None:
    """A Ctrl-C goes to the terminal's foreground process group: the stack's
    children are not in it, so only the stack gets the signal and stops them
    in order (services first, nats-server last)."""
    import os

    stack = Stack(tmp_path, 0)
    (tmp_path / "logs").mkdir()
    child = Proc("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
    await stack.spawn(child)
    stack.procs.append(child)
    try:
        assert child.process is not None
        assert os.getpgid(child.process.pid) != os.getpgrp()
    finally:
        await stack.stop(grace=2)
    assert child.process.returncode is not None
