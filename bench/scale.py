"""Scale: ``make bench-scale`` (``python -m bench.scale``).

1,000 simulated pods and their DCGM exporters (one process,
:mod:`kinference_simulators.fleet`: a loopback address per pod), scraped by
1, 2 and 4 collector replicas (real ``kinference-telemetry-collector``
processes sharing the fleet through a real nats-server). The machine has two
cores shared with the simulated pods, so each run shows the split and the
cost rather than the whole fleet's rate:

- per replica: targets, scrapes, share of the scrapes, CPU seconds (from
  ``/proc``); per run: scrapes per second, CPU per 1,000 scrapes (all
  replicas together), and the interval each replica count sustains (each
  replica on one core: its share of the pods times its CPU per scrape). In
  each of ``--rounds`` rounds (5) the replica counts run side by side, each
  on a fleet and a nats-server of its own, measured over the same seconds
  (run one after another, one run here moved by up to 45% from the next run
  of the same thing); each count's row is its median run, and the flat-CPU
  goal is judged on each round's own figures. Beside them, in each round, as
  many replicas as the most sharing nothing (each its own nats-server and
  share of the pods): the same work per replica, without replication;
- every pod's scrapes counted by the fleet itself (none missed, none
  scraped twice as often as the interval);
- publish lag to a router (the router's own telemetry follower,
  :class:`kinference_router.state.SnapshotKeeper`, in this process): from a
  page change (``/sim/set``) to the router holding the new state (this
  includes the wait for the next scrape, up to one interval), and from the
  scrape (``scrapedAt``) to the router for every state that arrives changed;
- the router's side at 1,000 endpoints (and 100 and 10,000, to see what
  grows with the pods that did not change): the cost to apply one update
  (the same 100 pods changing at every size, and every pod in turn),
  the snapshot rebuild, memory, and the decision's p99 (:mod:`bench.decision`'s
  workload);
- the API server's side: the collector's informers against the in-repo fake
  API server holding 1,000 engine pods and their exporters, watches cut every
  ``--watch-cut`` seconds (an API server ends every watch within minutes):
  list and watch calls per minute.

Results: a table, ``bench/results/scale.json`` (``rows``: one per run with
``pods``, ``collectors``, ``interval_s``, ``scrapes_per_s``,
``cpu_s_per_1000_scrapes``, ``lag_p50_ms``, ``lag_p99_ms``...), the plot
``docs/img/scale-cpu.png`` (CPU per replica against replicas) and the
``scale:results`` block of ``docs/benchmarks.md``. ``--smoke`` is the
suite's few-second version (no page, no plot written).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import math
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "scale.json"
PAGE = REPO / "docs" / "benchmarks.md"
PLOT = REPO / "docs" / "img" / "scale-cpu.png"
TICK = os.sysconf("SC_CLK_TCK")

#: the goals of issue 19
GOAL_SHARE_DEV = 0.10
GOAL_CPU_FLAT = 0.15
GOAL_LAG_P99_MS = 200.0
GOAL_CORES_1000_AT_100MS = 4.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


_SCRAPES = re.compile(r'^kinference_scrape_seconds_count\{target_kind="(vllm|dcgm)"\} ([0-9.e+]+)$', re.M)
_ENDPOINTS = re.compile(r'^kinference_endpoints\{state="[a-z_]+"\} ([0-9.e+]+)$', re.M)


class Replica:
    """One collector process."""

    def __init__(self, name: str, nats_url: str, endpoints: Path, interval: float, port: int, log: Path) -> None:
        self.name, self.port = name, port
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinference_collector", "--nats-url", nats_url, "--endpoints-file", str(endpoints),
             "--interval", str(interval), "--timeout", str(max(0.5, interval)), "--replica-id", name,
             "--http-host", "127.0.0.1", "--http-port", str(port), "--log-level", "warning",
             "--stale-after", str(max(1.0, 3 * interval)),
             # on two shared cores a replica's event loop can lag past the default
             # 1.5 s TTL, and a replica that looks dead hands its share to the others;
             # the heartbeat follows the TTL (a third of it, as the operations page says)
             "--member-ttl", "4"],
            stdout=subprocess.DEVNULL, stderr=self.log)

    async def metrics(self, http: aiohttp.ClientSession) -> dict[str, float]:
        async with http.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            text = await r.text()
        out = {f"scrapes_{k}": float(v) for k, v in _SCRAPES.findall(text)}
        out["targets"] = sum(float(v) for v in _ENDPOINTS.findall(text))
        return out

    async def stop(self) -> None:
        """SIGTERM, and wait (at most 10 s, then SIGKILL) without holding the
        event loop: the runs beside this one are still measuring, and their
        router probes run in this process (a replica drains for about a
        second: a blocking wait for four of them stalled the other runs'
        probes by 2-3 s, which their scrape -> router lags showed)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            deadline = time.monotonic() + 10
            while self.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self.proc.poll() is None:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        self.log.close()


class RouterProbe:
    """The router's telemetry follower, timing what reaches it."""

    def __init__(self) -> None:
        self.waiting: dict[tuple[str, int], asyncio.Future[float]] = {}
        self.pipeline: list[float] = []
        self.measuring = False
        self._last: dict[str, bytes] = {}
        #: changes never heard of in time
        self.lost = 0

    async def start(self, nats_url: str) -> None:
        import nats

        from kinference_common.engine import InFlightLedger
        from kinference_router.state import SnapshotKeeper

        import msgspec

        enc = msgspec.json.Encoder()
        self.nc = await nats.connect(nats_url)
        self.keeper = SnapshotKeeper("fleet", "bench", InFlightLedger())
        apply = self.keeper.set_endpoint

        def set_endpoint(st: Any) -> None:
            now = time.time()
            apply(st)
            # scrape -> router, for states that changed (an unchanged one is re-sent
            # with its last scrape's time, once per min-publish-interval)
            fp = enc.encode(msgspec.structs.replace(st, scraped_at=0.0))
            if self._last.get(st.pod) != fp:
                self._last[st.pod] = fp
                if self.measuring and st.scraped_at and not st.scrape_errors:
                    self.pipeline.append((now - st.scraped_at) * 1e3)
            fut = self.waiting.get((st.pod, st.queued or 0))
            if fut is not None and not fut.done():
                fut.set_result(now)

        self.keeper.set_endpoint = set_endpoint  # type: ignore[method-assign]
        await self.keeper.start(self.nc)

    async def stop(self) -> None:
        await self.keeper.stop()
        await self.nc.close()


#: numbers the runs of one bench: each sets its pods' queues to values of its own (a value
#: another run left set would be "changed" to itself, and timed at the next re-publish)
_RUNS = itertools.count(1)


async def collector_run(pods: int, collectors: int, interval: float, seconds: float, changes: int,
                        nats_url: str, fleet_url: str, targets: dict[str, Any], tmp: Path,
                        gpus_per_node: int, together: asyncio.Barrier | None = None) -> dict[str, Any]:
    from kinference_common import natsserver

    endpoints = tmp / f"endpoints-{collectors}.json"
    endpoints.write_text(json.dumps(targets))
    replicas = [Replica(f"collector-{k}", nats_url, endpoints, interval, natsserver.free_port(),
                        tmp / f"collector-{collectors}-{k}.log") for k in range(collectors)]
    probe = RouterProbe()
    await probe.start(nats_url)
    try:
        async with aiohttp.ClientSession() as http:
            # settled: the replicas hold every pod once between them, in equal shares
            deadline = time.monotonic() + 60
            while True:
                await asyncio.sleep(0.5)
                try:
                    held = [(await r.metrics(http))["targets"] for r in replicas]
                except (aiohttp.ClientError, KeyError):
                    held = []
                if len(held) == collectors and sum(held) == pods and max(held) - min(held) <= 1:
                    break
                if time.monotonic() > deadline or any(r.proc.poll() is not None for r in replicas):
                    for r in replicas:
                        r.log.flush()
                    tails = "".join(f"--- {r.name}:\n" + "".join((tmp / f"collector-{collectors}-{k}.log")
                                                              .read_text().splitlines(True)[-15:])
                                    for k, r in enumerate(replicas))
                    raise RuntimeError(f"{collectors} collectors did not settle on {pods} pods: {held}\n{tails}")
            await asyncio.sleep(max(1.0, 3 * interval))  # every replica has scraped its share
            if together is not None:  # runs side by side measure over the same seconds
                await together.wait()
            m0 = [await r.metrics(http) for r in replicas]
            c0 = [cpu_seconds(r.proc.pid) for r in replicas]
            async with http.get(f"{fleet_url}/sim/scrapes") as resp:
                s0 = (await resp.json())["pods"]
            t0 = time.monotonic()
            probe.measuring = True
            lags = await _changes(http, fleet_url, probe, changes, seconds, interval, targets, 100_000 * next(_RUNS))
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - t0)))
            probe.measuring = False
            wall = time.monotonic() - t0
            m1 = [await r.metrics(http) for r in replicas]
            c1 = [cpu_seconds(r.proc.pid) for r in replicas]
            async with http.get(f"{fleet_url}/sim/scrapes") as resp:
                s1 = (await resp.json())["pods"]
    finally:
        await probe.stop()
        await asyncio.gather(*(r.stop() for r in replicas))
    per_pod = [s1[p] - s0.get(p, 0) for p in s1]
    scrapes = [m1[k]["scrapes_vllm"] - m0[k]["scrapes_vllm"] for k in range(collectors)]
    dcgm = [m1[k].get("scrapes_dcgm", 0) - m0[k].get("scrapes_dcgm", 0) for k in range(collectors)]
    cpu = [c1[k] - c0[k] for k in range(collectors)]
    total, total_cpu = sum(scrapes), sum(cpu)
    per_scrape = total_cpu / total if total else float("nan")
    mean_share = total / collectors
    per_interval = [n / (wall / interval) for n in per_pod]
    return {
        "pods": pods, "collectors": collectors, "interval_s": interval, "window_s": round(wall, 2),
        "dcgm_exporters": len(targets["dcgm"]), "gpus_per_node": gpus_per_node,
        "scrapes_per_s": round(total / wall, 1),
        "target_scrapes_per_s": round(pods / interval, 1),
        "cpu_s_per_1000_scrapes": round(per_scrape * 1000, 4),
        "cpu_cores": round(total_cpu / wall, 3),
        "per_replica": [{"replica": r.name, "targets": int(m1[k]["targets"]), "scrapes": int(scrapes[k]),
                         "dcgm_scrapes": int(dcgm[k]), "share": round(scrapes[k] / total, 4) if total else 0.0,
                         "cpu_s": round(cpu[k], 3), "cpu_cores": round(cpu[k] / wall, 3),
                         "cpu_ms_per_scrape": round(cpu[k] / scrapes[k] * 1e3, 4) if scrapes[k] else None}
                        for k, r in enumerate(replicas)],
        "share_max_dev": round(max(abs(n - mean_share) / mean_share for n in scrapes), 4) if total else None,
        # each replica on a core of its own: its share of the pods at its CPU per scrape
        "sustained_interval_s": round(pods / collectors * per_scrape, 4),
        "cores_for_1000_pods_at_100ms": round(10_000 * per_scrape, 2),
        "pods_scraped": sum(1 for n in per_pod if n > 0),
        "scrapes_per_pod_per_interval_min": round(min(per_interval), 3),
        "scrapes_per_pod_per_interval_max": round(max(per_interval), 3),
        "lag_changes": len(lags),
        "lag_lost": probe.lost,
        "lag_p50_ms": round(percentile(lags, 0.5), 1),
        "lag_p99_ms": round(percentile(lags, 0.99), 1),
        "pipeline_states": len(probe.pipeline),
        "pipeline_lag_p50_ms": round(percentile(probe.pipeline, 0.5), 2),
        "pipeline_lag_p99_ms": round(percentile(probe.pipeline, 0.99), 2),
    }


async def _changes(http: aiohttp.ClientSession, fleet_url: str, probe: RouterProbe, changes: int,
                   seconds: float, interval: float, targets: dict[str, Any], base: int) -> list[float]:
    """Change ``changes`` pods' queues (distinct pods, spread over ``seconds``);
    ms from each change to the router. A change not heard of within five
    intervals (and 2 s) is left out and counted apart."""
    rnd = random.Random(7)
    names = rnd.sample([e["pod"] for e in targets["endpoints"]], min(changes, len(targets["endpoints"])))
    loop = asyncio.get_running_loop()

    async def one(k: int, pod: str) -> float | None:
        await asyncio.sleep(k * seconds * 0.8 / len(names) + rnd.uniform(0, interval))
        value = base + k  # never a value an earlier run left pinned
        fut: asyncio.Future[float] = loop.create_future()
        probe.waiting[(pod, value)] = fut
        async with http.post(f"{fleet_url}/sim/set", params={"pod": pod, "waiting": str(value)}) as r:
            at = (await r.json())["at"]
        try:
            return (await asyncio.wait_for(fut, 5 * interval + 2)) - at
        except TimeoutError:
            probe.lost += 1
            return None

    got = await asyncio.gather(*(one(k, p) for k, p in enumerate(names)))
    return [x * 1e3 for x in got if x is not None]


def _fleet_page() -> bytes:
    """One of the fleet's vLLM pages, as the collector reads it."""
    from kinference_simulators.fleet import PodLoad, vllm_template

    return vllm_template("meta-llama/Llama-3.1-8B-Instruct", 8192).fill(PodLoad(rate=2.0).values())


def parse_baseline(seconds: float = 0.5) -> float:
    """Microseconds for the collector's parser to read one of the fleet's pages,
    in this process, now: the machine's speed during the run (a shared
    machine's CPU seconds stretch when its caches are shared)."""
    from kinference_collector.promparse import parse_vllm

    body = _fleet_page()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        parse_vllm(body)
        n += 1
    return (time.perf_counter() - t0) / n * 1e6


def parse_after_gap(gap: float, seconds: float = 1.0) -> float:
    """CPU microseconds of the same parse done once after each pause of
    ``gap`` seconds, as a replica's scrapes come when spread over the
    interval: on a shared virtual machine work that follows an idle pause
    runs slower (cold caches, a descheduled core) than the same work in a
    tight loop, and this is how much, now."""
    from kinference_collector.promparse import parse_vllm

    body = _fleet_page()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        time.sleep(gap)
        parse_vllm(body)
        n += 1
    return (time.process_time() - c0) / n * 1e6


# ---------------------------------------------------------------- the router


#: pods whose updates the router's apply cost is timed on, at every fleet size
#: (the goal: that cost flat in the pods that did not change)
CHANGING_PODS = 100


def router_costs(sizes: list[int], updates: int) -> list[dict[str, Any]]:
    """The router's apply path at each size: one update's decode + apply, a
    snapshot rebuild, the memory of its telemetry and snapshot, a decision."""
    import msgspec

    from bench import decision
    from kinference_common.engine import InFlightLedger
    from kinference_common.messages import EndpointState
    from kinference_router.state import SnapshotKeeper

    out = []
    changing = min(CHANGING_PODS, *sizes)  # the same pods changing at every size
    for n in sizes:
        rng = random.Random(n)
        snapshot, ledger, prefix, requests = decision.build_world(n, 1, rng)
        states = [c.state for c in snapshot.candidates if c.is_local]
        providers = [c.state for c in snapshot.candidates if not c.is_local and c.state]
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        keeper = SnapshotKeeper("default", "bench", InFlightLedger(), clock=lambda: decision.NOW)
        for st in states:
            keeper.set_endpoint(st)
        for p in providers:
            keeper.set_provider(p)
        keeper.set_pool(snapshot.pool)  # builds the snapshot
        memory = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        enc = msgspec.json.Encoder()
        dec = msgspec.json.Decoder(EndpointState)

        def apply_us_each(changing: int) -> float:
            """One update's cost (what a telemetry message costs on arrival, the
            subscriber's callback), the updates going round ``changing`` pods."""
            wire = [enc.encode(msgspec.structs.replace(states[i % changing], queued=i % 7)) for i in range(updates)]
            t0 = time.perf_counter()
            for data in wire:
                keeper.set_endpoint(dec.decode(data))
            return (time.perf_counter() - t0) / updates * 1e6

        # the goal's figure: the same pods changing at every size, the others not
        apply_us = apply_us_each(min(changing, len(states)))
        # every pod changing in turn: each update touches memory the last one did not
        apply_every_us = apply_us_each(len(states))
        rebuild = rebuild_costs(keeper, rng)
        dec_row = decision.run_case(n, 1, n=2000, warmup=200)
        # the rebuild loop: at most every rebuild_interval while something
        # changed; in that time n * rebuild_interval / interval pods changed
        busy = {}
        for label in ("100ms", "1s"):
            ms = rebuild[f"rebuild_{label}_ms"]
            per_s = min(1.0 / keeper.rebuild_interval, 1000.0 / (ms + keeper.rebuild_interval * 1e3))
            busy[f"rebuild_cpu_share_busy_{label}"] = round(per_s * ms / 1e3, 3)
        out.append({"endpoints": n, "apply_us_per_update": round(apply_us, 2),
                    "apply_us_per_update_every_pod": round(apply_every_us, 2), "apply_changing_pods": changing,
                    **rebuild, **busy,
                    "memory_mb": round(memory / 1e6, 2), "memory_kb_per_endpoint": round(memory / n / 1e3, 2),
                    "decision_p50_us": dec_row["p50_us"], "decision_p99_us": dec_row["p99_us"]})
    return out


def rebuild_costs(keeper: Any, rng: random.Random) -> dict[str, float]:
    """The keeper's snapshot rebuild: whole (a new pool), then after no
    endpoint changed, after 5% changed (each pod publishing every second,
    a rebuild every 50 ms) and after 50% (every pod changed at every 100 ms
    scrape); milliseconds, the best of a few."""
    import msgspec

    def timed(prepare: Any) -> float:
        best = float("inf")
        for rep in range(5):
            prepare(rep)
            t0 = time.perf_counter()
            keeper.rebuild()
            best = min(best, time.perf_counter() - t0)
        return round(best * 1e3, 3)

    keys = list(keeper.endpoints)

    def change(frac: float) -> Any:
        def prepare(rep: int) -> None:
            for k in rng.sample(keys, int(len(keys) * frac)):
                keeper.set_endpoint(msgspec.structs.replace(keeper.endpoints[k], queued=rep + 1))
        return prepare

    def drop_snapshot(rep: int) -> None:
        keeper.snapshot = None
    return {"rebuild_whole_ms": timed(drop_snapshot), "rebuild_none_ms": timed(lambda rep: None),
            "rebuild_1s_ms": timed(change(0.05)), "rebuild_100ms_ms": timed(change(0.5))}


# ------------------------------------------------------------ the API server


async def api_calls(pods: int, gpus_per_node: int, seconds: float, watch_cut: float) -> dict[str, Any]:
    """The collector's informers against the fake API server holding ``pods``
    engine pods: list and watch calls per minute with watches cut every ``watch_cut``."""
    from kinference_collector.kube_discovery import KubeDiscovery
    from kinference_common.kube.client import ResourceClient
    from kinference_common.kube.config import api_client
    from kinference_simulators.kubeapi import FakeKubeAPI, pod

    api = FakeKubeAPI([REPO / "deploy" / "k8s" / "crds"])
    await api.start()
    with tempfile.TemporaryDirectory() as tmp:
        kc = api.write_kubeconfig(Path(tmp) / "kubeconfig", user="telemetry-collector", token="collector-token")
        api.apply({"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceWorkerSet",
                   "metadata": {"name": "sim", "namespace": "fleet"},
                   "spec": {"model": {"name": "llama"}, "engine": "vLLM", "port": 8000,
                            "selector": {"matchLabels": {"app": "sim"}}}})
        for i in range(pods):
            api.apply(pod(f"sim-{i}", "fleet", {"app": "sim"}, f"10.1.{i // 250}.{i % 250 + 1}",
                          node=f"node-{i // gpus_per_node}"))
        for j in range(-(-pods // gpus_per_node)):
            api.apply(pod(f"dcgm-{j}", "gpu-operator", {"app": "nvidia-dcgm-exporter"}, f"10.2.0.{j % 250 + 1}",
                          node=f"node-{j}"))
        client = await api_client(str(kc), "kinference-telemetry-collector")
        d = KubeDiscovery(ResourceClient(client))
        try:
            d.start()
            await d.wait_synced(60)
            api.requests.clear()
            rnd = random.Random(3)
            t0 = time.monotonic()
            next_cut = t0 + watch_cut
            while time.monotonic() - t0 < seconds:
                await asyncio.sleep(0.2)
                # some churn: a pod's readiness flips now and then
                i = rnd.randrange(pods)
                api.set_status("", "Pod", "fleet", f"sim-{i}", {**pod("x", "fleet", {}, f"10.1.{i // 250}.{i % 250 + 1}",
                                                                     ready=rnd.random() > 0.1)["status"]})
                if time.monotonic() >= next_cut:
                    api.drop_watches()
                    next_cut += watch_cut
            wall = time.monotonic() - t0
            found = len(await d.endpoints())
        finally:
            await d.stop()
            await client.close()
            await api.stop()
    calls = [r for r in api.requests if r.who == "telemetry-collector"]
    lists = sum(1 for r in calls if r.verb == "list")
    watches = sum(1 for r in calls if r.verb == "watch")
    return {"pods": pods, "targets_found": found, "seconds": round(wall, 1), "watch_cut_s": watch_cut,
            "informers": 3, "lists_per_min": round(lists / wall * 60, 1), "watches_per_min": round(watches / wall * 60, 1),
            "lists": lists, "watches": watches}


# -------------------------------------------------------------- the outputs


def verdicts(rows: list[dict[str, Any]], router: list[dict[str, Any]],
             model: dict[str, Any] | None = None, goal: dict[str, Any] | None = None,
             control: dict[str, Any] | None = None, flat_by_round: list[float] | None = None,
             lag: dict[str, Any] | None = None) -> list[str]:
    out = []
    for r in rows:
        ok = r["share_max_dev"] is not None and r["share_max_dev"] <= GOAL_SHARE_DEV
        out.append(f"{'MET ' if ok else 'MISS'} {r['collectors']} replica(s): each does 1/N of the scrapes within "
                   f"10% (largest deviation {100 * (r['share_max_dev'] or 0):.1f}%)")
    if len(rows) > 1:
        base = rows[0]["cpu_s_per_1000_scrapes"]
        worst = max(abs(r["cpu_s_per_1000_scrapes"] - base) / base for r in rows)
        costs = " / ".join(f"{r['cpu_s_per_1000_scrapes']:.3f}" for r in rows)
        rel = [r["scrape_cost_in_parses"] for r in rows if r.get("scrape_cost_in_parses")]
        norm = (f"; counted in bare parses timed in the same run, {' / '.join(f'{x:.2f}' for x in rel)}"
                if len(rel) == len(rows) else "")
        factors = [r["parse_us_after_gap"] / r["parse_us_baseline"] for r in rows
                   if r.get("parse_us_after_gap") and r.get("parse_us_baseline")]
        if len(factors) == len(rows) and all(r["cpu_s_per_1000_scrapes"] > 0 for r in rows):
            adjusted = [r["cpu_s_per_1000_scrapes"] / f for r, f in zip(rows, factors, strict=True)]
            spread = max(abs(a - adjusted[0]) / adjusted[0] for a in adjusted)
            norm += (f"; divided by the cost of work after each run's pause ({' / '.join(f'{f:.2f}x' for f in factors)})"
                     f" {' / '.join(f'{a:.3f}' for a in adjusted)}, within {100 * spread:.0f}%")
        runs = [r.get("cpu_s_per_1000_scrapes_runs") or [] for r in rows]
        if flat_by_round and all(len(x) == len(flat_by_round) for x in runs):
            # side by side: each round's counts ran over the same seconds, so judge each round's change
            worst = statistics.median(flat_by_round)
            rounds = "; ".join(f"{' / '.join(f'{x[k]:.3f}' for x in runs)} ({100 * f:.1f}%)"
                               for k, f in enumerate(flat_by_round))
            what = (f"the median of {len(flat_by_round)} rounds' largest change, {100 * worst:.1f}%; in each "
                    f"round the counts ran side by side: {rounds}; each count's median run {costs} s per 1,000")
        elif all(len(x) > 1 for x in runs):
            what = (f"largest change {100 * worst:.1f}%: {costs} s per 1,000, the median of {len(runs[0])} "
                    f"interleaved runs each; every run: " + "; ".join(" / ".join(f"{c:.3f}" for c in x) for x in runs))
        else:
            what = f"largest change {100 * worst:.1f}%: {costs} s per 1,000"
        out.append(f"{'MET ' if worst <= GOAL_CPU_FLAT else 'MISS'} total CPU per scrape flat within 15% from "
                   f"{rows[0]['collectors']} to {rows[-1]['collectors']} replicas ({what}{norm})")
        many = next((r for r in rows if r["collectors"] == (control or {}).get("collectors")), None)
        if control is not None and many is not None and control["cpu_s_per_1000_scrapes"] > 0:
            extra = many["cpu_s_per_1000_scrapes"] / control["cpu_s_per_1000_scrapes"] - 1
            shared, alone = many.get("cpu_s_per_1000_scrapes_runs"), control.get("cpu_s_per_1000_scrapes_runs")
            if flat_by_round and shared and alone and len(shared) == len(alone) == len(flat_by_round) \
                    and all(a > 0 for a in alone):
                # side by side: each round's sharing and apart replicas ran over the same seconds
                each = [sh / a - 1 for sh, a in zip(shared, alone, strict=True)]
                extra = statistics.median(each)
                rounds = (f" (the median of {len(each)} rounds: "
                          + "; ".join(f"{sh:.3f} against {a:.3f}, {100 * e:+.1f}%"
                                      for sh, a, e in zip(shared, alone, each, strict=True)) + ")")
            else:
                rounds = ""
            out.append(f"NOTE side by side, at the same load per replica: {many['collectors']} replicas "
                       f"sharing {many['pods']:,} pods {many['cpu_s_per_1000_scrapes']:.3f} s per 1,000 scrapes, "
                       f"{control['collectors']} replicas apart (each its own NATS server and {control['pods'] // control['collectors']:,} "
                       f"of the pods, no membership) {control['cpu_s_per_1000_scrapes']:.3f}: replication itself "
                       f"adds {100 * extra:+.1f}%{rounds}")
    if goal is not None:
        c = goal["cores_for_1000_pods_at_100ms"]
        out.append(f"{'MET ' if c <= GOAL_CORES_1000_AT_100MS else 'MISS'} 1,000 pods at 100 ms need at most 4 "
                   f"cores of collectors: {c:.2f} ({goal['cpu_s_per_1000_scrapes']:.3f} ms a scrape x 10,000/s, "
                   f"measured on one replica at 100 ms, {goal['pods']} pods whose load moves at every scrape, "
                   f"{goal['cpu_cores']:.2f} cores busy)")
    elif model is not None and model.get("separable", True):
        c = model["cores_for_1000_pods_at_100ms"]
        out.append(f"{'MET ' if c <= GOAL_CORES_1000_AT_100MS else 'MISS'} 1,000 pods at 100 ms need at most 4 "
                   f"cores of collectors: {c:.2f} ({model['cpu_ms_per_scrape']:.3f} ms a scrape x 10,000/s + "
                   f"{model['cpu_ms_per_pod_second']:.3f} ms a pod-second x 1,000, from one replica at "
                   f"{model['intervals_s'][0]:g} s and {model['intervals_s'][1]:g} s)")
    else:
        worst_cores = max(r["cores_for_1000_pods_at_100ms"] for r in rows)
        out.append(f"{'MET ' if worst_cores <= GOAL_CORES_1000_AT_100MS else 'MISS'} 1,000 pods at 100 ms need at "
                   f"most 4 cores of collectors ({worst_cores:.2f} at the costliest replica count, "
                   f"all of a run's CPU counted per scrape)")
    if lag is not None:  # measured with nothing beside the replicas
        p99 = lag["pipeline_lag_p99_ms"] + 100.0
        side = max(r["pipeline_lag_p99_ms"] for r in rows)
        out.append(f"{'MET ' if p99 < GOAL_LAG_P99_MS else 'MISS'} publish lag p99 < 200 ms at {lag['pods']} pods "
                   f"and a 100 ms interval: scrape -> router p99 {p99 - 100:.1f} ms ({lag['collectors']} replicas "
                   f"alone, after the rounds) + at most one 100 ms interval = {p99:.1f} ms (side by side, with "
                   f"the other runs' fleets and replicas on the same two cores: up to {side:.1f} ms)")
    else:
        big = [r for r in rows if r["pods"] >= 1000] or rows
        p99 = max(r["pipeline_lag_p99_ms"] for r in big) + 100.0
        out.append(f"{'MET ' if p99 < GOAL_LAG_P99_MS else 'MISS'} publish lag p99 < 200 ms at {big[0]['pods']} "
                   f"pods and a 100 ms interval: scrape -> router p99 {p99 - 100:.1f} ms + at most one 100 ms "
                   f"interval = {p99:.1f} ms")
    if len(router) > 1:
        a, b = router[0], router[-1]
        grow = b["apply_us_per_update"] / a["apply_us_per_update"]
        every = (f"; with every pod changing in turn {a['apply_us_per_update_every_pod']:.1f} and "
                 f"{b['apply_us_per_update_every_pod']:.1f} us, memory each update touches for the first time"
                 if "apply_us_per_update_every_pod" in b else "")
        out.append(f"{'MET ' if grow <= 1.5 else 'MISS'} the router's cost to apply one update flat in the pods "
                   f"that did not change: {a['apply_us_per_update']:.1f} us at {a['endpoints']} endpoints, "
                   f"{b['apply_us_per_update']:.1f} us at {b['endpoints']} ({grow:.2f}x; the same "
                   f"{b.get('apply_changing_pods', 'all')} pods changing at each size{every})")
        whole_us = b["rebuild_whole_ms"] * 1e3 / b["endpoints"]
        kept_us = b["rebuild_none_ms"] * 1e3 / b["endpoints"]
        out.append(f"{'MET ' if kept_us <= 0.1 * whole_us else 'MISS'} the snapshot rebuild follows what changed: "
                   f"an endpoint that did not change costs a rebuild {kept_us:.2f} us at {b['endpoints']} "
                   f"endpoints (at most 0.1x the {whole_us:.2f} us it costs in a whole build); "
                   f"{b['rebuild_none_ms']:.1f} ms with none changed, {b['rebuild_1s_ms']:.1f} ms with 5%, "
                   f"{b['rebuild_100ms_ms']:.1f} ms with 50%, {b['rebuild_whole_ms']:.1f} ms whole")
    return out


def table(result: dict[str, Any]) -> str:
    rows, router, kube = result["rows"], result["router"], result["api_server"]
    lines = ["| pods | replicas | interval | scrapes/s | shares (max dev) | CPU s / 1,000 scrapes | CPU cores "
             "per replica | sustained interval | cores for 1,000 pods at 100 ms | lag change->router p50 / p99 | "
             "scrape->router p50 / p99 | a scrape in bare parses | a bare parse after the replica's pause |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    control = result.get("control_row")
    for r in rows + ([control] if control else []):
        shares = " / ".join(f"{100 * p['share']:.1f}%" for p in r["per_replica"])
        replicas = f"{r['collectors']} apart (each its own NATS, 1/{r['collectors']} of the pods)" \
            if r.get("role") == "apart" else r["collectors"]
        cores = " / ".join(f"{p['cpu_cores']:.2f}" for p in r["per_replica"])
        lines.append(f"| {r['pods']:,} | {replicas} | {r['interval_s'] * 1e3:.0f} ms | {r['scrapes_per_s']:,.0f} | "
                     f"{shares} ({100 * (r['share_max_dev'] or 0):.1f}%) | {r['cpu_s_per_1000_scrapes']:.3f} | {cores} | "
                     f"{r['sustained_interval_s'] * 1e3:.0f} ms | {r['cores_for_1000_pods_at_100ms']:.2f} | "
                     f"{r['lag_p50_ms']:.0f} / {r['lag_p99_ms']:.0f} ms | "
                     f"{r['pipeline_lag_p50_ms']:.1f} / {r['pipeline_lag_p99_ms']:.1f} ms | "
                     f"{r.get('scrape_cost_in_parses', '-')} ({r.get('parse_us_baseline', '-')} us each) | "
                     + (f"{r['parse_us_after_gap']:.1f} us ({r['parse_us_after_gap'] / r['parse_us_baseline']:.2f}x) |"
                        if r.get("parse_us_after_gap") else "- |"))
    a = result.get("lag_row")
    if a:
        lines += ["", f"The rows above ran side by side (each on a fleet and a NATS server of its own, over the same "
                      f"seconds). With nothing beside them, {a['collectors']} replicas on {a['pods']:,} pods: "
                      f"{a['cpu_s_per_1000_scrapes']:.3f} CPU s per 1,000 scrapes, lag change->router p50 / p99 "
                      f"{a['lag_p50_ms']:.0f} / {a['lag_p99_ms']:.0f} ms, scrape->router p50 / p99 "
                      f"{a['pipeline_lag_p50_ms']:.1f} / {a['pipeline_lag_p99_ms']:.1f} ms."]
    m = result.get("cost_model")
    if m and not m.get("separable", True):
        lines += ["", f"One replica at {m['intervals_s'][0]:g} s and at {m['intervals_s'][1]:g} s used "
                      f"{m['cpu_cores'][0]:.2f} and {m['cpu_cores'][1]:.2f} cores for {m['scrapes_per_s'][0]:.0f} and "
                      f"{m['scrapes_per_s'][1]:.0f} scrapes a second: at these rates a replica's CPU hardly follows its "
                      f"scrapes (what a pod costs whatever its scrapes, its state published at least every second "
                      f"and its node's exporter scraped every second, dominates), and the machine's noise is "
                      f"larger than the difference, so the cost of a scrape alone is not separable in this run."]
    elif m:
        lines += ["", f"One replica at {m['intervals_s'][0]:g} s and at {m['intervals_s'][1]:g} s: a scrape costs "
                      f"{m['cpu_ms_per_scrape']:.3f} ms of CPU, and a pod {m['cpu_ms_per_pod_second']:.3f} ms a second "
                      f"whatever its scrapes (its state published at least every second, its node's DCGM exporter "
                      f"scraped every second); so 1,000 pods at 100 ms need {m['cores_for_1000_pods_at_100ms']:.2f} "
                      f"cores of collectors and 10,000 pods {m['cores_for_10000_pods_at_100ms']:.1f}. A split from "
                      f"two idle-heavy runs moves with this machine's noise from run to run; the run at the goal's "
                      f"interval below measures the same thing busy."]
    g = result.get("goal_row")
    if g:
        lines += ["", f"One replica at the goal's 100 ms on {g['pods']} pods whose load moves at every scrape "
                      f"(a fleet of its own): {g['scrapes_per_s']:,.0f} scrapes a second of "
                      f"{g['target_scrapes_per_s']:,.0f} asked, {g['cpu_cores']:.2f} cores, "
                      f"{g['cpu_s_per_1000_scrapes']:.3f} ms of CPU a scrape, everything counted (fetch, parse, "
                      f"publish, its pods' exporters, membership); so 1,000 pods at 100 ms need "
                      f"{g['cores_for_1000_pods_at_100ms']:.2f} cores of collectors and 10,000 pods "
                      f"{10 * g['cores_for_1000_pods_at_100ms']:.1f}. Scrape to router p50 / p99: "
                      f"{g['pipeline_lag_p50_ms']:.1f} / {g['pipeline_lag_p99_ms']:.1f} ms."]
    lines += ["", f"| router at | apply one update ({CHANGING_PODS} pods changing / every pod in turn) | "
              "snapshot rebuild: whole / none changed / 5% / 50% | "
              "rebuild CPU, every pod changing each 1 s / 100 ms | memory | decision p50 / p99 |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in router:
        every = r.get("apply_us_per_update_every_pod")
        lines.append(f"| {r['endpoints']:,} endpoints | {r['apply_us_per_update']:.1f} / "
                     f"{'-' if every is None else f'{every:.1f}'} us | "
                     f"{r['rebuild_whole_ms']:.2f} / {r['rebuild_none_ms']:.2f} / {r['rebuild_1s_ms']:.2f} / "
                     f"{r['rebuild_100ms_ms']:.2f} ms | {100 * r['rebuild_cpu_share_busy_1s']:.0f}% / "
                     f"{100 * r['rebuild_cpu_share_busy_100ms']:.0f}% of a core | {r['memory_mb']:.1f} MB "
                     f"({r['memory_kb_per_endpoint']:.1f} KB each) | {r['decision_p50_us']:.0f} / "
                     f"{r['decision_p99_us']:.0f} us |")
    if kube:
        lines += ["", f"API server, {kube['pods']:,} pods, watches cut every {kube['watch_cut_s']:g} s "
                      f"({kube['seconds']:g} s): {kube['lists_per_min']:g} lists and {kube['watches_per_min']:g} "
                      f"watches per minute per replica ({kube['informers']} informers; "
                      f"{kube['lists']} lists in all, the resumed watches relist nothing)"]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    """CPU cores per replica (and in all) against replicas: a PNG (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [r["collectors"] for r in rows]
    per = [statistics.fmean(p["cpu_cores"] for p in r["per_replica"]) for r in rows]
    total = [r["cpu_cores"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.plot(n, per, "o-", label="CPU per replica (cores)")
    ax.plot(n, total, "s--", label="CPU of all replicas (cores)")
    ax.set_xlabel("collector replicas")
    ax.set_ylabel("cores")
    ax.set_xticks(n)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{rows[0]['pods']:,} pods scraped every {rows[0]['interval_s']:g} s")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return str(path.relative_to(REPO))


_BLOCK = re.compile(r"(<!-- scale:results -->\n)(.*?)(<!-- /scale:results -->)", re.S)


def rewrite(page: str, result: dict[str, Any]) -> str:
    body = (f"Measured {result['when']} by `make bench-scale` on {result['env']['cpus']} shared cores "
            f"(the simulated pods, NATS and the router's probe share them with the collectors)"
            + (f", the simulated DCGM exporters collecting every {result['dcgm_collect_interval_s']:g} s"
               if result.get("dcgm_collect_interval_s") else "") + ":\n\n"
            + table(result) + "\n\n" + "\n".join(f"- {v}" for v in result["verdicts"]) + "\n\n"
            + "![CPU per collector replica against replicas](img/scale-cpu.png)\n")
    if _BLOCK.search(page) is None:
        raise SystemExit(f"bench-scale: no <!-- scale:results --> block in {PAGE}")
    return _BLOCK.sub(lambda m: m.group(1) + body + m.group(3), page)


# --------------------------------------------------------------------- main


@contextlib.asynccontextmanager
async def fleet_of(args: argparse.Namespace, pods: int, change_interval: float) -> Any:
    """A simulated fleet of ``pods`` and their exporters: ``(fleet, its targets, a scratch directory)``."""
    from kinference_simulators.testing import run_simulator

    with tempfile.TemporaryDirectory(prefix="kinference-bench-scale-") as tmp, \
            run_simulator("fleet", "--pods", str(pods), "--gpus-per-node", str(args.gpus_per_node),
                          "--change-interval", str(change_interval),
                          "--dcgm-collect-interval", str(args.dcgm_collect_interval),
                          "--log-format", "json") as fleet:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{fleet.url}/sim/targets") as r:
                targets = await r.json()
        yield fleet, targets, Path(tmp)


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    from kinference_common import natsserver

    rows: list[dict[str, Any]] = []
    split: dict[str, Any] | None = None
    goal: dict[str, Any] | None = None
    control: dict[str, Any] | None = None
    flat_by_round: list[float] = []
    alone: dict[str, Any] | None = None
    server = natsserver.start()
    try:
        most = max(args.collectors)
        apart = args.control and 1 in args.collectors and most > 1
        kinds: list[int | str] = [*args.collectors, *(["apart"] if apart else [])]
        runs: dict[int | str, list[dict[str, Any]]] = {k: [] for k in kinds}
        async with contextlib.AsyncExitStack() as stack:
            # a fleet of its own for each replica count: the counts run side by side
            fleets = {k: await stack.enter_async_context(fleet_of(args, args.pods, args.change_interval))
                      for k in kinds}
            for r in range(args.rounds):
                for k, row in zip(kinds, await side_by_side(args, kinds, fleets), strict=True):
                    runs[k].append(row)
                    print(f"  round {r + 1}: {_describe(row)}", flush=True)
                costs = [runs[n][-1]["cpu_s_per_1000_scrapes"] for n in args.collectors]
                if len(costs) > 1 and costs[0] > 0:
                    flat_by_round.append(round(max(abs(c - costs[0]) / costs[0] for c in costs), 4))
                    print(f"  round {r + 1}: CPU per scrape {' / '.join(f'{c:.3f}' for c in costs)}, largest "
                          f"change {100 * flat_by_round[-1]:.1f}%", flush=True)
            rows = [median_row(runs[n]) for n in args.collectors]
            control = median_row(runs["apart"]) if apart else None
            if args.rounds and len(kinds) > 1:
                # the lag to the routers, with nothing beside the replicas (side by side, every
                # count's fleet, NATS server and router follower share the two cores)
                fleet, targets, tmp = fleets[most]
                alone = await collector_run(args.pods, most, args.interval, args.seconds, args.changes,
                                            server.url, fleet.url, targets, tmp, args.gpus_per_node)
                alone["role"] = "alone"
                print(f"  alone: {_describe(alone)}, scrape -> router p99 {alone['pipeline_lag_p99_ms']:.1f} ms",
                      flush=True)
            if args.split and 1 in args.collectors:
                # the same replica at twice the interval: what a scrape costs apart from what
                # a pod costs whatever its scrapes (publishing at least once a second, DCGM)
                fleet, targets, tmp = fleets[1]
                row = await collector_run(args.pods, 1, 2 * args.interval, args.seconds, args.changes,
                                          server.url, fleet.url, targets, tmp, args.gpus_per_node)
                row["role"] = "cost split"
                split = row
        if args.goal_pods:
            goal = await goal_interval_run(args, server.url)
    finally:
        server.stop()
    model = cost_model(next(r for r in rows if r["collectors"] == 1), split) if split else None
    router = router_costs(args.router_sizes, args.updates) if args.router_sizes else []
    kube = await api_calls(args.pods, args.gpus_per_node, args.kube_seconds, args.watch_cut) \
        if args.kube_seconds > 0 else None
    return {"rows": rows, "split_row": split, "cost_model": model, "goal_row": goal, "control_row": control,
            "cpu_flat_by_round": flat_by_round, "lag_row": alone, "router": router, "api_server": kube}


async def side_by_side(args: argparse.Namespace, kinds: list[int | str],
                       fleets: dict[int | str, tuple[Any, dict[str, Any], Path]]) -> list[dict[str, Any]]:
    """One round: every replica count (and the replicas apart) at once, each
    on its fleet and nats-server of its own, measuring over the same seconds,
    so that every count runs on the machine as it is at that moment (run one
    after another, the same configuration moved by up to 45% from one run to
    the next here, more than the differences measured). Then, per run, this
    machine's speed: a bare parse, and one after a pause as long as a
    replica's mean gap between scrapes."""
    from kinference_common import natsserver

    most = max(k for k in kinds if k != "apart")
    # every collector_run measures from the moment the last of them has settled
    parties = sum(most if k == "apart" else 1 for k in kinds)
    together = asyncio.Barrier(parties)
    servers = {k: natsserver.start() for k in kinds if k != "apart"}
    try:
        f0 = {k: cpu_seconds(fleets[k][0].proc.pid) for k in kinds}
        t0 = time.monotonic()

        async def one(k: int | str) -> dict[str, Any]:
            fleet, targets, tmp = fleets[k]
            if k == "apart":
                return await apart_run(args, most, fleet, targets, tmp, together)
            return await collector_run(len(targets["endpoints"]), int(k), args.interval, args.seconds, args.changes,
                                       servers[k].url, fleet.url, targets, tmp, args.gpus_per_node, together)

        tasks = [asyncio.create_task(one(k)) for k in kinds]
        try:
            rows = await asyncio.gather(*tasks)
        except BaseException:  # the others would wait at the barrier for the one that failed
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        wall = time.monotonic() - t0
        fleet_cores = {k: (cpu_seconds(fleets[k][0].proc.pid) - f0[k]) / wall for k in kinds}
    finally:
        for server in servers.values():
            server.stop()
    baseline = round(parse_baseline(), 1)
    for k, row in zip(kinds, rows, strict=True):
        row["fleet_cpu_cores"] = round(fleet_cores[k], 3)
        if k == "apart":
            continue
        row["parse_us_baseline"] = baseline
        # the mean pause between two of a replica's scrapes
        row["parse_us_after_gap"] = round(parse_after_gap(row["collectors"] / row["scrapes_per_s"]), 1)
        # one scrape's whole cost (fetch, parse, derive, publish, DCGM, membership) in bare parses
        row["scrape_cost_in_parses"] = round(row["cpu_s_per_1000_scrapes"] * 1e3 / baseline, 2)
    return rows


def _describe(row: dict[str, Any]) -> str:
    who = (f"{row['collectors']} replicas apart" if row.get("role") == "apart"
           else f"{row['collectors']} replica(s)")
    return (f"{who}: {row['scrapes_per_s']:.0f} scrapes/s, shares {[p['share'] for p in row['per_replica']]}, "
            f"{row['cpu_s_per_1000_scrapes']:.3f} CPU s per 1,000 scrapes, lag p99 {row['lag_p99_ms']:.0f} ms")


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median CPU per scrape (the lower middle one of an even
    number), with every run's figure beside it (``cpu_s_per_1000_scrapes_runs``,
    in the order measured): one run of this shared machine moves by up to
    45% from the next run of the same thing."""
    ordered = sorted(runs, key=lambda r: r["cpu_s_per_1000_scrapes"])
    row = dict(ordered[(len(ordered) - 1) // 2])
    row["cpu_s_per_1000_scrapes_runs"] = [r["cpu_s_per_1000_scrapes"] for r in runs]
    return row


async def apart_run(args: argparse.Namespace, n: int, fleet: Any, targets: dict[str, Any],
                    tmp: Path, together: asyncio.Barrier | None = None) -> dict[str, Any]:
    """``n`` replicas that share nothing, all at once: each has its own
    nats-server and holds 1/``n`` of the pods and of the exporters, so each
    does what each of ``n`` sharing replicas does, without membership,
    heartbeats, probes or shared GPU stats. Run beside the ``n`` sharing
    replicas (:func:`side_by_side`, ``together``), it shows what replication
    itself adds to a scrape (one replica holding a share alone would run on a
    quieter machine, and work on this virtual machine costs more the quieter
    it is)."""
    from kinference_common import natsserver

    per, per_dcgm = len(targets["endpoints"]) // n, math.ceil(len(targets["dcgm"]) / n)
    shares = [{"endpoints": targets["endpoints"][k * per:(k + 1) * per],
               "dcgm": targets["dcgm"][k * per_dcgm:(k + 1) * per_dcgm]} for k in range(n)]
    servers = [natsserver.start() for _ in range(n)]
    try:
        dirs = [tmp / f"apart-{k}" for k in range(n)]
        for d in dirs:
            d.mkdir(exist_ok=True)
        parts = await asyncio.gather(*(
            collector_run(per, 1, args.interval, args.seconds, max(1, args.changes // n), servers[k].url,
                          fleet.url, shares[k], dirs[k], args.gpus_per_node, together) for k in range(n)))
    finally:
        for server in servers:
            server.stop()
    scrapes = [p["per_replica"][0]["scrapes"] for p in parts]
    cpu = [p["per_replica"][0]["cpu_s"] for p in parts]
    total = sum(scrapes)
    mean_share = total / n
    return {
        "role": "apart", "pods": per * n, "collectors": n, "interval_s": args.interval,
        "window_s": round(statistics.fmean(p["window_s"] for p in parts), 2),
        "scrapes_per_s": round(sum(p["scrapes_per_s"] for p in parts), 1),
        "cpu_s_per_1000_scrapes": round(sum(cpu) / total * 1000, 4) if total else float("nan"),
        "cpu_cores": round(sum(p["cpu_cores"] for p in parts), 3),
        "per_replica": [dict(p["per_replica"][0], share=round(sc / total, 4) if total else 0.0)
                        for p, sc in zip(parts, scrapes, strict=True)],
        "share_max_dev": round(max(abs(sc - mean_share) / mean_share for sc in scrapes), 4) if total else None,
        "sustained_interval_s": round(per * sum(cpu) / total, 4) if total else float("nan"),
        "cores_for_1000_pods_at_100ms": round(10_000 * sum(cpu) / total, 2) if total else float("nan"),
        # the worst part's (each part's lags are its own run's)
        "lag_p50_ms": max(p["lag_p50_ms"] for p in parts), "lag_p99_ms": max(p["lag_p99_ms"] for p in parts),
        "pipeline_lag_p50_ms": max(p["pipeline_lag_p50_ms"] for p in parts),
        "pipeline_lag_p99_ms": max(p["pipeline_lag_p99_ms"] for p in parts),
    }


async def goal_interval_run(args: argparse.Namespace, nats_url: str) -> dict[str, Any]:
    """One replica at the goal's 100 ms on ``--goal-pods`` pods whose load
    moves at every scrape (a fleet of its own): a replica sized for 100 ms is
    busy, and busy it pays none of this machine's cost of work after an idle
    pause, so its CPU per scrape, times 10,000 scrapes a second, is what 1,000
    pods at 100 ms need."""
    async with fleet_of(args, args.goal_pods, 0.1) as (fleet, targets, tmp):
        row = await collector_run(args.goal_pods, 1, 0.1, args.seconds, args.changes, nats_url, fleet.url,
                                  targets, tmp, args.gpus_per_node)
    row["role"] = "the goal's interval"
    print(f"  1 replica at 100 ms on {args.goal_pods} pods: {row['scrapes_per_s']:.0f} scrapes/s "
          f"({row['target_scrapes_per_s']:.0f} asked), {row['cpu_cores']:.2f} cores, "
          f"{row['cpu_s_per_1000_scrapes']:.3f} CPU s per 1,000 scrapes", flush=True)
    return row


def cost_model(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """One replica at two intervals: CPU = per_scrape x scrapes/s + per_pod x pods.
    The per-pod part (a state published at least every second, DCGM
    exporters scraped every second, housekeeping) does not grow with the
    scrape rate; the projection to 100 ms adds only scrapes."""
    per_scrape = (a["cpu_cores"] - b["cpu_cores"]) / (a["scrapes_per_s"] - b["scrapes_per_s"])
    per_pod = (a["cpu_cores"] - per_scrape * a["scrapes_per_s"]) / a["pods"]
    if per_scrape <= 0 or per_pod < 0:  # the machine's noise is larger than the difference
        return {"intervals_s": [a["interval_s"], b["interval_s"]], "separable": False,
                "cpu_cores": [a["cpu_cores"], b["cpu_cores"]], "scrapes_per_s": [a["scrapes_per_s"], b["scrapes_per_s"]]}
    return {"separable": True,"cpu_ms_per_scrape": round(per_scrape * 1e3, 4), "cpu_ms_per_pod_second": round(per_pod * 1e3, 4),
            "intervals_s": [a["interval_s"], b["interval_s"]],
            "cores_for_1000_pods_at_100ms": round(1000 * (10 * per_scrape + per_pod), 2),
            "cores_for_10000_pods_at_100ms": round(10_000 * (10 * per_scrape + per_pod), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=1000, help="simulated engine pods (default %(default)s)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="pods per DCGM exporter (default %(default)s)")
    ap.add_argument("--collectors", type=int, nargs="+", default=[1, 2, 4],
                    help="collector replica counts, one run each (default 1 2 4)")
    ap.add_argument("--interval", type=float, default=2.5,
                    help="scrape interval of the runs, seconds (default 2.5: what two shared cores sustain "
                         "at 1,000 pods; the cost per scrape gives the replicas 100 ms needs)")
    ap.add_argument("--seconds", type=float, default=12.0, help="measured window of each run (default %(default)s)")
    ap.add_argument("--changes", type=int, default=40, help="page changes timed to the router per run")
    ap.add_argument("--change-interval", type=float, default=1.0,
                    help="seconds between two moves of a pod's load in the fleet (default %(default)s)")
    ap.add_argument("--dcgm-collect-interval", type=float, default=30.0,
                    help="seconds between two collections of a simulated DCGM exporter, which serves the same "
                         "page in between (dcgm-exporter's default, %(default)s; 0 = a new page at every move "
                         "of its pods' load)")
    ap.add_argument("--goal-pods", type=int, default=100,
                    help="pods of the run of one replica at the goal's 100 ms interval, their load moving at "
                         "every scrape (default %(default)s: what one replica holds here; 0 = skip)")
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="skip the run of as many replicas as the most, sharing nothing (each its own NATS server "
                         "and share of the pods): the same load per replica on a machine as busy, to tell "
                         "replication's own cost from the machine's")
    ap.add_argument("--rounds", type=int, default=5,
                    help="rounds in which the replica counts run side by side; each count's row is its median "
                         "run, and the flat-CPU goal is judged on the median of the rounds' own figures (default "
                         "%(default)s: one round's figure moves by several points here, and three rounds' median "
                         "moved across the goal from one run to the next)")
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="skip the run of one replica at twice the interval (the per-scrape / per-pod cost split)")
    ap.add_argument("--router-sizes", type=int, nargs="*", default=[100, 1000, 10000],
                    help="endpoints of the router's cost rows (default 100 1000 10000; none = skip)")
    ap.add_argument("--updates", type=int, default=20000, help="updates timed per router size")
    ap.add_argument("--kube-seconds", type=float, default=30.0,
                    help="length of the API server run (default %(default)s; 0 = skip)")
    ap.add_argument("--watch-cut", type=float, default=5.0,
                    help="the fake API server ends every watch this often, seconds (default %(default)s)")
    ap.add_argument("--smoke", action="store_true",
                    help="the suite's short check: 50 pods, 2 replicas, 3 s, no router/API rows, no page or plot")
    ap.add_argument("--out", default=str(RESULTS), help="results file (default bench/results/scale.json)")
    ap.add_argument("--no-page", action="store_true", help="do not rewrite docs/benchmarks.md and the plot")
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: the table, verdicts, plot and page again from the results file")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be 1 or more, not {args.rounds}")
    import signal

    # SIGTERM (make, a CI runner) unwinds like Ctrl-C: the collectors, the fleet and NATS are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.smoke:
        args.pods, args.collectors, args.seconds, args.changes = min(args.pods, 50), [2], 3.0, 5
        args.interval, args.router_sizes, args.kube_seconds, args.no_page = 0.2, [], 0.0, True
        args.split, args.goal_pods, args.rounds = False, 0, 1
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if args.render:
        result = json.loads(Path(args.out).read_text())
        if result.get("split_row"):
            result["cost_model"] = cost_model(next(r for r in result["rows"] if r["collectors"] == 1),
                                              result["split_row"])
        return _report(result, args, measured=False)
    print(f"bench-scale: {args.pods} pods, replicas {args.collectors}, interval {args.interval:g} s, "
          f"{args.seconds:g} s each", flush=True)
    result = asyncio.run(amain(args))
    result["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["dcgm_collect_interval_s"] = args.dcgm_collect_interval
    result["env"] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                     "note": "shared machine: other work ran beside the bench"}
    return _report(result, args, measured=True)


def _report(result: dict[str, Any], args: argparse.Namespace, measured: bool) -> int:
    result["verdicts"] = verdicts(result["rows"], result["router"], result["cost_model"], result.get("goal_row"),
                                  result.get("control_row"), result.get("cpu_flat_by_round"), result.get("lag_row"))
    print(table(result))
    print("\n".join(result["verdicts"]))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not args.no_page:
        result["plot"] = plot(result["rows"], PLOT)
        PAGE.write_text(rewrite(PAGE.read_text(), result))
        print(f"wrote {result['plot']} and the scale:results block of {PAGE.relative_to(REPO)}")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
