"""``kinfctl events`` follows decision events on a real nats-server."""

from __future__ import annotations

import asyncio
import json
import sys

import msgspec
import nats

from kinference_common import bus, subjects
from kinference_common.engine.trace import DecisionTrace, ModelTrace, OutcomeTrace, encode_trace
from kinference_common.natsserver import NatsServer


def trace(decision_id: str, routed: bool) -> bytes:
    return encode_trace(DecisionTrace(
        decision_id=decision_id, pool="default/inference-all", tenant="alice",
        model=ModelTrace(requested="qwen-2.5", canonical="qwen-2.5"), tags=["pii-none"],
        outcome=OutcomeTrace(type="Routed", backend="Local/qwen-2-5-32b", endpoint="qwen-0",
                             model="Qwen/Qwen2.5-32B-Instruct", rule="burst") if routed
        else OutcomeTrace(type="Rejected", code="no_capacity", reason="busy", rule=None),
        decide_us=42.0))


async def follow(server: NatsServer, *extra: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinfctl", "events", "--nats-url", server.url, "--count", "2", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    ready = await asyncio.wait_for(proc.stderr.readline(), 30)  # "following ..." once subscribed
    assert b"following" in ready
    nc = await nats.connect(server.url)
    await nc.publish(subjects.decisions_subject("default", "inference-all"), trace("a" * 32, True))
    await nc.publish(subjects.decisions_subject("default", "inference-all"), trace("b" * 32, False))
    await bus.sync(nc)
    await nc.close()
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_one_line_per_decision(nats_server: NatsServer) -> None:
    code, out, _ = await follow(nats_server, "--pool", "default/inference-all")
    assert code == 0
    first, second = out.splitlines()
    assert "aaaaaaaaaaaa default/inference-all tenant=alice model=qwen-2.5->Qwen/Qwen2.5-32B-Instruct" in first
    assert "rule=burst Local/qwen-2-5-32b qwen-0 tags=pii-none 42us" in first
    assert "Rejected no_capacity" in second


def test_a_routed_decisions_second_event_says_what_the_client_got() -> None:
    from kinfctl.events import format_line

    routed = msgspec.json.decode(trace("c" * 32, True), type=DecisionTrace)
    assert "rule=burst Local/qwen-2-5-32b qwen-0 tags=" in format_line(routed)
    failed = msgspec.structs.replace(routed, outcome=msgspec.structs.replace(routed.outcome, code="upstream_error"))
    assert "rule=burst Local/qwen-2-5-32b qwen-0 then upstream_error tags=" in format_line(failed)


async def test_json_output_is_the_raw_event(nats_server: NatsServer) -> None:
    code, out, _ = await follow(nats_server, "-o", "json")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["decision_id"][0] for e in events] == ["a", "b"]
