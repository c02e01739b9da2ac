"""``make run``: the whole stack on this machine, as local processes, with
simulated GPUs.

Started, in order, each waited for until it answers:

====================  ============================================  ===========
process               what                                          port
====================  ============================================  ===========
nats-server           JetStream, the bus                            4222
policy-compiler       compiles .run/manifests, a copy of            8090
                      ``deploy/examples`` made at each start
                      (status: .run)
classifier            pii and injection tags                        8083
vllm sim qwen-0/1     worker set qwen-2-5-32b                       8001, 8002
vllm sim qwen-spot-0  worker set qwen-2-5-32b-spot                  8003
dcgm sim              GPUs of the three pods                        9410
provider sim          stands in for Databricks (API key checked)    8300
telemetry-collector   scrapes the sims, publishes state             9091
router                the OpenAI-compatible endpoint                8080 (admin 8081)
envoy (``--envoy``)   Envoy in front of the router's Endpoint       8088 (admin 9907)
                      Picker (EPP 9012, egress 8082)
====================  ============================================  ===========

``--nats-cluster`` (``make run-ha``) runs NATS as a JetStream cluster of three
servers on loopback instead of one (``nats-0`` to ``nats-2``: clients on 4222,
4232, 4242, routes on 6252, 6262, 6272 with their own password, monitoring on
8225, 8235, 8245), every service given the three URLs and the KV buckets made
at three replicas: the same cluster deploy/k8s runs, to kill a server of. It
also runs two telemetry-collector replicas sharing the pods
(``telemetry-collector`` on 9091 and ``telemetry-collector-1`` on 9094), as
deploy/k8s does, to kill or stop one of.

``--envoy`` (``make run-envoy``) also runs the router's Endpoint Picker and
provider egress and a real Envoy (``deploy/envoy/envoy-fallback.yaml``, rendered by
:mod:`kinference_simulators.envoy`) in front of it: requests to the Envoy
port take the gateway path, the router's own port still works.

``--port-offset N`` shifts every port (to run two stacks, or in tests). No
two of these ports end in the same two digits, so stacks whose offsets are
different multiples of 100 never collide (the collector moved from 9090 and
the DCGM simulator from 9400 for that; the services' own defaults are
unchanged). A stack with an offset keeps its state in ``.run-<offset>``.

It is a supervisor: a process that dies is started again (after 0.5 s,
doubling up to 30 s while it keeps dying; back to 0.5 s once it stayed up
for 30 s), and each exit and restart is printed with the tail of its log,
so what the rest of the stack does without it can be watched.
Each process logs to ``.run/logs/<name>.log``; statuses are in
``.run/status``. Ctrl-C (or SIGTERM, or SIGHUP: the terminal closed, unless
started with ``nohup``) stops
everything: SIGTERM to each process in reverse order, SIGKILL to what has not
exited after a few seconds. On Linux no process outlives the supervisor, even
one killed with SIGKILL: each gets SIGTERM from the kernel when it dies
(``PR_SET_PDEATHSIG``).
``--smoke`` starts the stack, sends one chat completion through the router,
prints the answer and stops (exit 0 when the request succeeded).

A start that is refused (the ports are taken, a stack already runs from the
run directory, a binary is missing) says why and changes nothing on disk:
the run directory is wiped only once the start is sure. The supervisor
records its pid in ``<run dir>/supervisor.json`` and holds a lock on it while
it runs, so a refusal can name the stack in the way.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kinference_common.manifests import DocumentRef, ManifestError
from kinference_common.natsauth import LocalAuth
from kinference_common.natsserver import cluster_members, find_binary
from kinference_common.tasks import unless_stopped

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
PROVIDER_KEY = "sk-local-databricks"  # the provider simulator's key, written to the secrets dir
SERVED = "Qwen/Qwen2.5-32B-Instruct"

PODS = [  # (worker set, pod, port)
    ("qwen-2-5-32b", "qwen-0", 8001),
    ("qwen-2-5-32b", "qwen-1", 8002),
    ("qwen-2-5-32b-spot", "qwen-spot-0", 8003),
]

#: every port of the stack before the offset; no two end in the same two
#: digits, so two stacks whose offsets differ by a multiple of 100 never collide
PORTS = {
    "nats": 4222, "compiler": 8090, "classifier": 8083, **{pod: port for _ws, pod, port in PODS},
    "dcgm": 9410, "provider": 8300, "collector": 9091, "router": 8080, "admin": 8081,
}
#: NATS as a cluster of three (``--nats-cluster``): each server's client, route and monitoring port, same rule
NATS_CLUSTER = [(4222, 6252, 8225), (4232, 6262, 8235), (4242, 6272, 8245)]
NATS_CLUSTER_PORTS = {f"nats-{what}-{i}": port for i, ports in enumerate(NATS_CLUSTER)
                      for what, port in zip(("client", "route", "monitor"), ports, strict=True)}
#: ``--nats-cluster`` also runs a second collector replica (its /metrics and /healthz)
NATS_CLUSTER_PORTS["collector-1"] = 9094
#: the gateway path's ports (``--envoy``), same rule
ENVOY_PORTS = {"envoy": 8088, "envoy-admin": 9907, "epp": 9012, "egress": 8082}
POOL = "default/inference-all"
#: in the run directory: the running supervisor's pid and ports, locked (flock) while it runs;
#: spared when the directory is wiped, so that the lock stays on one file
LOCK = "supervisor.json"
#: the script's name in messages when make did not start it
DIRECT = "python -m kinference_simulators.stack"

#: On Linux each child is started through this (``python -c``): it asks the kernel for
#: SIGTERM when its parent, the supervisor, dies (even by SIGKILL, where nothing of the
#: supervisor runs), then execs the child in its place (same pid; the setting survives
#: exec). If the supervisor died before the prctl, the parent is no longer its pid: the
#: child is not started. A wrapper rather than ``preexec_fn``, which is not safe in a
#: process with threads. The kernel sends the signal when the *thread* that forked
#: exits: ``spawn`` forks on the event loop's thread, which lives as long as the stack.
_PDEATHSIG = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
    sys.exit(f"prctl(PR_SET_PDEATHSIG): {os.strerror(ctypes.get_errno())}")
if os.getppid() != int(sys.argv[1]):
    sys.exit("the supervisor is gone: not starting " + sys.argv[2])
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.exit(f"cannot run {sys.argv[2]}: {exc}")
"""


class StackError(RuntimeError):
    """The stack could not start; the message says which process and why."""


@dataclass
class Proc:
    name: str
    argv: list[str]
    ready_url: str | None = None  # HTTP GET that must answer 200
    ready_port: int | None = None  # or a TCP port that must accept
    process: asyncio.subprocess.Process | None = None
    log: Path | None = None
    #: supervision: restarts so far, the next delay, when it last started
    restarts: int = 0
    backoff: float = 0.0
    started_at: float = 0.0
    #: not restarted while held (the chaos suite holds a process it keeps down)
    held: bool = False


@dataclass
class Stack:
    run_dir: Path
    offset: int = 0
    procs: list[Proc] = field(default_factory=list)
    #: extra arguments for every vLLM simulator (the chaos suite makes the pods small)
    vllm_args: list[str] = field(default_factory=list)
    #: Envoy in front of the router's Endpoint Picker (make run-envoy)
    envoy: bool = False
    #: the pool's failureMode as Envoy's failure_mode_allow (--envoy)
    fail_open: bool = False
    #: extra router flags (tests: --epp-conformance-hooks)
    router_args: list[str] = field(default_factory=list)
    #: NATS as a cluster of three servers (make run-ha)
    nats_cluster: bool = False
    #: the lock on ``run_dir/supervisor.json`` (:meth:`claim`)
    lock_fd: int | None = field(default=None, repr=False)

    def port(self, base: int) -> int:
        return base + self.offset

    @property
    def nats_dir(self) -> Path:
        """nats-server's JetStream storage."""
        return self.run_dir / "nats"

    @property
    def nats_names(self) -> list[str]:
        """The NATS processes: ``nats-server``, or ``nats-0`` to ``nats-2``."""
        return [f"nats-{i}" for i in range(len(NATS_CLUSTER))] if self.nats_cluster else ["nats-server"]

    @property
    def nats_url(self) -> str:
        """What the services are given: the server, or every server of the cluster."""
        ports = [c for c, _r, _m in NATS_CLUSTER] if self.nats_cluster else [4222]
        return ",".join(f"nats://127.0.0.1:{self.port(p)}" for p in ports)

    def _nats_procs(self, nats_bin: str, auth: LocalAuth) -> list[Proc]:
        if not self.nats_cluster:
            conf = auth.server_config(f"127.0.0.1:{self.port(4222)}", str(self.nats_dir))
            return [Proc("nats-server", [nats_bin, "-c", str(conf)], ready_port=self.port(4222))]
        members = cluster_members("127.0.0.1", [self.port(r) for _c, r, _m in NATS_CLUSTER], auth.route_password())
        procs = []
        for member, (client, _route, monitor) in zip(members, NATS_CLUSTER, strict=True):
            conf = auth.server_config(f"127.0.0.1:{self.port(client)}", str(self.nats_dir / member.server_name),
                                      cluster=member, http_port=self.port(monitor))
            procs.append(Proc(member.server_name, [nats_bin, "-c", str(conf)], ready_port=self.port(client)))
        # the cluster is up once the last one joined and a JetStream leader is elected
        procs[-1].ready_port, procs[-1].ready_url = None, f"http://127.0.0.1:{self.port(NATS_CLUSTER[-1][2])}/healthz"
        return procs

    def plan(self, speed_profile: str, time_scale: float) -> list[Proc]:
        py = sys.executable
        nats_url = self.nats_url
        status = self.run_dir / "status"
        secrets = self.run_dir / "secrets"
        nats_bin = find_binary()
        if nats_bin is None:
            raise StackError("make run: nats-server not found; run `make install` first")
        # NATS with a user per service and subject permissions (natsauth.py): the
        # classify subjects carry prompts, only routers and classifiers touch them
        auth = LocalAuth(self.run_dir / "nats-auth")
        # the buckets and the records stream at three replicas on a cluster of three
        replicas = ["--kv-replicas", str(len(NATS_CLUSTER))] if self.nats_cluster else []
        procs = [
            *self._nats_procs(nats_bin, auth),
            Proc("policy-compiler", [py, "-m", "kinference_policy_compiler", "--manifests", str(self.run_dir / "manifests"),
                                     *replicas,
                                     "--status-dir", str(status), "--nats-url", nats_url, *auth.flags("policy-compiler"),
                                     "--http-port", str(self.port(8090)), "--log-format", "json"],
                 ready_url=f"http://127.0.0.1:{self.port(8090)}/readyz"),
            Proc("classifier", [py, "-m", "kinference_classifier", "--nats-url", nats_url, *auth.flags("classifier"), "--health-host", "127.0.0.1",
                                "--health-port", str(self.port(8083)), "--log-format", "json"],
                 ready_url=f"http://127.0.0.1:{self.port(8083)}/readyz"),
        ]
        for i, (_ws, pod, port) in enumerate(PODS):
            procs.append(Proc(f"vllm-{pod}", [
                py, "-m", "kinference_simulators.vllm", "--host", "127.0.0.1", "--port", str(self.port(port)),
                "--model", SERVED, "--max-model-len", "32768", "--speed-profile", speed_profile,
                "--time-scale", str(time_scale), "--seed", str(i + 1), "--pod-name", pod, *self.vllm_args,
            ], ready_url=f"http://127.0.0.1:{self.port(port)}/health"))
        gpus = []
        for _ws, pod, port in PODS:
            gpus += ["--gpu", f"default/{pod}=http://127.0.0.1:{self.port(port)}"]
        procs.append(Proc("dcgm", [py, "-m", "kinference_simulators.dcgm", "--host", "127.0.0.1",
                                   "--port", str(self.port(PORTS['dcgm'])), *gpus],
                          ready_url=f"http://127.0.0.1:{self.port(PORTS['dcgm'])}/metrics"))
        procs.append(Proc("provider", [py, "-m", "kinference_simulators.provider", "--host", "127.0.0.1",
                                       "--port", str(self.port(8300)), "--api-key", PROVIDER_KEY,
                                       "--model", "databricks-qwen25-32b", "--ttft-ms", "400",
                                       "--log-file", str(self.run_dir / "provider-requests.jsonl")],
                          ready_port=self.port(8300)))
        # on a cluster, two collector replicas share the pods (kill either: the other takes its share)
        collectors = [("telemetry-collector", PORTS["collector"])]
        if self.nats_cluster:
            collectors.append(("telemetry-collector-1", NATS_CLUSTER_PORTS["collector-1"]))
        for k, (name, http_port) in enumerate(collectors):
            procs.append(Proc(name, [
                py, "-m", "kinference_collector", "--nats-url", nats_url, *auth.flags("telemetry-collector"),
                *replicas, "--endpoints-file", str(self.run_dir / "endpoints.yaml"),
                "--dcgm", f"127.0.0.1:{self.port(PORTS['dcgm'])}", "--http-host", "127.0.0.1",
                "--http-port", str(self.port(http_port)), "--log-format", "json",
                *(["--replica-id", f"collector-{k}"] if len(collectors) > 1 else []),
            ], ready_url=f"http://127.0.0.1:{self.port(http_port)}/healthz"))
        procs.append(Proc("router", [
            py, "-m", "kinference_router", "--pool", "default/inference-all", "--nats-url", nats_url,
            *auth.flags("router"), *replicas,
            "--port", str(self.port(8080)), "--admin-port", str(self.port(8081)), "--auth", "none",
            "--secrets-dir", str(secrets), "--log-format", "json", *self._gateway_flags(), *self.router_args,
        ], ready_url=f"http://127.0.0.1:{self.port(8080)}/readyz"))
        if self.envoy:
            procs.append(self._envoy_proc())
        return procs

    def _gateway_flags(self) -> list[str]:
        if not self.envoy:
            return []
        # Envoy's override_host bootstrap walks a list: the pick and two fallbacks
        return ["--epp-port", str(self.port(ENVOY_PORTS["epp"])), "--egress-port", str(self.port(ENVOY_PORTS["egress"])),
                "--epp-fallbacks", "2"]

    def pool_endpoints(self) -> list[str]:
        """The pool's pods as a gateway lists them (``--envoy``)."""
        return [f"127.0.0.1:{self.port(port)}" for _ws, _pod, port in PODS]

    def envoy_config(self):  # type: ignore[no-untyped-def]
        from kinference_simulators import envoy

        return envoy.EnvoyConfig(
            port=self.port(ENVOY_PORTS["envoy"]), admin_port=self.port(ENVOY_PORTS["envoy-admin"]),
            fallback=True,  # the Endpoint Picker names fallback lists: override_host walks them
            pools=[envoy.Pool(epp=f"127.0.0.1:{self.port(ENVOY_PORTS['epp'])}",
                              endpoints=self.pool_endpoints(),
                              egress=f"127.0.0.1:{self.port(ENVOY_PORTS['egress'])}", fail_open=self.fail_open)])

    def _envoy_proc(self) -> Proc:
        from kinference_simulators import envoy

        cfg = self.envoy_config()
        path = envoy.write(cfg, self.run_dir)
        return Proc("envoy", envoy.argv(path, cfg), ready_url=f"http://127.0.0.1:{cfg.admin_port}/ready")

    def preflight(self, started_by: str = DIRECT, retry: str = "--port-offset {offset}") -> None:
        """Everything that can refuse a start, checked before the run directory
        is touched: the ports, a stack running from the run directory, the
        binaries. ``started_by`` and ``retry`` (with ``{offset}``) word the
        message for how the stack was started (:func:`how_started`)."""
        busy = [p for p in self._ports() if _port_open(p)]
        if busy:
            raise StackError(self._busy_message(busy, started_by, retry))
        running = running_from(self.run_dir)
        if running is not None:
            raise StackError(f"{started_by}: a stack is already running from {self.run_dir}"
                             f"{_pid_words(running)}: stop it first, or use another run directory")
        if find_binary() is None:
            raise StackError(f"{started_by}: nats-server not found; run `make install` first")
        if self.envoy:
            from kinference_simulators import envoy

            try:
                envoy.envoy_binary()
            except envoy.EnvoyError as exc:
                raise StackError(f"{started_by}: {exc}") from None

    def claim(self, started_by: str = DIRECT) -> None:
        """Lock the run directory for this supervisor (until it exits) and
        record its pid and ports there; refused, changing nothing, while
        another supervisor holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StackError(f"{started_by}: a stack is already running from {self.run_dir}"
                             f"{_pid_words(running_from(self.run_dir) or {})}: stop it first, "
                             "or use another run directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "offset": self.offset, "ports": self._ports()}).encode(), 0)
        self.lock_fd = fd

    def release(self) -> None:
        """Let go of :meth:`claim`'s lock (exiting does too, however it exits)."""
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    def _busy_message(self, busy: list[int], started_by: str, retry: str) -> str:
        ports = ", ".join(map(str, busy))
        free = self._free_offset()
        instead = f"try {retry.format(offset=free)}" if free is not None else "try another port offset"
        for run_dir, running in _stacks_near(self.run_dir):
            if set(running.get("ports", [])) & set(busy) or run_dir == self.run_dir:
                return (f"{started_by}: ports already in use: {ports}: a stack is running from {run_dir}"
                        f"{_pid_words(running)}; stop it, or {instead}")
        return f"{started_by}: ports already in use: {ports} (another stack running? {instead})"

    def _free_offset(self) -> int | None:
        """The smallest multiple of 100 (other than this offset) whose ports are
        all free, keeping them below the kernel's ephemeral range (32768)."""
        bases = [p - self.offset for p in self._ports()]
        for offset in range(100, 32_768 - max(bases), 100):
            if offset != self.offset and not any(_port_open(b + offset) for b in bases):
                return offset
        return None

    def prepare(self) -> None:
        """Fresh run directory: manifests (the examples, with ports shifted),
        the collector's endpoint list, the provider's API key."""
        if self.run_dir.exists():
            for entry in self.run_dir.iterdir():
                if entry.name == LOCK:
                    continue  # :meth:`claim`'s lock is on this file
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        (self.run_dir / "logs").mkdir(parents=True)
        manifests = self.run_dir / "manifests"
        manifests.mkdir()
        for f in sorted(EXAMPLES.glob("*.yaml")):
            text = f.read_text()
            if self.offset:
                text = text.replace("127.0.0.1:8300", f"127.0.0.1:{self.port(8300)}")
            (manifests / f.name).write_text(text)
        endpoints = [{"namespace": "default", "workerSet": ws, "pod": pod, "address": f"127.0.0.1:{self.port(port)}",
                      "model": "qwen-2.5", "ready": True} for ws, pod, port in PODS]
        (self.run_dir / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": endpoints}, sort_keys=False))
        secret = self.run_dir / "secrets" / "default" / "databricks-token"
        secret.mkdir(parents=True)
        (secret / "token").write_text(PROVIDER_KEY)

    async def start(self, speed_profile: str, time_scale: float, timeout: float = 60.0) -> None:
        """Start every process, each waited for; on any failure (or cancel),
        stop what was already started before raising."""
        try:
            await self._start(speed_profile, time_scale, timeout)
        except BaseException:
            await self.stop()
            raise

    async def _start(self, speed_profile: str, time_scale: float, timeout: float) -> None:
        busy = [p for p in self._ports() if _port_open(p)]
        if busy:  # amain checked before preparing (preflight); this is for callers of start()
            raise StackError(self._busy_message(busy, *how_started(self)))
        for proc in self.plan(speed_profile, time_scale):
            await self.spawn(proc)
            self.procs.append(proc)
            await self._wait_ready(proc, timeout)
            print(f"  started {proc.name:<22} pid {proc.process.pid}", flush=True)

    def _ports(self) -> list[int]:
        """Every port the stack listens on, each once (the cluster's first NATS
        server is the single server's port: a refusal listed it twice)."""
        return list(dict.fromkeys(self.port(p) for p in (PORTS | (ENVOY_PORTS if self.envoy else {})
                                                          | (NATS_CLUSTER_PORTS if self.nats_cluster else {})).values()))

    # ---------------------------------------------------------- supervision

    def proc(self, name: str) -> Proc:
        for p in self.procs:
            if p.name == name:
                return p
        raise KeyError(name)

    async def spawn(self, proc: Proc) -> None:
        """Start ``proc`` (again), its output appended to its log; on Linux it
        gets SIGTERM when the supervisor dies (:data:`_PDEATHSIG`)."""
        proc.log = self.run_dir / "logs" / f"{proc.name}.log"
        argv = proc.argv
        if sys.platform.startswith("linux"):
            argv = [sys.executable, "-I", "-S", "-c", _PDEATHSIG, str(os.getpid()), *argv]
        out = open(proc.log, "ab")  # noqa: SIM115 - handed to the child
        try:
            proc.process = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL, cwd=str(REPO),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                # Ctrl-C (and the hangup of a closed terminal) reaches the
                # terminal's whole process group: the children stay out of
                # it, so the stack stops them in order (services first,
                # nats-server last) instead of all at once
                start_new_session=True,
            )
        finally:
            out.close()
        proc.started_at = time.monotonic()

    async def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a process and wait for it to exit (the supervisor
        restarts it unless it is held)."""
        p = self.proc(name).process
        if p is not None and p.returncode is None:
            p.send_signal(sig)
            await p.wait()

    async def supervise(self, stop: asyncio.Event, *, initial: float = 0.5, longest: float = 30.0,
                        stable: float = 30.0, say=print) -> None:  # type: ignore[no-untyped-def]
        """Until ``stop``: restart each process that exited, with backoff."""
        due: dict[str, float] = {}
        while not stop.is_set():
            now = time.monotonic()
            for proc in self.procs:
                p = proc.process
                if p is None or p.returncode is None or proc.held:
                    continue
                if proc.name not in due:
                    up = now - proc.started_at
                    proc.backoff = initial if up >= stable or proc.backoff == 0 else min(proc.backoff * 2, longest)
                    due[proc.name] = now + proc.backoff
                    say(f"{proc.name} exited (code {p.returncode}) after {up:.1f}s; restarting in "
                        f"{proc.backoff:.1f}s. Last lines of {proc.log}:\n{log_tail(proc.log, 5)}", flush=True)
                elif now >= due[proc.name]:
                    del due[proc.name]
                    await self.spawn(proc)
                    proc.restarts += 1
                    assert proc.process is not None
                    say(f"  restarted {proc.name:<20} pid {proc.process.pid} (restart #{proc.restarts})", flush=True)
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except TimeoutError:
                pass

    async def _wait_ready(self, proc: Proc, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.process is not None
            if proc.process.returncode is not None:
                raise StackError(f"make run: {proc.name} exited with code {proc.process.returncode}; "
                                 f"see {proc.log}:\n{log_tail(proc.log)}")
            if proc.ready_port is not None and _port_open(proc.ready_port):
                return
            if proc.ready_url is not None and await asyncio.to_thread(_http_ok, proc.ready_url):
                return
            await asyncio.sleep(0.1)
        raise StackError(f"make run: {proc.name} was not ready within {timeout:.0f}s; see {proc.log}:\n"
                         f"{log_tail(proc.log)}")

    async def stop(self, grace: float = 5.0) -> None:
        for proc in reversed(self.procs):
            p = proc.process
            if p is not None and p.returncode is None:
                p.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(p.wait(), grace)
                except TimeoutError:
                    p.kill()
                    await p.wait()
        self.procs.clear()

    def exited(self) -> Proc | None:
        return next((p for p in self.procs if p.process is not None and p.process.returncode is not None), None)


def running_from(run_dir: Path) -> dict[str, object] | None:
    """What the supervisor running from ``run_dir`` recorded (pid, offset,
    ports), or None when none holds its lock. Reads only."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                recorded = json.loads(os.pread(fd, 65_536, 0) or b"{}")
            except ValueError:  # locked, not yet written
                recorded = {}
            return recorded if isinstance(recorded, dict) else {}
        return None
    finally:
        os.close(fd)


def _stacks_near(run_dir: Path) -> list[tuple[Path, dict[str, object]]]:
    """The running stacks of ``run_dir`` and of the default run directories
    (``.run``, ``.run-<offset>``) next to it and in the repository."""
    dirs = [run_dir]
    for parent in dict.fromkeys((run_dir.parent, REPO)):
        try:
            dirs += sorted(d for d in parent.glob(".run*")
                           if d.is_dir() and (d.name == ".run" or d.name.startswith(".run-")))
        except OSError:
            continue
    found = []
    for d in dict.fromkeys(dirs):
        running = running_from(d)
        if running is not None:
            found.append((d, running))
    return found


def _pid_words(running: dict[str, object]) -> str:
    return f" (pid {running['pid']})" if isinstance(running.get("pid"), int) else ""


def how_started(stack: Stack, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """Who started the stack, for messages: its name and how to start it on
    another offset (``{offset}``). make (which sets MAKELEVEL for its
    recipes) takes no --port-offset: the Makefile runs this script, which
    reads KINFERENCE_PORT_OFFSET."""
    environ = os.environ if environ is None else environ
    if environ.get("MAKELEVEL"):
        target = "run-ha" if stack.nats_cluster else "run-envoy" if stack.envoy else "run"
        return f"make {target}", f"KINFERENCE_PORT_OFFSET={{offset}} make {target}"
    return DIRECT, "--port-offset {offset}"


def _say(*args: object, **kwargs: object) -> None:
    """print, but a closed terminal (EIO) or a closed pipe does not stop the
    stack from stopping."""
    try:
        print(*args, **kwargs)  # type: ignore[call-overload]
    except OSError:
        pass


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - localhost only
            return r.status == 200
    except Exception:
        return False


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def smoke_request(port: int) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps({"model": "qwen-2.5", "max_tokens": 16,
                         "messages": [{"role": "user", "content": "Say hello to Kinference."}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - localhost only
        return {"status": r.status, "backend": r.headers.get("x-kinference-backend"),
                "rule": r.headers.get("x-kinference-rule"), "body": json.loads(r.read())}


def manifest_errors_note(stack: Stack) -> str:
    """A warning for the banner when the manifests the stack started with
    have errors (what they break is not in force: a policy with a typo leaves
    its pool on the default policy, which never bursts), naming the first
    few; empty when there are none."""
    try:
        errors = (yaml.safe_load((stack.run_dir / "status" / "errors.yaml").read_text()) or {}).get("errors") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return ""
    if not errors:
        return ""
    # written as lint writes them (the file's name alone: they all lie in the manifests directory)
    lines = []
    for e in errors[:3]:
        path, line = e.get("path") or "", e.get("line")
        ref = DocumentRef(Path(str(e.get("source", ""))).name, e.get("document") or 0,
                          e.get("kind"), e.get("namespace"), e.get("name"),
                          {path: line} if path and isinstance(line, int) else None)
        lines.append(f"    {ManifestError(ref, path, str(e.get('message')))}")
    more = f"    ... and {len(errors) - 3} more\n" if len(errors) > 3 else ""
    n = len(errors)
    return (f"WARNING: the manifests have {n} error{'s' if n > 1 else ''}; what they break is not in force:\n"
            + "\n".join(lines) + "\n" + more
            + f"  (all of them: {stack.run_dir / 'status' / 'errors.yaml'}, or "
              f".venv/bin/kinfctl lint {stack.run_dir / 'manifests'})\n\n")


def banner(stack: Stack) -> str:
    port, admin = stack.port(8080), stack.port(8081)
    gateway = ""
    if stack.envoy:
        gateway = (f"  Envoy (gateway path)  http://127.0.0.1:{stack.port(ENVOY_PORTS['envoy'])}/v1        through the "
                   f"Endpoint Picker on 127.0.0.1:{stack.port(ENVOY_PORTS['epp'])} "
                   f"(Fail{'Open' if stack.fail_open else 'Close'}), egress :{stack.port(ENVOY_PORTS['egress'])}\n"
                   f"  Envoy admin           http://127.0.0.1:{stack.port(ENVOY_PORTS['envoy-admin'])}/stats\n")
        port = stack.port(ENVOY_PORTS["envoy"])
    cluster = ""
    if stack.nats_cluster:
        cluster = ("NATS is a cluster of three (nats-0..2 above, buckets at three replicas): kill -9 the pid\n"
                   "of any one, requests keep being served; the stack starts it again and it catches up.\n"
                   "Two collector replicas share the pods (telemetry-collector and telemetry-collector-1, /metrics\n"
                   f"on :{stack.port(PORTS['collector'])} and :{stack.port(NATS_CLUSTER_PORTS['collector-1'])}): "
                   "kill -9 or kill -STOP either, the other takes its share within\n"
                   "a scrape interval or two (kinference_endpoints counts what each holds).\n\n")
    return f"""
Kinference is running.

{gateway}  Router (OpenAI API)   http://127.0.0.1:{stack.port(8080)}/v1        pool default/inference-all, auth off (tenant anonymous)
  Admin (explain)       http://127.0.0.1:{admin}/debug/explain
  Manifests (watched)   {stack.run_dir / 'manifests'}/
                        the policy-compiler's input: edit these to change the running stack; copied
                        from deploy/examples at each start (an edit there needs a restart)
  Statuses              {stack.run_dir / 'status'}
  Logs                  {stack.run_dir / 'logs'}/

Try:
  curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{{"model": "qwen-2.5", "messages": [{{"role": "user", "content": "Hello!"}}]}}' -i

Watch decisions:
  .venv/bin/kinfctl events --nats-url {stack.nats_url} \\
       --nats-user observer --nats-password-file {stack.run_dir / 'nats-auth' / 'observer'}
  (NATS requires a user per service; passwords in {stack.run_dir / 'nats-auth'}/)

{cluster}{manifest_errors_note(stack)}Press Ctrl-C to stop everything.
"""


async def amain(args: argparse.Namespace) -> int:
    stack = Stack(Path(args.run_dir).resolve(), args.port_offset, envoy=args.envoy, fail_open=args.fail_open,
                  nats_cluster=args.nats_cluster)
    started_by, retry = how_started(stack)
    try:
        # a start that is refused changes nothing: the run directory may be a running stack's
        stack.preflight(started_by, retry)
        stack.claim(started_by)
    except StackError as exc:
        _say(exc, file=sys.stderr, flush=True)
        return 1
    try:
        return await _run(stack, args)
    finally:
        stack.release()


async def _run(stack: Stack, args: argparse.Namespace) -> int:
    stack.prepare()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP: the terminal was closed (its children are in sessions of their own, out of its reach);
    # unless it was started to outlive its terminal (nohup: SIGHUP ignored), which it keeps doing
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    _say("Starting Kinference locally (simulated GPUs)...", flush=True)
    try:
        starting = await unless_stopped(stack.start(args.speed_profile, args.time_scale), stop)
        if starting is None:
            return 130
        starting.result()
        if args.smoke:
            result = await asyncio.to_thread(smoke_request, stack.port(ENVOY_PORTS["envoy"] if args.envoy else 8080))
            _say(json.dumps(result, indent=2), flush=True)
            return 0 if result["status"] == 200 else 1
        _say(banner(stack), flush=True)
        await stack.supervise(stop, say=_say)
        return 0
    except StackError as exc:
        _say(exc, file=sys.stderr)
        return 1
    finally:
        _say("Stopping...", flush=True)
        await stack.stop()
        _say("Stopped.", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=DIRECT,
                                description=__doc__.split("\n\n")[0] if __doc__ else None,
                                epilog="make run runs this; give it an offset as KINFERENCE_PORT_OFFSET=N make run.")
    p.add_argument("--run-dir", default=None,
                   help="state, logs and statuses (default .run, or .run-<offset> with a port offset)")
    p.add_argument("--port-offset", type=int, default=int(os.environ.get("KINFERENCE_PORT_OFFSET", "0")),
                   help="add this to every port (env KINFERENCE_PORT_OFFSET)")
    p.add_argument("--speed-profile", default="h100", help="GPU speed profile of the engine simulators")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per real second")
    p.add_argument("--smoke", action="store_true", help="start, send one request, stop")
    p.add_argument("--envoy", action="store_true",
                   help="also the router's Endpoint Picker and egress, behind a real Envoy (make run-envoy)")
    p.add_argument("--fail-open", action="store_true",
                   help="with --envoy: Envoy serves from any pod while the Endpoint Picker is down (FailOpen)")
    p.add_argument("--nats-cluster", action="store_true",
                   help="NATS as a cluster of three servers, KV buckets at three replicas (make run-ha)")
    args = p.parse_args(argv)
    if args.run_dir is None:
        args.run_dir = str(REPO / (f".run-{args.port_offset}" if args.port_offset else ".run"))
    return asyncio.run(amain(args))


if __name__ == "__main__":
    raise SystemExit(main())
