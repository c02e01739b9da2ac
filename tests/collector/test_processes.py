"""Real processes: the collector's console entry point, and the engine/DCGM simulators."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import pytest

from kinference_simulators.testing import run_simulator

from kinference_collector import pages
from kinference_collector.derive import DeriveConfig
from kinference_collector.discovery import ListDiscovery, Target
from kinference_collector.publish import NatsBus, Publisher
from kinference_collector.service import Collector, CollectorConfig
from kinference_common import natsserver, subjects
from kinference_common.messages import EndpointState

pytestmark = pytest.mark.nats
PATIENCE = 20.0
dec = msgspec.json.Decoder(EndpointState)


async def wait_for_state(kv: Any, key: str, pred: Any) -> EndpointState:
    async with asyncio.timeout(PATIENCE):
        while True:
            try:
                st = dec.decode((await kv.get(key)).value)
                if pred(st):
                    return st
            except Exception:  # not there yet (bucket or key)
                pass
            await asyncio.sleep(0.05)


async def open_kv(nc: Any) -> Any:
    async with asyncio.timeout(PATIENCE):
        while True:
            try:
                return await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
            except Exception:
                await asyncio.sleep(0.05)


async def test_console_entry_point_runs_and_drains_on_sigterm(
    nats_server: Any, page_server: Any, tmp_path: Path
) -> None:
    srv = await page_server(pages.VllmPage(running=2, waiting=5))
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        f"- {{namespace: team, workerSet: llama, pod: llama-0, address: '{srv.address}', model: m}}\n"
    )
    http_port = natsserver.free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinference_collector", "--nats-url", nats_server.url,
         "--endpoints-file", str(endpoints), "--interval", "0.1", "--http-port", str(http_port),
         "--http-host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        nc = await nats.connect(nats_server.url)
        kv = await open_kv(nc)  # the collector created the bucket
        st = await wait_for_state(kv, "endpoint.team.llama.llama-0", lambda s: s.ready)
        assert (st.queued, st.running, st.model) == (5, 2, "m")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{http_port}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{http_port}/metrics") as r:
                text = await r.text()
        assert 'kinference_scrape_seconds_count{target_kind="vllm"}' in text
        assert 'kinference_endpoints{state="ready"} 1.0' in text
        assert "kinference_scrape_errors_total" in text
        await nc.drain()
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 15)
        assert rc == 0
        assert "draining" in (proc.stderr.read() if proc.stderr else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ simulators


async def test_against_engine_and_dcgm_simulators(nats_server: Any) -> None:
    model = "meta-llama/Llama-3.1-8B-Instruct"
    with run_simulator("vllm", "--model", model, "--max-model-len", "8192", "--pod-name", "sim-0",
                       "--seed", "1") as engine_sim:
        engine, eport = engine_sim.proc, engine_sim.port
        engine_url = f"http://127.0.0.1:{eport}"
        with run_simulator("dcgm", "--gpu", f"team/sim-0={engine_url}", "--interval", "0.1") as dcgm_sim:
            dport = dcgm_sim.port
            nc = await nats.connect(nats_server.url)
            bus = NatsBus(nc)
            await bus.start()
            cfg = CollectorConfig(interval=0.1, timeout=0.5, dcgm_interval=0.1,
                                  derive=DeriveConfig(window=5.0, stale_after=1.0))
            c = Collector(cfg, ListDiscovery([
                Target(namespace="team", worker_set="llama", pod="sim-0", address=f"127.0.0.1:{eport}",
                       model=model),
                Target(kind="dcgm", address=f"127.0.0.1:{dport}"),
            ]), Publisher(bus, 1.0))
            await c.start()
            try:
                kv = await nc.jetstream().key_value(subjects.TELEMETRY_BUCKET)
                key = "endpoint.team.llama.sim-0"
                st = await wait_for_state(kv, key, lambda s: s.ready and s.context_window is not None
                                          and s.gpu_utilization is not None)
                assert st.context_window == 8192
                assert st.kv_capacity_tokens and st.kv_capacity_tokens > 0
                assert st.queued == 0 and st.running == 0
                # load: requests complete, so the windowed signals are learned
                async with aiohttp.ClientSession() as http:
                    async def one(i: int) -> None:
                        body = {"model": model, "max_tokens": 8,
                                "messages": [{"role": "user", "content": "shared prefix " * 50 + str(i)}]}
                        async with http.post(f"{engine_url}/v1/chat/completions", json=body) as r:
                            assert r.status == 200
                            await r.read()

                    await asyncio.gather(*(one(i) for i in range(12)))
                st = await wait_for_state(kv, key, lambda s: s.mean_ttft_seconds is not None
                                          and s.prefill_tokens_per_second is not None)
                assert st.mean_ttft_seconds > 0
                assert st.prefill_tokens_per_second > 0
                assert st.prefix_cache_hit_rate is not None
                # the engine dies: stale (errors counted, values kept), then not ready
                engine.kill()
                engine.wait()
                stale = await wait_for_state(kv, key, lambda s: s.scrape_errors >= 2)
                assert stale.kv_capacity_tokens == st.kv_capacity_tokens
                gone = await wait_for_state(kv, key, lambda s: not s.ready)
                assert gone.scrape_errors >= stale.scrape_errors
            finally:
                await c.stop()
                await nc.drain()
