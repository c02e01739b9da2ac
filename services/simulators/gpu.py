"""What a GPU's DCGM counters read, given the load of the engine on it (pure).

Utilisation is the fraction of simulated time the engine spent in steps
between two samples of its ``/sim/state``. Memory follows the KV cache:
``used = weights + kv_cache_usage * kv_pool`` (weights 20 %, KV pool 70 % of
the framebuffer). A real vLLM pre-allocates its whole pool at start, so its
FB_USED barely moves; the simulator lets memory follow load on purpose, so
that tests can see it change. Power, temperature, clocks and the profiling
ratios are monotone functions of utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass

XID_MESSAGES = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
}


def xid_message(code: int) -> str:
    return XID_MESSAGES.get(code, "Unknown Error")


@dataclass(frozen=True, slots=True)
class GpuHardware:
    model_name: str = "NVIDIA H100 80GB HBM3"
    fb_total_mib: int = 81559
    power_idle_w: float = 70.0
    power_max_w: float = 700.0
    sm_clock_max_mhz: int = 1980
    sm_clock_idle_mhz: int = 345
    mem_clock_mhz: int = 2619

    @property
    def fb_reserved_mib(self) -> int:
        return max(1, round(self.fb_total_mib * 0.006))


@dataclass(frozen=True, slots=True)
class EngineSample:
    sim_time: float
    busy_seconds: float
    kv_cache_usage: float


@dataclass(frozen=True, slots=True)
class GpuReadings:
    util_pct: float
    fb_used_mib: float
    fb_free_mib: float
    fb_reserved_mib: float
    power_w: float
    gpu_temp_c: float
    memory_temp_c: float
    sm_clock_mhz: float
    mem_clock_mhz: float
    gr_engine_active: float
    tensor_active: float
    dram_active: float


def utilisation(prev: EngineSample | None, cur: EngineSample | None) -> float:
    """Busy fraction between two samples, 0..1 (0 without two samples of the same engine)."""
    if prev is None or cur is None:
        return 0.0
    dt = cur.sim_time - prev.sim_time
    if dt <= 0:
        return 0.0
    return min(1.0, max(0.0, (cur.busy_seconds - prev.busy_seconds) / dt))


def readings(hw: GpuHardware, prev: EngineSample | None, cur: EngineSample | None) -> GpuReadings:
    """Counters of a GPU whose engine was sampled ``prev`` then ``cur`` (None: no engine)."""
    util = utilisation(prev, cur)
    reserved = hw.fb_reserved_mib
    usable = hw.fb_total_mib - reserved
    if cur is None:
        used = 0.0
    else:
        kv = min(1.0, max(0.0, cur.kv_cache_usage))
        used = round(usable * (0.2 + 0.7 * kv))
    return GpuReadings(
        util_pct=round(util * 100),
        fb_used_mib=used,
        fb_free_mib=usable - used,
        fb_reserved_mib=reserved,
        power_w=round(hw.power_idle_w + (hw.power_max_w - hw.power_idle_w) * util, 3),
        gpu_temp_c=round(30 + 45 * util),
        memory_temp_c=round(35 + 45 * util),
        sm_clock_mhz=hw.sm_clock_max_mhz if util > 0 else hw.sm_clock_idle_mhz,
        mem_clock_mhz=hw.mem_clock_mhz,
        gr_engine_active=round(util, 6),
        tensor_active=round(util * 0.55, 6),
        dram_active=round(util * 0.45, 6),
    )
