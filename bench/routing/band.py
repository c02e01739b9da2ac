"""The headline's cases on several draws of the scrape instants.

``make bench-routing-band`` (``python -m bench.routing.band``) runs every
router of the sweep on the headline's cases (the goal's loads, 0.8-1.0)
again with ``--phases`` draws of *when* each pod's scrapes fall within the
0.1 s interval (:func:`.fleet.simulate`'s ``phase``; draw 0 is the one
``make bench-routing`` uses). The arrivals, the pods and the routers' own
draws stay the same: only the instants at which a router learns each
pod's state move, as they do between any two real runs.

Why: a simulated run is deterministic for its seed, but not stable. One
decision taken otherwise early in a run (a prefix copied or not while the
first groups are placed) changes every later pick, and a p99 moves by
several percent from one draw to the next with the same code. A change to
the engine measured on one draw, or a verdict of the headline, can be that
draw's. Per case this reports Kinference's p99 on draw 0, its median and
range over the draws, the best peer's the same way (the best peer is
chosen per draw), and on how many draws the goal (:func:`.run.goal`) is
met; and where draw 0 ranks among the draws: code tuned on the
headline's draw shows it at the low end of its band.

Writes ``bench/results/routing_band.json`` (every row, with its ``phase``)
and the ``routing:band`` block of docs/routing-benchmark.md
(``--page-only`` rewrites the block from the file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from bench.harness import page_only, save_results

from . import run

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_band.json"
PAGE = REPO / "docs" / "routing-benchmark.md"
BLOCK = "routing:band"


def _one(case: run.Case) -> dict:
    return run.run_case(case)


def summarize(rows: Sequence[dict]) -> list[dict]:
    """Per headline case (workload, load), over the draws the rows hold:
    the draws, Kinference's p99 on each, the best peer (name, p99) on
    each, the goal's bound and verdict on each (:func:`.run.headline` on
    each draw's rows alone). A draw without Kinference's row or any peer's
    is left out of its case."""
    by_phase: dict[int, list[dict]] = {}
    for r in rows:
        plain = {k: v for k, v in r.items() if k != "phase"}
        by_phase.setdefault(int(r.get("phase", 0)), []).append(plain)
    workloads = sorted({r["workload"] for r in rows}, key=list(run.SPECS).index)
    loads = sorted({r["load"] for r in rows})
    cases: dict[tuple[str, float], dict] = {}
    for phase in sorted(by_phase):
        for h in run.headline(by_phase[phase], workloads, loads):
            c = cases.setdefault((h["workload"], h["load"]), {
                "workload": h["workload"], "load": h["load"], "phases": [], "kinference_p99_s": [],
                "best_peer": [], "best_peer_p99_s": [], "goal_p99_s": [], "met": [], "missed": []})
            c["phases"].append(phase)
            c["kinference_p99_s"].append(h["kinference_p99_s"])
            c["best_peer"].append(h["best_peer_p99"])
            c["best_peer_p99_s"].append(h["best_peer_p99_s"])
            c["goal_p99_s"].append(h["goal_p99_s"])
            c["met"].append(h["met"])
            c["missed"].append(h["missed"])
    out = []
    for (w, load), c in sorted(cases.items(), key=lambda kv: (workloads.index(kv[0][0]), kv[0][1])):
        ks = c["kinference_p99_s"]
        ratios = [k / b for k, b in zip(ks, c["best_peer_p99_s"])]
        c["p99_ratio"] = ratios
        if 0 in c["phases"]:
            k0 = ks[c["phases"].index(0)]
            # draw 0's place among the draws, 1 the lowest p99; draws with the same p99 share a place
            c["draw0_rank"] = 1 + sum(1 for k in ks if k < k0)
            c["draw0_ties"] = sum(1 for k in ks if k == k0) - 1
        else:
            c["draw0_rank"], c["draw0_ties"] = None, 0
        out.append(c)
    return out


def _band(xs: Sequence[float], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def _rank(c: dict) -> str:
    r, n, ties = c["draw0_rank"], len(c["phases"]), c["draw0_ties"]
    if r is None:
        return "-"
    if ties == n - 1:
        return "all the same"
    place = "lowest" if r == 1 else "highest" if r + ties == n else f"{r} of {n}"
    return place + (f" (with {ties} more)" if ties else "")


def totals(summary: Sequence[dict]) -> dict:
    """Over the cases: how many are met on every draw, on some, on none;
    on how many draws in all; where draw 0's verdict is the other draws'
    majority's; and, of the cases whose p99 moves between draws, in how
    many draw 0 gave Kinference's lowest p99 (alone) and its highest.
    Were draw 0 any draw, it would be the lowest in about one case of
    ``--phases``."""
    every = sum(1 for c in summary if all(c["met"]))
    never = sum(1 for c in summary if not any(c["met"]))
    moving = [c for c in summary if c["draw0_rank"] is not None and c["draw0_ties"] < len(c["phases"]) - 1]
    return {
        "cases": len(summary), "met_every_draw": every, "met_no_draw": never,
        "met_some_draws": len(summary) - every - never,
        "draws": sum(len(c["met"]) for c in summary), "draws_met": sum(sum(c["met"]) for c in summary),
        "moving": len(moving),
        "draw0_lowest": sum(1 for c in moving if c["draw0_rank"] == 1 and not c["draw0_ties"]),
        "draw0_highest": sum(1 for c in moving if c["draw0_rank"] == len(c["phases"])),
    }


def markdown(summary: Sequence[dict], seed: int | None) -> str:
    n = max((len(c["phases"]) for c in summary), default=0)
    t = totals(summary)
    out = [f"Written by `make bench-routing-band` from `bench/results/routing_band.json` (seed {seed}, {n} draws "
           "of the scrape instants, draw 0 the headline's; p99 in seconds, median (range) over the draws; the "
           "best peer is chosen per draw):",
           "",
           "| workload | load | Kinference p99 on draw 0 | Kinference p99 | best peer p99 | p99 / best peer | "
           "goal on draw 0 | goal met on | draw 0 among the draws |",
           "|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for c in summary:
        ks = c["kinference_p99_s"]
        k0 = ks[c["phases"].index(0)] if 0 in c["phases"] else None
        peers = sorted(set(c["best_peer"]))
        met0 = c["met"][c["phases"].index(0)] if 0 in c["phases"] else None
        out.append(f"| {c['workload']} | {c['load']:.1f} | " + (f"{k0:.3f}" if k0 is not None else "-")
                   + f" | {_band(ks)} | {_band(c['best_peer_p99_s'])} ({', '.join(peers)}) | "
                   f"{_band(c['p99_ratio'], 'x{:.2f}')} | " + ("-" if met0 is None else "met" if met0 else "missed")
                   + f" | {sum(c['met'])} of {len(c['met'])} | {_rank(c)} |")
    out += ["",
            f"The goal is met on every draw in {t['met_every_draw']} of {t['cases']} cases, on some in "
            f"{t['met_some_draws']}, on none in {t['met_no_draw']} ({t['draws_met']} of {t['draws']} case-draws). "
            f"Of the {t['moving']} cases whose Kinference p99 moves between draws, draw 0 gave its lowest in "
            f"{t['draw0_lowest']} and its highest in {t['draw0_highest']}."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.band", description=__doc__.split("\n\n")[0])
    ap.add_argument("--phases", type=int, default=5, help="draws of the scrape instants, 0 to N-1 (default 5; "
                    "draw 0 is make bench-routing's)")
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(run.HEADLINE_WORKLOADS),
                    help="comma-separated (default: the headline's)")
    ap.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[0.8, 0.9, 1.0],
                    help="comma-separated (default 0.8,0.9,1.0: the goal's)")
    ap.add_argument("--routers", type=lambda s: s.split(","), default=run.ROUTERS,
                    help="comma-separated (default: every router of the sweep; the goal needs the peers)")
    ap.add_argument("--seed", type=int, default=1, help="the arrivals' seed (default 1, the headline's)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file (default "
                    "bench/results/routing_band.json)")
    ap.add_argument("--merge", action="store_true", help="keep the rows of --out this run does not measure (e.g. "
                    "--workloads multiturn after an engine change that touches only it)")
    ap.add_argument("--page-only", action="store_true", help="rewrite the page's block from --out, measure nothing")
    ap.add_argument("--no-page", action="store_true", help="leave docs/routing-benchmark.md alone")
    args = ap.parse_args(argv)
    if args.phases < 1:
        ap.error("--phases must be at least 1")
    run.check_names(ap, args.workloads, args.routers)
    if "kinference" not in args.routers or len(args.routers) < 2:
        ap.error("--routers needs kinference and at least one peer (the goal is against the best peer)")
    if args.page_only:
        rows = json.loads(args.out.read_text()) if args.out.exists() else []
        seed = rows[0]["seed"] if rows else None
        return page_only(ap.prog, BLOCK, rows, args.out, PAGE, markdown(summarize(rows), seed))
    run.pin_hash_seed("bench.routing.band", argv)  # measuring: deterministic for the seed
    todo = [run.Case(w, r, load, seed=args.seed, phase=p) for p in range(args.phases) for w in args.workloads
            for load in args.loads for r in args.routers]
    print(f"bench-routing-band: {len(todo)} runs on {args.jobs} processes (seed {args.seed}, "
          f"{args.phases} draws of the scrape instants)", flush=True)
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(args.jobs) as ex:
        futures = [ex.submit(_one, c) for c in todo]
        for i, f in enumerate(as_completed(futures), 1):
            rows.append(f.result())
            if i % 10 == 0 or i == len(todo):
                print(f"  {i}/{len(todo)} runs done ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.merge and args.out.exists():
        def key(r: dict) -> tuple:
            return r["workload"], r["load"], r["router"], r.get("phase", 0)

        fresh = {key(r) for r in rows}
        rows += [r for r in json.loads(args.out.read_text()) if key(r) not in fresh and r["seed"] == args.seed]
    rows.sort(key=lambda r: (r.get("phase", 0), list(run.SPECS).index(r["workload"]), r["load"],
                             run.ROUTERS.index(r["router"])))
    summary = summarize(rows)
    for c in summary:
        print(f"  {c['workload']:<18} {c['load']:.1f}: Kinference p99 {_band(c['kinference_p99_s'])} s, best peer "
              f"{_band(c['best_peer_p99_s'])} s, goal met on {sum(c['met'])} of {len(c['met'])} draws, draw 0 "
              f"{_rank(c)}")
    t = totals(summary)
    print(f"goal met on every draw in {t['met_every_draw']} of {t['cases']} cases, on none in {t['met_no_draw']}; "
          f"of the {t['moving']} cases that move between draws, draw 0 the lowest in {t['draw0_lowest']}, the "
          f"highest in {t['draw0_highest']}")
    save_results(args.out, rows, started, None if args.no_page else PAGE, BLOCK, markdown(summary, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
