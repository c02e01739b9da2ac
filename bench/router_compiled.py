"""The router compiled against the router as it runs: ``make
bench-router-compiled`` (``python -m bench.router_compiled``).

The question it answers: would compiling the router's Python take the CPU
per request to where ``make bench-router``'s goals are? It copies the two
packages the router runs on (``kinference_router``, ``kinference_common``)
into a temporary directory, compiles modules there in place, checks that
they are what Python imports, then measures the router (``kinference`` of
:mod:`bench.router`: a real nats-server, the stub upstream, decisions
recorded, pinned to one core) and its transport alone (``kinference-null``)
at concurrency 64, plain and streamed, alternately interpreted and compiled
(``PYTHONPATH`` puts the compiled copy first), ``--rounds`` times. CPU per
request (``/proc``) is the figure to read; requests per second moves with
the machine. Two compilers (``--compiler``):

- ``cython`` (default): the 32 modules a proxied request runs through
  (:data:`MODULES`), as they are, annotations not used as C types (with
  them Cython refuses values PEP 484 allows, such as a msgspec ``Struct``
  class where ``type`` is annotated, and the router does not start);
- ``mypyc``: the transport's two modules (:data:`MYPYC_MODULES`, the HTTP
  server and the upstream client), the ones that type-check under mypy as
  mypyc needs (native classes, attributes read from C structs); the rest of
  the request path does not yet (mypy finds about 240 errors in it).

The compilers go into ``bench/.venv-competitors`` (never a product
dependency) and build for this interpreter (the same Python makes that
virtualenv). Prints a table, writes ``bench/results/router_compiled.json``
(one entry per compiler, its last run) and rewrites the ``router:compiled``
block of ``docs/benchmarks.md`` from it (``--page-only``: without measuring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness, router

RESULTS = harness.REPO / "bench" / "results" / "router_compiled.json"

#: the modules compiled: every module of the two packages a proxied request
#: runs through (the HTTP server and client, request control, the engine,
#: events and records, metrics), by package-relative path
MODULES: tuple[str, ...] = (
    *(f"kinference_router/{m}.py" for m in (
        "app", "director", "http_server", "events", "recording", "classification", "metrics", "flow",
        "replica_sync", "state", "model_name", "stream_usage", "retry", "upstream", "egress")),
    *(f"kinference_common/{m}.py" for m in (
        "upstream_http", "recording", "request_body", "messages", "bus", "durations")),
    *(f"kinference_common/engine/{m}.py" for m in (
        "candidates", "decide", "ledger", "prefix", "request", "signals", "snapshot", "tokens", "trace",
        "ttft", "lazy")),
)
#: what mypyc compiles: the transport (the rest of the request path does not type-check yet)
MYPYC_MODULES: tuple[str, ...] = ("kinference_common/upstream_http.py", "kinference_router/http_server.py")
#: the modules each compiler compiles
COMPILED = {"cython": MODULES, "mypyc": MYPYC_MODULES}
#: the targets measured (bench.router's): the router and its transport alone
TARGETS = ("kinference", "kinference-null")
#: where each package's source is in the repository
SOURCES = {"kinference_router": harness.REPO / "services" / "router",
           "kinference_common": harness.REPO / "libs" / "kinference_common"}


def ensure_compiler(compiler: str) -> Path:
    """The compiler's command in the competitors' virtualenv (installed when missing)."""
    why = router.ensure_competitors()
    if why is not None:
        raise SystemExit(f"bench-router-compiled: {why}")
    tool = router.COMPETITORS / "bin" / ("cythonize" if compiler == "cython" else "mypyc")
    if not tool.exists():
        package = "cython" if compiler == "cython" else "mypy"
        print(f"installing {package} into bench/.venv-competitors", flush=True)
        subprocess.run([str(router.COMPETITORS / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        package, "setuptools"], check=True)
    return tool


def build(root: Path, compiler: str, tool: Path) -> float:
    """Copy the packages under ``root`` and compile the compiler's modules in
    place; seconds taken. Raises SystemExit naming what failed."""
    for name, src in SOURCES.items():
        shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    modules = COMPILED[compiler]
    t0 = time.monotonic()
    if compiler == "cython":
        argv = [str(tool), "-i", "-j", str(os.cpu_count() or 1), "-X", "language_level=3",
                "-X", "annotation_typing=False", *modules]
    else:
        argv = [str(tool), "--ignore-missing-imports", *modules]
    out = subprocess.run(argv, cwd=root, capture_output=True, text=True, check=False,
                         env={**os.environ, "MYPYPATH": str(root)})
    if out.returncode != 0:
        raise SystemExit(f"bench-router-compiled: {compiler} failed (rc {out.returncode}):\n"
                         f"{(out.stdout + out.stderr)[-2000:]}")
    # the router must import the compiled modules, not the copies' sources
    names = [m.removesuffix(".py").replace("/", ".") for m in modules]
    probe = ("import importlib, sys\n"
             "bad = [n for n in sys.argv[1:] if not importlib.import_module(n).__file__.endswith('.so')]\n"
             "print(' '.join(bad))")
    got = subprocess.run([sys.executable, "-c", probe, *names], env={**os.environ, "PYTHONPATH": str(root)},
                         cwd=root, capture_output=True, text=True, check=False)
    if got.returncode != 0 or got.stdout.strip():
        raise SystemExit(f"bench-router-compiled: not imported compiled: {got.stdout.strip() or got.stderr[-800:]}")
    return time.monotonic() - t0


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target and mode: the median CPU per request and req/s of each
    variant over the rounds, and compiled / interpreted."""
    out = []
    for target in TARGETS:
        for mode in router.MODES:
            med = {}
            for variant in ("interpreted", "compiled"):
                got = [r for r in rows if r["variant"] == variant and r["mode"] == mode
                       and r.get("target", TARGETS[0]) == target and "cpu_us_per_request" in r]
                if not got:
                    break
                med[variant] = {"cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in got),
                                "rps": statistics.median(r["rps"] for r in got)}
            if len(med) < 2:
                continue
            out.append({"target": target, "mode": mode,
                        **{f"{v}_{k}": round(x, 1) for v, d in med.items() for k, x in d.items()},
                        "cpu_ratio": round(med["compiled"]["cpu_us_per_request"]
                                           / med["interpreted"]["cpu_us_per_request"], 3),
                        "rps_ratio": round(med["compiled"]["rps"] / med["interpreted"]["rps"], 3)})
    return out


def _set_pythonpath(value: str | None) -> None:
    """What the routers started next see as ``PYTHONPATH`` (None: unset)."""
    if value is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = value


async def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk = router.ensure_wrk()
    tool = ensure_compiler(args.compiler)
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kinference-compiled-") as tmp:
        root = Path(tmp) / "build"
        root.mkdir()
        print(f"compiling {len(COMPILED[args.compiler])} modules with {args.compiler} ...", flush=True)
        seconds = build(root, args.compiler, tool)
        print(f"compiled in {seconds:.0f} s; measuring {args.rounds} rounds", flush=True)
        log_dir = Path(tmp) / "logs"
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, args.client_cpu)
        load = router.Load(wrk, args.client_cpu, log_dir)
        before = os.environ.get("PYTHONPATH")
        # the compiled copy first, the caller's own path after it
        paths = {"interpreted": before, "compiled": str(root) if not before else f"{root}{os.pathsep}{before}"}
        try:
            for n in range(1, args.rounds + 1):
                # ABBA: which goes first alternates by round, so a drift of the machine falls on both
                order = ("interpreted", "compiled") if n % 2 else ("compiled", "interpreted")
                for variant in order:
                    _set_pythonpath(paths[variant])
                    for target in TARGETS:
                        got: list[dict[str, Any]] = []
                        await router.measure_target(target, args, load, stub_port, log_dir, got)
                        for r in got:
                            r.update(variant=variant, round=n)
                        rows += got
        finally:
            _set_pythonpath(before)
            stub.stop()
    return {"compiler": args.compiler, "modules": list(COMPILED[args.compiler]), "rounds": args.rounds, "duration_s": args.duration,
            "concurrency": args.concurrency[0], "rows": rows, "summary": summarize(rows),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(result: dict[str, Any]) -> str:
    lines = [f"{'round':>5} {'variant':<12} {'target':<16} {'mode':<6} {'req/s':>9} {'CPU us/req':>11}", "-" * 64]
    for r in result["rows"]:
        head = f"{r['round']:>5} {r['variant']:<12} {r['target']:<16} {r['mode']:<6}"
        if "error" in r:
            lines.append(f"{head} ERROR: {r['error']}")
        else:
            lines.append(f"{head} {r['rps']:>9.0f} {r.get('cpu_us_per_request', float('nan')):>11.1f}")
    for s in result["summary"]:
        lines.append(f"median {s['target']} {s['mode']}: CPU per request {s['compiled_cpu_us_per_request']} us "
                     f"compiled ({result['compiler']}) against {s['interpreted_cpu_us_per_request']} interpreted "
                     f"({s['cpu_ratio']:.2f}x), req/s {s['rps_ratio']:.2f}x")
    return "\n".join(lines)


def page_block(results: dict[str, dict[str, Any]]) -> str:
    """The ``router:compiled`` block of docs/benchmarks.md, from the results
    file (one entry per compiler: its last run)."""
    lines = ["| compiler | modules compiled | target | mode | CPU us/req interpreted | compiled | ratio | "
             "req/s ratio | measured |", "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for compiler in COMPILED:
        r = results.get(compiler)
        if r is None:
            continue
        for s in r["summary"]:
            lines.append(f"| {compiler} | {len(r['modules'])} | {s['target']} | {s['mode']} | "
                         f"{s['interpreted_cpu_us_per_request']:.1f} | {s['compiled_cpu_us_per_request']:.1f} | "
                         f"{s['cpu_ratio']:.2f}x | {s['rps_ratio']:.2f}x | "
                         f"{r['started'].replace('T', ' ').removesuffix('Z')} UTC, median of {r['rounds']} |")
    return ("Written by `make bench-router-compiled` from `bench/results/router_compiled.json` (each "
            "compiler's last run; interpreted and compiled in turn in that run, concurrency 64, one core):\n\n"
            + "\n".join(lines) + "\n")


def rewrite_page(page: Path, results: dict[str, dict[str, Any]]) -> bool:
    """Rewrite the page's block from ``results``; False when the page has none."""
    return harness.rewrite_block(page, "router:compiled", page_block(results))


def load_results() -> dict[str, dict[str, Any]]:
    """The results file: one entry per compiler ({} when missing or unreadable)."""
    try:
        kept = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in kept.items() if k in COMPILED} if isinstance(kept, dict) else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench-router-compiled", description=__doc__.split("\n\n")[0])
    p.add_argument("--compiler", choices=tuple(COMPILED), default="cython",
                   help="cython: the request path's 32 modules as they are (default); mypyc: the transport's two")
    p.add_argument("--rounds", type=int, default=3, help="interpreted/compiled pairs measured (default 3)")
    p.add_argument("--duration", type=int, default=6, help="whole seconds measured per figure (default 6)")
    p.add_argument("--warmup", type=int, default=1, help="whole seconds of warm-up before each figure (default 1)")
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--page-only", action="store_true",
                   help="measure nothing: rewrite the page's block from bench/results/router_compiled.json")
    args = p.parse_args(argv)
    if args.page_only:
        results = load_results()
        return harness.page_only("bench-router-compiled", "router:compiled", results, RESULTS, router.PAGE,
                                 page_block(results) if results else "")
    if args.rounds < 1 or args.duration < 1:
        p.error("--rounds and --duration must be at least 1")
    args.concurrency = [64]
    result = asyncio.run(run(args))
    print(table(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    # one file, one entry per compiler (the last run of each)
    if not result["summary"]:  # a run with no figure to compare does not replace the last good one
        print("no compiled/interpreted pair was measured: results file and page left as they were")
        return 1
    kept = load_results()
    kept[args.compiler] = result
    RESULTS.write_text(json.dumps(kept, indent=1) + "\n")
    if rewrite_page(router.PAGE, kept):
        print(f"rewrote the router:compiled block of {router.PAGE.relative_to(harness.REPO)}")
    print(f"wrote {RESULTS.relative_to(harness.REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
