"""Cross-check the re-implemented ``cache_aware`` against the real vllm-router.

``python -m bench.routing.crosscheck`` (part of ``make bench-routing``):

1. starts 4 HTTP engine simulators (``kinference_simulators.vllm``, the same
   scheduler model as the fleet, ``h100`` profile, 2,048 KV blocks) in
   accelerated time (``--time-scale``, simulated seconds per real second) on
   127.0.0.1 with free ports, and the ``vllm-router`` binary (PyPI, installed
   in ``bench/.venv-competitors``, never a product dependency) in front of them
   with ``--policy cache_aware`` and its default thresholds;
2. replays a small shared-prefix workload (8 groups x 16 prompts, 1,024-token
   system prompts, 128-token questions, 32 output tokens) through it as
   streaming ``/v1/completions`` at the arrival times (scaled), and reads each
   simulator's ``/metrics`` afterwards (requests served, prefix-cache queries
   and hits);
3. runs the same arrivals through the fleet simulation with the
   re-implemented ``vllm_router_cache_aware`` on the same 4 pods.

Tolerance: the fleet's prefix-cache hit rate within 0.05 of the real
router's, and the share of requests each pod served within 0.10 (pods
matched by rank of load, since worker order differs). TTFT is reported but
not held to a tolerance: the HTTP path adds real-time jitter multiplied by
the time scale. Writes ``bench/results/routing_crosscheck.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench import harness
from bench.router import COMPETITORS, ensure_competitors

from . import run
from .fleet import PodSpec, simulate
from .peers import VllmRouterCacheAware
from .workloads import TextFactory, _grouped, _poisson_times

import random

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_crosscheck.json"
PODS = 4
BLOCKS = 2048
TIME_SCALE = 2.0
RATE = 40.0  # requests per simulated second
DURATION = 15.0
HIT_TOLERANCE = 0.05
SHARE_TOLERANCE = 0.10


def workload(seed: int = 7):  # noqa: ANN201
    rng = random.Random(f"crosscheck/{seed}")
    return _grouped(rng, _poisson_times(rng, RATE, DURATION), TextFactory(seed), groups=8, per_group=16,
                    system=1024, question=128, output=32, prefix="k")


def _metric(page: str, name: str) -> float:
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            m = re.match(rf"{re.escape(name)}(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", line)
            if m:
                total += float(m.group(1))
    return total


async def _replay(url: str, reqs) -> list[float | None]:  # noqa: ANN001
    ttfts: list[float | None] = [None] * len(reqs)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            r = reqs[i]
            delay = r.time / TIME_SCALE - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": "m", "prompt": r.text, "max_tokens": r.output_len, "ignore_eos": True, "stream": True}
            start = time.perf_counter()
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if line.startswith(b"data:") and ttfts[i] is None:
                        ttfts[i] = (time.perf_counter() - start) * TIME_SCALE
        await asyncio.gather(*(one(i) for i in range(len(reqs))))
    return ttfts


def real_run(reqs, log_dir: Path) -> dict:  # noqa: ANN001
    procs = []
    try:
        ports = [harness.free_port() for _ in range(PODS)]
        for i, port in enumerate(ports):
            p = harness.spawn(f"sim-{i}", [sys.executable, "-m", "kinference_simulators.vllm", "--host", "127.0.0.1",
                                           "--port", str(port), "--model", "m", "--speed-profile", "h100",
                                           "--kv-blocks", str(BLOCKS), "--time-scale", str(TIME_SCALE),
                                           "--pod-name", f"pod-{i}", "--log-level", "warning"], log_dir)
            procs.append(p)
        for i, port in enumerate(ports):
            harness.wait_http(f"http://127.0.0.1:{port}/health", 60, procs[i].proc, f"sim-{i}")
        rport = harness.free_port()
        router = harness.spawn("vllm-router", [
            str(COMPETITORS / "bin" / "vllm-router"), "--worker-urls", *[f"http://127.0.0.1:{p}" for p in ports],
            "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(rport),
            "--prometheus-port", str(harness.free_port()), "--worker-startup-check-interval", "1",
            "--log-level", "warning"], log_dir)
        procs.append(router)
        harness.wait_http(f"http://127.0.0.1:{rport}/health", 60, router.proc, "vllm-router")
        ttfts = asyncio.run(_replay(f"http://127.0.0.1:{rport}/v1/completions", reqs))
        served, queries, hits = [], 0.0, 0.0
        import urllib.request

        for port in ports:
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            served.append(_metric(page, "vllm:request_success_total"))
            queries += _metric(page, "vllm:prefix_cache_queries_total")
            hits += _metric(page, "vllm:prefix_cache_hits_total")
        return {"served": served, "hit_rate": hits / queries if queries else 0.0,
                "ttft_p50_s": run._q([t for t in ttfts if t is not None], 0.5),
                "ttft_p99_s": run._q([t for t in ttfts if t is not None], 0.99),
                "answered": sum(t is not None for t in ttfts)}
    finally:
        for p in reversed(procs):
            p.stop()


def sim_run(reqs) -> dict:  # noqa: ANN001
    pods = [PodSpec(f"pod-{i}", "ws", "m", "h100", BLOCKS) for i in range(PODS)]
    res = simulate(reqs, pods, [VllmRouterCacheAware()], seed=7)
    ttft = [o.ttft for o in res.outcomes if o.ttft is not None]
    return {"served": list(res.per_pod_requests.values()),
            "hit_rate": res.prefix_hits / res.prefix_queries if res.prefix_queries else 0.0,
            "ttft_p50_s": run._q(ttft, 0.5), "ttft_p99_s": run._q(ttft, 0.99), "answered": len(ttft)}


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable, "-m", "bench.routing.crosscheck", *sys.argv[1:]],
                  dict(os.environ, PYTHONHASHSEED="0"))
    why = ensure_competitors()
    if why is not None:
        print(f"crosscheck skipped: {why}")
        return 1
    reqs = workload()
    with tempfile.TemporaryDirectory(prefix="routing-crosscheck-") as tmp:
        real = real_run(reqs, Path(tmp))
    sim = sim_run(workload())
    n = len(reqs)
    real_share = sorted(s / n for s in real["served"])
    sim_share = sorted(s / n for s in sim["served"])
    share_diff = max(abs(a - b) for a, b in zip(real_share, sim_share))
    hit_diff = abs(real["hit_rate"] - sim["hit_rate"])
    ok = hit_diff <= HIT_TOLERANCE and share_diff <= SHARE_TOLERANCE
    out = {"requests": n, "pods": PODS, "time_scale": TIME_SCALE, "real": real, "simulated": sim,
           "hit_rate_diff": hit_diff, "share_diff": share_diff, "hit_tolerance": HIT_TOLERANCE,
           "share_tolerance": SHARE_TOLERANCE, "within_tolerance": ok}
    print(f"vllm-router cache_aware, real binary vs re-implementation ({n} requests, {PODS} pods):")
    print(f"  prefix hit rate  real {real['hit_rate']:.3f}  simulated {sim['hit_rate']:.3f}  "
          f"(diff {hit_diff:.3f}, tolerance {HIT_TOLERANCE})")
    print(f"  requests per pod real {sorted(real['served'])}  simulated {sorted(sim['served'])}  "
          f"(largest share diff {share_diff:.3f}, tolerance {SHARE_TOLERANCE})")
    print(f"  TTFT p50/p99     real {real['ttft_p50_s']:.3f}/{real['ttft_p99_s']:.3f} s  simulated "
          f"{sim['ttft_p50_s']:.3f}/{sim['ttft_p99_s']:.3f} s (not held to a tolerance)")
    print("  WITHIN TOLERANCE" if ok else "  OUTSIDE TOLERANCE")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
