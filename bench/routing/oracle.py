"""A router told everything: how low an online router's TTFT tail can go.

``make bench-routing-oracle`` (``python -m bench.routing.oracle``) runs,
beside every router of the sweep, :class:`FullInformation`: at each arrival
it copies each candidate pod's engine scheduler as it is at that instant
(its queue, its running batch, its KV cache, the step in progress) and runs
the copy forward with the request added and nothing else arriving, and
sends the request where its first token comes soonest. No telemetry delay,
no estimate: the exact answer to "where would this request be served
first now", which is what every router here (Kinference's PredictedTTFT
included) tries to guess. It does not know the future: a request placed
on the fastest pod can still be slowed by the ones that arrive after it,
which is where a Poisson tail comes from.

What it is for: the goal of ``make bench-routing`` asks Kinference's TTFT
p99 to be at most max(0.7x the best peer's, 1.05x the idle floor, the
loaded floor) at loads 0.8-1.0. The loaded floor (:mod:`.floor`) is an
estimate of a perfectly balanced fleet, not a bound. Where this router's
p99 is above the goal too, the goal asks for less than exact knowledge of
every pod buys a router that places each request greedily, and the
distance between Kinference and this router is what better information or
a better estimate could still win there.

It is not a peer: the headline's best peer and the goal never count it.
The run writes ``bench/results/routing_oracle.json`` and the
``routing:full-information`` block of docs/routing-benchmark.md
(``--page-only`` rewrites the block from the file). Each probe copies a
scheduler, so a case costs minutes where the other routers take seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench.harness import page_only, save_results

from . import run
from .fleet import Pod, Router
from .workloads import SimRequest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_oracle.json"
PAGE = REPO / "docs" / "routing-benchmark.md"
BLOCK = "routing:full-information"
NAME = "full_information"
#: a probe gives up after this many steps (its request then counts as never served there)
MAX_STEPS = 2000
_PROBE = "\x00probe"


def probe_ttft(pod: Pod, req: SimRequest, now: float) -> float:
    """Seconds from ``now`` to ``req``'s first token if it were added to
    ``pod`` now and nothing else arrived: a copy of the pod's scheduler
    run forward (from the end of the step in progress, if one is)."""
    sched = copy.deepcopy(pod.sched)
    sched.add_request(_PROBE, req.prompt_tokens, req.engine_hashes, req.output_len, "length", now)
    t = pod.step_end if pod.busy and pod.step_end > now else now
    for _ in range(MAX_STEPS):
        result = sched.step(t)
        for ev in result.tokens:
            if ev.request_id == _PROBE and ev.index == 0:
                return ev.time - now
        if not sched.has_work():
            break
        t = result.end
    return math.inf


class FullInformation(Router):
    """Each request to the pod of its model where :func:`probe_ttft` is lowest
    (the first such pod in the fleet's order on a tie)."""

    name = NAME

    def see_fleet(self, pods: Mapping[str, Pod]) -> None:
        self.fleet = dict(pods)

    def pick(self, req: SimRequest, now: float) -> str | None:
        best: tuple[float, str] | None = None
        for key, pod in self.fleet.items():
            if pod.spec.model != req.model:
                continue
            ttft = probe_ttft(pod, req, now)
            if best is None or ttft < best[0]:
                best = (ttft, key)
        return None if best is None else best[1]


def _make(name: str) -> Router:
    return FullInformation() if name == NAME else run.make_router(name)


def _one(case: run.Case) -> dict:
    return run.run_case(case, _make)


def compare(rows: Sequence[dict]) -> list[dict]:
    """Per headline case: Kinference's p99, the goal (:func:`.run.goal`, the
    full-information router left out of it), and the full-information
    router's p50 and p99 on the same arrivals."""
    out = []
    peers = [r for r in rows if r["router"] != NAME]
    for h in run.headline(peers, sorted({r["workload"] for r in rows}, key=list(run.SPECS).index),
                          sorted({r["load"] for r in rows})):
        o = next((r for r in rows if r["router"] == NAME and r["workload"] == h["workload"]
                  and abs(r["load"] - h["load"]) < 1e-9), None)
        if o is None or o["ttft_p99_s"] is None:
            continue
        out.append({
            "workload": h["workload"], "load": h["load"], "kinference_p99_s": h["kinference_p99_s"],
            "best_peer": h["best_peer_p99"], "best_peer_p99_s": h["best_peer_p99_s"],
            "goal_p99_s": h["goal_p99_s"], "goal_met": h["met"],
            "full_information_p50_s": o["ttft_p50_s"], "full_information_p99_s": o["ttft_p99_s"],
            "goal_below_full_information": h["goal_p99_s"] < o["ttft_p99_s"],
        })
    return out


def markdown(cmp: Sequence[dict], seed: int | None) -> str:
    out = [f"Written by `make bench-routing-oracle` from `bench/results/routing_oracle.json` (seed {seed}; "
           "the router told everything is not a peer: the goal column is the headline's).",
           "",
           "| workload | load | Kinference p99 | best peer p99 | goal p99 | full information p99 (p50) | "
           "goal under the full-information p99 | Kinference / full information |",
           "|---|---:|---:|---|---:|---:|---|---:|"]
    for c in cmp:
        out.append(f"| {c['workload']} | {c['load']:.1f} | {c['kinference_p99_s']:.3f} s | {c['best_peer']} "
                   f"({c['best_peer_p99_s']:.3f} s) | {c['goal_p99_s']:.3f} s"
                   + ("" if c["goal_met"] else " (missed)")
                   + f" | {c['full_information_p99_s']:.3f} s ({c['full_information_p50_s']:.3f} s) | "
                   + ("yes" if c["goal_below_full_information"] else "no")
                   + f" | x{c['kinference_p99_s'] / c['full_information_p99_s']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.oracle", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(run.HEADLINE_WORKLOADS),
                    help="comma-separated (default: the headline's)")
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.8, 0.9, 1.0],
                    help="comma-separated (default 0.8,0.9,1.0: the goal's)")
    ap.add_argument("--seed", type=int, default=1, help="the arrivals' seed (default 1, the headline's)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file (default "
                    "bench/results/routing_oracle.json)")
    ap.add_argument("--merge", action="store_true", help="keep the cases of --out this run does not measure")
    ap.add_argument("--page-only", action="store_true", help="rewrite the page's block from --out, measure nothing")
    ap.add_argument("--no-page", action="store_true", help="leave docs/routing-benchmark.md alone")
    args = ap.parse_args(argv)
    run.check_names(ap, args.workloads)
    if args.page_only:
        rows = json.loads(args.out.read_text()) if args.out.exists() else []
        seed = rows[0]["seed"] if rows else None
        return page_only(ap.prog, BLOCK, rows, args.out, PAGE, markdown(compare(rows), seed))
    run.pin_hash_seed("bench.routing.oracle", argv)  # measuring: deterministic for the seed
    todo = [run.Case(w, r, load, seed=args.seed) for w in args.workloads for load in args.loads
            for r in [NAME, *run.ROUTERS]]  # the slow ones first
    print(f"bench-routing-oracle: {len(todo)} runs on {args.jobs} processes (seed {args.seed})", flush=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(_one, todo))
    if args.merge and args.out.exists():
        fresh = {(r["workload"], r["load"], r["router"]) for r in rows}
        rows = [r for r in json.loads(args.out.read_text())
                if (r["workload"], r["load"], r["router"]) not in fresh and r["seed"] == args.seed] + rows
    cmp = compare(rows)
    for c in cmp:
        print(f"  {c['workload']:<18} {c['load']:.1f}: Kinference p99 {c['kinference_p99_s']:.3f}s, goal "
              f"{c['goal_p99_s']:.3f}s, full information {c['full_information_p99_s']:.3f}s: the goal is "
              + ("under it" if c["goal_below_full_information"] else "above it"))
    save_results(args.out, rows, started, None if args.no_page else PAGE, BLOCK, markdown(cmp, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
