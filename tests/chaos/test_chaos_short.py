"""The chaos suite's short version (``python -m bench.chaos --short``): the
stack as processes, a bounded open-loop load, and every fault once, for a
few seconds each. Invariants: no request hangs, every failure is an HTTP
answer, the stack recovers within the phase, failures stay bounded, and no
marked PII reaches the provider, neither typed into a message nor outside
the messages (the ``user`` field, ``metadata``, tool text, client headers:
docs/hardening.md says what a provider receives)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.chaos import SHORT, faults, free_offset, run_chaos, table

pytestmark = [pytest.mark.slow, pytest.mark.nats, pytest.mark.serial]  # alone: it measures success rates

#: success rate each fault must keep: faults of the control plane and the
#: bus must not show on the data plane; killing pods costs what was on them,
#: a failing provider what was sent to it
FLOOR = {"one pod kill -9 mid-stream": 0.7, "all pods kill -9": 0.3,
         "provider failing (500)": 0.6, "provider hanging": 0.6}


def progress() -> Callable[[str], None]:
    """The run's progress, each line with the seconds since the start: shown
    when the test fails (pytest shows what a failed test printed), so a
    failure says which step it was at."""
    start = time.monotonic()
    return lambda line: print(f"[{time.monotonic() - start:6.1f}s] {line}", flush=True)


@pytest.mark.timeout(400)  # about 85 s here; the suite's 120 s safety net is too close on a busy machine
async def test_short_chaos_suite_keeps_its_invariants(tmp_path: Path) -> None:
    offset = free_offset(random.Random())
    async with asyncio.timeout(360):  # before pytest's: the run says where it was and stops the stack
        results = await run_chaos(SHORT, tmp_path / "run", offset, say=progress())
    print(table(results))
    assert [r.fault for r in results] == [name for name, _ in faults()]
    for r in results:
        assert r.requests >= 20, r
        assert r.hung == 0, r  # nothing waits for the client's deadline
        assert r.no_http_answer == 0, r  # the router always answers (an error in the envelope at worst)
        assert r.recovery_s is not None, r  # the phase ended succeeding
        assert r.pii_leaked_message == 0 and r.pii_leaked_side == 0 and r.pii_leaked == 0, r
        assert r.success_rate >= FLOOR.get(r.fault, 0.8), r
    went = {r.fault: r.went for r in results}
    assert any(k.startswith("Provider/") for k in went["all pods kill -9"]), went  # clean prompts burst


@pytest.mark.timeout(300)
async def test_short_nats_cluster_loses_one_server_and_nothing_else(tmp_path: Path) -> None:
    """The same stack on NATS as a cluster of three (``make run-ha``), under
    the chaos load: the config bucket's leader kill -9'd. Requests keep
    being served, every answered request's decision event arrives, the KV
    probe's acknowledged writes are all there and writes resume, and the
    server rejoins and catches up (``make chaos`` also kills two)."""
    from bench.chaos import ha_faults

    offset = free_offset(random.Random())
    (name, _), *_ = ha_faults()
    async with asyncio.timeout(220):  # before pytest's: the run says where it was and stops the stack
        (r,) = await run_chaos(SHORT, tmp_path / "run", offset, say=progress(), nats_cluster=True, only=[name])
    print(table([r]))
    assert r.requests >= 20 and r.hung == 0 and r.no_http_answer == 0, r
    assert r.success_rate >= 0.8 and r.recovery_s is not None, r
    assert r.decisions_lost == 0 and r.kv_acked_lost == 0 and r.records_lost == 0, r
    assert r.kv_writes_failed is not None and r.kv_longest_unwritable_s is not None, r
    assert r.catchup_s is not None and r.router_said_unavailable <= 1, r
