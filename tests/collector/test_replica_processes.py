"""Collector replicas as real processes sharing a simulated fleet (one
``kinference_simulators.fleet`` process, a loopback address per pod) through
a real nats-server: every pod scraped by exactly one replica in the steady
state, a replica killed with SIGKILL under load, the fleet scaled 1 -> 3 -> 1,
and at no moment a pod whose telemetry at the router is older than two
intervals plus the rebalance time (member TTL plus a heartbeat)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import pytest

from kinference_common import natsserver, subjects
from kinference_common.messages import EndpointState
from kinference_simulators.testing import run_simulator

pytestmark = pytest.mark.nats

PODS = 24
INTERVAL = 0.2
HEARTBEAT = 0.2
TTL = 0.6
#: what the issue allows: two intervals plus the rebalance time
BOUND = 2 * INTERVAL + TTL + HEARTBEAT
#: this machine is shared: a scheduling hiccup is not a gap
MARGIN = 1.0
PATIENCE = 30.0


class Replica:
    def __init__(self, name: str, nats_url: str, endpoints: Path, log: Path, ttl: float = TTL) -> None:
        self.name, self.port = name, natsserver.free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kinference_collector", "--nats-url", nats_url, "--endpoints-file",
             str(endpoints), "--interval", str(INTERVAL), "--replica-id", name, "--heartbeat", str(HEARTBEAT),
             "--member-ttl", str(ttl), "--min-publish-interval", str(INTERVAL), "--stale-after", "3",
             "--http-host", "127.0.0.1", "--http-port", str(self.port), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=log.open("w"))

    async def held(self, http: aiohttp.ClientSession) -> int | None:
        """Targets this replica scrapes now (its ``kinference_endpoints`` gauges)."""
        try:
            async with http.get(f"http://127.0.0.1:{self.port}/metrics") as r:
                text = await r.text()
        except aiohttp.ClientError:
            return None
        return round(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                         if line.startswith("kinference_endpoints{")))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class RouterView:
    """What a router hears: each pod's newest scrape time, and the worst age seen."""

    def __init__(self) -> None:
        self.scraped: dict[str, float] = {}
        self.not_ready: list[str] = []
        self.worst = 0.0
        self.worst_pod = ""
        self.dec = msgspec.json.Decoder(EndpointState)

    async def on_state(self, msg: Any) -> None:
        st = self.dec.decode(msg.data)
        if not st.ready:
            self.not_ready.append(st.pod)
        self.scraped[st.pod] = max(self.scraped.get(st.pod, 0.0), st.scraped_at)

    async def watch_ages(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            if len(self.scraped) == PODS:
                now = time.time()
                pod, at = min(self.scraped.items(), key=lambda kv: kv[1])
                if now - at > self.worst:
                    self.worst, self.worst_pod = now - at, pod


async def settled(http: aiohttp.ClientSession, live: list[Replica]) -> None:
    """Every pod held by exactly one of ``live``, in equal shares."""
    async with asyncio.timeout(PATIENCE):
        while True:
            held = [await r.held(http) for r in live]
            if None not in held and sum(held) == PODS and max(held) - min(held) <= 1:  # type: ignore[type-var, arg-type]
                return
            await asyncio.sleep(0.1)


async def scrapes(http: aiohttp.ClientSession, fleet_url: str) -> dict[str, int]:
    async with http.get(f"{fleet_url}/sim/scrapes") as r:
        return (await r.json())["pods"]


async def heard_every_pod(view: RouterView) -> None:
    async with asyncio.timeout(PATIENCE):
        while len(view.scraped) < PODS:
            await asyncio.sleep(0.05)


@dataclass
class Trial:
    """A simulated fleet, its endpoint file, what a router hears, the replicas started."""

    fleet_url: str
    http: aiohttp.ClientSession
    endpoints: Path
    view: RouterView
    made: list[Replica] = field(default_factory=list)


@contextlib.asynccontextmanager
async def trial(nats_url: str, tmp_path: Path) -> AsyncIterator[Trial]:
    with run_simulator("fleet", "--pods", str(PODS), "--gpus-per-node", "8", "--change-interval", "0.1",
                       "--log-format", "json") as fleet:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{fleet.url}/sim/targets") as r:
                targets = await r.json()
            endpoints = tmp_path / "endpoints.json"
            endpoints.write_text(json.dumps(targets))
            t = Trial(fleet.url, http, endpoints, RouterView())
            nc = await nats.connect(nats_url)
            await nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=t.view.on_state)
            ages = asyncio.create_task(t.view.watch_ages())
            try:
                yield t
            finally:
                ages.cancel()
                await nc.close()
                for r in t.made:
                    r.stop()


async def each_pod_read_at_the_interval(t: Trial) -> None:
    """The steady state: each pod's page read at the interval, none twice as often."""
    before, t0 = await scrapes(t.http, t.fleet_url), time.monotonic()
    await asyncio.sleep(2.0)
    after, wall = await scrapes(t.http, t.fleet_url), time.monotonic() - t0
    rates = {p: (after[p] - before[p]) * INTERVAL / wall for p in after}
    assert all(0 < v < 1.5 for v in rates.values()), rates


async def test_three_replica_processes_kill_and_scale_one_three_one(nats_server: Any, tmp_path: Path) -> None:
    async with trial(nats_server.url, tmp_path) as t:
        http, view, made = t.http, t.view, t.made

        def start(name: str) -> Replica:
            r = Replica(name, nats_server.url, t.endpoints, tmp_path / f"{name}.log")
            made.append(r)
            return r

        a = start("collector-0")
        await settled(http, [a])
        b, c = start("collector-1"), start("collector-2")
        await settled(http, [a, b, c])
        await heard_every_pod(view)
        await each_pod_read_at_the_interval(t)

        # kill -9 one replica under load: the others take its share, no pod left behind
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        await settled(http, [a, c])
        await asyncio.sleep(BOUND + MARGIN)
        # scale down to one, gracefully (SIGTERM: it leaves, then stops)
        c.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PATIENCE):
            while c.proc.poll() is None:
                await asyncio.sleep(0.05)
        assert c.proc.returncode == 0
        await settled(http, [a])
        await asyncio.sleep(BOUND + MARGIN)
        assert view.worst <= BOUND + MARGIN, f"a pod's telemetry was {view.worst:.2f} s old"
        assert view.not_ready == []
        logs = "".join((tmp_path / f"{r.name}.log").read_text() for r in made)
        assert "Traceback" not in logs, logs


#: a replica frozen with its connection open is found by ``--probe-misses`` (2)
#: unanswered probes: at most an interval until the next probe, then two
#: timeouts of half an interval, the second probe sent as the first times out
FROZEN_FOUND = INTERVAL + 2 * (INTERVAL / 2)


async def test_a_replica_frozen_with_its_connection_open_is_replaced_by_the_probes_not_the_ttl(
        nats_server: Any, tmp_path: Path) -> None:
    """SIGSTOP one of three replicas under load: NATS still holds its
    connection (as with a node gone and its TCP connection half-open), so only
    its unanswered probes tell. With a 30 s member TTL the others must take its
    share within a few intervals, and no pod's telemetry at the router may get
    older than two intervals plus that. SIGCONT: its next heartbeat brings it
    back, and each pod is again scraped by one replica."""
    async with trial(nats_server.url, tmp_path) as t:
        http, view, made = t.http, t.view, t.made
        a, b, c = (Replica(f"collector-{i}", nats_server.url, t.endpoints, tmp_path / f"collector-{i}.log",
                           ttl=30.0) for i in range(3))
        made += [a, b, c]
        await settled(http, [a, b, c])
        await heard_every_pod(view)
        await asyncio.sleep(1.0)
        view.worst = 0.0
        b.proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            await settled(http, [a, c])
            taken = time.monotonic() - t0
            await asyncio.sleep(2 * INTERVAL + MARGIN)
            worst, worst_pod = view.worst, view.worst_pod
        finally:
            b.proc.send_signal(signal.SIGCONT)
        assert taken < 30.0 / 2, f"the share was taken after {taken:.2f} s: the ttl, not the probes"
        assert worst <= 2 * INTERVAL + FROZEN_FOUND + MARGIN, \
            f"pod {worst_pod}'s telemetry was {worst:.2f} s old (share taken after {taken:.2f} s)"
        # back: every pod held once again, and scraped at the interval, none twice as often
        await settled(http, [a, b, c])
        await asyncio.sleep(1.0)
        await each_pod_read_at_the_interval(t)
        assert view.not_ready == []
        logs = "".join((tmp_path / f"{r.name}.log").read_text() for r in made)
        assert "member_gone" in logs and "answered none of 2 probes" in logs, logs
        assert "Traceback" not in logs, logs
