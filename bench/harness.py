"""What the router benchmarks share: a real nats-server, a compiled pool
whose one worker set points at a stub upstream, endpoint telemetry kept fresh
on NATS, and the Kinference router started as its own process
(``python -m kinference_router``), pinned to a CPU with ``taskset``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats

from kinference_common import bus, natsserver, subjects
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text
from kinference_common.messages import EndpointState, encode
from kinference_policy_compiler.publisher import ConfigPublisher

REPO = Path(__file__).resolve().parent.parent
MODEL = "bench-model"
NAMESPACE, POOL, WORKER_SET = "default", "bench", "bench-stub"

#: one worker set, a policy with a single catch-all rule and no classifier
#: (no tag condition anywhere), the pool joining them
MANIFESTS = f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: {WORKER_SET}, namespace: {NAMESPACE}}}
spec:
  model: {{name: {MODEL}, servedName: {MODEL}, contextWindow: 32768}}
  engine: vLLM
  selector: {{matchLabels: {{app: bench-stub}}}}
  port: 8000
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{name: bench-catch-all, namespace: {NAMESPACE}}}
spec:
  rules:
    - name: everything-local
      route:
        select:
          - {{type: Local, minimize: PredictedTTFT}}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{name: {POOL}, namespace: {NAMESPACE}}}
spec:
  destinations:
    - {{kind: InferenceWorkerSet, name: {WORKER_SET}}}
  policyRef: {{name: bench-catch-all}}
"""


def rewrite_block(page: Path, name: str, body: str) -> bool:
    """Replace what sits between ``<!-- name -->`` and ``<!-- /name -->`` in
    ``page`` with ``body``; False (the page untouched) when it has no such block."""
    block = re.compile(rf"(<!-- {re.escape(name)} -->\n)(.*?)(<!-- /{re.escape(name)} -->)", re.S)
    text = page.read_text()
    if block.search(text) is None:
        return False
    page.write_text(block.sub(lambda m: m.group(1) + body + m.group(3), text))
    return True


def save_results(out: Path, rows: list, started: float, page: Path | None, name: str, body: str) -> None:
    """A benchmark's end: ``rows`` written to ``out`` as JSON, and the
    ``name`` block of ``page`` rewritten with ``body`` (``page`` None: left
    alone), each said on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out} ({len(rows)} rows) in {time.perf_counter() - started:.0f} s")
    if page is not None and rewrite_block(page, name, body):
        print(f"rewrote the {name} block of {page.relative_to(REPO) if page.is_relative_to(REPO) else page}")


def page_only(prog: str, name: str, results: object, results_path: Path, page: Path, body: str) -> int:
    """``--page-only`` of a benchmark: rewrite the page's ``name`` block from
    the results file without measuring (SystemExit naming what is missing)."""
    if not results:
        shown = results_path.relative_to(REPO) if results_path.is_relative_to(REPO) else results_path
        raise SystemExit(f"{prog}: no results in {shown}")
    if not rewrite_block(page, name, body):
        raise SystemExit(f"{prog}: {page.name} has no {name} block")
    print(f"rewrote the {name} block of {page.relative_to(REPO)}")
    return 0


def free_port() -> int:
    return natsserver.free_port()


def taskset_prefix(cpu: int | None) -> list[str]:
    """``taskset -c CPU`` when taskset exists and a CPU is asked for."""
    if cpu is None:
        return []
    exe = shutil.which("taskset")
    if exe is None:
        raise SystemExit("taskset not found (util-linux): cannot pin processes to a core")
    return [exe, "-c", str(cpu)]


def pin_pid(pid: int, cpu: int | None) -> None:
    """Pin a running process and all its threads."""
    if cpu is None:
        return
    subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(pid)], check=True, stdout=subprocess.DEVNULL)


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[11], fields[12]: utime, stime in clock ticks (man 5 proc, fields 14 and 15)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int | None:
    """VmRSS of a process in KiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
        return False


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what or url}: exited with code {proc.returncode}")
        if http_ok(url):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what or url}: not ready within {timeout:.0f}s")


@dataclass
class Process:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def spawn(name: str, argv: Sequence[str], log_dir: Path, cpu: int | None = None,
          env: dict[str, str] | None = None) -> Process:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*taskset_prefix(cpu), *argv], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO),
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    return Process(name, proc, log)


def start_stub(port: int, log_dir: Path, cpu: int | None, *, chunks: int = 3, interval: float = 0.0,
               name: str = "stub") -> Process:
    p = spawn(name, [sys.executable, "-m", "bench.stub_upstream", "--port", str(port), "--chunks", str(chunks),
                     "--chunk-interval", str(interval)], log_dir, cpu)
    wait_http(f"http://127.0.0.1:{port}/health", 15, p.proc, name)
    return p


def start_kinference(port: int, admin_port: int, nats_url: str, log_dir: Path, cpu: int | None,
                     extra: Sequence[str] = ()) -> Process:
    p = spawn("kinference-router", [
        sys.executable, "-m", "kinference_router", "--pool", f"{NAMESPACE}/{POOL}", "--nats-url", nats_url,
        "--host", "127.0.0.1", "--port", str(port), "--admin-host", "127.0.0.1", "--admin-port", str(admin_port),
        "--auth", "none", "--log-level", "warning", *extra,
    ], log_dir, cpu)
    wait_http(f"http://127.0.0.1:{port}/readyz", 30, p.proc, "kinference-router")
    return p


@dataclass
class Control:
    """The control plane of a bench: nats-server, the compiled pool, and
    endpoint telemetry for the stub's endpoints republished every second
    (fresh, idle: the router decides on live signals, as in production)."""

    nats: natsserver.NatsServer
    nc: nats.NATS
    addresses: list[str]
    task: asyncio.Task[None] | None = None
    published: int = field(default=0)

    @property
    def url(self) -> str:
        return self.nats.url

    async def publish_telemetry(self) -> None:
        for i, address in enumerate(self.addresses):
            pod = f"stub-{i}"
            state = EndpointState(namespace=NAMESPACE, worker_set=WORKER_SET, pod=pod, address=address,
                                  model=MODEL, ready=True, scraped_at=time.time(), queued=0, running=0,
                                  kv_cache_usage=0.1, prefill_tokens_per_second=10000.0)
            await self.nc.publish(subjects.endpoint_subject(NAMESPACE, WORKER_SET, pod), encode(state))
        await bus.sync(self.nc)
        self.published += 1

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                await self.publish_telemetry()


@contextlib.asynccontextmanager
async def control_plane(addresses: list[str], cpu: int | None) -> AsyncIterator[Control]:
    """nats-server (pinned to ``cpu``), the bench pool compiled and published."""
    server = natsserver.start()
    try:
        if server.proc is not None:
            pin_pid(server.proc.pid, cpu)
        res = compile_documents(load_text(MANIFESTS, "bench"))
        if res.errors:
            raise SystemExit(f"bench pool does not compile: {res.errors}")
        nc = await nats.connect(server.url)
        try:
            publisher = ConfigPublisher(nc)
            await publisher.start()
            await publisher.publish(res.pools)
            ctl = Control(server, nc, addresses)
            await ctl.publish_telemetry()
            ctl.task = asyncio.create_task(ctl._loop())
            try:
                yield ctl
            finally:
                ctl.task.cancel()
                await asyncio.gather(ctl.task, return_exceptions=True)
        finally:
            await nc.close()
    finally:
        server.stop()
