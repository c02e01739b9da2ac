"""The result tables of docs/routing-benchmark.md, made from ``routing.json``.

``python -m bench.routing.report`` (run by ``make bench-routing`` after the
sweep) rewrites every block of the page between ``<!-- routing:NAME -->`` and
``<!-- /routing:NAME -->`` from ``bench/results/routing.json``, so the
numbers on the page are the last full run's and the prose around them is
left alone. Blocks:

- ``headline``: Kinference against the best peer at 80-100% load on every
  workload, with the TTFT floors (:mod:`.floor`) and the verdict on the
  goal restated with them (:func:`.run.goal`);
- ``targets``: every workload and load where Kinference's TTFT p50 or p99
  is more than 5% above the best peer's;
- ``workload-<name>``: one workload's table (:func:`.run.markdown`);
- ``before-after``: Kinference against its ``before`` variant;
- ``telemetry``: TTFT p99 at each scrape interval;
- ``replicas``: 1 / 3 / 3-with-replica-sync rows;
- ``burst``: the burst-to-cloud measurement (``routing_burst.json``, when
  there is one).

``--check`` exits 1 when a block is missing from the page (a renamed
heading must not silently stop the page from being refreshed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import run

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "routing-benchmark.md"
RESULTS = REPO / "bench" / "results" / "routing.json"
BURST = REPO / "bench" / "results" / "routing_burst.json"


def _f(v: float | None, d: int = 3) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def _sel(rows: Sequence[dict], workload: str, load: float, *, replicas: int = 1, scrape: float = 0.1,
         variant: str = "") -> list[dict]:
    return [r for r in rows if r["workload"] == workload and abs(r["load"] - load) < 1e-9
            and r["replicas"] == replicas and r["scrape_interval_s"] == scrape and r.get("variant", "") == variant]


def headline(rows: Sequence[dict]) -> str:
    out = ["| workload | load | Kinference TTFT p99 | best peer (p99) | ratio | goodput vs best peer | "
           "TTFT p50 vs best peer | idle floor p99 | 30% below the best peer | goal p99 | goal |",
           "|---|---:|---:|---|---:|---:|---:|---:|---|---:|---|"]
    for h in run.headline(rows):
        target = h.get("target_p99_s")
        reach = "-" if target is None else (
            f"{target:.3f} s: under the idle floor" if h.get("target_below_floor") else f"{target:.3f} s")
        floor = h.get("idle_floor_p99_s")
        out.append(f"| {h['workload']} | {h['load']:.1f} | {h['kinference_p99_s']:.3f} s | {h['best_peer_p99']} "
                   f"({h['best_peer_p99_s']:.3f} s) | x{h['p99_ratio']:.2f} | x{h['goodput_ratio']:.2f} | "
                   f"x{h['p50_ratio']:.2f} | {_f(floor)} s | {reach} | {h['goal_p99_s']:.3f} s | "
                   + ("met" if h["met"] else "**missed**: " + ", ".join(h["missed"])) + " |")
    return "\n".join(out)


def targets(rows: Sequence[dict]) -> str:
    out = ["| workload | load | Kinference p50 / best peer's (who) | Kinference p99 / best peer's (who) |",
           "|---|---:|---|---|"]
    cases = sorted({(r["workload"], r["load"]) for r in rows}, key=lambda c: (list(run.SPECS).index(c[0]), c[1]))
    for w, load in cases:
        _, k, peers = run.versus(rows, w, load)
        if k is None or not peers:
            continue
        b50 = min(peers, key=lambda r: r["ttft_p50_s"])
        b99 = min(peers, key=lambda r: r["ttft_p99_s"])
        bad50 = k["ttft_p50_s"] > 1.05 * b50["ttft_p50_s"]
        bad99 = k["ttft_p99_s"] > 1.05 * b99["ttft_p99_s"]
        if not (bad50 or bad99):
            continue
        p50 = f"{k['ttft_p50_s']:.3f} / {b50['ttft_p50_s']:.3f} ({b50['router']})"
        p99 = f"{k['ttft_p99_s']:.3f} / {b99['ttft_p99_s']:.3f} ({b99['router']})"
        out.append(f"| {w} | {load:.1f} | {'**' + p50 + '**' if bad50 else p50} | "
                   f"{'**' + p99 + '**' if bad99 else p99} |")
    return "\n".join(out)


def before_after(rows: Sequence[dict]) -> str:
    out = ["| workload | load | TTFT p50 before / after | TTFT p99 before / after | hit rate before / after | "
           "preemptions before / after |", "|---|---:|---:|---:|---:|---:|"]
    for w in ("trial", "chat", "shared_prefix"):
        for load in run.LOADS:
            after = next((r for r in _sel(rows, w, load) if r["router"] == "kinference"), None)
            before = next((r for r in _sel(rows, w, load, variant="before")), None)
            if after is None or before is None:
                continue
            out.append(f"| {w} | {load:.1f} | {_f(before['ttft_p50_s'])} / {_f(after['ttft_p50_s'])} | "
                       f"{_f(before['ttft_p99_s'])} / {_f(after['ttft_p99_s'])} | "
                       f"{_f(before['prefix_hit_rate'], 2)} / {_f(after['prefix_hit_rate'], 2)} | "
                       f"{before['preemptions']} / {after['preemptions']} |")
    return "\n".join(out)


def telemetry(rows: Sequence[dict]) -> str:
    out = ["| workload | load | scrape | " + " | ".join(run.ROUTERS) + " |",
           "|---|---:|---:|" + "---:|" * len(run.ROUTERS)]
    for w in ("chat", "shared_prefix"):
        for load in (0.8, 1.0):
            for si in sorted({r["scrape_interval_s"] for r in rows}):
                sel = {r["router"]: r for r in _sel(rows, w, load, scrape=si)}
                if not sel:
                    continue
                cells = " | ".join(_f(sel[r]["ttft_p99_s"]) if r in sel else "-" for r in run.ROUTERS)
                out.append(f"| {w} | {load:.1f} | {si:g} s | {cells} |")
    return "\n".join(out)


def replicas(rows: Sequence[dict]) -> str:
    out = ["| workload | load | router | TTFT p50, 1 / 3 / 3 shared | TTFT p99, 1 / 3 / 3 shared | "
           "hit rate, 1 / 3 / 3 shared | goodput, 1 / 3 / 3 shared |", "|---|---:|---|---:|---:|---:|---:|"]
    many = sorted({r["replicas"] for r in rows if r["replicas"] > 1})
    if not many:
        return "\n".join(out)
    n = many[0]
    for w in ("chat", "shared_prefix"):
        for load in (0.8, 1.0):
            for router in run.ROUTERS:
                one = next((r for r in _sel(rows, w, load) if r["router"] == router), None)
                three = next((r for r in _sel(rows, w, load, replicas=n) if r["router"] == router), None)
                shared = next((r for r in _sel(rows, w, load, replicas=n, variant="replica_sync")
                               if r["router"] == router), None)
                if one is None or three is None:
                    continue
                cols = [x for x in (one, three, shared) if x is not None]

                def join(key: str, d: int = 3, cols: list = cols) -> str:
                    return " / ".join(_f(x[key], d) for x in cols)

                name = "**kinference**" if router == "kinference" else router
                out.append(f"| {w} | {load:.1f} | {name} | {join('ttft_p50_s')} | {join('ttft_p99_s')} | "
                           f"{join('prefix_hit_rate', 2)} | {join('goodput', 1)} |")
    return "\n".join(out)


def burst(rows: Sequence[dict]) -> str:
    out = ["| load | router | SLO met | sent out | provider $ / 1k requests | PII sent out | rejected | TTFT p50 | "
           "TTFT p99 |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['load']:.1f} | {r['router']} | {_f(r['slo_attainment'])} | {_f(r['offload_share'])} | "
                   f"{_f(r['provider_cost_per_1k_requests'])} | {r['pii_sent_out']} of {r['pii_requests']} | "
                   f"{r['rejected']} | {_f(r['ttft_p50_s'])} | {_f(r['ttft_p99_s'])} |")
    return "\n".join(out)


def blocks(rows: Sequence[dict], burst_rows: Sequence[dict] | None = None) -> dict[str, Callable[[], str]]:
    out: dict[str, Callable[[], str]] = {
        "headline": lambda: headline(rows), "targets": lambda: targets(rows),
        "before-after": lambda: before_after(rows), "telemetry": lambda: telemetry(rows),
        "replicas": lambda: replicas(rows),
    }
    for w in run.SPECS:
        loads = run.LOADS if w in ("chat", "shared_prefix", "trial") else (0.4, 0.8, 1.0, 1.2)
        out[f"workload-{w}"] = lambda w=w, loads=loads: run.markdown(rows, w, loads=loads)
    if burst_rows is not None:
        out["burst"] = lambda: burst(burst_rows)
    return out


_BLOCK = re.compile(r"(<!-- routing:([a-z0-9_-]+) -->\n)(.*?)(<!-- /routing:\2 -->)", re.S)


def rewrite(page: str, rows: Sequence[dict], burst_rows: Sequence[dict] | None = None,
            ) -> tuple[str, list[str], list[str]]:
    """``page`` with every known block refreshed; (page, refreshed, unknown block names)."""
    makers = blocks(rows, burst_rows)
    done: list[str] = []
    unknown: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in makers:
            unknown.append(name)
            return m.group(0)
        done.append(name)
        return f"{m.group(1)}{makers[name]()}\n{m.group(4)}"

    return _BLOCK.sub(sub, page), done, unknown


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--burst", type=Path, default=BURST)
    ap.add_argument("--page", type=Path, default=PAGE)
    ap.add_argument("--check", action="store_true", help="exit 1 if a required block is missing from the page")
    args = ap.parse_args(argv)
    if not args.results.exists():
        print(f"{args.results}: no results; run `make bench-routing` first", file=sys.stderr)
        return 2
    rows = json.loads(args.results.read_text())
    burst_rows = json.loads(args.burst.read_text()) if args.burst.exists() else None
    page, done, unknown = rewrite(args.page.read_text(), rows, burst_rows)
    missing = sorted(set(blocks(rows, burst_rows)) - set(done))
    for name in unknown:
        print(f"{args.page}: unknown block routing:{name} (left as it is)", file=sys.stderr)
    if missing:
        print(f"{args.page}: no block for {', '.join(missing)}", file=sys.stderr)
        if args.check:
            return 1
    args.page.write_text(page)
    print(f"refreshed {len(done)} tables in {args.page.relative_to(REPO) if args.page.is_relative_to(REPO) else args.page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
