"""Many simulated pods in one process: ``python -m kinference_simulators.fleet --help``.

For scale trials (``make bench-scale``): ``--pods`` engine pods, each with its
own loopback address (``127.1.0.1``, ``127.1.0.2``, ... all on one port, as
pods share a port on their own IPs), serving a vLLM V1 ``/metrics`` page and
``/v1/models``, and one DCGM exporter per ``--gpus-per-node`` pods (a node)
on ``127.2.0.x``, its GPUs labelled with those pods. Linux routes all of
127.0.0.0/8 to the loopback interface, so nothing needs configuring.

Cheap by construction: each page is rendered once by the simulators' real
renderers (:mod:`.vllm_metrics`, :mod:`.dcgm`: every family, label and
bucket a real page has) and turned into a template whose moving numbers
(running, waiting, KV use, the counters and sums the collector derives rates
from) are slots; a pod's load moves every ``--change-interval`` seconds and
only then is its page filled again. A node's exporter page follows its pods'
loads once per ``--dcgm-collect-interval`` (30 s, dcgm-exporter's default
collection interval) and serves the same page in between, as dcgm-exporter
does. Pages are served by a minimal HTTP/1.1
keep-alive server (an :class:`asyncio.Protocol`, no framework), so one core
serves thousands of scrapes a second.

Control (``--host``/``--port``, aiohttp): ``GET /sim/targets`` lists the pods
and exporters in the collector's endpoint-file format; ``POST
/sim/set?pod=NAME&waiting=K`` sets a pod's queue now and pins it there (the
answer carries the wall time its page changed); ``GET /sim/scrapes`` counts
the requests each pod and exporter answered.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from kinference_common import logs
from kinference_common.tasks import cancel_and_wait

from . import cli
from .dcgm import DcgmCollector, Gpu, GpuAssignment
from .gpu import GpuHardware
from .vllm_metrics import EngineMetrics

log = cli.log

#: vLLM series whose value a pod's load moves (the rest of the page is fixed)
VLLM_SLOTS = (
    b"vllm:num_requests_running", b"vllm:num_requests_waiting", b"vllm:kv_cache_usage_perc",
    b"vllm:prefix_cache_queries_total", b"vllm:prefix_cache_hits_total", b"vllm:prompt_tokens_total",
    b"vllm:generation_tokens_total", b"vllm:time_to_first_token_seconds_sum",
    b"vllm:time_to_first_token_seconds_count", b"vllm:request_queue_time_seconds_sum",
    b"vllm:request_queue_time_seconds_count", b"vllm:request_prefill_time_seconds_sum",
    b"vllm:request_prefill_time_seconds_count", b"vllm:request_prefill_kv_computed_tokens_sum",
    b"vllm:request_prefill_kv_computed_tokens_count",
)
DCGM_SLOTS = (b"DCGM_FI_DEV_GPU_UTIL", b"DCGM_FI_DEV_FB_USED", b"DCGM_FI_DEV_FB_FREE")


class Template:
    """A rendered exposition page with the values of some series cut out.

    ``slots[i]`` is ``(metric name, occurrence)`` of the i-th cut value, in
    page order; :meth:`fill` puts values back (``values[i]`` for slot i)."""

    def __init__(self, page: bytes, names: Sequence[bytes]) -> None:
        wanted = set(names)
        self.parts: list[bytes] = []
        self.slots: list[tuple[bytes, int]] = []
        seen: dict[bytes, int] = {}
        pending: list[bytes] = []
        for line in page.splitlines(keepends=True):
            name = line.split(b"{", 1)[0].split(b" ", 1)[0]
            if line.startswith(b"#") or name not in wanted:
                pending.append(line)
                continue
            head = line.rstrip(b"\n").rsplit(b" ", 1)[0]
            pending.append(head + b" ")
            self.parts.append(b"".join(pending))
            pending = [b"\n"]
            n = seen.get(name, 0)
            seen[name] = n + 1
            self.slots.append((name, n))
        self.tail = b"".join(pending)

    def index(self, name: bytes, occurrence: int = 0) -> int:
        return self.slots.index((name, occurrence))

    def fill(self, values: Sequence[float]) -> bytes:
        out: list[bytes] = []
        for part, v in zip(self.parts, values, strict=True):
            out.append(part)
            out.append(repr(float(v)).encode())
        out.append(self.tail)
        return b"".join(out)


def vllm_template(model: str, max_model_len: int) -> Template:
    m = EngineMetrics(model_name=model, max_model_len=max_model_len, cache_info={
        "block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9", "num_cpu_blocks": "None", "num_gpu_blocks": "8192",
        "kv_cache_size_tokens": "131072", "prefix_caching_hash_algo": "sha256"}, profile="h100")
    m.engine("0")
    return Template(m.render(), VLLM_SLOTS)


def dcgm_template(node: str, pods: Sequence[tuple[str, str]], hw: GpuHardware) -> Template:
    gpus = [Gpu(i, node, hw, "550.90.07", "vllm", GpuAssignment(ns, pod, ""))
            for i, (ns, pod) in enumerate(pods)]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DcgmCollector(gpus))
    return Template(generate_latest(registry), DCGM_SLOTS)


@dataclass(slots=True)
class PodLoad:
    """One simulated engine's numbers; :meth:`step` moves them on."""

    rate: float
    running: int = 0
    waiting: int = 0
    kv: float = 0.0
    requests: float = 0.0
    prompt: float = 0.0
    hits: float = 0.0
    generated: float = 0.0
    ttft_sum: float = 0.0
    queue_sum: float = 0.0
    prefill_sum: float = 0.0
    #: set by ``/sim/set``: the queue stays there until the next set
    pinned_waiting: int | None = None

    def step(self, dt: float, rnd: random.Random) -> None:
        n = max(0.0, rnd.gauss(self.rate * dt, (self.rate * dt) ** 0.5))
        prompt = n * rnd.uniform(300, 3000)
        hit = rnd.uniform(0.1, 0.7)
        self.requests += n
        self.prompt += prompt
        self.hits += prompt * hit
        self.generated += n * 200
        self.ttft_sum += n * rnd.uniform(0.05, 0.4)
        self.queue_sum += n * rnd.uniform(0.0, 0.05)
        self.prefill_sum += n * rnd.uniform(0.02, 0.2)
        self.running = min(256, int(rnd.gauss(self.rate * 4, 2)) if self.rate else 0)
        self.running = max(0, self.running)
        self.waiting = self.pinned_waiting if self.pinned_waiting is not None else max(0, int(rnd.gauss(1, 2)))
        self.kv = min(1.0, self.running / 256 + rnd.uniform(0, 0.05))

    def values(self) -> list[float]:
        miss = self.prompt - self.hits
        return [self.running, self.waiting, self.kv, self.prompt, self.hits, self.prompt, self.generated,
                self.ttft_sum, self.requests, self.queue_sum, self.requests, self.prefill_sum, self.requests,
                miss, self.requests]


@dataclass(slots=True)
class Served:
    """What one address serves: its page, and how often it was asked."""

    name: str
    page: bytes = b""
    models: bytes = b""
    scrapes: int = 0


class _Http(asyncio.Protocol):
    """HTTP/1.1 keep-alive, GET only, just enough for scrapers."""

    __slots__ = ("served", "transport", "buf")

    def __init__(self, served: Served) -> None:
        self.served = served
        self.transport: asyncio.Transport | None = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > 16384:
                    self._answer(b"431 Request Header Fields Too Large", b"", close=True)
                return
            head, self.buf = self.buf[:end], self.buf[end + 4:]
            line = head.split(b"\r\n", 1)[0].split(b" ")
            if len(line) != 3 or line[0] != b"GET":
                self._answer(b"405 Method Not Allowed", b"", close=True)
                return
            path = line[1].split(b"?", 1)[0]
            s = self.served
            if path == b"/metrics":
                s.scrapes += 1
                self._answer(b"200 OK", s.page)
            elif path == b"/v1/models" and s.models:
                self._answer(b"200 OK", s.models, b"application/json")
            elif path == b"/health":
                self._answer(b"200 OK", b"")
            else:
                self._answer(b"404 Not Found", b"")

    def _answer(self, status: bytes, body: bytes, ctype: bytes = b"text/plain; version=0.0.4",
                close: bool = False) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                             + str(len(body)).encode() + (b"\r\nConnection: close" if close else b"")
                             + b"\r\n\r\n" + body)
        if close:
            self.transport.close()


def address(base: str, i: int) -> str:
    """The i-th address from ``base``, skipping .0 and .255 of each /24."""
    a = int(ipaddress.IPv4Address(base)) + (i // 254) * 256 + i % 254
    return str(ipaddress.IPv4Address(a))


@dataclass
class FleetConfig:
    pods: int = 100
    gpus_per_node: int = 8
    namespace: str = "fleet"
    worker_set: str = "sim"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    max_model_len: int = 8192
    pod_net: str = "127.1.0.1"
    dcgm_net: str = "127.2.0.1"
    #: 0: a free port, the same on every address
    pod_port: int = 0
    dcgm_port: int = 0
    change_interval: float = 1.0
    #: seconds between two collections of a node's exporter, which serves the
    #: last one until the next (dcgm-exporter's --collect-interval, 30 s by
    #: default); 0: the page follows every move of its pods' load
    dcgm_collect_interval: float = 30.0
    seed: int = 0
    hardware: GpuHardware = field(default_factory=GpuHardware)


class Fleet:
    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        self.rnd = random.Random(cfg.seed)
        self.vllm = vllm_template(cfg.model, cfg.max_model_len)
        self.loads = [PodLoad(rate=self.rnd.uniform(0.5, 5.0)) for _ in range(cfg.pods)]
        self.pods = [Served(f"{cfg.worker_set}-{i}") for i in range(cfg.pods)]
        models = (b'{"object":"list","data":[{"id":"' + cfg.model.encode() + b'","object":"model","max_model_len":'
                  + str(cfg.max_model_len).encode() + b"}]}")
        for p in self.pods:
            p.models = models
        per = max(1, cfg.gpus_per_node)
        self.nodes: list[Served] = []
        self.dcgm: list[Template] = []
        for j in range(0, cfg.pods, per):
            held = [(cfg.namespace, self.pods[k].name) for k in range(j, min(cfg.pods, j + per))]
            self.nodes.append(Served(f"node-{j // per}"))
            self.dcgm.append(dcgm_template(f"node-{j // per}", held, cfg.hardware))
        for i in range(cfg.pods):
            self.loads[i].step(1.0, self.rnd)
            self.render(i)
        for j in range(len(self.nodes)):
            self.render_node(j)
        self.pod_addresses: list[str] = []
        self.dcgm_addresses: list[str] = []
        self._servers: list[asyncio.base_events.Server] = []

    def render(self, i: int) -> None:
        self.pods[i].page = self.vllm.fill(self.loads[i].values())

    def render_node(self, j: int) -> None:
        per = max(1, self.cfg.gpus_per_node)
        held = self.loads[j * per:(j + 1) * per]
        hw = self.cfg.hardware
        used = [hw.fb_total_mib * (0.2 + 0.7 * ld.kv) for ld in held]
        by_name = {b"DCGM_FI_DEV_GPU_UTIL": [min(100.0, ld.running / 2.56) for ld in held],
                   b"DCGM_FI_DEV_FB_USED": used, b"DCGM_FI_DEV_FB_FREE": [hw.fb_total_mib - u for u in used]}
        t = self.dcgm[j]
        self.nodes[j].page = t.fill([by_name[name][k] for name, k in t.slots])

    async def _bind(self, served: Sequence[Served], net: str, port: int) -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        out: list[str] = []
        for i, s in enumerate(served):
            host = address(net, i)
            srv = await loop.create_server(lambda s=s: _Http(s), host, port, reuse_address=True, backlog=64)
            if port == 0:
                port = srv.sockets[0].getsockname()[1]
            self._servers.append(srv)
            out.append(f"{host}:{port}")
        return out, port

    async def start(self) -> None:
        self.pod_addresses, self.pod_port = await self._bind(self.pods, self.cfg.pod_net, self.cfg.pod_port)
        self.dcgm_addresses, self.dcgm_port = await self._bind(self.nodes, self.cfg.dcgm_net, self.cfg.dcgm_port)

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
        self._servers.clear()

    async def run(self) -> None:
        """Move every pod's load once per ``change_interval``, spread over it."""
        n = len(self.pods)
        if not n or self.cfg.change_interval <= 0:
            await asyncio.Event().wait()
        per = max(1, self.cfg.gpus_per_node)
        tick, batch = _pace(n, self.cfg.change_interval)
        collect = self.cfg.dcgm_collect_interval
        collector = asyncio.create_task(self._collect_nodes(collect), name="fleet-dcgm-collect") \
            if collect > 0 and self.nodes else None
        i = 0
        try:
            while True:
                await asyncio.sleep(tick)
                for _ in range(batch):
                    self.loads[i].step(self.cfg.change_interval, self.rnd)
                    self.render(i)
                    if collect <= 0 and (i % per == per - 1 or i == n - 1):
                        self.render_node(i // per)
                    i = (i + 1) % n
        finally:
            if collector is not None:
                await cancel_and_wait(collector)

    async def _collect_nodes(self, every: float) -> None:
        """Each node's exporter collects once per ``every`` seconds, spread over it."""
        m = len(self.nodes)
        tick, batch = _pace(m, every)
        j = 0
        while True:
            await asyncio.sleep(tick)
            for _ in range(batch):
                self.render_node(j)
                j = (j + 1) % m

    # ---------------------------------------------------------------- control

    def targets(self) -> dict[str, object]:
        c = self.cfg
        return {
            "endpoints": [{"namespace": c.namespace, "workerSet": c.worker_set, "pod": p.name, "address": a,
                           "model": c.model} for p, a in zip(self.pods, self.pod_addresses, strict=True)],
            "dcgm": [{"address": a} for a in self.dcgm_addresses],
        }

    async def set_waiting(self, pod: str, waiting: int) -> float:
        i = next((k for k, p in enumerate(self.pods) if p.name == pod), None)
        if i is None:
            raise KeyError(pod)
        self.loads[i].pinned_waiting = waiting
        self.loads[i].waiting = waiting
        self.render(i)
        return time.time()

    def app(self) -> web.Application:
        async def targets(_: web.Request) -> web.Response:
            return web.json_response(self.targets())

        async def set_(req: web.Request) -> web.Response:
            try:
                waiting = int(req.query["waiting"])
                at = await self.set_waiting(req.query["pod"], waiting)
            except (KeyError, ValueError):
                return web.json_response({"error": "expected ?pod=NAME&waiting=INT naming a pod of the fleet"},
                                         status=400)
            return web.json_response({"at": at})

        async def scrapes(_: web.Request) -> web.Response:
            return web.json_response({"pods": {p.name: p.scrapes for p in self.pods},
                                      "dcgm": {a: n.scrapes for a, n in zip(self.dcgm_addresses, self.nodes,
                                                                            strict=True)}})

        app = web.Application()
        app.router.add_get("/sim/targets", targets)
        app.router.add_post("/sim/set", set_)
        app.router.add_get("/sim/scrapes", scrapes)
        return app


def _pace(n: int, every: float) -> tuple[float, int]:
    """``(tick, batch)``: ``batch`` of ``n`` items every ``tick`` seconds goes
    through all of them once per ``every`` seconds, spread evenly."""
    tick = max(0.01, every / n)
    return tick, max(1, round(n * tick / every))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = FleetConfig()
    ap = argparse.ArgumentParser(prog="python -m kinference_simulators.fleet",
                                 description="Many simulated vLLM pods and their DCGM exporters in one process.")
    ap.add_argument("--host", default="127.0.0.1", help="address of the control API (default %(default)s)")
    ap.add_argument("--port", type=int, default=8700, help="port of the control API; 0 picks a free one (logged)")
    ap.add_argument("--pods", type=int, default=d.pods, help="engine pods (default %(default)s)")
    ap.add_argument("--gpus-per-node", type=int, default=d.gpus_per_node,
                    help="pods per DCGM exporter (one exporter per node; default %(default)s)")
    ap.add_argument("--namespace", default=d.namespace, help="the pods' namespace (default %(default)s)")
    ap.add_argument("--worker-set", default=d.worker_set, help="their worker set; pods are NAME-0.. (default %(default)s)")
    ap.add_argument("--model", default=d.model, help="the model their pages name (default %(default)s)")
    ap.add_argument("--pod-net", default=d.pod_net, help="first pod address (default %(default)s)")
    ap.add_argument("--dcgm-net", default=d.dcgm_net, help="first DCGM exporter address (default %(default)s)")
    ap.add_argument("--pod-port", type=int, default=0, help="the pods' port; 0 = a free one (default)")
    ap.add_argument("--dcgm-port", type=int, default=0, help="the exporters' port; 0 = a free one (default)")
    ap.add_argument("--change-interval", type=float, default=d.change_interval,
                    help="seconds between two moves of one pod's load (default %(default)s; 0 = never)")
    ap.add_argument("--dcgm-collect-interval", type=float, default=d.dcgm_collect_interval,
                    help="seconds between two collections of a node's DCGM exporter, which serves the last one "
                         "in between (dcgm-exporter's --collect-interval; default %(default)s; 0 = the page "
                         "follows every move of its pods' load)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the pods' load (default 0)")
    cli.add_logging_arguments(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    if a.pods < 0 or a.gpus_per_node < 1:
        raise SystemExit("error: --pods must be >= 0 and --gpus-per-node >= 1")
    try:
        ipaddress.IPv4Address(a.pod_net), ipaddress.IPv4Address(a.dcgm_net)
    except ValueError as exc:
        raise SystemExit(f"error: --pod-net/--dcgm-net: {exc}") from None
    cfg = FleetConfig(pods=a.pods, gpus_per_node=a.gpus_per_node, namespace=a.namespace, worker_set=a.worker_set,
                      model=a.model, pod_net=a.pod_net, dcgm_net=a.dcgm_net, pod_port=a.pod_port,
                      dcgm_port=a.dcgm_port, change_interval=a.change_interval,
                      dcgm_collect_interval=a.dcgm_collect_interval, seed=a.seed)
    fleet = Fleet(cfg)

    async def run() -> None:
        await fleet.start()
        log.info("fleet_serving", pods=len(fleet.pod_addresses), pod_port=fleet.pod_port,
                 dcgm=len(fleet.dcgm_addresses), dcgm_port=fleet.dcgm_port)
        task = asyncio.create_task(fleet.run(), name="fleet-load")
        try:
            await cli.serve(fleet.app(), a.host, a.port, "fleet")
        finally:
            task.cancel()
            await fleet.stop()

    logs.configure(a.log_level, a.log_format)
    asyncio.run(run())


if __name__ == "__main__":
    main()
