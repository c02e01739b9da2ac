"""On the ``make run`` stack's authenticated NATS: the router's user may
create the records stream and publish records, and ``kinfctl replay`` /
``kinfctl audit --since`` read them as the observer, its password found in
``.run-<offset>/nats-auth/`` like ``kinfctl events`` finds it."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import nats

from kinference_common import natsauth, recording
from kinference_router.recording import RecordSettings, ensure_stream
from tests.kinfctl.test_events_credentials import stack  # noqa: F401 - fixture


async def kinfctl(cwd: Path, offset: int, *argv: str) -> tuple[int, str, str]:
    env = {**os.environ, "KINFERENCE_PORT_OFFSET": str(offset)}
    env.pop(natsauth.PASSWORD_ENV, None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kinfctl", *argv, env=env, cwd=cwd,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_router_records_and_the_observer_reads_them(stack: tuple[Path, int]) -> None:  # noqa: F811
    root, offset = stack
    auth = root / f".run-{offset}" / "nats-auth"
    nc = await nats.connect(f"nats://127.0.0.1:{4222 + offset}", user=natsauth.ROUTER,
                            password=(auth / natsauth.ROUTER).read_text().strip(),
                            inbox_prefix=natsauth.inbox_prefix(natsauth.ROUTER))
    try:
        assert await ensure_stream(nc, RecordSettings(max_bytes=1 << 20), attempts=3, wait=0.2)
        assert await ensure_stream(nc, RecordSettings(max_bytes=2 << 20), attempts=3, wait=0.2)  # limits changed
        rec = recording.DecisionRecord(
            decision_id="d" * 32, at=time.time(), router="r", snapshot=1, namespace="default", pool="p",
            request=recording.RecordedRequest(model="m", tags=["pii-confirmed"]),
            outcome=recording.OutcomeTrace(type="Rejected", code="no_capacity", rule="r"))
        # twice, as a router sends again what its stream may have missed while it had no leader
        for _ in range(2):
            await nc.jetstream().publish(recording.subject("default", "p", "decision"), recording.encode(rec))
    finally:
        await nc.close()
    code, out, err = await kinfctl(root, offset, "replay", "--export", "-", "--pool", "default/p")
    assert code == 0, err
    assert "d" * 32 in out and "1 records of default/p" in err
    code, out, err = await kinfctl(root, offset, "audit", "--since", "1h")
    assert code == 0, err
    assert "1 of 1 requests carried a PII tag: 0 kept local, 1 refused" in out
