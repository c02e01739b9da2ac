"""The router compiled with Cython against the router as it runs:
``make bench-router-compiled`` (``python -m bench.router_compiled``).

The question it answers: would compiling the router's Python (the request
path's modules, as they are, no type declarations) take the CPU per request
to where ``make bench-router``'s goals are? It copies the two packages the
router runs on (``kinference_router``, ``kinference_common``) into a
temporary directory, compiles :data:`MODULES` there in place with Cython
(``cythonize -i``, language level 3, annotations not used as C types: with
them Cython refuses values PEP 484 allows, such as a msgspec ``Struct``
class where ``type`` is annotated, and the router does not start), checks
that the router imports the compiled modules, then measures the router
(``kinference`` of :mod:`bench.router`: a real nats-server, the stub
upstream, decisions recorded, pinned to one core) at concurrency 64, plain
and streamed, alternately interpreted and compiled (``PYTHONPATH`` puts
the compiled copy first), ``--rounds`` times. CPU per request (``/proc``)
is the figure to read; requests per second moves with the machine.

Cython goes into ``bench/.venv-competitors`` (never a product dependency)
and builds for this interpreter (the same Python makes that virtualenv).
Prints a table and writes ``bench/results/router_compiled.json``.
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
#: where each package's source is in the repository
SOURCES = {"kinference_router": harness.REPO / "services" / "router",
           "kinference_common": harness.REPO / "libs" / "kinference_common"}
MODES = ("plain", "stream")


def ensure_cython() -> Path:
    """``cythonize`` in the competitors' virtualenv (installed when missing)."""
    why = router.ensure_competitors()
    if why is not None:
        raise SystemExit(f"bench-router-compiled: {why}")
    tool = router.COMPETITORS / "bin" / "cythonize"
    if not tool.exists():
        print("installing Cython into bench/.venv-competitors", flush=True)
        subprocess.run([str(router.COMPETITORS / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "cython", "setuptools"], check=True)
    return tool


def build(root: Path, cythonize: Path) -> float:
    """Copy the packages under ``root`` and compile :data:`MODULES` in place;
    seconds taken. Raises SystemExit naming what failed."""
    for name, src in SOURCES.items():
        shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    t0 = time.monotonic()
    out = subprocess.run([str(cythonize), "-i", "-j", str(os.cpu_count() or 1), "-X", "language_level=3",
                          "-X", "annotation_typing=False", *MODULES], cwd=root, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"bench-router-compiled: cythonize failed (rc {out.returncode}):\n"
                         f"{(out.stdout + out.stderr)[-2000:]}")
    # the router must import the compiled modules, not the copies' sources
    names = [m.removesuffix(".py").replace("/", ".") for m in MODULES]
    probe = ("import importlib, sys\n"
             "bad = [n for n in sys.argv[1:] if not importlib.import_module(n).__file__.endswith('.so')]\n"
             "print(' '.join(bad))")
    got = subprocess.run([sys.executable, "-c", probe, *names], env={**os.environ, "PYTHONPATH": str(root)},
                         cwd=root, capture_output=True, text=True, check=False)
    if got.returncode != 0 or got.stdout.strip():
        raise SystemExit(f"bench-router-compiled: not imported compiled: {got.stdout.strip() or got.stderr[-800:]}")
    return time.monotonic() - t0


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the median CPU per request and req/s of each variant over the
    rounds, and compiled / interpreted."""
    out = []
    for mode in MODES:
        med = {}
        for variant in ("interpreted", "compiled"):
            got = [r for r in rows if r["variant"] == variant and r["mode"] == mode and "error" not in r]
            if not got:
                break
            med[variant] = {"cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in got),
                            "rps": statistics.median(r["rps"] for r in got)}
        if len(med) < 2:
            continue
        out.append({"mode": mode, **{f"{v}_{k}": round(x, 1) for v, d in med.items() for k, x in d.items()},
                    "cpu_ratio": round(med["compiled"]["cpu_us_per_request"]
                                       / med["interpreted"]["cpu_us_per_request"], 3),
                    "rps_ratio": round(med["compiled"]["rps"] / med["interpreted"]["rps"], 3)})
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    wrk = router.ensure_wrk()
    cythonize = ensure_cython()
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kinference-compiled-") as tmp:
        root = Path(tmp) / "build"
        root.mkdir()
        print(f"compiling {len(MODULES)} modules with Cython ...", flush=True)
        seconds = build(root, cythonize)
        print(f"compiled in {seconds:.0f} s; measuring {args.rounds} rounds", flush=True)
        log_dir = Path(tmp) / "logs"
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, args.client_cpu)
        load = router.Load(wrk, args.client_cpu, log_dir)
        before = os.environ.get("PYTHONPATH")
        try:
            for n in range(1, args.rounds + 1):
                for variant in ("interpreted", "compiled"):
                    if variant == "compiled":
                        os.environ["PYTHONPATH"] = str(root)
                    elif before is None:
                        os.environ.pop("PYTHONPATH", None)
                    else:
                        os.environ["PYTHONPATH"] = before
                    got: list[dict[str, Any]] = []
                    await router.measure_target("kinference", args, load, stub_port, log_dir, got)
                    for r in got:
                        r.update(variant=variant, round=n)
                    rows += got
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
            stub.stop()
    return {"modules": list(MODULES), "rounds": args.rounds, "duration_s": args.duration,
            "concurrency": args.concurrency[0], "rows": rows, "summary": summarize(rows),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(result: dict[str, Any]) -> str:
    lines = [f"{'round':>5} {'variant':<12} {'mode':<6} {'req/s':>9} {'CPU us/req':>11}", "-" * 47]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['round']:>5} {r['variant']:<12} {r['mode']:<6} ERROR: {r['error']}")
        else:
            lines.append(f"{r['round']:>5} {r['variant']:<12} {r['mode']:<6} {r['rps']:>9.0f} "
                         f"{r.get('cpu_us_per_request', float('nan')):>11.1f}")
    for s in result["summary"]:
        lines.append(f"median {s['mode']}: CPU per request {s['compiled_cpu_us_per_request']} us compiled against "
                     f"{s['interpreted_cpu_us_per_request']} interpreted ({s['cpu_ratio']:.2f}x), "
                     f"req/s {s['rps_ratio']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench-router-compiled", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="interpreted/compiled pairs measured (default 3)")
    p.add_argument("--duration", type=int, default=6, help="whole seconds measured per figure (default 6)")
    p.add_argument("--warmup", type=int, default=1, help="whole seconds of warm-up before each figure (default 1)")
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.duration < 1:
        p.error("--rounds and --duration must be at least 1")
    args.concurrency = [64]
    result = asyncio.run(run(args))
    print(table(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(harness.REPO)}")
    return 0 if result["summary"] else 1


if __name__ == "__main__":
    sys.exit(main())
