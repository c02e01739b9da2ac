"""DCGM exporter simulator: ``python -m kinference_simulators.dcgm --help``.

``/metrics`` carries dcgm-exporter's default gauges with its labels (``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``, and the Kubernetes mapping ``pod``,
``namespace``, ``container``). One GPU per ``--gpu NAMESPACE/POD=ENGINE_URL``,
driven by that engine simulator's ``GET /sim/state`` (polled every
``--interval`` seconds), plus ``--unassigned`` idle GPUs with empty pod labels.

``POST /sim/xid`` with ``{"gpu": 0, "code": 79}`` (or ``{"pod": "ns/pod"}``)
sets a GPU's last XID error; ``code`` 0 clears it. ``GET /sim/gpus`` lists
the GPUs as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import cli
from .gpu import EngineSample, GpuHardware, GpuReadings, readings, xid_message
from .vllm_metrics import CONTENT_TYPE

log = cli.log

LABELS = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "namespace",
    "pod",
]

#: (name, help, GpuReadings attribute)
GAUGES = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temp_c"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gpu_temp_c"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_pct"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "fb_free_mib"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "fb_used_mib"),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "fb_reserved_mib"),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
        "gr_engine_active",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "tensor_active",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "dram_active",
    ),
)


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    namespace: str
    pod: str
    engine_url: str


def parse_gpu(spec: str) -> GpuAssignment:
    """``NAMESPACE/POD=ENGINE_URL`` -> assignment (ValueError with the reason)."""
    target, sep, url = spec.partition("=")
    ns, slash, pod = target.partition("/")
    if not sep or not slash or not ns or not pod or not url:
        raise ValueError(f"--gpu {spec!r}: expected NAMESPACE/POD=ENGINE_URL")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return GpuAssignment(ns, pod, url.rstrip("/"))


class Gpu:
    def __init__(
        self,
        index: int,
        hostname: str,
        hw: GpuHardware,
        driver: str,
        container: str,
        assignment: GpuAssignment | None,
    ) -> None:
        self.index = index
        self.hw = hw
        self.assignment = assignment
        self.uuid = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}/gpu/{index}"))
        self.labels = [
            str(index),
            self.uuid,
            f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            f"nvidia{index}",
            hw.model_name,
            hostname,
            driver,
            container if assignment else "",
            assignment.namespace if assignment else "",
            assignment.pod if assignment else "",
        ]
        self.prev: EngineSample | None = None
        self.cur: EngineSample | None = None
        self.reachable = False
        self.xid = 0

    def observe(self, sample: EngineSample | None) -> None:
        if sample is None or (self.cur is not None and sample.sim_time < self.cur.sim_time):
            self.prev = None  # engine gone or restarted
        else:
            self.prev = self.cur
        self.cur = sample
        self.reachable = sample is not None

    def readings(self) -> GpuReadings:
        return readings(self.hw, self.prev, self.cur)

    def describe(self) -> dict[str, object]:
        return {
            "gpu": self.index,
            "uuid": self.uuid,
            "namespace": self.assignment.namespace if self.assignment else "",
            "pod": self.assignment.pod if self.assignment else "",
            "engine_url": self.assignment.engine_url if self.assignment else "",
            "reachable": self.reachable,
            "xid": self.xid,
            "util_pct": self.readings().util_pct,
        }


class DcgmCollector(Collector):
    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self.gpus = gpus

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reads = [(g, g.readings()) for g in self.gpus]
        for name, doc, attr in GAUGES:
            fam = GaugeMetricFamily(name, doc, labels=LABELS)
            for g, r in reads:
                fam.add_metric(g.labels, getattr(r, attr))
            yield fam
        fam = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            labels=[*LABELS, "err_code", "err_msg"],
        )
        for g, _ in reads:
            fam.add_metric([*g.labels, str(g.xid), xid_message(g.xid)], g.xid)
        yield fam


class Poller:
    """Samples each assigned GPU's engine ``/sim/state``."""

    def __init__(self, gpus: Sequence[Gpu], session: aiohttp.ClientSession) -> None:
        self.gpus = [g for g in gpus if g.assignment is not None]
        self.session = session
        self._decoder = msgspec.json.Decoder(EngineSample)

    async def _sample(self, gpu: Gpu) -> EngineSample | None:
        assert gpu.assignment is not None
        try:
            async with self.session.get(gpu.assignment.engine_url + "/sim/state") as resp:
                if resp.status != 200:
                    return None
                return self._decoder.decode(await resp.read())
        except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError):
            return None

    async def poll_once(self) -> None:
        samples = await asyncio.gather(*(self._sample(g) for g in self.gpus))
        for g, s in zip(self.gpus, samples, strict=True):
            if g.reachable and s is None:
                log.info("engine_unreachable", gpu=g.index, pod=g.labels[-1])
            g.observe(s)

    async def run(self, interval: float) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(interval)


@dataclass(frozen=True)
class DcgmSimConfig:
    gpus: tuple[GpuAssignment, ...] = ()
    unassigned: int = 1
    hostname: str = "sim-node-0"
    hardware: GpuHardware = field(default_factory=GpuHardware)
    driver_version: str = "550.90.07"
    container: str = "vllm"
    interval: float = 1.0


CONFIG = web.AppKey("config", DcgmSimConfig)
GPUS = web.AppKey("gpus", list[Gpu])
POLLER = web.AppKey("poller", Poller)
REGISTRY = web.AppKey("registry", CollectorRegistry)


async def _poller_ctx(app: web.Application) -> AsyncIterator[None]:
    cfg = app[CONFIG]
    timeout = aiohttp.ClientTimeout(total=max(0.5, min(5.0, cfg.interval * 2)))
    async with aiohttp.ClientSession(timeout=timeout) as session:
        poller = Poller(app[GPUS], session)
        app[POLLER] = poller
        task = asyncio.create_task(poller.run(cfg.interval), name="dcgm-poller")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def make_app(config: DcgmSimConfig) -> web.Application:
    gpus = [
        Gpu(i, config.hostname, config.hardware, config.driver_version, config.container, a)
        for i, a in enumerate([*config.gpus, *([None] * config.unassigned)])
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(gpus))
    app = web.Application()
    app[CONFIG] = config
    app[GPUS] = gpus
    app[REGISTRY] = registry
    app.cleanup_ctx.append(_poller_ctx)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/sim/gpus", _gpus)
    app.router.add_post("/sim/xid", _xid)
    return app


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(request.app[REGISTRY]), headers={"Content-Type": CONTENT_TYPE}
    )


async def _gpus(request: web.Request) -> web.Response:
    return web.json_response([g.describe() for g in request.app[GPUS]])


async def _xid(request: web.Request) -> web.Response:
    try:
        body = await request.json()
        code = int(body.get("code", 79))
    except (ValueError, TypeError, AttributeError):
        return web.json_response({"error": "expected JSON {gpu|pod, code}"}, status=400)
    gpus = request.app[GPUS]
    if "gpu" in body:
        chosen = [g for g in gpus if g.index == body["gpu"]]
    elif "pod" in body:
        chosen = [
            g
            for g in gpus
            if g.assignment and f"{g.assignment.namespace}/{g.assignment.pod}" == body["pod"]
        ]
    else:
        chosen = []
    if not chosen:
        return web.json_response({"error": "no such gpu or pod"}, status=404)
    for g in chosen:
        g.xid = code
        log.info("xid_injected", gpu=g.index, code=code)
    return web.json_response([g.describe() for g in chosen])


# --------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m kinference_simulators.dcgm",
        description="A DCGM exporter simulator whose GPUs follow engine simulators' load.",
    )
    hw = GpuHardware()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9400, help="0 picks a free port (logged)")
    ap.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="NAMESPACE/POD=ENGINE_URL",
        help="a GPU held by that pod, driven by that engine simulator (repeatable)",
    )
    ap.add_argument("--unassigned", type=int, default=1, help="idle GPUs with empty pod labels")
    ap.add_argument("--hostname", default="sim-node-0")
    ap.add_argument("--gpu-model", default=hw.model_name)
    ap.add_argument("--fb-total-mib", type=int, default=hw.fb_total_mib)
    ap.add_argument("--driver-version", default="550.90.07")
    ap.add_argument("--container", default="vllm")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between engine polls")
    cli.add_logging_arguments(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    try:
        gpus = tuple(parse_gpu(s) for s in a.gpu)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    config = DcgmSimConfig(
        gpus=gpus,
        unassigned=a.unassigned,
        hostname=a.hostname,
        hardware=GpuHardware(model_name=a.gpu_model, fb_total_mib=a.fb_total_mib),
        driver_version=a.driver_version,
        container=a.container,
        interval=a.interval,
    )
    cli.run(lambda: make_app(config), a, "dcgm")


if __name__ == "__main__":
    main()
