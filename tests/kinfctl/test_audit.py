"""``kinfctl audit FILE``: PII-tagged requests by tenant and rule, what the
policy did with each, fail-closed counts; a PII request that left is shouted
(exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kinference_common.engine.trace import ClassifierTrace, DecisionTrace, ModelTrace, OutcomeTrace, encode_trace


def event(n: int, tenant: str, tags: list[str], backend: str | None, rule: str = "burst",
          pii_outcome: str = "ok") -> bytes:
    return encode_trace(DecisionTrace(
        decision_id=f"{n:032x}", pool="default/inference-all", tenant=tenant,
        model=ModelTrace(requested="qwen-2.5", canonical="qwen-2.5"), tags=tags,
        classifiers=[ClassifierTrace(name="pii", outcome=pii_outcome, tags=[t for t in tags if t.startswith("pii")])],
        outcome=OutcomeTrace(type="Routed" if backend else "Rejected", backend=backend, rule=rule,
                             code=None if backend else "no_capacity"),
        decide_us=10.0))


def kinfctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kinfctl", "audit", *args], capture_output=True, text=True, timeout=60)


def test_audit_counts_by_tenant_and_rule_and_shouts_a_leak(tmp_path: Path) -> None:
    f = tmp_path / "events.jsonl"
    lines = [event(1, "alice", ["pii-confirmed"], "InferenceWorkerSet/qwen"),
             event(2, "alice", ["pii-unknown"], None, pii_outcome="deadline"),
             event(3, "bob", ["pii-none"], "Provider/databricks"),
             event(4, "bob", ["pii-confirmed"], "InferenceWorkerSet/qwen")]
    f.write_bytes(b"\n".join(lines) + b"\n")
    r = kinfctl(str(f), "-o", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["total"] == {"requests": 4, "pii": 3, "local": 2, "refused": 1, "provider": 0, "failed_closed": 1}
    assert [(b["tenant"], b["pii"], b["refused"]) for b in out["by"]] == [("alice", 2, 1), ("bob", 1, 0)]
    r = kinfctl(str(f))
    assert "3 of 4 requests carried a PII tag" in r.stdout and "sk-" not in r.stdout
    # one PII-tagged request that went to a provider: shouted, exit 1
    f.write_bytes(b"\n".join([*lines, event(5, "bob", ["pii-unknown"], "Provider/databricks", pii_outcome="error")]))
    r = kinfctl(str(f))
    assert r.returncode == 1 and "PII LEFT THE CLUSTER: 1" in r.stderr


def test_a_line_that_is_not_an_event_is_named(tmp_path: Path) -> None:
    f = tmp_path / "events.jsonl"
    f.write_text('{"nope": 1}\n')
    r = kinfctl(str(f))
    assert r.returncode != 0 and "events.jsonl:1: not a decision event" in r.stderr
