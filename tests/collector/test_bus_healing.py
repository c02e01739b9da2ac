"""The collector's console entry point when NATS goes away, comes back, and
comes back with empty storage: the bucket is recreated (said once), states
are published again, and while NATS is down the log holds one line per state
change, not one per retry."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from kinference_collector import pages
from kinference_collector.service import NatsLog
from kinference_common import natsserver, subjects
from kinference_common.messages import EndpointState

pytestmark = pytest.mark.nats
dec = msgspec.json.Decoder(EndpointState)
KEY = "endpoint.team.llama.llama-0"


async def fresh_state(nc: Any, after: float, timeout: float = 20.0) -> EndpointState:
    """The endpoint's state in the KV bucket, scraped after ``after``."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
                st = dec.decode((await kv.get(KEY)).value)
                if st.scraped_at > after:
                    return st
            except Exception:  # bucket or key not there yet
                pass
            await asyncio.sleep(0.1)


async def test_collector_recreates_its_bucket_after_nats_lost_its_storage(
        nats_server: natsserver.NatsServer, page_server: Any, tmp_path: Path) -> None:
    srv = await page_server(pages.VllmPage(running=1, waiting=2))
    endpoints = tmp_path / "endpoints.yaml"
    # several endpoints: their states are sent at once, and the bucket must be recreated once
    endpoints.write_text("".join(
        f"- {{namespace: team, workerSet: llama, pod: llama-{i}, address: '{srv.address}', model: m}}\n"
        for i in range(4)))
    log_path = tmp_path / "collector.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kinference_collector", "--nats-url", nats_server.url,
             "--endpoints-file", str(endpoints), "--interval", "0.1", "--http-port", "0",
             "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=log_file)
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        await fresh_state(nc, 0)
        nats_server.kill()
        await asyncio.sleep(3.0)  # down: the client retries twice a second
        nats_server.restart(wipe=True)
        st = await fresh_state(nc, time.time())
        assert (st.queued, st.running) == (2, 1)
    finally:
        await nc.close()
        proc.terminate()
        proc.wait(timeout=15)
    lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
    events = [x["event"] for x in lines]
    events = events[:events.index("draining")]  # closing the connection at exit is a disconnect too
    assert events.count("telemetry_bucket_recreated") == 1, events
    assert events.count("nats_disconnected") == 1 and events.count("nats_reconnected") == 1, events
    # about 6 retries while down: one line per kind of error (refused, the cut connection, a
    # handshake cut while the server starts), never one per retry, even when kinds alternate
    said = [x["error"] for x in lines[:len(events)] if x["event"] == "nats_error"]
    assert len(said) == len(set(said)) and len(said) <= 3, said
    assert "Traceback" not in log_path.read_text()


def test_nats_log_says_each_change_once_and_summarises_a_long_outage() -> None:
    now = [0.0]
    from structlog.testing import capture_logs

    state = NatsLog("nats://x", summary_every=30.0, clock=lambda: now[0])
    with capture_logs() as logs:
        state.disconnected()
        for _ in range(120):  # a minute of retries twice a second
            now[0] += 0.5
            state.error(ConnectionRefusedError("refused"))
        state.reconnected()
    events = [e["event"] for e in logs]
    assert events == ["nats_disconnected", "nats_error", "nats_still_unavailable", "nats_still_unavailable",
                      "nats_reconnected"], events
    assert logs[-1]["errors"] == 120


def test_nats_log_says_each_kind_once_when_kinds_alternate() -> None:
    """A server coming back cuts a handshake or two between refusals: refused, cut,
    refused, cut is two lines while down, and a new outage says them again."""
    from structlog.testing import capture_logs

    state = NatsLog("nats://x", summary_every=30.0, clock=lambda: 0.0)
    with capture_logs() as logs:
        state.error(EOFError("unexpected EOF"))  # the cut connection, before the disconnect
        state.disconnected()
        for _ in range(3):
            state.error(ConnectionRefusedError("refused"))
            state.error(EOFError("unexpected EOF"))
        state.reconnected()
        state.disconnected()
        state.error(ConnectionRefusedError("refused"))
    said = [(e["event"], e.get("error")) for e in logs if e["event"] == "nats_error"]
    assert said == [("nats_error", "EOFError: unexpected EOF"), ("nats_error", "ConnectionRefusedError: refused"),
                    ("nats_error", "ConnectionRefusedError: refused")], said
