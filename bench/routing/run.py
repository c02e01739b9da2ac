"""The sweep: workloads x routers x loads -> rows, a table, plots.

Capacity (what "load 1.0" means)
--------------------------------
For each workload and GPU profile, one engine is given a backlog of 400 of
the workload's requests at once (no router involved) and its capacity is
``0.8 * 400 / (time the 320th request finished)``: the request rate one
saturated engine sustains with full batching on that request mix, its own
prefix cache included. Where requests share prefixes, the engine's backlog
holds only its share of the prefix groups (one in ``pods`` of them; per
model with two models): what each pod would see if every prefix lived on
exactly one pod, the best case for any router. The fleet's capacity is the
sum over its pods. So load 1.0 saturates even an ideal prefix-aware router,
and a router that spreads every prefix over every pod (round robin)
saturates earlier. An
offered load ``x`` is a Poisson (or the workload's own) arrival process at
``x * capacity`` requests/s.

Metrics per run
---------------
Requests arriving in the first ``warmup`` seconds are not measured (cold
caches); the rest are, until every one has finished (the run drains). TTFT
and end-to-end quantiles are over measured requests; output tokens/s and
goodput are per second of the measured arrival window; goodput counts the
requests whose TTFT and time per output token meet the workload's SLOs.
Prefix-cache hit rate and preemptions are the fleet's engine counters over
the whole run; ``load_cv`` is the coefficient of variation of requests per
pod, ``busy_cv`` of busy seconds per pod.

Floors (:mod:`.floor`): ``idle_floor_p50_s`` / ``idle_floor_p99_s`` are the
quantiles of each measured request's TTFT alone on an idle pod with its
shareable prefix cached, a strict lower bound for every router on those
arrivals; ``loaded_floor_p50_s`` / ``loaded_floor_p99_s`` add the decode
work the run's fleet carried per pod on average, an estimate of what a
perfectly balanced router would see.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kinference_simulators.profiles import get_profile

from . import floor, workloads
from .fleet import PodSpec, ProviderSpec, Router, RunResult, TelemetrySpec, fleet, simulate
from .kinference import Kinference, ReplicaShare, link
from .peers import PEERS

ROUTERS = ["round_robin", "least_queue", "gie_default", "llmd_sticky", "vllm_router_cache_aware", "kinference"]
LOADS = [0.2, 0.4, 0.6, 0.8, 0.9, 1.0, 1.2]


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    pods: Callable[[], list[PodSpec]]
    duration: float
    ttft_slo: float
    tpot_slo: float = 0.05
    warmup: float = 5.0


def _pods8() -> list[PodSpec]:
    return fleet(8)


def _trial() -> list[PodSpec]:
    return fleet(4, blocks=1200)


def _two_models() -> list[PodSpec]:
    return fleet(8, worker_sets=(("ws-m", "m"), ("ws-n", "n")))


def _hetero() -> list[PodSpec]:
    specs = fleet(8, profiles=("h100", "a10g"))
    return [PodSpec(p.name, p.worker_set, p.model, p.profile, 8192 if p.profile == "h100" else 4096)
            for p in specs]


SPECS: dict[str, WorkloadSpec] = {
    s.name: s
    for s in (
        WorkloadSpec("chat", _pods8, 60.0, ttft_slo=2.0),
        WorkloadSpec("shared_prefix", _pods8, 30.0, ttft_slo=0.5),
        WorkloadSpec("shared_prefix_long", _pods8, 60.0, ttft_slo=2.0),
        WorkloadSpec("multiturn", _pods8, 40.0, ttft_slo=1.0),
        WorkloadSpec("bursty", _pods8, 32.0, ttft_slo=0.5),
        WorkloadSpec("two_models", _two_models, 30.0, ttft_slo=0.5),
        WorkloadSpec("hetero", _hetero, 30.0, ttft_slo=1.0),
        WorkloadSpec("trial", _trial, 60.0, ttft_slo=0.5),
    )
}


def pin_hash_seed(module: str, argv: Sequence[str] | None = None) -> None:
    """Re-execute ``python -m module`` with ``PYTHONHASHSEED=0`` unless it is
    set so: the fleet benchmark's runs are deterministic for a seed only with
    Python's string hashing pinned. ``argv``: the arguments (default: this
    process's)."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        rest = sys.argv[1:] if argv is None else list(argv)
        os.execve(sys.executable, [sys.executable, "-m", module, *rest], dict(os.environ, PYTHONHASHSEED="0"))


def check_names(ap: argparse.ArgumentParser, workloads: Sequence[str] = (), routers: Sequence[str] = ()) -> None:
    """A benchmark's ``--workloads`` and ``--routers`` checked: ``ap.error``
    naming the first unknown one and what is known."""
    for w in workloads:
        if w not in SPECS:
            ap.error(f"unknown workload {w!r}; known: {', '.join(SPECS)}")
    for r in routers:
        if r not in ROUTERS:
            ap.error(f"unknown router {r!r}; known: {', '.join(ROUTERS)}")


def make_router(name: str) -> Router:
    if name == "kinference":
        return Kinference()
    return PEERS[name]()


# ------------------------------------------------------------- capacity

_capacity_memo: dict[tuple[str, str, int, int, int], float] = {}


def engine_capacity(workload: str, profile: str, blocks: int, seed: int, share: int = 1,
                    backlog: int = 400) -> float:
    """Requests/s one saturated engine of ``profile`` sustains on ``workload``,
    given one ``share``-th of its prefix groups (each prefix on one pod: the
    best any router can do)."""
    key = (workload, profile, blocks, seed, share)
    if key in _capacity_memo:
        return _capacity_memo[key]
    reqs = workloads.generate(workload, seed + 1000, 1000.0, backlog * share / 1000.0 * 1.6)
    reqs = [r for r in reqs if r.group < 0 or r.group % share == 0][:backlog]
    for r in reqs:
        r.time = 0.0
    pod = PodSpec("cap", "ws", "m", profile, blocks)
    reqs = [r for r in reqs]
    for r in reqs:
        r.model = "m"
    res = simulate(reqs, [pod], [PEERS["round_robin"]()], seed=seed)
    done = sorted(o.finished for o in res.outcomes if o.finished is not None)
    k = int(0.8 * len(done))
    cap = k / done[k - 1]
    _capacity_memo[key] = cap
    return cap


def fleet_capacity(workload: str, pods: Sequence[PodSpec], seed: int) -> float:
    share = max(1, len(pods) // len({p.model for p in pods}))
    return sum(engine_capacity(workload, p.profile, p.num_gpu_blocks, seed, share) for p in pods)


# -------------------------------------------------------------- metrics


def _q(xs: Sequence[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    i = min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))
    return s[i]


def metrics(res: RunResult, spec: WorkloadSpec) -> dict:
    measured = [o for o in res.outcomes if o.req.time >= spec.warmup]
    window = max(1e-9, spec.duration - spec.warmup)
    ttft = [o.ttft for o in measured if o.ttft is not None]
    e2e = [o.e2e for o in measured if o.e2e is not None]
    out_tokens = sum(o.output_tokens for o in measured)
    good = sum(1 for o in measured if o.ttft is not None and o.ttft <= spec.ttft_slo
               and o.tpot is not None and o.tpot <= spec.tpot_slo)
    reqs = list(res.per_pod_requests.values())
    busy = list(res.per_pod_busy.values())

    def cv(xs: list[float]) -> float:
        m = statistics.fmean(xs) if xs else 0.0
        return statistics.pstdev(xs) / m if m > 0 else 0.0

    floors = floor.measured_floors(res, spec.warmup)
    idle = [f.idle_s for f in floors]
    loaded = [f.loaded_s for f in floors]

    return {
        "ttft_p50_s": _q(ttft, 0.5), "ttft_p90_s": _q(ttft, 0.9), "ttft_p99_s": _q(ttft, 0.99),
        "e2e_p50_s": _q(e2e, 0.5), "e2e_p99_s": _q(e2e, 0.99),
        "output_tokens_per_s": out_tokens / window,
        "goodput": good / window,
        "slo_attainment": good / len(measured) if measured else None,
        "prefix_hit_rate": res.prefix_hits / res.prefix_queries if res.prefix_queries else 0.0,
        "preemptions": res.preemptions,
        "load_cv": cv(reqs), "busy_cv": cv(busy),
        "requests": len(measured),
        "rejected": sum(1 for o in measured if o.rejected),
        "idle_floor_p50_s": _q(idle, 0.5), "idle_floor_p99_s": _q(idle, 0.99),
        "loaded_floor_p50_s": _q(loaded, 0.5), "loaded_floor_p99_s": _q(loaded, 0.99),
        "fleet_carried": floor.carried(res),
    }


# ---------------------------------------------------------------- sweep


@dataclass
class Case:
    workload: str
    router: str
    load: float
    replicas: int = 1
    scrape_interval: float = 0.1
    seed: int = 1
    variant: str = ""
    extra: dict = field(default_factory=dict)
    #: another draw of the pods' scrape instants (:func:`.fleet.simulate`); 0: the benchmark's
    phase: int = 0


def run_case(case: Case, make: Callable[[str], Router] = make_router) -> dict:
    spec = SPECS[case.workload]
    pods = spec.pods()
    cap = fleet_capacity(case.workload, pods, case.seed)
    rate = case.load * cap
    reqs = workloads.generate(case.workload, case.seed, rate, spec.duration)
    if case.workload == "two_models":
        pass  # models already alternate by group
    if case.variant == "before":
        routers = [Kinference(fixed=False) for _ in range(case.replicas)]
    elif case.variant == "replica_sync":
        routers = [Kinference(share=ReplicaShare()) for _ in range(case.replicas)]
        link(routers)
    else:
        routers = [make(case.router) for _ in range(case.replicas)]
    res = simulate(reqs, pods, routers, telemetry=TelemetrySpec(scrape_interval=case.scrape_interval),
                   seed=case.seed, window=(spec.warmup, spec.duration), phase=case.phase)
    row = {"workload": case.workload, "router": case.router, "load": case.load, "replicas": case.replicas}
    row.update(metrics(res, spec))
    row.update({"scrape_interval_s": case.scrape_interval, "capacity_rps": cap, "rate_rps": rate,
                "seed": case.seed})
    if case.variant:
        row["variant"] = case.variant
    if case.phase:
        row["phase"] = case.phase
    return row


def table(rows: Sequence[dict], keys: Sequence[str] = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p99_s",
                                                         "goodput", "prefix_hit_rate", "preemptions",
                                                         "load_cv")) -> str:
    head = f"{'workload':<19}{'router':<25}{'load':>5}{'rep':>4}" + "".join(f"{k.replace('_s', ''):>14}" for k in keys)
    out = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append(f"{'-':>14}" if v is None else f"{v:>14.3f}" if isinstance(v, float) else f"{v:>14}")
        name = r["router"] + (f"[{r['variant']}]" if r.get("variant") else "")
        out.append(f"{r['workload']:<19}{name:<25}{r['load']:>5.2f}{r['replicas']:>4}" + "".join(cells))
    return "\n".join(out)


def versus(rows: Sequence[dict], workload: str, load: float) -> tuple[list[dict], dict | None, list[dict]]:
    """One case's rows (one router replica, 0.1 s scrapes, no variant, the
    benchmark's scrape instants), Kinference's row among them, and the
    peers' rows that have a TTFT."""
    sel = [r for r in rows if r["workload"] == workload and abs(r["load"] - load) < 1e-9 and r["replicas"] == 1
           and r["scrape_interval_s"] == 0.1 and not r.get("variant") and not r.get("phase")]
    k = next((r for r in sel if r["router"] == "kinference"), None)
    peers = [r for r in sel if r["router"] != "kinference" and r["ttft_p99_s"] is not None]
    return sel, k, peers


#: the headline's workloads when none are named: every workload the sweep has
HEADLINE_WORKLOADS = ("chat", "shared_prefix", "shared_prefix_long", "multiturn", "bursty", "two_models", "hetero",
                      "trial")


def goal(h: dict) -> dict:
    """The goal of one headline case, restated where the floors make 30%
    below the best peer impossible: TTFT p99 at most max(0.7x the best
    peer's, 1.05x the idle floor, the loaded floor); goodput at least the
    best peer's; p50 within 5% of the best peer's. ``{"goal_p99_s",
    "met", "missed": [what fell short]}``."""
    parts = [0.7 * h["best_peer_p99_s"]]
    if h.get("idle_floor_p99_s") is not None:
        parts.append(1.05 * h["idle_floor_p99_s"])
    if h.get("loaded_floor_p99_s") is not None:
        parts.append(h["loaded_floor_p99_s"])
    target = max(parts)
    missed = []
    if h["kinference_p99_s"] > target + 1e-9:
        missed.append(f"p99 {h['kinference_p99_s'] / target:.2f}x the target")
    if h["goodput_ratio"] is not None and h["goodput_ratio"] < 1.0 - 1e-9:
        missed.append(f"goodput x{h['goodput_ratio']:.3f}")
    if h["p50_ratio"] > 1.05 + 1e-9:
        missed.append(f"p50 x{h['p50_ratio']:.2f}")
    return {"goal_p99_s": target, "met": not missed, "missed": missed}


def headline(rows: Sequence[dict], workloads_: Sequence[str] = HEADLINE_WORKLOADS,
             loads: Sequence[float] = (0.8, 0.9, 1.0)) -> list[dict]:
    """Per workload and load: Kinference's TTFT p99 and goodput against the
    best peer's, and the floors under them (:mod:`.floor`): the idle floor's
    p99 (the same arrivals in every row of the case), the lowest loaded
    floor p99 of the case's rows, the best peer's p99 as a multiple of the
    idle floor, whether 30% below the best peer would be under the idle
    floor, i.e. out of any router's reach, and the verdict on the goal
    restated with the floors (:func:`goal`)."""
    out = []
    for w in workloads_:
        for load in loads:
            sel, k, peers = versus(rows, w, load)
            if k is None or not peers:
                continue
            best_p99 = min(peers, key=lambda r: r["ttft_p99_s"])
            best_good = max(peers, key=lambda r: r["goodput"])
            best_p50 = min(peers, key=lambda r: r["ttft_p50_s"])
            out.append({
                "workload": w, "load": load,
                "kinference_p99_s": k["ttft_p99_s"], "best_peer_p99": best_p99["router"],
                "best_peer_p99_s": best_p99["ttft_p99_s"],
                "p99_ratio": k["ttft_p99_s"] / best_p99["ttft_p99_s"],
                "kinference_goodput": k["goodput"], "best_peer_goodput": best_good["router"],
                "goodput_ratio": k["goodput"] / best_good["goodput"] if best_good["goodput"] else None,
                "p50_ratio": k["ttft_p50_s"] / best_p50["ttft_p50_s"],
            })
            idle = k.get("idle_floor_p99_s")
            loaded = [r["loaded_floor_p99_s"] for r in sel if r.get("loaded_floor_p99_s") is not None]
            if idle is not None:
                target = 0.7 * best_p99["ttft_p99_s"]
                out[-1].update({
                    "idle_floor_p99_s": idle,
                    "loaded_floor_p99_s": min(loaded) if loaded else None,
                    "best_peer_over_floor": best_p99["ttft_p99_s"] / idle if idle > 0 else None,
                    "kinference_over_floor": k["ttft_p99_s"] / idle if idle > 0 else None,
                    "target_p99_s": target,
                    "target_below_floor": target < idle,
                })
            out[-1].update(goal(out[-1]))
    return out


def seeded(seed: int) -> random.Random:
    return random.Random(seed)


def gpu_summary(pods: Sequence[PodSpec]) -> str:
    by: dict[str, int] = {}
    for p in pods:
        by[p.profile] = by.get(p.profile, 0) + 1
    return ", ".join(f"{n} x {prof} ({get_profile(prof).gpu_model})" for prof, n in by.items())


__all__ = ["Case", "LOADS", "ROUTERS", "SPECS", "headline", "run_case", "table", "ProviderSpec"]


def markdown(rows: Sequence[dict], workload: str, loads: Sequence[float] = (0.4, 0.8, 1.0, 1.2),
             replicas: int = 1, scrape: float = 0.1) -> str:
    """One workload's rows as a Markdown table (for docs/routing-benchmark.md)."""
    sel = [r for r in rows if r["workload"] == workload and r["replicas"] == replicas
           and r["scrape_interval_s"] == scrape and any(abs(r["load"] - x) < 1e-9 for x in loads)]
    out = ["| load | router | TTFT p50 | p90 | p99 | e2e p99 | goodput/s | hit rate | preempt | load CV |",
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(sel, key=lambda r: (r["load"], ROUTERS.index(r["router"]), r.get("variant", ""))):
        name = r["router"] + (f" ({r['variant']})" if r.get("variant") else "")
        if r["router"] == "kinference" and not r.get("variant"):
            name = "**kinference**"
        f = lambda v, d=3: "-" if v is None else f"{v:.{d}f}"  # noqa: E731
        out.append(f"| {r['load']:.1f} | {name} | {f(r['ttft_p50_s'])} | {f(r['ttft_p90_s'])} | "
                   f"{f(r['ttft_p99_s'])} | {f(r['e2e_p99_s'], 1)} | {f(r['goodput'], 1)} | "
                   f"{f(r['prefix_hit_rate'], 2)} | {r['preemptions']} | {f(r['load_cv'], 2)} |")
    return "\n".join(out)
