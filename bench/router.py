"""Router overhead, side by side: ``make bench-router`` (``python -m bench.router``).

Against one fast upstream stub (:mod:`bench.stub_upstream`, its own process:
plain JSON at once, or a short SSE stream at once), measures with the same
load client (``wrk``, a Lua script that POSTs a chat completion and reports
exact percentiles) and for non-streaming (``plain``) and streaming
(``stream``) requests at concurrency 1 and 64:

==========================  ==================================================
target                      what the client calls
==========================  ==================================================
direct                      the stub itself (the baseline)
kinference                  ``python -m kinference_router`` (uvloop), a real
                            nats-server, a compiled pool whose worker set's
                            endpoint is the stub (fresh telemetry on NATS),
                            one catch-all rule, no classifier, auth none;
                            decisions recorded (the default)
kinference-no-record        the same with ``--no-record``: the cost of the
                            decision records is the difference
kinference-null             the router's own HTTP server and upstream client
                            with nothing between them (:mod:`bench.null_router`):
                            the most any router on that transport reaches in
                            Python; the distance to ``kinference`` is what the
                            router does on the way (no goal of its own)
vllm-router-round_robin     the vLLM project's Rust router, ``--policy
                            round_robin``, the stub as its one worker
vllm-router-cache_aware     the same with ``--policy cache_aware``
litellm                     the LiteLLM proxy, the stub as an OpenAI-compatible
                            model, no master key (as Kinference's auth none)
==========================  ==================================================

Each router under test runs alone, pinned to one core (``--router-cpu``,
``taskset``); the client, the stub, nats-server and this script share the
other (``--client-cpu``). Each figure is a ``--duration`` run after a
``--warmup`` run at the same concurrency. Latency is the whole response (for
a stream: until its last chunk). Added latency = target minus direct.

The competitors are installed into their own virtualenv,
``bench/.venv-competitors`` (never a dependency of the product); one that
cannot be installed or started is written with an ``error`` field instead of
figures. Prints a table and writes ``bench/results/router.json``: a list of
``{target, mode, concurrency, rps, p50_ms, p99_ms, ...}`` (plus
``added_p50_ms``, ``added_p99_ms``, ``requests``, ``errors``).

Goals (each MET or MISS in the output and on the page), one core each,
measured in one run: Kinference's added p50 at concurrency 1 no more than
vllm-router round_robin's (plain and streamed); its requests/s at
concurrency 64 at least 0.9x round_robin's plain and at least its streamed;
above cache_aware's in both modes. (The first targets were 1.5x and 40%.)

The ``router:results`` block of ``docs/benchmarks.md`` is rewritten from the
run (``--page-only``: from ``bench/results/router.json``, without running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "router.json"
COMPETITORS = BENCH / ".venv-competitors"
COMPETITOR_PACKAGES = ["vllm-router", "litellm[proxy]", "py-spy"]
TARGETS = ["direct", "kinference", "kinference-no-record", "kinference-null", "vllm-router-round_robin",
           "vllm-router-cache_aware", "litellm"]
#: docs/benchmarks.md's block that ``make bench-router`` rewrites: the recording's cost
PAGE = BENCH.parent / "docs" / "benchmarks.md"
_RECORDING_BLOCK = re.compile(r"(<!-- router:recording -->\n)(.*?)(<!-- /router:recording -->)", re.S)
#: ... and the block of every target's figures and the goals
_RESULTS_BLOCK = re.compile(r"(<!-- router:results -->\n)(.*?)(<!-- /router:results -->)", re.S)
MODES = ["plain", "stream"]
PROMPT = "Write one sentence about the sea."

WRK_LUA = """
wrk.method = "POST"
wrk.body = [[%(body)s]]
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"p50_us\\": %%d, \\"p99_us\\": %%d, "
    .. "\\"mean_us\\": %%.1f, \\"max_us\\": %%d, \\"connect\\": %%d, \\"read\\": %%d, \\"write\\": %%d, "
    .. "\\"status\\": %%d, \\"timeout\\": %%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.mean, latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


# ---------------------------------------------------------------- tools


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing wrk (apt)", flush=True)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, **quiet).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], check=False, **quiet)
            subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, **quiet)
        found = shutil.which("wrk")
        if found:
            return found
    raise SystemExit("bench-router: wrk not found and could not be installed (apt-get install wrk as root)")


def ensure_competitors() -> str | None:
    """Create/refresh bench/.venv-competitors; None when ready, else why not."""
    stamp = COMPETITORS / ".installed"
    wanted = " ".join(COMPETITOR_PACKAGES)
    py = COMPETITORS / "bin" / "python"
    if stamp.exists() and stamp.read_text().strip() == wanted and py.exists():
        return None
    print(f"installing competitors into {COMPETITORS.relative_to(harness.REPO)}: {wanted}", flush=True)
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(COMPETITORS)], check=True)
            (COMPETITORS / ".gitignore").write_text("*\n")
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", *COMPETITOR_PACKAGES], check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"pip install into {COMPETITORS.name} failed: {exc}"
    stamp.write_text(wanted + "\n")
    return None


# ------------------------------------------------------------- the client


@dataclass
class Load:
    wrk: str
    cpu: int | None
    workdir: Path

    def script(self, mode: str) -> Path:
        body = {"model": harness.MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
        if mode == "stream":
            body["stream"] = True
        path = self.workdir / f"{mode}.lua"
        path.write_text(WRK_LUA % {"body": json.dumps(body)})
        return path

    def run(self, url: str, mode: str, concurrency: int, seconds: int) -> dict[str, Any]:
        argv = [*harness.taskset_prefix(self.cpu), self.wrk, "-t", "1", "-c", str(concurrency),
                "-d", f"{max(1, int(seconds))}s", "--timeout", "30s", "-s", str(self.script(mode)), url]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60, check=False)
        m = re.search(r"^WRKJSON (\{.*\})$", out.stdout, re.MULTILINE)
        if m is None:
            raise RuntimeError(f"wrk gave no result (rc {out.returncode}): {out.stdout[-400:]} {out.stderr[-400:]}")
        r: dict[str, Any] = json.loads(m.group(1))
        r["errors"] = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
        r["rps"] = r["requests"] / (r["duration_us"] / 1e6) if r["duration_us"] else 0.0
        return r


def smoke(url: str, stream: bool) -> None:
    """One request by hand: 200, and for a stream every chunk then [DONE]."""
    import urllib.request

    body = {"model": harness.MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": stream}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
        if r.status != 200:
            raise RuntimeError(f"smoke request answered {r.status}")
    if stream and ("tok2" not in text or "[DONE]" not in text):
        raise RuntimeError(f"smoke stream incomplete: {text[:300]!r}")
    if not stream and "Hello from the stub" not in text:
        raise RuntimeError(f"smoke answer unexpected: {text[:300]!r}")


# ----------------------------------------------------------- the targets


class Target:
    """Starts one router; ``url`` is its chat-completions URL."""

    def __init__(self, name: str, args: argparse.Namespace, stub_port: int, log_dir: Path) -> None:
        self.name, self.args, self.stub_port, self.log_dir = name, args, stub_port, log_dir
        self.procs: list[harness.Process] = []
        self.url = ""
        self.pid: int | None = None
        self._control: Any = None
        self._ctl: Any = None
        #: the decision records' stream after the run: bytes, messages, decisions recorded
        self.records: dict[str, int] | None = None

    async def start(self) -> None:
        cpu = self.args.router_cpu
        stub = f"127.0.0.1:{self.stub_port}"
        if self.name == "direct":
            self.url = f"http://{stub}/v1/chat/completions"
            return
        port = harness.free_port()
        if self.name in ("kinference", "kinference-no-record"):
            control = harness.control_plane([stub], self.args.client_cpu)
            ctl = await control.__aenter__()
            self._control, self._ctl = control, ctl  # entered: stop() leaves it
            extra = ["--no-record"] if self.name == "kinference-no-record" else []
            p = await asyncio.to_thread(harness.start_kinference, port, harness.free_port(), ctl.url,
                                        self.log_dir, cpu, extra)
            self.procs.append(p)
            await ctl.publish_telemetry()  # the router is subscribed now
            await asyncio.sleep(0.3)  # the snapshot rebuilt (every 50 ms)
        elif self.name == "kinference-null":
            p = harness.spawn(self.name, [sys.executable, "-m", "bench.null_router", "--port", str(port),
                                          "--upstream", stub], self.log_dir, cpu)
            self.procs.append(p)
            await asyncio.to_thread(harness.wait_http, f"http://127.0.0.1:{port}/health", 30, p.proc, self.name)
        elif self.name.startswith("vllm-router-"):
            policy = self.name.removeprefix("vllm-router-")
            p = harness.spawn(self.name, [
                str(COMPETITORS / "bin" / "vllm-router"), "--worker-urls", f"http://{stub}", "--policy", policy,
                "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(harness.free_port()),
                "--worker-startup-check-interval", "1", "--log-level", "warning",
            ], self.log_dir, cpu)
            self.procs.append(p)
            await asyncio.to_thread(harness.wait_http, f"http://127.0.0.1:{port}/health", 60, p.proc, self.name)
        elif self.name == "litellm":
            config = self.log_dir / "litellm.yaml"
            config.write_text(
                "model_list:\n"
                f"  - model_name: {harness.MODEL}\n"
                "    litellm_params:\n"
                f"      model: openai/{harness.MODEL}\n"
                f"      api_base: http://{stub}/v1\n"
                "      api_key: sk-bench\n"
                "litellm_settings:\n"
                "  telemetry: false\n"
                "  drop_params: true\n"
                "general_settings:\n"
                "  dangerously_permit_weak_or_unset_master_key: true\n"
            )
            p = harness.spawn(self.name, [
                str(COMPETITORS / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
                "--port", str(port), "--num_workers", "1",
            ], self.log_dir, cpu, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"})
            self.procs.append(p)
            await asyncio.to_thread(harness.wait_http, f"http://127.0.0.1:{port}/health/liveliness", 120,
                                    p.proc, self.name)
        else:
            raise ValueError(self.name)
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.pid = self.procs[0].pid if self.procs else None

    async def stop(self) -> None:
        for p in self.procs:
            await asyncio.to_thread(p.stop)
        if self._ctl is not None:
            self.records = await record_stats(self._ctl.nc)
        if self._control is not None:
            await self._control.__aexit__(None, None, None)

    def tail(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def cpu_pids(self) -> list[int]:
        """The processes whose CPU time is the target's (bench.epp: Envoy and the EPP)."""
        return [self.pid] if self.pid else []

    def cpu_seconds(self) -> float | None:
        got = [harness.cpu_seconds(pid) for pid in self.cpu_pids()]
        return None if not got or None in got else sum(got)  # type: ignore[arg-type]

    def counters(self) -> dict[str, int]:
        """Counters a target exposes (bench.epp: Envoy's ext_proc messages);
        measure_target reports their increase per request."""
        return {}


async def measure_target(name: str, args: argparse.Namespace, load: Load, stub_port: int, log_dir: Path,
                         rows: list[dict[str, Any]], target_cls: type[Target] | None = None) -> None:
    """Start ``name`` (a :class:`Target`, or ``target_cls``: bench.epp's
    gateway targets), smoke it, measure every mode and concurrency."""
    cases = [(m, c) for m in MODES for c in args.concurrency]
    target = (target_cls or Target)(name, args, stub_port, log_dir)
    try:
        await target.start()
        for stream in (False, True):
            await asyncio.to_thread(smoke, target.url, stream)
    except Exception as exc:  # noqa: BLE001 - any failure to start is reported in the results
        why = f"could not start: {exc}".strip()
        tail = target.tail().strip().splitlines()
        if tail:
            why += f" (log: {tail[-1][:200]})"
        print(f"  {name}: {why}", flush=True)
        rows += [{"target": name, "mode": m, "concurrency": c, "error": why} for m, c in cases]
        await target.stop()
        return
    try:
        for mode, conc in cases:
            try:
                await asyncio.to_thread(load.run, target.url, mode, conc, args.warmup)
                cpu0, n0 = target.cpu_seconds(), target.counters()
                r = await asyncio.to_thread(load.run, target.url, mode, conc, args.duration)
                cpu1, n1 = target.cpu_seconds(), target.counters()
            except Exception as exc:  # noqa: BLE001 - reported in the results, the bench goes on
                rows.append({"target": name, "mode": mode, "concurrency": conc, "error": f"load failed: {exc}"})
                print(f"  {name:<24} {mode:<6} c={conc:<3} ERROR {exc}", flush=True)
                continue
            row = {"target": name, "mode": mode, "concurrency": conc, "rps": round(r["rps"], 1),
                   "p50_ms": round(r["p50_us"] / 1e3, 3), "p99_ms": round(r["p99_us"] / 1e3, 3),
                   "requests": r["requests"], "errors": r["errors"]}
            if cpu0 is not None and cpu1 is not None and r["requests"]:
                # the router's own CPU per request: steadier than req/s on a shared machine
                row["cpu_us_per_request"] = round((cpu1 - cpu0) / r["requests"] * 1e6, 1)
            if n0 and n1 and r["requests"]:
                row["per_request"] = {k: round((n1[k] - n0.get(k, 0)) / r["requests"], 2) for k in n1}
            rows.append(row)
            print(f"  {name:<24} {mode:<6} c={conc:<3} {row['rps']:>9.1f} req/s  p50 {row['p50_ms']:7.3f} ms  "
                  f"p99 {row['p99_ms']:7.3f} ms  errors {row['errors']}", flush=True)
    finally:
        await target.stop()
        if target.records and target.records.get("decisions"):
            per = target.records["bytes"] / target.records["decisions"]
            for row in rows:
                if row["target"] == name and "error" not in row:
                    row["record_bytes_per_request"] = round(per)


async def record_stats(nc: Any) -> dict[str, int] | None:
    """The records stream's size and how many decisions it holds (None: no stream)."""
    from kinference_common import recording

    try:
        info = await nc.jetstream().stream_info(recording.STREAM, subjects_filter=f"{recording.PREFIX}.>")
    except Exception:  # noqa: BLE001 - not recording (--no-record): no stream
        return None
    decisions = sum(n for subj, n in (info.state.subjects or {}).items() if subj.endswith(".decision"))
    return {"bytes": info.state.bytes, "messages": info.state.messages, "decisions": decisions}


def cost_line(cost: dict[str, float]) -> str:
    return (f"In-process, the steadier figure (`bench.hotpath.recording_cost`, best of 9 rounds): "
            f"{cost['capture_us']:.1f} us per request on the request path (capturing the decision's inputs) "
            f"and {cost['record_us']:.1f} us after it (building, encoding and queuing a "
            f"{cost['decision_record_bytes']:.0f}-byte decision record); building and encoding the decision "
            f"event, which every router publishes anyway, takes {cost['decision_event_us']:.1f} us in the same "
            f"measurement; a snapshot record (3 endpoints, 1 provider) costs "
            f"{cost['snapshot_record_us']:.1f} us and {cost['snapshot_record_bytes']:.0f} bytes, once per snapshot "
            "a decision used (the router rebuilds its snapshot at most every 50 ms).")


def recording_table(rows: list[dict[str, Any]]) -> str:
    """Recording on (``kinference``) against off (``kinference-no-record``), same run."""
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows if "error" not in r}
    lines = ["| mode | concurrency | req/s on / off | p50 ms on / off | p99 ms on / off | "
             "CPU us/req on / off (+cost) | bytes recorded per request |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["target"] != "kinference" or "error" in r:
            continue
        off = idx.get(("kinference-no-record", r["mode"], r["concurrency"]))
        if off is None:
            continue
        on_cpu, off_cpu = r.get("cpu_us_per_request"), off.get("cpu_us_per_request")
        cost = f" (+{on_cpu - off_cpu:.1f})" if on_cpu is not None and off_cpu is not None else ""
        lines.append(f"| {r['mode']} | {r['concurrency']} | {r['rps']:.0f} / {off['rps']:.0f} | "
                     f"{r['p50_ms']:.3f} / {off['p50_ms']:.3f} | {r['p99_ms']:.3f} / {off['p99_ms']:.3f} | "
                     f"{on_cpu if on_cpu is not None else '-'} / {off_cpu if off_cpu is not None else '-'}{cost} | "
                     f"{r.get('record_bytes_per_request', '-')} |")
    return "\n".join(lines)


def rewrite_recording(page: str, rows: list[dict[str, Any]], when: str, cost: dict[str, float]) -> str | None:
    """The page with its ``router:recording`` block rewritten; None when the run has no pair to compare."""
    body = recording_table(rows)
    if body.count("\n") < 2 or _RECORDING_BLOCK.search(page) is None:
        return None
    text = (f"Measured {when} by `make bench-router` (one run, recording on and off in the same run; "
            "a shared 2-core machine, where the difference between two runs of the same router is often "
            "larger than the recording's cost):\n\n" + body + "\n\n" + cost_line(cost) + "\n")
    return _RECORDING_BLOCK.sub(lambda m: m.group(1) + text + m.group(3), page)


# ------------------------------------------------------------------ report


def annotate(rows: list[dict[str, Any]]) -> None:
    base = {(r["mode"], r["concurrency"]): r for r in rows if r["target"] == "direct" and "error" not in r}
    for r in rows:
        b = base.get((r["mode"], r["concurrency"]))
        if "error" in r or b is None:
            continue
        r["added_p50_ms"] = round(r["p50_ms"] - b["p50_ms"], 3)
        r["added_p99_ms"] = round(r["p99_ms"] - b["p99_ms"], 3)


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def table(rows: list[dict[str, Any]]) -> str:
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows}
    head = (f"{'target':<24} {'mode':<6} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'+p50 ms':>8} {'+p99 ms':>8} {'rps/direct':>10} {'rps/vllm-rr':>11} {'+p50/vllm-rr':>12} "
            f"{'cpu us/req':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['target']:<24} {r['mode']:<6} {r['concurrency']:>4} ERROR: {r['error']}")
            continue
        d = idx.get(("direct", r["mode"], r["concurrency"]), {})
        v = idx.get(("vllm-router-round_robin", r["mode"], r["concurrency"]), {})
        lines.append(
            f"{r['target']:<24} {r['mode']:<6} {r['concurrency']:>4} {r['rps']:>9.1f} {r['p50_ms']:>8.3f} "
            f"{r['p99_ms']:>8.3f} {r.get('added_p50_ms', 0):>8.3f} {r.get('added_p99_ms', 0):>8.3f} "
            f"{ratio(r['rps'], d.get('rps')):>10} {ratio(r['rps'], v.get('rps')):>11} "
            f"{ratio(r.get('added_p50_ms'), v.get('added_p50_ms')) if r['target'] != 'direct' else '-':>12} "
            f"{r.get('cpu_us_per_request', '-'):>10}"
            + (f"  ({r['errors']} errors)" if r.get("errors") else ""))
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """The goals, MET or MISS, for what the run measured (a goal whose figures
    are missing is left out)."""
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows if "error" not in r}
    out = []
    for mode in MODES:
        k, v = (idx.get((t, mode, 1)) for t in ("kinference", "vllm-router-round_robin"))
        if k and v and "added_p50_ms" in k and "added_p50_ms" in v:
            ok = k["added_p50_ms"] <= v["added_p50_ms"]
            out.append(f"{'MET ' if ok else 'MISS'} {mode:<6} c=1  added p50 {k['added_p50_ms']:.3f} ms <= "
                       f"vllm-router round_robin's {v['added_p50_ms']:.3f} ms "
                       f"({ratio(k['added_p50_ms'], v['added_p50_ms'])})")
    for mode, share in (("plain", 0.9), ("stream", 1.0)):
        k, v, c = (idx.get((t, mode, 64)) for t in ("kinference", "vllm-router-round_robin",
                                                     "vllm-router-cache_aware"))
        if k and v:
            ok = k["rps"] >= share * v["rps"]
            out.append(f"{'MET ' if ok else 'MISS'} {mode:<6} c=64 {k['rps']:.0f} req/s >= {share:g}x vllm-router "
                       f"round_robin's {v['rps']:.0f} ({ratio(k['rps'], v['rps'])})")
        if k and c:
            ok = k["rps"] > c["rps"]
            out.append(f"{'MET ' if ok else 'MISS'} {mode:<6} c=64 {k['rps']:.0f} req/s > vllm-router cache_aware's "
                       f"{c['rps']:.0f} ({ratio(k['rps'], c['rps'])})")
    out += ceilings(idx)
    return out


def ceilings(idx: dict[tuple[str, str, int], dict[str, Any]]) -> list[str]:
    """What the router's transport alone (``kinference-null``) reaches, against
    round_robin and against the whole router: the part of each goal that no
    change to the rest of the router (its decision path, accounting, events
    and the background work of its process) can close."""
    out = []
    for mode in MODES:
        n, k, v = (idx.get((t, mode, 1)) for t in ("kinference-null", "kinference", "vllm-router-round_robin"))
        if n and v and "added_p50_ms" in n and "added_p50_ms" in v:
            out.append(f"ceiling {mode:<6} c=1  the transport alone (bench.null_router) adds "
                       f"{n['added_p50_ms']:.3f} ms p50 = {ratio(n['added_p50_ms'], v['added_p50_ms'])} round_robin's"
                       + (f"; the rest of the router adds {k['added_p50_ms'] - n['added_p50_ms']:.3f} ms more"
                          if k and "added_p50_ms" in k else ""))
        n, k, v = (idx.get((t, mode, 64)) for t in ("kinference-null", "kinference", "vllm-router-round_robin"))
        if n and v:
            line = (f"ceiling {mode:<6} c=64 the transport alone {n['rps']:.0f} req/s = {ratio(n['rps'], v['rps'])} "
                    "round_robin's")
            if k:
                line += f"; Kinference reaches {k['rps'] / n['rps']:.0%} of it"
                if "cpu_us_per_request" in k and "cpu_us_per_request" in n:
                    line += (f" (CPU per request {k['cpu_us_per_request']:.0f} against {n['cpu_us_per_request']:.0f}"
                             f" us: {k['cpu_us_per_request'] - n['cpu_us_per_request']:.0f} us for the rest of the "
                             "router's work)")
            out.append(line)
    return out


def results_table(rows: list[dict[str, Any]]) -> str:
    """Every figure of the run as a Markdown table, with the ratios the goals read."""
    idx = {(r["target"], r["mode"], r["concurrency"]): r for r in rows if "error" not in r}
    lines = ["| target | mode | concurrency | req/s | p50 ms | p99 ms | added p50 ms | CPU us/req | "
             "req/s / round_robin | added p50 / round_robin |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in sorted(rows, key=lambda r: (MODES.index(r["mode"]) if r["mode"] in MODES else 9, r["concurrency"])):
        if "error" in r:
            lines.append(f"| {r['target']} | {r['mode']} | {r['concurrency']} | not measured: "
                         f"{r['error'][:80]} | | | | | | |")
            continue
        v = idx.get(("vllm-router-round_robin", r["mode"], r["concurrency"]), {})
        direct = r["target"] == "direct"
        lines.append(
            f"| {r['target']} | {r['mode']} | {r['concurrency']} | {r['rps']:.0f} | {r['p50_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {'-' if direct else format(r.get('added_p50_ms', 0.0), '.3f')} | "
            f"{r.get('cpu_us_per_request', '-')} | {ratio(r['rps'], v.get('rps'))} | "
            f"{'-' if direct else ratio(r.get('added_p50_ms'), v.get('added_p50_ms'))} |")
    return "\n".join(lines)


def rewrite_results(page: str, rows: list[dict[str, Any]], when: str) -> str | None:
    """The page with its ``router:results`` block rewritten from ``rows``; None without the block."""
    if _RESULTS_BLOCK.search(page) is None or not rows:
        return None
    goals = verdicts(rows)
    text = (f"Measured {when} by `make bench-router` (one run; every router on one core, the client on the "
            "other; a shared machine, where one router's figures move by 10-25% between runs, so read the "
            "ratios, measured in the same run):\n\n" + results_table(rows) + "\n\n"
            + ("The goals in this run:\n\n" + "\n".join(f"- {g}" for g in goals) + "\n" if goals else ""))
    return _RESULTS_BLOCK.sub(lambda m: m.group(1) + text + m.group(3), page)


# -------------------------------------------------------------------- main


async def amain(args: argparse.Namespace) -> int:
    started = time.monotonic()
    wrk = ensure_wrk()
    if shutil.which("taskset") is None:
        raise SystemExit("bench-router: taskset (util-linux) not found")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or args.router_cpu not in cpus or args.client_cpu not in cpus:
        print(f"warning: CPUs {cpus}: cannot pin router and client to separate cores; not pinning", flush=True)
        args.router_cpu = args.client_cpu = None
    competitor_error = None if args.no_competitors else ensure_competitors()
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})  # this script, and what it starts unless told otherwise
    targets = [t for t in TARGETS if t in args.targets]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kinference-bench-") as tmp:
        log_dir = Path(tmp)
        stub_port = harness.free_port()
        stub = harness.start_stub(stub_port, log_dir, args.client_cpu)
        load = Load(wrk, args.client_cpu, log_dir)
        print(f"router on CPU {args.router_cpu}, client (wrk) + stub + nats-server on CPU {args.client_cpu}; "
              f"{args.warmup:g}s warm-up + {args.duration:g}s per figure", flush=True)
        try:
            for name in targets:
                if not name.startswith(("direct", "kinference")) and (args.no_competitors or competitor_error):
                    why = "not run (--no-competitors)" if args.no_competitors else competitor_error
                    rows += [{"target": name, "mode": m, "concurrency": c, "error": why}
                             for m in MODES for c in args.concurrency]
                    continue
                await measure_target(name, args, load, stub_port, log_dir, rows)
        finally:
            stub.stop()
    annotate(rows)
    print()
    print(table(rows))
    print()
    for line in verdicts(rows):
        print(line)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    page = rewrite_results(PAGE.read_text(), rows, when)
    if page is not None:
        PAGE.write_text(page)
        print(f"rewrote the results block of {PAGE.relative_to(harness.REPO)}")
    pair = recording_table(rows)
    if pair.count("\n") >= 2:
        from bench.hotpath import recording_cost

        cost = recording_cost()
        print("\ndecision records (recording on vs off):\n" + pair + "\n" + cost_line(cost))
        page = rewrite_recording(PAGE.read_text(), rows, when, cost)
        if page is not None:
            PAGE.write_text(page)
            print(f"rewrote the recording block of {PAGE.relative_to(harness.REPO)}")
    print(f"\nwrote {RESULTS.relative_to(harness.REPO)} in {time.monotonic() - started:.0f}s "
          "(a shared machine: figures move by 10-20% from run to run)")
    return 0


def measurement_flags(p: argparse.ArgumentParser, targets: list[str]) -> None:
    """The flags every front-door benchmark takes (this one and bench.epp)."""
    p.add_argument("--duration", type=int, default=4, help="whole seconds measured per figure (default 4)")
    p.add_argument("--warmup", type=int, default=1, help="whole seconds of warm-up before each figure (default 1)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    p.add_argument("--targets", nargs="+", default=targets, choices=targets)
    p.add_argument("--router-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make bench-router", description=__doc__.split("\n\n")[0])
    measurement_flags(p, TARGETS)
    p.add_argument("--no-competitors", action="store_true", help="only direct and kinference")
    p.add_argument("--page-only", action="store_true",
                   help=f"measure nothing: rewrite the page's results block from {RESULTS.relative_to(harness.REPO)}")
    args = p.parse_args(argv)
    if args.page_only:
        return page_only()
    return asyncio.run(amain(args))


def page_only() -> int:
    """``--page-only``: the page's results block from the last run's file."""
    try:
        rows = json.loads(RESULTS.read_text())
    except (OSError, ValueError) as exc:
        print(f"bench-router: cannot read {RESULTS.relative_to(harness.REPO)} ({exc}); run make bench-router first",
              file=sys.stderr)
        return 1
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(RESULTS.stat().st_mtime))
    page = rewrite_results(PAGE.read_text(), rows, when)
    if page is None:
        print(f"bench-router: no <!-- router:results --> block in {PAGE.relative_to(harness.REPO)}, or no rows",
              file=sys.stderr)
        return 1
    PAGE.write_text(page)
    for line in verdicts(rows):
        print(line)
    print(f"rewrote the results block of {PAGE.relative_to(harness.REPO)} from {RESULTS.relative_to(harness.REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
