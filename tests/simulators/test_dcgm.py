"""The DCGM exporter simulator: labels, pod mapping, load from an engine, XID injection."""

from __future__ import annotations

import asyncio

import pytest
from kinference_simulators import dcgm, gpu, vllm
from kinference_simulators.testing import serve
from prometheus_client.parser import text_string_to_metric_families

MODEL = "m"
DEFAULT_GAUGES = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
]


def by_pod(text: str, name: str) -> dict[str, tuple[float, dict[str, str]]]:
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            return {s.labels["pod"]: (s.value, s.labels) for s in fam.samples}
    raise KeyError(name)


# ------------------------------------------------------------------- pure


def test_utilisation_is_busy_time_over_elapsed_time() -> None:
    a = gpu.EngineSample(sim_time=10.0, busy_seconds=2.0, kv_cache_usage=0.0)
    b = gpu.EngineSample(sim_time=12.0, busy_seconds=3.5, kv_cache_usage=0.5)
    assert gpu.utilisation(a, b) == pytest.approx(0.75)
    assert gpu.utilisation(None, b) == 0.0
    assert gpu.utilisation(b, b) == 0.0
    hw = gpu.GpuHardware()
    idle = gpu.readings(hw, None, None)
    busy = gpu.readings(hw, a, b)
    assert idle.util_pct == 0 and busy.util_pct == 75
    assert busy.fb_used_mib > gpu.readings(hw, a, a).fb_used_mib > idle.fb_used_mib == 0
    assert busy.fb_used_mib + busy.fb_free_mib + busy.fb_reserved_mib == hw.fb_total_mib
    assert busy.power_w > idle.power_w and busy.gpu_temp_c > idle.gpu_temp_c
    assert busy.sm_clock_mhz > idle.sm_clock_mhz


def test_parse_gpu_spec() -> None:
    a = dcgm.parse_gpu("default/llama-0=127.0.0.1:8000")
    assert a == dcgm.GpuAssignment("default", "llama-0", "http://127.0.0.1:8000")
    for bad in ("default/llama-0", "llama=http://x", "/p=http://x", "ns/=http://x"):
        with pytest.raises(ValueError):
            dcgm.parse_gpu(bad)


# ------------------------------------------------------------------- HTTP


async def test_labels_pod_mapping_and_unassigned_gpu() -> None:
    cfg = dcgm.DcgmSimConfig(
        gpus=(
            dcgm.GpuAssignment("team-a", "llama-0", "http://127.0.0.1:9"),
            dcgm.GpuAssignment("team-b", "llama-1", "http://127.0.0.1:9"),
        ),
        unassigned=1,
        hostname="node-7",
        interval=3600,
    )
    async with serve(dcgm.make_app(cfg)) as c:
        resp = await c.get("/metrics")
        text = await resp.text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in DEFAULT_GAUGES:
        assert fams[name].type == "gauge", name
        assert len(fams[name].samples) == 3, name
    util = by_pod(text, "DCGM_FI_DEV_GPU_UTIL")
    assert set(util) == {"llama-0", "llama-1", ""}
    labels = util["llama-0"][1]
    assert labels["namespace"] == "team-a" and labels["container"] == "vllm"
    assert labels["Hostname"] == "node-7" and labels["gpu"] == "0" and labels["device"] == "nvidia0"
    assert labels["UUID"].startswith("GPU-") and labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["pci_bus_id"].startswith("00000000:") and labels["DCGM_FI_DRIVER_VERSION"]
    spare = util[""][1]
    assert spare["namespace"] == "" and spare["container"] == "" and spare["gpu"] == "2"
    # no engine answered: idle and empty
    assert util["llama-0"][0] == 0 and by_pod(text, "DCGM_FI_DEV_FB_USED")["llama-0"][0] == 0
    uuids = {v[1]["UUID"] for v in util.values()}
    assert len(uuids) == 3


async def test_gpu_follows_the_engine_load_and_xid_injection() -> None:
    engine_cfg = vllm.VllmSimConfig(
        model=MODEL, speed_profile="fast", max_model_len=4096, pod_name="llama-0"
    )
    async with serve(vllm.make_app(engine_cfg)) as engine:
        url = f"http://127.0.0.1:{engine.port}"
        cfg = dcgm.DcgmSimConfig(gpus=(dcgm.GpuAssignment("ns", "llama-0", url),), interval=3600)
        async with serve(dcgm.make_app(cfg)) as c:
            poller = c.app[dcgm.POLLER]  # type: ignore[index]
            await poller.poll_once()
            idle = await (await c.get("/metrics")).text()
            assert by_pod(idle, "DCGM_FI_DEV_GPU_UTIL")["llama-0"][0] == 0
            idle_fb = by_pod(idle, "DCGM_FI_DEV_FB_USED")["llama-0"][0]
            assert idle_fb > 0  # an engine is up: its weights are resident

            req = asyncio.create_task(
                engine.post(
                    "/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "max_tokens": 3000,
                        "ignore_eos": True,
                        "stream": True,
                        "messages": [{"role": "user", "content": "z" * 2000}],
                    },
                )
            )
            for _ in range(500):
                if (await (await engine.get("/sim/state")).json())["running"]:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the request never ran")
            await poller.poll_once()
            await asyncio.sleep(0.05)
            await poller.poll_once()
            busy = await (await c.get("/metrics")).text()
            req.cancel()
            assert by_pod(busy, "DCGM_FI_DEV_GPU_UTIL")["llama-0"][0] > 0
            assert by_pod(busy, "DCGM_FI_DEV_FB_USED")["llama-0"][0] > idle_fb
            assert (
                by_pod(busy, "DCGM_FI_DEV_POWER_USAGE")["llama-0"][0]
                > by_pod(idle, "DCGM_FI_DEV_POWER_USAGE")["llama-0"][0]
            )

            xid0 = by_pod(busy, "DCGM_FI_DEV_XID_ERRORS")["llama-0"]
            assert xid0[0] == 0 and xid0[1]["err_code"] == "0"
            resp = await c.post("/sim/xid", json={"pod": "ns/llama-0", "code": 79})
            assert resp.status == 200
            text = await (await c.get("/metrics")).text()
            value, labels = by_pod(text, "DCGM_FI_DEV_XID_ERRORS")["llama-0"]
            assert value == 79 and labels["err_code"] == "79"
            assert labels["err_msg"] == "GPU has fallen off the bus"
            assert by_pod(text, "DCGM_FI_DEV_XID_ERRORS")[""][0] == 0
            assert (await c.post("/sim/xid", json={"gpu": 0, "code": 0})).status == 200
            text = await (await c.get("/metrics")).text()
            assert by_pod(text, "DCGM_FI_DEV_XID_ERRORS")["llama-0"][0] == 0
            assert (await c.post("/sim/xid", json={"pod": "ns/none"})).status == 404
            gpus = await (await c.get("/sim/gpus")).json()
            assert gpus[0]["pod"] == "llama-0" and gpus[0]["reachable"] is True
