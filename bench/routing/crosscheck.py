"""Cross-check the re-implemented ``cache_aware`` against the real vllm-router.

``python -m bench.routing.crosscheck [--seed N] [--time-scale X] [--log-dir DIR
--router-log-level debug]`` (part of ``make bench-routing``):

1. starts 4 HTTP engine simulators (``kinference_simulators.vllm``, the same
   scheduler model as the fleet, ``h100`` profile, 2,048 KV blocks) in
   accelerated time (``--time-scale``, simulated seconds per real second) on
   127.0.0.1 with free ports, and the ``vllm-router`` binary (PyPI, installed
   in ``bench/.venv-competitors``, never a product dependency) in front of them
   with ``--policy cache_aware`` and its default thresholds. The router asks
   each simulator's ``/tokenize`` for the prompt's token ids and matches
   prefixes on them (without that endpoint it gets nothing to match and
   falls back to least-load for every request);
2. replays a small shared-prefix workload (8 groups x 16 prompts, 1,024-token
   system prompts, 128-token questions, 32 output tokens) through it as
   streaming ``/v1/completions`` at the arrival times (scaled), notes which
   pod answered each request (every simulator gets its own ``--seed``, so its
   completion ids name it) and reads each simulator's ``/metrics``
   afterwards (requests served, prefix-cache queries and hits, preemptions);
3. runs the same arrivals through the fleet simulation with the
   re-implemented ``vllm_router_cache_aware`` on the same 4 pods.

Tolerances (:func:`compare`): the fleet's prefix-cache hit rate within 0.05
of the real router's; the share of requests sent to the pod their prefix
group was sent to most within 0.05 (the decision, which the hit rate only
shows through the cache: with room in every cache, a router that ignores
prefixes still hits on the system prompts); and at least 0.98 of the real
router's picks allowed by the re-implemented rule when it is fed the real
run's own timeline (:func:`explained`: a pick-by-pick check). The share of
requests each pod served is reported (pods matched by rank of load), not
held: see :func:`compare`. TTFT is reported but not held to a tolerance: the HTTP path
adds real-time jitter multiplied by the time scale. Prints the table,
writes ``bench/results/routing_crosscheck.json`` and exits 1 when outside a
tolerance (or when the binary cannot be installed or a request failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench import harness
from bench.router import COMPETITORS, ensure_competitors

from . import run
from .fleet import PodSpec, prepare, simulate
from .peers import VllmRouterCacheAware
from .workloads import TextFactory, _grouped, _poisson_times

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_crosscheck.json"
PODS = 4
BLOCKS = 2048
TIME_SCALE = 2.0
RATE = 40.0  # requests per simulated second
DURATION = 15.0
HIT_TOLERANCE = 0.05
CONCENTRATION_TOLERANCE = 0.05
#: at least this share of the real picks must be ones the rule allows on the real timeline
EXPLAINED_MIN = 0.98


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


async def _replay(url: str, reqs, time_scale: float) -> dict[str, list]:  # noqa: ANN001
    """Send ``reqs`` at their (scaled) times: each one's TTFT (simulated seconds),
    completion id, and when it was sent and its stream ended (real seconds)."""
    ttfts: list[float | None] = [None] * len(reqs)
    ids: list[str | None] = [None] * len(reqs)
    sent: list[float | None] = [None] * len(reqs)
    ended: list[float | None] = [None] * len(reqs)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            r = reqs[i]
            delay = r.time / time_scale - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": "m", "prompt": r.text, "max_tokens": r.output_len, "ignore_eos": True, "stream": True}
            start = time.perf_counter()
            sent[i] = start - t0
            async with session.post(url, json=body) as resp:
                resp.raise_for_status()
                async for line in resp.content:
                    if line.startswith(b"data:") and ttfts[i] is None:
                        ttfts[i] = (time.perf_counter() - start) * time_scale
                        m = re.search(rb'"id":"([^"]+)"', line)
                        ids[i] = m.group(1).decode() if m else None
            ended[i] = time.perf_counter() - t0
        await asyncio.gather(*(one(i) for i in range(len(reqs))))
    return {"ttfts": ttfts, "ids": ids, "sent": sent, "ended": ended}


def _response_ids(seed: int, n: int) -> list[str]:
    """The first ``n`` completion ids a simulator started with ``--seed seed`` hands out
    (its id generator is seeded from ``--seed``), so that each answer names its pod."""
    rng = random.Random(seed)
    rng.random()  # the fault injector's seed
    ids = random.Random(rng.random())
    return [f"cmpl-{ids.getrandbits(64):016x}" for _ in range(n)]


def real_run(reqs, log_dir: Path, time_scale: float = TIME_SCALE,  # noqa: ANN001
             router_log_level: str = "warning") -> dict:
    procs = []
    try:
        ports = [harness.free_port() for _ in range(PODS)]
        for i, port in enumerate(ports):
            p = harness.spawn(f"sim-{i}", [sys.executable, "-m", "kinference_simulators.vllm", "--host", "127.0.0.1",
                                           "--port", str(port), "--model", "m", "--speed-profile", "h100",
                                           "--kv-blocks", str(BLOCKS), "--time-scale", str(time_scale),
                                           "--pod-name", f"pod-{i}", "--seed", str(100 + i), "--log-level", "warning"], log_dir)
            procs.append(p)
        for i, port in enumerate(ports):
            harness.wait_http(f"http://127.0.0.1:{port}/health", 60, procs[i].proc, f"sim-{i}")
        rport = harness.free_port()
        router = harness.spawn("vllm-router", [
            str(COMPETITORS / "bin" / "vllm-router"), "--worker-urls", *[f"http://127.0.0.1:{p}" for p in ports],
            "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(rport),
            "--prometheus-port", str(harness.free_port()), "--worker-startup-check-interval", "1",
            "--log-level", router_log_level], log_dir)
        procs.append(router)
        harness.wait_http(f"http://127.0.0.1:{rport}/health", 60, router.proc, "vllm-router")
        got = asyncio.run(_replay(f"http://127.0.0.1:{rport}/v1/completions", reqs, time_scale))
        ttfts, ids = got["ttfts"], got["ids"]
        owner = {rid: f"pod-{i}" for i in range(PODS) for rid in _response_ids(100 + i, 4 * len(reqs))}
        picks = [owner.get(rid) if rid else None for rid in ids]
        served, queries, hits, preempted = [], 0.0, 0.0, 0.0
        for port in ports:
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            served.append(_metric(page, "vllm:request_success_total"))
            queries += _metric(page, "vllm:prefix_cache_queries_total")
            hits += _metric(page, "vllm:prefix_cache_hits_total")
            preempted += _metric(page, "vllm:num_preemptions_total")
        return {"served": served, "hit_rate": hits / queries if queries else 0.0, "preemptions": preempted,
                "ttft_p50_s": run._q([t for t in ttfts if t is not None], 0.5),
                "ttft_p99_s": run._q([t for t in ttfts if t is not None], 0.99),
                "answered": sum(t is not None for t in ttfts), "picks": picks,
                "sent_at": got["sent"], "ended_at": got["ended"]}
    finally:
        for p in reversed(procs):
            p.stop()


def sim_run(reqs) -> dict:  # noqa: ANN001
    pods = [PodSpec(f"pod-{i}", "ws", "m", "h100", BLOCKS) for i in range(PODS)]
    res = simulate(reqs, pods, [VllmRouterCacheAware()], seed=7)
    ttft = [o.ttft for o in res.outcomes if o.ttft is not None]
    return {"served": list(res.per_pod_requests.values()),
            "hit_rate": res.prefix_hits / res.prefix_queries if res.prefix_queries else 0.0,
            "preemptions": res.preemptions,
            "ttft_p50_s": run._q(ttft, 0.5), "ttft_p99_s": run._q(ttft, 0.99), "answered": len(ttft),
            "picks": [o.target.rsplit("/", 1)[-1] if o.target else None for o in res.outcomes]}


def concentration(picks: Sequence[str | None], groups: Sequence[int]) -> float:
    """The share of requests sent to the pod their prefix group was sent to
    most (1.0: every group stays on one pod; about 1/pods: routing ignores
    prefixes)."""
    per: dict[int, dict[str | None, int]] = {}
    for pod, g in zip(picks, groups):
        c = per.setdefault(g, {})
        c[pod] = c.get(pod, 0) + 1
    n = len(groups)
    return sum(max(c.values()) for c in per.values()) / n if n else 1.0


def explained(reqs, picks: Sequence[str | None], sent_at: Sequence[float | None],  # noqa: ANN001
              ended_at: Sequence[float | None]) -> float:
    """The share of the real router's picks that the re-implemented rule allows
    when it is fed the real run's own timeline: requests open and finish when
    the client saw them sent and ended, and each pick, the real one, is
    recorded before the next decision (so one disagreement does not cascade).
    Ties allow every tied worker: the pods' names differ between the runs."""
    pods = [PodSpec(f"pod-{i}", "ws", "m", "h100", BLOCKS) for i in range(PODS)]
    rule = VllmRouterCacheAware()
    rule.setup(pods, [], random.Random(0))
    prepare(reqs)
    events = []
    for i, (r, pod, t0, t1) in enumerate(zip(reqs, picks, sent_at, ended_at)):
        if pod is None or t0 is None or t1 is None:
            continue
        events.append((t0, 1, i))
        events.append((t1, 0, i))  # at one instant, a finish before a send
    agree = total = 0
    for _, kind, i in sorted(events):
        req, key = reqs[i], f"default/ws/{picks[i]}"
        if kind == 0:
            rule.on_finished(req, 0.0)
            continue
        total += 1
        agree += key in rule.allowed(req)
        rule.commit(req, key)
    return agree / total if total else 1.0


def compare(real: dict, sim: dict, groups: Sequence[int], explained_share: float) -> dict:
    """The differences and whether each is within its tolerance.

    ``real`` and ``sim`` carry ``hit_rate``, ``served`` (requests per pod, in
    any pod order) and ``picks`` (the pod of each request, in arrival order);
    ``groups`` is each request's prefix group; ``explained_share`` what
    :func:`explained` found. The per-pod share is reported, not held: which
    pod a new group lands on is a tie or near-tie of loads settled by
    milliseconds of real time, and one group is an eighth of the requests
    (the binary against itself on the same arrivals differs by 0.11)."""
    n = len(groups)
    if len(real["picks"]) != n or len(sim["picks"]) != n:
        raise ValueError(f"picks for {len(real['picks'])} (real) and {len(sim['picks'])} (simulated) "
                         f"requests, expected {n}")
    real_share = sorted(s / n for s in real["served"])
    sim_share = sorted(s / n for s in sim["served"])
    if len(real_share) != len(sim_share):
        raise ValueError(f"{len(real_share)} real pods against {len(sim_share)} simulated")
    share_diff = max(abs(a - b) for a, b in zip(real_share, sim_share))
    hit_diff = abs(real["hit_rate"] - sim["hit_rate"])
    real_conc, sim_conc = concentration(real["picks"], groups), concentration(sim["picks"], groups)
    conc_diff = abs(real_conc - sim_conc)
    checks = {"hit_rate": hit_diff <= HIT_TOLERANCE, "concentration": conc_diff <= CONCENTRATION_TOLERANCE,
              "explained": explained_share >= EXPLAINED_MIN}
    return {"hit_rate_diff": hit_diff, "share_diff": share_diff, "explained": explained_share,
            "real_concentration": real_conc,
            "simulated_concentration": sim_conc, "concentration_diff": conc_diff, "checks": checks,
            "within_tolerance": all(checks.values())}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.crosscheck", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=7, help="workload seed (default 7)")
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE,
                    help=f"simulated seconds per real second for the HTTP run (default {TIME_SCALE})")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file (default %(default)s)")
    ap.add_argument("--log-dir", type=Path, help="keep the simulators' and the router's logs here")
    ap.add_argument("--router-log-level", default="warning", choices=["debug", "info", "warning", "error"],
                    help="vllm-router's --log-level (debug logs every decision's match rate)")
    args = ap.parse_args(argv)
    if args.time_scale <= 0:
        ap.error(f"--time-scale must be positive, got {args.time_scale}")
    run.pin_hash_seed("bench.routing.crosscheck")
    why = ensure_competitors()
    if why is not None:
        print(f"crosscheck not run: {why}")
        return 1
    reqs = workload(args.seed)
    groups = [r.group for r in reqs]
    if args.log_dir is not None:
        real = real_run(reqs, args.log_dir, args.time_scale, args.router_log_level)
    else:
        with tempfile.TemporaryDirectory(prefix="routing-crosscheck-") as tmp:
            real = real_run(reqs, Path(tmp), args.time_scale, args.router_log_level)
    sim = sim_run(workload(args.seed))
    n = len(reqs)
    cmp = compare(real, sim, groups, explained(reqs, real["picks"], real["sent_at"], real["ended_at"]))
    ok = cmp["within_tolerance"] and real["answered"] == n and None not in real["picks"]
    out = {"requests": n, "pods": PODS, "seed": args.seed, "time_scale": args.time_scale, "real": real,
           "simulated": sim, **cmp, "hit_tolerance": HIT_TOLERANCE, "explained_min": EXPLAINED_MIN,
           "concentration_tolerance": CONCENTRATION_TOLERANCE, "within_tolerance": ok}
    mark = {True: "ok", False: "OUTSIDE"}
    c = cmp["checks"]
    print(f"vllm-router cache_aware, real binary vs re-implementation ({n} requests, {PODS} pods, seed {args.seed}, "
          f"time scale {args.time_scale:g}):")
    print(f"  prefix hit rate    real {real['hit_rate']:.3f}  simulated {sim['hit_rate']:.3f}  "
          f"diff {cmp['hit_rate_diff']:.3f} (tolerance {HIT_TOLERANCE})  {mark[c['hit_rate']]}")
    print(f"  group on one pod   real {cmp['real_concentration']:.3f}  simulated "
          f"{cmp['simulated_concentration']:.3f}  diff {cmp['concentration_diff']:.3f} "
          f"(tolerance {CONCENTRATION_TOLERANCE})  {mark[c['concentration']]}")
    print(f"  picks the rule allows on the real timeline {cmp['explained']:.3f} (at least {EXPLAINED_MIN})  "
          f"{mark[c['explained']]}")
    print(f"  requests per pod   real {sorted(int(x) for x in real['served'])}  simulated {sorted(sim['served'])}  "
          f"largest share diff {cmp['share_diff']:.3f} (reported: new groups land by ms-level load ties)")
    print(f"  preemptions        real {int(real['preemptions'])}  simulated {sim['preemptions']}")
    print(f"  TTFT p50/p99       real {real['ttft_p50_s']:.3f}/{real['ttft_p99_s']:.3f} s  simulated "
          f"{sim['ttft_p50_s']:.3f}/{sim['ttft_p99_s']:.3f} s (not held to a tolerance)")
    if real["answered"] != n or None in real["picks"]:
        print(f"  {n - real['answered']} requests unanswered, {real['picks'].count(None)} with no known pod")
    print("  WITHIN TOLERANCE" if ok else "  OUTSIDE TOLERANCE")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
