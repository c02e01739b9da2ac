"""Where the router's CPU goes per request: ``make profile-router``
(``python -m bench.router_profile``).

Starts the router as ``make bench-router`` does (:class:`bench.router.Target`
``kinference``: a real nats-server, a compiled pool over the stub upstream,
decisions recorded, pinned to ``--router-cpu``; ``--target
kinference-null``: the router's transport alone, to read the router
against part by part), loads it with ``wrk`` at
``--concurrency`` (64) for ``--duration`` seconds, plain or streamed, and
samples its stacks meanwhile with ``py-spy`` (in ``bench/.venv-competitors``,
never a product dependency; it needs ptrace rights over the router, as root
or with ``kernel.yama.ptrace_scope`` 0).

Each on-CPU sample is charged to one part of the request path: the first
frame, from the innermost out, that belongs to a part of :data:`PARTS`; the
event loop only gets the samples in none of the others (a socket write
under the upstream client counts as the upstream client). The
table gives each part's share of the samples and, from the router's CPU
time per request measured over the same run (``/proc``), its microseconds
per request. Writes ``bench/results/router_profile.json`` (one entry per
target and mode: the last run of each) and the ``router:profile`` block of
docs/benchmarks.md from it: the router's parts beside its transport alone's
where both were profiled in the same mode (``--page-only`` rewrites the block
from the file without measuring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import harness, router

RESULTS = harness.REPO / "bench" / "results" / "router_profile.json"
PY_SPY = router.COMPETITORS / "bin" / "py-spy"

#: the parts of the request path, each a list of patterns matched against a
#: frame (``function (path:line)``), checked in this order at each frame
PARTS: dict[str, tuple[str, ...]] = {
    "decision event and record": ("router/recording.py", "publish_decision", "engine/trace.py",
                                  "publish_observation"),
    "NATS publishing": ("router/events.py", "/nats/"),
    "replica sync": ("router/replica_sync.py",),
    "accounting (ledger, prefix index)": ("engine/ledger.py", "engine/prefix.py"),
    "decide (engine)": ("engine/decide.py", "engine/candidates.py", "engine/ttft.py", "engine/lazy.py",
                        "engine/signals.py", "engine/snapshot.py", "router/validate.py", "router/flow.py"),
    "engine request (body, tokens, hashes)": ("router/body.py", "engine/tokens.py", "engine/request.py",
                                              "engine_request"),
    "classification": ("router/classification.py",),
    "metrics": ("router/metrics.py", "prometheus_client"),
    "snapshot keeping": ("router/state.py",),
    "upstream client": ("kinference_common/upstream_http.py", "router/upstream.py", "router/stream_usage.py"),
    "HTTP server": ("router/http_server.py", "httptools"),
    "request control (app, director)": ("router/app.py", "router/director.py", "router/retry.py",
                                        "router/tenants.py"),
    "event loop": ("asyncio/", "uvloop"),
}
OTHER = "other (interpreter, GC, libraries)"
#: what can be profiled (targets of bench.router): the router, without records, its transport alone
TARGETS = ("kinference", "kinference-no-record", "kinference-null")
#: the transport alone, the column the router's parts are read against on the page
BASELINE = "kinference-null"


#: the part a stack goes to only when no other part is in it: the loop runs
#: every callback, and a transport's write under the upstream client is the
#: upstream client's
LOOP = "event loop"


def part_of(stack: str) -> str:
    """The part a collapsed stack (``outer;...;inner``) is charged to."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for part, patterns in PARTS.items():
            if part != LOOP and any(p in frame for p in patterns):
                return part
    if any(p in frame for frame in frames for p in PARTS[LOOP]):
        return LOOP
    return OTHER


def charge(lines: Iterable[str]) -> Counter[str]:
    """Samples per part from py-spy's raw output (``stack count`` per line)."""
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if stack and n.isdigit():
            counts[part_of(stack)] += int(n)
    return counts


def breakdown(counts: Counter[str], cpu_us_per_request: float | None) -> list[dict[str, Any]]:
    """Rows of (part, share, us per request), largest first."""
    total = sum(counts.values())
    rows = []
    for part, n in counts.most_common():
        share = n / total if total else 0.0
        rows.append({"part": part, "samples": n, "share": round(share, 4),
                     "us_per_request": None if cpu_us_per_request is None else round(share * cpu_us_per_request, 1)})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'part of the request path':<40}{'share':>8}{'us/req':>9}", "-" * 57]
    for r in rows:
        us = "-" if r["us_per_request"] is None else f"{r['us_per_request']:.1f}"
        out.append(f"{r['part']:<40}{r['share'] * 100:>7.1f}%{us:>9}")
    return "\n".join(out)


async def profile(args: argparse.Namespace) -> dict[str, Any]:
    wrk = router.ensure_wrk()
    why = router.ensure_competitors()
    if why is not None:
        raise SystemExit(f"profile-router: {why}")
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    with tempfile.TemporaryDirectory(prefix="kinference-profile-") as tmp:
        log_dir = Path(tmp)
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, args.client_cpu)
        load = router.Load(wrk, args.client_cpu, log_dir)
        target = router.Target(args.target, args, stub_port, log_dir)
        try:
            await target.start()
            assert target.pid is not None
            await asyncio.to_thread(load.run, target.url, args.mode, args.concurrency, args.warmup)
            raw = log_dir / "stacks.txt"
            spy = subprocess.Popen([str(PY_SPY), "record", "--pid", str(target.pid), "--rate", str(args.rate),
                                    "--duration", str(args.duration + 1), "--format", "raw", "--nonblocking",
                                    "--output", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await asyncio.sleep(0.5)  # py-spy attached
            cpu0 = target.cpu_seconds()
            r = await asyncio.to_thread(load.run, target.url, args.mode, args.concurrency, args.duration)
            cpu1 = target.cpu_seconds()
            _, err = await asyncio.to_thread(spy.communicate, timeout=args.duration + 60)
            if spy.returncode != 0 or not raw.exists():
                raise SystemExit(f"profile-router: py-spy failed (rc {spy.returncode}): "
                                 f"{err.decode(errors='replace')[-400:]}")
            counts = charge(raw.read_text().splitlines())
            if args.stacks is not None:
                args.stacks.write_text(raw.read_text())
        finally:
            await target.stop()
            stub.stop()
    cpu_us = (cpu1 - cpu0) / r["requests"] * 1e6 if cpu0 is not None and cpu1 is not None and r["requests"] else None
    return {"target": args.target, "mode": args.mode, "concurrency": args.concurrency, "duration_s": args.duration, "rps": round(r["rps"], 1),
            "requests": r["requests"], "errors": r["errors"],
            "cpu_us_per_request": None if cpu_us is None else round(cpu_us, 1),
            "samples": sum(counts.values()), "parts": breakdown(counts, cpu_us),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def key(result: dict[str, Any]) -> str:
    """A run's entry in the results file: ``target/mode``."""
    return f"{result['target']}/{result['mode']}"


def load_results() -> dict[str, dict[str, Any]]:
    """The results file: one entry per target and mode ({} when missing or
    unreadable; a file from before it kept one run per target holds that run)."""
    try:
        kept = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict):
        return {}
    if "target" in kept and "parts" in kept:  # the one-run file
        return {key(kept): kept}
    return {k: v for k, v in kept.items() if isinstance(v, dict) and "parts" in v}


def _when(result: dict[str, Any]) -> str:
    return str(result.get("started", "?")).replace("T", " ").removesuffix("Z") + " UTC"


def page_block(results: dict[str, dict[str, Any]]) -> str:
    """The ``router:profile`` block of docs/benchmarks.md: for each target
    other than the transport alone, its parts (share, us per request) beside
    the transport alone's in the same mode, when that was profiled too."""
    out = ["Written by `make profile-router` from `bench/results/router_profile.json` (each target's "
           "last run; the router on one core, py-spy sampling it):", ""]
    for k, r in sorted(results.items(), key=lambda kv: (kv[1]["target"] == BASELINE, kv[0])):
        if r["target"] == BASELINE and any(v["target"] != BASELINE and v["mode"] == r["mode"]
                                           for v in results.values()):
            continue  # shown as the column beside the router's
        base = results.get(f"{BASELINE}/{r['mode']}") if r["target"] != BASELINE else None
        cpu = r.get("cpu_us_per_request")
        head = (f"`{r['target']}`, {r['mode']}, concurrency {r.get('concurrency', '?')}, measured {_when(r)}: "
                f"{r['rps']:.0f} req/s, "
                f"{'-' if cpu is None else f'{cpu:.1f}'} us of CPU per request, {r['samples']} samples")
        if base is not None:
            bcpu = base.get("cpu_us_per_request")
            head += (f"; the transport alone (`{BASELINE}`), measured {_when(base)}: {base['rps']:.0f} req/s, "
                     f"{'-' if bcpu is None else f'{bcpu:.1f}'} us per request")
        out += [head + ".", ""]
        if base is None:
            out += ["| part of the request path | share | us per request |", "| --- | ---: | ---: |"]
            out += [f"| {p['part']} | {p['share'] * 100:.1f}% | {_us(p)} |" for p in r["parts"]]
        else:
            alone = {p["part"]: p for p in base["parts"]}
            out += ["| part of the request path | share | us per request | the transport alone, us per request |",
                    "| --- | ---: | ---: | ---: |"]
            for p in r["parts"]:
                a = alone.get(p["part"])
                out.append(f"| {p['part']} | {p['share'] * 100:.1f}% | {_us(p)} | {'-' if a is None else _us(a)} |")
            out += [f"| {p['part']} | - | - | {_us(p)} |" for p in base["parts"]
                    if p["part"] not in {q["part"] for q in r["parts"]}]
        out.append("")
    return "\n".join(out)


def _us(part: dict[str, Any]) -> str:
    return "-" if part["us_per_request"] is None else f"{part['us_per_request']:.1f}"


def rewrite_page(page: Path, results: dict[str, dict[str, Any]]) -> bool:
    """Rewrite the page's block from ``results``; False when the page has none."""
    return harness.rewrite_block(page, "router:profile", page_block(results))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make profile-router", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=TARGETS,
                   default="kinference", help="what to profile (default kinference; kinference-null: the "
                   "router's transport alone, bench.null_router, to read the router against part by part)")
    p.add_argument("--mode", choices=router.MODES, default="plain")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=int, default=10, help="whole seconds sampled (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="whole seconds of load before sampling (default 2)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second (default 200)")
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--stacks", type=Path, metavar="FILE",
                   help="also keep py-spy's collapsed stacks here (for flamegraph.pl or speedscope)")
    p.add_argument("--page-only", action="store_true",
                   help="measure nothing: rewrite the page's block from bench/results/router_profile.json")
    args = p.parse_args(argv)
    if args.page_only:
        results = load_results()
        return harness.page_only("profile-router", "router:profile", results, RESULTS, router.PAGE,
                                 page_block(results) if results else "")
    result = asyncio.run(profile(args))
    print(f"{args.target} at {args.mode} c={args.concurrency}: {result['rps']:.0f} req/s, "
          f"{result['cpu_us_per_request']} us of router CPU per request, {result['samples']} samples")
    print(table(result["parts"]))
    if not result["samples"] or not result["requests"]:  # nothing measured: keep the last good run
        print("no samples or no requests: results file and page left as they were")
        return 1
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    kept = load_results()
    kept[key(result)] = result
    RESULTS.write_text(json.dumps(kept, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(harness.REPO)}")
    if rewrite_page(router.PAGE, kept):
        print(f"rewrote the router:profile block of {router.PAGE.relative_to(harness.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
