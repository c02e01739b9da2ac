"""Decision records are exact (services/router/recording.py): a replay of
the live policy on the recorded snapshots takes every decision again, ties
broken at random or by prefix affinity and the router's own in-flight
requests included; what cannot be replayed is named, with why."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from kinference_common.recording import SCHEMA_VERSION
from kinference_router.recording import RecordSettings
from tests.router.test_router import Upstream

from kinfctl import records, replay

TIES = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: ws, namespace: default}
spec:
  model: {name: m, servedName: m, contextWindow: 32768}
  engine: vLLM
  selector: {matchLabels: {app: ws}}
  port: 8000
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: ties, namespace: default}
spec:
  rules:
    - name: any-pod
      route:
        tieBreak: [PrefixAffinity, LeastInFlight, Random]
        select:
          - {type: Local}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: ties, namespace: default}
spec:
  destinations:
    - {kind: InferenceWorkerSet, name: ws}
  policyRef: {name: ties}
"""


async def test_ties_and_in_flight_sends_replay_exactly(start_pool: Any, tmp_path: Path) -> None:
    pods = [Upstream(f"p{i}") for i in range(4)]
    for up in pods:
        up.server = TestServer(up.app())
        await up.server.start_server()
    try:
        served = await start_pool(TIES, "ties", record=RecordSettings(keyframe_seconds=0.2))
        for i, up in enumerate(pods):
            await served.endpoint("ws", "m", up.address, pod=f"p{i}", settle=0.0)
        await asyncio.sleep(0.15)
        prompts = [("You are a careful assistant. " * 40) + f"question {i % 3}" for i in range(24)]
        async with aiohttp.ClientSession() as s:
            async def one(p: str) -> str:
                async with s.post(served.url, json={"model": "m", "messages": [{"role": "user", "content": p}]}) as r:
                    assert r.status == 200
                    return r.headers["x-kinference-backend"]
            for batch in range(3):  # concurrent: decisions see each other's sends in flight
                await asyncio.gather(*(one(p) for p in prompts[batch * 8:(batch + 1) * 8]))
        await asyncio.sleep(0.2)
        got = await asyncio.to_thread(records.from_nats, _args(served), "default", "ties", 600.0)
        decisions = [r for r in got if isinstance(r, records.DecisionRecord)]
        assert len(decisions) == 24
        # every record says its schema version (a record that does not is version 1)
        assert {r.v for r in got} == {SCHEMA_VERSION} and SCHEMA_VERSION >= 2
        assert any(r.draws for r in decisions) and any(r.loads for r in decisions) and any(r.matches for r in decisions)
        rep = replay.replay(got, "default", "ties", None)
        assert rep["reproduced"] == {"count": 24, "of": 24, "not_reproduced": []}
        # a lost snapshot, and a draw the record does not hold, are named
        lost = [r for r in got if not (isinstance(r, records.SnapshotRecord) and r.version == decisions[0].snapshot)]
        rep = replay.replay(lost, "default", "ties", None)
        whys = {f["decision_id"]: f["why"] for f in rep["reproduced"]["not_reproduced"]}
        assert "not recorded" in whys[decisions[0].decision_id]
        assert rep["reproduced"]["count"] == 24 - len(whys)
        drew = next(r for r in decisions if r.draws)
        drew.draws = []
        rep = replay.replay(got, "default", "ties", None)
        whys = {f["decision_id"]: f["why"] for f in rep["reproduced"]["not_reproduced"]}
        assert list(whys) == [drew.decision_id] and "random tie" in whys[drew.decision_id]
    finally:
        for up in pods:
            await up.server.close()  # type: ignore[union-attr]


async def test_a_prompt_no_window_holds_replays_as_refused_for_its_length(start_pool: Any) -> None:
    # the router answers context_length_exceeded (not the engine's policy_rejected): replay must say the same
    up = Upstream("p0")
    up.server = TestServer(up.app())
    await up.server.start_server()
    try:
        served = await start_pool(TIES.replace("contextWindow: 32768", "contextWindow: 1000"), "ties",
                                  record=RecordSettings())
        await served.endpoint("ws", "m", up.address, pod="p0", settle=0.0)
        await asyncio.sleep(0.15)
        long = " ".join(f"word{i}" for i in range(3000))
        async with aiohttp.ClientSession() as s:
            for extra in ({"max_tokens": 100}, {}):
                body = {"model": "m", "messages": [{"role": "user", "content": long}], **extra}
                async with s.post(served.url, json=body) as r:
                    assert r.status == 400 and (await r.json())["error"]["code"] == "context_length_exceeded"
        await asyncio.sleep(0.2)
        got = await asyncio.to_thread(records.from_nats, _args(served), "default", "ties", 600.0)
        decisions = [r for r in got if isinstance(r, records.DecisionRecord)]
        assert [r.outcome.code for r in decisions] == ["context_length_exceeded"] * 2
        rep = replay.replay(got, "default", "ties", None)
        assert rep["reproduced"] == {"count": 2, "of": 2, "not_reproduced": []}
    finally:
        await up.server.close()  # type: ignore[union-attr]


def _args(served: Any) -> Any:
    import argparse

    url = f"nats://127.0.0.1:{served.nc.connected_url.port}"
    return argparse.Namespace(nats_url=url, port_offset=None, timeout=5.0, nats_user=None, nats_password_file=None,
                              nats_tls_ca=None, nats_tls_cert=None, nats_tls_key=None)


async def test_flow_controls_outcomes_are_named_not_replayed(start_pool: Any) -> None:
    from tests.router.test_flow import MANIFESTS, answering_upstream

    upstream = await answering_upstream()
    try:
        served = await start_pool(MANIFESTS, "queued", record=RecordSettings())
        await served.endpoint("stub", "m", f"127.0.0.1:{upstream.port}", queued=10)  # saturated
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        async with aiohttp.ClientSession() as s:
            async def one() -> int:
                async with s.post(served.url, json=body) as r:
                    return r.status

            waiting = [asyncio.create_task(one()) for _ in range(2)]
            while len(served.router.flow) < 2:
                await asyncio.sleep(0.02)
            assert await one() == 429  # the queue holds 2: shed
            assert sorted(await asyncio.gather(*waiting)) == [503, 503]  # maxQueueWait
        await asyncio.sleep(0.2)
        got = await asyncio.to_thread(records.from_nats, _args(served), "default", "queued", 600.0)
        assert sorted(r.amended for r in got if isinstance(r, records.DecisionRecord)) == ["", "", "flow_control"]
        rep = replay.replay(got, "default", "queued", None)
        assert rep["reproduced"] == {"count": 2, "of": 2, "not_reproduced": []}
        assert rep["flow_control"]["count"] == 1
    finally:
        await upstream.close()


def test_record_flags_take_sizes_and_durations() -> None:
    import subprocess
    import sys

    from kinference_router.__main__ import parse_args

    args = parse_args(["--record-max-bytes", "512MiB", "--record-max-age", "90m", "--record-keyframe-interval", "30"])
    assert (args.record, args.record_max_bytes, args.record_max_age, args.record_keyframe_interval) == (
        True, 512 << 20, 5400.0, 30.0)
    assert parse_args(["--no-record"]).record is False
    for argv, words in ((["--record-max-bytes", "lots"], "not a size: 'lots'"),
                        (["--record-max-age", "0"], "must be positive"),
                        (["--record-keyframe-interval", "10m"], "at most 5m")):
        proc = subprocess.run([sys.executable, "-m", "kinference_router", *argv], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
