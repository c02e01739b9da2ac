"""``make bench-routing`` (``python -m bench.routing``): the fleet benchmark.

Runs every workload x router x load case (see :mod:`.run`), prints the
table, writes ``bench/results/routing.json`` (a list of rows) and the plots
``docs/img/routing-*.png``. ``--quick`` runs the two required workloads at
three loads (a minute or two); the default is the full sweep.
Deterministic for a given ``--seed`` (Python's string hashing is pinned:
the process re-executes itself with ``PYTHONHASHSEED=0`` when it is not).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from . import run

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing.json"
IMG = REPO / "docs" / "img"


def _one(case: run.Case) -> dict:
    return run.run_case(case)


def cases(args: argparse.Namespace) -> list[run.Case]:
    out = []
    for w in args.workloads:
        for load in args.loads:
            for r in args.routers:
                out.append(run.Case(w, r, load, seed=args.seed))
    if "kinference" in args.routers and not args.no_before:
        for w in ("chat", "shared_prefix", "trial"):
            if w in args.workloads:
                out.extend(run.Case(w, "kinference", load, seed=args.seed, variant="before") for load in args.loads)
    if args.replicas > 1:
        for w in ("chat", "shared_prefix"):
            if w in args.workloads:
                for load in (0.8, 1.0):
                    out.extend(run.Case(w, r, load, replicas=args.replicas, seed=args.seed) for r in args.routers)
                    if "kinference" in args.routers and not args.no_replica_sync:
                        out.append(run.Case(w, "kinference", load, replicas=args.replicas, seed=args.seed,
                                            variant="replica_sync"))
    for si in args.scrape_intervals:
        if si == 0.1:
            continue
        for w in ("chat", "shared_prefix"):
            if w not in args.workloads:
                continue
            for load in (0.8, 1.0):
                for r in args.routers:
                    out.append(run.Case(w, r, load, scrape_interval=si, seed=args.seed))
    return out


def main(argv: list[str] | None = None) -> int:
    run.pin_hash_seed("bench.routing")
    ap = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(run.SPECS))
    ap.add_argument("--routers", type=lambda s: s.split(","), default=run.ROUTERS)
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=run.LOADS)
    ap.add_argument("--scrape-intervals", type=lambda s: [float(x) for x in s.split(",")],
                    default=[0.1, 0.05, 1.0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--replicas", type=int, default=3, help="also run chat and shared_prefix with this many "
                    "router replicas (traffic spread round robin over them); 1 to skip")
    ap.add_argument("--no-replica-sync", action="store_true", help="skip the rows of Kinference's replicas "
                    "sharing their ledgers and prefix picks (variant replica_sync)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="chat and shared_prefix at loads 0.4, 0.8, 1.0 only "
                    "(no plots)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-before", action="store_true", help="skip the engine-before-the-fixes rows")
    ap.add_argument("--merge", action="store_true", help="replace only the rows this run produces in --out "
                    "(e.g. --routers kinference after an engine change), keep the others")
    args = ap.parse_args(argv)
    run.check_names(ap, args.workloads, args.routers)
    if args.quick:
        args.workloads = [w for w in args.workloads if w in ("chat", "shared_prefix")]
        args.loads = [0.4, 0.8, 1.0]
        args.scrape_intervals = [0.1]
        args.no_plots = True  # the committed plots are the full sweep's
    todo = cases(args)
    started = time.perf_counter()
    print(f"bench-routing: {len(todo)} runs on {args.jobs} processes (seed {args.seed})", flush=True)
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as ex:
            rows = list(ex.map(_one, todo))
    else:
        rows = [_one(c) for c in todo]
    took = time.perf_counter() - started
    rows.sort(key=lambda r: (list(run.SPECS).index(r["workload"]), r["replicas"], r["scrape_interval_s"],
                             r["load"], run.ROUTERS.index(r["router"]), r.get("variant", "")))
    print(run.table(rows))
    heads = run.headline(rows)
    if heads:
        print("\nheadline (loads 0.8-1.0): Kinference vs the best peer")
        for h in heads:
            print(f"  {h['workload']:<14} load {h['load']:.1f}: TTFT p99 {h['kinference_p99_s']:.3f}s vs "
                  f"{h['best_peer_p99']} {h['best_peer_p99_s']:.3f}s (x{h['p99_ratio']:.2f}); goodput "
                  f"x{h['goodput_ratio']:.2f} of {h['best_peer_goodput']}'s; p50 x{h['p50_ratio']:.2f}")
            if h.get("idle_floor_p99_s") is not None:
                loaded = h["loaded_floor_p99_s"]
                print(f"  {'':<14}           floor p99 {h['idle_floor_p99_s']:.3f}s idle"
                      + (f", {loaded:.3f}s loaded" if loaded is not None else "")
                      + f": best peer at x{h['best_peer_over_floor']:.2f} of the idle floor, Kinference at "
                      f"x{h['kinference_over_floor']:.2f}; 30% below the best peer ({h['target_p99_s']:.3f}s) "
                      + ("would be under the idle floor" if h["target_below_floor"] else "is above the idle floor"))
            print(f"  {'':<14}           goal: p99 <= {h['goal_p99_s']:.3f}s, goodput >= the best peer's, p50 "
                  "within 5%: " + ("MET" if h["met"] else "MISSED (" + ", ".join(h["missed"]) + ")"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and args.out.exists():
        def key(r: dict) -> tuple:
            return (r["workload"], r["router"], r["load"], r["replicas"], r["scrape_interval_s"], r.get("variant", ""))

        fresh = {key(r) for r in rows}
        rows = [r for r in json.loads(args.out.read_text()) if key(r) not in fresh] + rows
        rows.sort(key=lambda r: (list(run.SPECS).index(r["workload"]), r["replicas"], r["scrape_interval_s"],
                                 r["load"], run.ROUTERS.index(r["router"]), r.get("variant", "")))
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out} "
          f"({len(rows)} rows) in {took:.0f} s")
    if not args.no_plots:
        from .plots import plot_sweep

        for path in plot_sweep(rows, IMG):
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
