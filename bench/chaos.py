"""The chaos suite (``make chaos``): the whole stack as separate processes
(the same supervisor as ``make run``), a bounded open-loop load through the
router, and one fault at a time.

Load: requests sent at a fixed rate whatever the answers (open loop), each
with a unique marker: clean prompts, prompts with PII in the message (a card
number and an email holding the marker), and "side" requests whose message
is clean but whose ``user`` field, ``metadata``, a tool's description and
the ``X-User-Email`` / ``Cookie`` headers carry marked PII. About a third
are streamed. Every request has a client deadline; one that reaches it
counts as hung.

Faults, one at a time, each preceded and followed by load: kill -9 and
restart of the classifier, NATS (keeping its storage, and with its storage
wiped), the collector, the compiler (and the compiler with a broken
manifest file), one vLLM pod while streams are under way, every pod; a
provider answering 500 to everything and one that never answers. Then the
same stack with NATS as a cluster of three and two collector replicas
(:func:`ha_faults`): the config bucket's leader kill -9'd, then it and one
more (no quorum), measured with :class:`ClusterProbe` (decision events, KV
writes, catch-up, what the router said); then one collector replica kill
-9'd, and one stopped (SIGSTOP, its connection open).

For each fault: requests, success rate (200 and a complete body), p50/p99
latency, where requests went (``x-kinference-backend``, or the error status),
recovery time (from the end of the fault, the process running again, until
the end of the last one-second window in which more than 20% of the steady
requests failed; 0 when that was before the fault ended, null when the phase
ended that way; the load's bursts are left out),
and the marked PII found in what the provider simulator received
(body and headers): ``pii_leaked`` counts every marked request found,
``pii_leaked_message`` those whose PII was in the message itself,
``pii_leaked_side`` those with PII only outside the messages.

``python -m bench.chaos`` prints a table and writes ``bench/results/chaos.json``;
``--short`` is the few-seconds-per-fault version the test suite runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from kinference_simulators.stack import NATS_CLUSTER_PORTS, PORTS, Stack, log_tail

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "chaos.json"
BROKEN_POOL = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {name: inference-all\n"


@dataclass(frozen=True)
class Config:
    rate: float = 12.0  # requests per second
    pre: float = 3.0  # load before the fault, seconds
    down: float = 3.0  # how long a killed process stays down
    post: float = 10.0  # load after the fault ended
    client_timeout: float = 20.0
    provider_first_token: str = "3s"  # the provider's firstToken timeout in the chaos stack
    speed_profile: str = "a10g"
    max_tokens: int = 48
    #: the pods' max_num_seqs: small, so that this load saturates them and clean requests burst
    max_num_seqs: int = 4
    #: on top of the steady rate, this many clean requests at once every
    #: ``burst_every`` seconds: the pods saturate and clean prompts burst to the provider
    burst: int = 16
    burst_every: float = 2.0
    seed: int = 1


FULL = Config()
SHORT = Config(rate=14.0, pre=0.6, down=0.8, post=3.0, client_timeout=10.0, max_tokens=32, burst=14,
               burst_every=1.4)


@dataclass
class Shot:
    marker: str
    kind: str  # clean | pii | side
    stream: bool
    burst: bool = False  # sent in a burst (load shaping), not at the steady rate
    sent: float = 0.0
    latency: float = 0.0
    status: int = 0  # 0: no HTTP answer (connection error or client timeout)
    ok: bool = False
    backend: str = ""
    error: str = ""
    decision_id: str = ""


@dataclass
class Result:
    fault: str
    requests: int
    success_rate: float
    p50_ms: float
    p99_ms: float
    to_provider: int
    recovery_s: float | None
    pii_leaked: int
    pii_leaked_message: int = 0
    pii_leaked_side: int = 0
    fault_s: float = 0.0  # how long the fault lasted (down, restarted and ready again)
    hung: int = 0
    no_http_answer: int = 0
    went: dict[str, int] = field(default_factory=dict)
    #: failures by kind of request (clean, pii, side)
    failed: dict[str, int] = field(default_factory=dict)
    # ---- NATS as a cluster of three (make chaos runs these faults on a second stack)
    #: answered requests whose decision event no observer received (three observers, one per server)
    decisions_lost: int | None = None
    #: decisions of the phase with no record on the KINFERENCE_RECORDS stream (read once every
    #: server is back: records held through an outage are sent again then)
    records_lost: int | None = None
    #: KV writes (a probe key, every 100 ms): acknowledged ones missing afterwards, the longest time
    #: without a successful write, and the writes that failed
    kv_acked_lost: int | None = None
    kv_longest_unwritable_s: float | None = None
    kv_writes_failed: int | None = None
    #: from the killed servers' restart until every replica of the buckets is current again
    catchup_s: float | None = None
    #: "config_store_unavailable" lines the router logged in the phase (kill two: once)
    router_said_unavailable: int | None = None


# ------------------------------------------------------------------ the load


def request_for(i: int, marker: str, rng: random.Random, max_tokens: int) -> tuple[Shot, dict, dict]:
    kind = "pii" if i % 10 in (1, 5) else "side" if i % 10 == 7 else "clean"
    stream = i % 3 == 0
    headers = {"Content-Type": "application/json"}
    topic = rng.choice(["tea", "rivers", "bridges", "maps", "clocks", "bees"])
    if kind == "pii":
        content = (f"My card is 4111 1111 1111 1111 and my email is jane.{marker}@example.com, "
                   f"please summarise my account.")
    elif kind == "side":
        content = f"Write two sentences about {topic}."  # clean; the PII is elsewhere
    else:
        content = f"Write two sentences about {topic}. Ref {marker}."
    body: dict = {"model": "qwen-2.5", "max_tokens": max_tokens, "stream": stream,
                  "messages": [{"role": "user", "content": content}]}
    if kind == "side":
        body["user"] = f"pat.{marker}@example.com"
        body["metadata"] = {"note": f"card 4111 1111 1111 1111 of {marker}"}
        body["tools"] = [{"type": "function", "function": {
            "name": "lookup", "description": f"Look up the account of pat.{marker}@example.com",
            "parameters": {"type": "object", "properties": {}}}}]
        headers["X-User-Email"] = f"pat.{marker}@example.com"
        headers["Cookie"] = f"session={marker}"
    return Shot(marker, kind, stream), body, headers


async def fire(http: aiohttp.ClientSession, url: str, shot: Shot, body: dict, headers: dict,
               timeout: float) -> None:
    shot.sent = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            async with http.post(url, json=body, headers=headers) as r:
                shot.status = r.status
                shot.backend = r.headers.get("x-kinference-backend", "")
                shot.decision_id = r.headers.get("x-kinference-decision-id", "")
                data = await r.read()
                if r.status == 200:
                    shot.ok = b"[DONE]" in data if shot.stream else b'"choices"' in data
                    if not shot.ok:
                        shot.error = "incomplete body"
                else:
                    try:
                        shot.error = json.loads(data)["error"]["code"] or ""
                    except Exception:
                        shot.error = "no error envelope"
    except TimeoutError:
        shot.status, shot.error = 0, "client timeout"
    except aiohttp.ClientError as exc:
        if shot.status == 200:
            shot.error = f"stream cut: {type(exc).__name__}"
        else:
            shot.status, shot.error = 0, type(exc).__name__
    shot.latency = time.monotonic() - shot.sent


async def load(http: aiohttp.ClientSession, url: str, cfg: Config, phase: int, stop: asyncio.Event,
               shots: list[Shot], spike: list[int] | None = None) -> None:
    """Open loop: one request every 1/rate seconds, plus a burst of clean ones
    every ``burst_every`` seconds, until ``stop``; then wait for them all
    (each is bounded by the client's deadline)."""
    rng = random.Random(cfg.seed * 1000 + phase)
    tasks: list[asyncio.Task[None]] = []

    def send(kind_index: int, burst: bool = False) -> None:
        marker = f"mk{phase:02d}q{len(shots):05d}z"
        shot, body, headers = request_for(kind_index, marker, rng, cfg.max_tokens)
        shot.burst = burst
        shots.append(shot)
        tasks.append(asyncio.create_task(fire(http, url, shot, body, headers, cfg.client_timeout)))

    try:
        await _paced(cfg, stop, send, spike)
    finally:
        if not stop.is_set():  # cancelled: the requests under way too
            for t in tasks:
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _paced(cfg: Config, stop: asyncio.Event, send: Callable[..., None], spike: list[int] | None) -> None:
    start = time.monotonic()
    next_burst = start + cfg.burst_every / 2
    steady = 0
    while not stop.is_set():
        send(steady)
        steady += 1
        extra = 0
        if cfg.burst and time.monotonic() >= next_burst:
            next_burst += cfg.burst_every
            extra += cfg.burst
        if spike and spike[0]:  # asked for by a fault
            extra, spike[0] = extra + spike[0], 0
        for _ in range(extra):
            send(9, burst=True)  # a clean, non-streamed prompt
        delay = start + steady / cfg.rate - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass


# ------------------------------------------------------------------ the faults

Fault = Callable[["Chaos"], Awaitable[None]]


class Chaos:
    """The stack under test and what the faults do to it."""

    def __init__(self, stack: Stack, cfg: Config, say: Callable[[str], None] = print) -> None:
        self.stack, self.cfg = stack, cfg
        #: progress of each step, with the time since the run started
        self.say = say
        #: files to write back after the phase
        self.mend: list[tuple[Path, str]] = []
        #: clean requests a fault asks the load to send at once
        self.spike = [0]
        #: NATS as a cluster: the observers and the KV writer (:class:`ClusterProbe`)
        self.probe: ClusterProbe | None = None
        self.catchup_s: float | None = None

    def url(self, base: int, path: str) -> str:
        return f"http://127.0.0.1:{self.stack.port(base)}{path}"

    async def down_and_up(self, names: list[str], *, wipe_nats: bool = False,
                          before_restart: Callable[[], None] | None = None) -> None:
        """kill -9, stay down ``cfg.down`` seconds, start again (waited for)."""
        procs = [self.stack.proc(n) for n in names]
        for p in procs:
            p.held = True
        try:
            await asyncio.gather(*(self.stack.kill(n, signal.SIGKILL) for n in names))
            if wipe_nats:
                shutil.rmtree(self.stack.nats_dir, ignore_errors=True)
            if before_restart is not None:
                before_restart()
            await asyncio.sleep(self.cfg.down)
            for p in procs:
                await self.stack.spawn(p)
                p.restarts += 1
            await asyncio.gather(*(self.stack._wait_ready(p, 60) for p in procs))
        finally:
            for p in procs:
                p.held = False

    async def stopped(self, name: str) -> None:
        """SIGSTOP for ``cfg.down`` seconds, then SIGCONT: the process keeps its
        sockets (its NATS connection stays open) but does nothing."""
        p = self.stack.proc(name)
        p.held = True
        try:
            assert p.process is not None
            p.process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(self.cfg.down)
            finally:
                p.process.send_signal(signal.SIGCONT)
        finally:
            p.held = False

    async def provider_faults(self, **rates: float) -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(self.url(PORTS["provider"], "/sim/faults"), json=rates) as r:
                r.raise_for_status()

    async def provider_for_a_while(self, **rates: float) -> None:
        await self.provider_faults(**rates)
        self.spike[0] += 2 * self.cfg.burst  # saturate the pods now: clean prompts burst into the fault
        try:
            await asyncio.sleep(max(self.cfg.down, self.cfg.burst_every))
        finally:
            await self.provider_faults()

    @property
    def pool_file(self) -> Path:
        return self.stack.run_dir / "manifests" / "20-pool.yaml"

    async def compiler_with_broken_file(self) -> None:
        """Break the pool's file, then kill -9 and restart the compiler: it
        starts while the file is broken. The file is mended after the phase."""
        self.mend.append((self.pool_file, self.pool_file.read_text()))
        self.pool_file.write_text(BROKEN_POOL)
        await asyncio.sleep(0.3)  # the running compiler sees it and keeps the last good version
        await self.down_and_up(["policy-compiler"])

    async def kill_nats(self, n: int) -> None:
        """kill -9 ``n`` servers of the cluster, the config bucket's leader
        first; held down ``cfg.down`` seconds, started again; then wait until
        every bucket's replicas are current (:attr:`catchup_s`)."""
        from kinference_common import subjects

        assert self.probe is not None
        leader = await self.probe.leader(f"KV_{subjects.CONFIG_BUCKET}")
        names = self.stack.nats_names
        order = ([leader] if leader in names else []) + [x for x in names if x != leader]
        victims = order[:n]
        procs = [self.stack.proc(v) for v in victims]
        for p in procs:
            p.held = True
        try:
            await asyncio.gather(*(self.stack.kill(v, signal.SIGKILL) for v in victims))
            self.say(f"    killed {', '.join(victims)} (config bucket leader: {leader or 'none'})")
            await asyncio.sleep(self.cfg.down)
            restarted = time.monotonic()
            for p in procs:
                await self.stack.spawn(p)
                p.restarts += 1
            for p in procs:
                await self.stack._wait_ready(p, 60)
            self.say(f"    {', '.join(victims)} listening again after {time.monotonic() - restarted:.1f}s")
            if await self.probe.caught_up(60):
                self.catchup_s = round(time.monotonic() - restarted, 2)
                self.say(f"    every bucket's replicas current after {self.catchup_s:.1f}s")
            else:
                self.say(f"    buckets not current 60s after the restart: {await self.probe.replicas()}")
        finally:
            for p in procs:
                p.held = False

    async def healthy(self, timeout: float = 60.0) -> None:
        """Every process ready, and the router deciding on fresh endpoint telemetry."""
        deadline = time.monotonic() + timeout
        for p in self.stack.procs:
            await self.stack._wait_ready(p, max(1.0, deadline - time.monotonic()))
        probe = {"model": "qwen-2.5", "messages": [{"role": "user", "content": "x"}], "tags": ["pii-none"]}
        last = "no answer"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while time.monotonic() < deadline:
                try:
                    async with http.post(self.url(PORTS["admin"], "/debug/explain"), json=probe) as r:
                        trace = await r.json()
                    outcome = trace.get("outcome", {})
                    if outcome.get("type") == "Routed" and str(outcome.get("backend", "")).startswith("Local/"):
                        return
                    last = json.dumps(outcome)[:300]
                except Exception as exc:
                    last = f"{type(exc).__name__}: {exc}"[:300]
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the stack did not become healthy again within {timeout:g}s; "
                           f"the router's last explain: {last}")


def ha_faults() -> list[tuple[str, Fault]]:
    """The faults of the stack on NATS as a cluster of three
    (``Stack(nats_cluster=True)``, two collector replicas): the config
    bucket's leader killed (the worst one to lose), then that server and one
    more (no quorum until they are back); then one collector replica killed,
    and one stopped with SIGSTOP (its NATS connection stays open, as when its
    node is lost): the other takes its pods."""
    return [
        ("nats 1 of 3 kill -9 (leader)", lambda c: c.kill_nats(1)),
        ("nats 2 of 3 kill -9", lambda c: c.kill_nats(2)),
        ("collector 1 of 2 kill -9", lambda c: c.down_and_up(["telemetry-collector-1"])),
        ("collector 1 of 2 stopped (SIGSTOP)", lambda c: c.stopped("telemetry-collector-1")),
    ]


def faults() -> list[tuple[str, Fault]]:
    pods = [n for n in ("vllm-qwen-0", "vllm-qwen-1", "vllm-qwen-spot-0")]

    async def none(c: Chaos) -> None:
        await asyncio.sleep(c.cfg.down)

    return [
        ("none", none),
        ("classifier kill -9", lambda c: c.down_and_up(["classifier"])),
        ("nats kill -9", lambda c: c.down_and_up(["nats-server"])),
        ("nats kill -9, storage wiped", lambda c: c.down_and_up(["nats-server"], wipe_nats=True)),
        ("collector kill -9", lambda c: c.down_and_up(["telemetry-collector"])),
        ("compiler kill -9", lambda c: c.down_and_up(["policy-compiler"])),
        ("compiler kill -9, file broken", lambda c: c.compiler_with_broken_file()),
        ("one pod kill -9 mid-stream", lambda c: c.down_and_up(["vllm-qwen-0"])),
        ("all pods kill -9", lambda c: c.down_and_up(pods)),
        ("provider failing (500)", lambda c: c.provider_for_a_while(rate5xx=1.0)),
        ("provider hanging", lambda c: c.provider_for_a_while(timeoutRate=1.0)),
    ]


# ------------------------------------------------------------------ measuring


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def recovery(shots: list[Shot], fault_at: float, fault_end: float, window: float = 1.0,
             tolerance: float = 0.2) -> float | None:
    """Seconds from the end of the fault (the process running again, the
    provider healed) until the end of the last one-second window (by sending
    time, from the fault on) in which more than ``tolerance`` of the steady
    requests failed: 0 when that window ended before the fault did (or none
    was that bad); None when the phase's last window was still that bad.
    Burst requests are left out: they saturate the pods on purpose, and what
    they lose is load, not the fault; the tolerance lets an odd request shed
    by the load pass, as it does before any fault."""
    steady = [s for s in shots if not s.burst and s.sent >= fault_at]
    if not steady:
        return 0.0
    buckets: dict[int, list[Shot]] = {}
    for s in steady:
        buckets.setdefault(int((s.sent - fault_at) // window), []).append(s)
    bad = [i for i, b in buckets.items() if sum(not s.ok for s in b) > tolerance * len(b)]
    if not bad:
        return 0.0
    if max(bad) == max(buckets):
        return None
    return round(max(0.0, fault_at + (max(bad) + 1) * window - fault_end), 2)


def leaked(shots: list[Shot], provider_text: str) -> tuple[int, int]:
    """(marked requests with PII in the message, marked side requests) found
    in what the provider received."""
    message = sum(1 for s in shots if s.kind == "pii" and s.marker in provider_text)
    side = sum(1 for s in shots if s.kind == "side" and s.marker in provider_text)
    return message, side


def summarise(name: str, shots: list[Shot], fault_at: float, fault_end: float, provider_text: str) -> Result:
    ok = [s for s in shots if s.ok]
    latencies = [s.latency * 1000 for s in shots]
    went = Counter(s.backend if s.ok else (f"error {s.status} {s.error}".strip()) for s in shots)
    message, side = leaked(shots, provider_text)
    return Result(
        fault=name, requests=len(shots), success_rate=round(len(ok) / len(shots), 4) if shots else 0.0,
        p50_ms=round(percentile(latencies, 0.5), 1), p99_ms=round(percentile(latencies, 0.99), 1),
        to_provider=sum(1 for s in shots if s.ok and s.backend.startswith("Provider/")),
        recovery_s=recovery(shots, fault_at, fault_end), fault_s=round(fault_end - fault_at, 2),
        pii_leaked=message + side, pii_leaked_message=message,
        pii_leaked_side=side, hung=sum(1 for s in shots if s.error == "client timeout"),
        no_http_answer=sum(1 for s in shots if s.status == 0), went=dict(sorted(went.items())),
        failed=dict(sorted(Counter(s.kind for s in shots if not s.ok).items())),
    )


class ProviderLog:
    """What the provider simulator received, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new_text(self) -> str:
        if not self.path.exists():
            return ""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        return data.decode("utf-8", "replace")


class ClusterProbe:
    """What a cluster fault is measured with: three observers (user
    ``observer``), one first connected to each server, collecting decision
    ids (an event any of them saw was delivered); a KV writer (the
    compiler's user) putting a counter to ``_chaos.probe`` in the config
    bucket every 100 ms; bucket leaders and replicas from each owner."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.seen: set[str] = set()
        self.acked = 0
        self.failed = 0
        self.last_ok = 0.0
        self.longest = 0.0
        self._ncs: list[object] = []
        self._writer: asyncio.Task[None] | None = None

    def _auth(self, user: str) -> dict[str, object]:
        from kinference_common import natsauth

        password = (self.stack.run_dir / "nats-auth" / user).read_text().strip()
        return {"user": user, "password": password, "inbox_prefix": natsauth.inbox_prefix(user)}

    async def start(self) -> None:
        from kinference_common import bus

        urls = bus.servers(self.stack.nats_url)
        for i in range(len(urls)):
            nc = await bus.connect(urls[i:] + urls[:i], name=f"chaos-observer-{i}", dont_randomize=True,
                                   **self._auth("observer"))

            async def on(msg: object) -> None:
                try:
                    self.seen.add(json.loads(msg.data)["decision_id"])  # type: ignore[attr-defined]
                except Exception:
                    pass

            await nc.subscribe("kinference.decisions.>", cb=on)
            self._ncs.append(nc)
        self.compiler = await bus.connect(urls, name="chaos-kv-writer", **self._auth("policy-compiler"))
        self.collector = await bus.connect(urls, name="chaos-replicas", **self._auth("telemetry-collector"))
        self._ncs += [self.compiler, self.collector]
        self._writer = asyncio.create_task(self._write())

    async def recorded_ids(self, timeout: float = 60.0) -> set[str]:
        """The decision ids the KINFERENCE_RECORDS stream holds (what
        ``kinfctl audit`` and ``replay`` read), once the routers have sent
        what they held: read until two reads a few seconds apart agree."""
        from kinference_common import recording

        js = self._ncs[0].jetstream(timeout=5.0)  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        last: set[str] | None = None
        while True:
            got: set[str] = set()
            try:
                total = (await js.stream_info(recording.STREAM)).state.messages
                sub = await js.subscribe(f"{recording.PREFIX}.>", stream=recording.STREAM, ordered_consumer=True)
                try:
                    for _ in range(total):
                        rec = recording.decode((await sub.next_msg(timeout=5)).data)
                        if isinstance(rec, recording.DecisionRecord):
                            got.add(rec.decision_id)
                finally:
                    await sub.unsubscribe()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
                continue
            if got == last or time.monotonic() > deadline:
                return got
            last = got
            await asyncio.sleep(3.0)

    async def _write(self) -> None:
        from kinference_common import subjects

        js = self.compiler.jetstream(timeout=1.0)  # type: ignore[attr-defined]
        n = 0
        self.last_ok = time.monotonic()
        while True:
            try:
                kv = await js.key_value(subjects.CONFIG_BUCKET)
                await kv.put("_chaos.probe", str(n + 1).encode())
                n += 1
                self.acked = n
                now = time.monotonic()
                self.longest = max(self.longest, now - self.last_ok)
                self.last_ok = now
            except Exception:
                self.failed += 1
            await asyncio.sleep(0.1)

    def phase(self) -> None:
        """Measure the next phase from here."""
        self.failed, self.longest, self.last_ok = 0, 0.0, time.monotonic()

    async def acked_lost(self) -> int:
        """Acknowledged writes the bucket does not hold (0: its value is the last acknowledged one or later)."""
        from kinference_common import subjects

        acked = self.acked
        for _ in range(50):
            try:
                kv = await self.compiler.jetstream(timeout=1.0).key_value(subjects.CONFIG_BUCKET)  # type: ignore[attr-defined]
                return max(0, acked - int((await kv.get("_chaos.probe")).value))
            except Exception:
                await asyncio.sleep(0.2)
        return acked

    async def leader(self, stream: str) -> str | None:
        try:
            info = await self.compiler.jetstream(timeout=2.0).stream_info(stream)  # type: ignore[attr-defined]
            return info.cluster.leader if info.cluster is not None else None
        except Exception:
            return None

    async def caught_up(self, timeout: float) -> bool:
        """Whether both buckets have a leader and every follower current within ``timeout``."""
        from kinference_common import bus, subjects

        done = await asyncio.gather(
            bus.wait_current(self.compiler.jetstream(timeout=1.0), f"KV_{subjects.CONFIG_BUCKET}", timeout),  # type: ignore[attr-defined]
            bus.wait_current(self.collector.jetstream(timeout=1.0), f"KV_{subjects.TELEMETRY_BUCKET}", timeout))  # type: ignore[attr-defined]
        return all(done)

    async def replicas(self) -> str:
        """Each bucket's leader and replicas as the servers say (for a message)."""
        from kinference_common import subjects

        out = []
        for nc, stream in ((self.compiler, f"KV_{subjects.CONFIG_BUCKET}"),
                           (self.collector, f"KV_{subjects.TELEMETRY_BUCKET}")):
            try:
                c = (await nc.jetstream(timeout=2.0).stream_info(stream)).cluster  # type: ignore[attr-defined]
                if c is None:
                    out.append(f"{stream}: no cluster")
                    continue
                reps = ", ".join(f"{r.name} current={r.current} lag={r.lag}" for r in (c.replicas or []))
                out.append(f"{stream}: leader {c.leader}, {reps}")
            except Exception as exc:
                out.append(f"{stream}: {type(exc).__name__} {exc}")
        return "; ".join(out)

    async def stop(self) -> None:
        from kinference_common import bus

        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        for nc in self._ncs:
            await bus.close(nc)  # type: ignore[arg-type]


def said(log: Path | None, event: str, since: int) -> int:
    """Lines naming ``event`` in ``log`` past byte ``since``."""
    if log is None or not log.exists():
        return 0
    with open(log, "rb") as f:
        f.seek(since)
        return f.read().decode("utf-8", "replace").count(f'"{event}"')


# ------------------------------------------------------------------ running


def free_offset(rng: random.Random | None = None, tries: int = 50) -> int:
    """A multiple of 100 whose every stack port is free, below the kernel's
    ephemeral range (so an outgoing connection cannot hold one of them)."""
    rng = rng or random.Random()
    ports = [*PORTS.values(), *NATS_CLUSTER_PORTS.values()]
    top = max(ports)
    for _ in range(tries):
        offset = rng.randrange(100, 32_000 - top, 100)
        if all(_free(base + offset) for base in ports):
            return offset
    raise RuntimeError("no free port offset found")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def run_chaos(cfg: Config, run_dir: Path, offset: int, *, only: list[str] | None = None,
                    say: Callable[[str], None] = print, nats_cluster: bool = False) -> list[Result]:
    """Every fault of :func:`faults` on a stack with one NATS server, or with
    ``nats_cluster`` those of :func:`ha_faults` on NATS as a cluster of three."""
    stack = Stack(run_dir, offset, vllm_args=["--max-num-seqs", str(cfg.max_num_seqs)], nats_cluster=nats_cluster)
    stack.prepare()
    for f in (run_dir / "manifests").glob("*.yaml"):  # a hanging provider is seen within a phase
        f.write_text(f.read_text().replace("firstToken: 30s", f"firstToken: {cfg.provider_first_token}"))
    stop_supervising = asyncio.Event()
    results: list[Result] = []
    await stack.start(cfg.speed_profile, 1.0, timeout=90)
    supervisor = asyncio.create_task(stack.supervise(stop_supervising, say=lambda m, **_: say(m)))
    chaos = Chaos(stack, cfg, say)
    plog = ProviderLog(run_dir / "provider-requests.jsonl")
    url = chaos.url(PORTS["router"], "/v1/chat/completions")
    try:
        await chaos.healthy()
        if nats_cluster:
            chaos.probe = ClusterProbe(stack)
            await chaos.probe.start()
        connector = aiohttp.TCPConnector(limit=512)
        #: each HA phase's result and its decision ids, for the records read at the end
        phase_ids: list[tuple[Result, set[str]]] = []
        async with aiohttp.ClientSession(connector=connector) as http:
            for phase, (name, fault) in enumerate(ha_faults() if nats_cluster else faults()):
                if only is not None and name not in only:
                    continue
                plog.new_text()  # only what this phase sends counts
                router_log = stack.proc("router").log
                router_at = router_log.stat().st_size if router_log is not None and router_log.exists() else 0
                if chaos.probe is not None:
                    chaos.probe.phase()
                shots: list[Shot] = []
                stop = asyncio.Event()
                loader = asyncio.create_task(load(http, url, cfg, phase, stop, shots, chaos.spike))
                try:
                    await asyncio.sleep(cfg.pre)
                    fault_at = time.monotonic()
                    await fault(chaos)
                    fault_end = time.monotonic()
                    await asyncio.sleep(cfg.post)
                    stop.set()
                    await loader
                except BaseException:  # interrupted: no request left behind
                    loader.cancel()
                    await asyncio.gather(loader, return_exceptions=True)
                    raise
                result = summarise(name, shots, fault_at, fault_end, plog.new_text())
                if chaos.probe is not None:
                    await asyncio.sleep(1.0)  # the last events on their way
                    ids = {s.decision_id for s in shots if s.decision_id}
                    phase_ids.append((result, ids))
                    result.decisions_lost = len(ids - chaos.probe.seen)
                    at = time.monotonic()
                    result.kv_acked_lost = await chaos.probe.acked_lost()
                    say(f"    the probe's value read back after {time.monotonic() - at:.1f}s")
                    result.kv_longest_unwritable_s = round(chaos.probe.longest, 2)
                    result.kv_writes_failed = chaos.probe.failed
                    result.catchup_s, chaos.catchup_s = chaos.catchup_s, None
                    result.router_said_unavailable = said(router_log, "config_store_unavailable", router_at)
                results.append(result)
                for path, text in chaos.mend:
                    path.write_text(text)
                chaos.mend.clear()
                say(f"  {name:<32} {result.requests:>4} requests, {result.success_rate:.1%} ok, "
                    f"recovery {result.recovery_s}s, pii leaked {result.pii_leaked}")
                await chaos.healthy()
            if chaos.probe is not None and phase_ids:
                recorded = await chaos.probe.recorded_ids()
                for result, ids in phase_ids:
                    result.records_lost = len(ids - recorded)
    except BaseException as exc:  # failed, or interrupted (a deadline): say where each process was
        say(f"chaos: stopped by {type(exc).__name__}; the last lines of each NATS server's and the router's log:")
        for proc in stack.procs:
            if proc.name in stack.nats_names or proc.name == "router":
                say(f"--- {proc.log}\n{log_tail(proc.log, 12)}")
        raise
    finally:
        if chaos.probe is not None:
            await chaos.probe.stop()
        stop_supervising.set()
        await supervisor
        await stack.stop()
    return results


def table(results: list[Result]) -> str:
    head = (f"{'fault':<32} {'requests':>8} {'success':>8} {'p50 ms':>8} {'p99 ms':>8} {'provider':>8} "
            f"{'recovery s':>10} {'pii msg':>7} {'pii side':>8} {'hung':>5}")
    lines = [head, "-" * len(head)]
    for r in results:
        rec = "never" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        lines.append(f"{r.fault:<32} {r.requests:>8} {r.success_rate:>8.1%} {r.p50_ms:>8.0f} {r.p99_ms:>8.0f} "
                     f"{r.to_provider:>8} {rec:>10} {r.pii_leaked_message:>7} {r.pii_leaked_side:>8} {r.hung:>5}")
    ha = [r for r in results if r.decisions_lost is not None]
    if ha:
        head = (f"{'NATS cluster fault':<32} {'decisions lost':>14} {'records lost':>12} {'kv acked lost':>13} "
                f"{'kv unwritable s':>15} {'kv failed':>9} {'catch-up s':>10} {'router said':>11}")
        lines += ["", head, "-" * len(head)]
        for r in ha:
            lines.append(f"{r.fault:<32} {r.decisions_lost:>14} {'-' if r.records_lost is None else r.records_lost:>12} "
                         f"{r.kv_acked_lost:>13} "
                         f"{r.kv_longest_unwritable_s:>15.2f} {r.kv_writes_failed:>9} "
                         f"{'-' if r.catchup_s is None else f'{r.catchup_s:.2f}':>10} {r.router_said_unavailable:>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--short", action="store_true", help="a few seconds per fault (what make test runs)")
    p.add_argument("--port-offset", type=int, default=int(os.environ.get("KINFERENCE_PORT_OFFSET", "0")) or None,
                   help="port offset of the chaos stack (env KINFERENCE_PORT_OFFSET; default: a free one)")
    p.add_argument("--run-dir", default=str(REPO / ".run-chaos"))
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--only", action="append", metavar="FAULT", help="run only this fault (repeat)")
    p.add_argument("--nats", choices=("single", "cluster", "both"), default="both",
                   help="the faults of one NATS server, of NATS as a cluster of three (a second stack), "
                        "or both (default)")
    args = p.parse_args(argv)
    cfg = SHORT if args.short else FULL
    offset = args.port_offset if args.port_offset is not None else free_offset()
    print(f"chaos: stack on port offset {offset} (router 127.0.0.1:{PORTS['router'] + offset}), "
          f"{cfg.rate:g} requests/s, fault held {cfg.down:g}s, {cfg.post:g}s after", flush=True)
    async def interruptible() -> list[Result]:
        # SIGINT/SIGTERM stop the run and the whole stack (also where SIGINT is
        # ignored, as for a background job of a non-interactive shell)
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        results: list[Result] = []
        if args.nats in ("single", "both"):
            results += await run_chaos(cfg, Path(args.run_dir), offset, only=args.only,
                                       say=lambda m: print(m, flush=True))
        if args.nats in ("cluster", "both"):
            print("chaos: the same stack with NATS as a cluster of three", flush=True)
            results += await run_chaos(cfg, Path(args.run_dir + "-ha"), offset, only=args.only,
                                       say=lambda m: print(m, flush=True), nats_cluster=True)
        return results

    try:
        results = asyncio.run(interruptible())
    except asyncio.CancelledError:
        print("chaos: interrupted; the stack is stopped", file=sys.stderr)
        return 130
    print()
    print(table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
