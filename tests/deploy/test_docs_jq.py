"""The docs' jq recipes on decision traces (``kinfctl events -o json``,
``kinfctl explain -o json``, ``/debug/explain``) run without error on every
kind of decision: a routed one and a refused one, whose ``outcome.backend``
is null (the trial: ``startswith() requires string inputs`` on every refused
decision)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kinference_common.engine.trace import (DecisionTrace, ModelTrace, OutcomeTrace, RuleTrace, TierTrace,
                                            encode_trace)

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: commands whose output is a decision trace, one JSON object per decision
TRACE_SOURCES = ("kinfctl events", "kinfctl explain", "/debug/explain")
JQ = re.compile(r"\|\s*jq\s+(?:-\w+\s+)*(?:'([^']*)'|([^\s`'|;)]+))")


def recipes() -> list[tuple[str, str]]:
    """(where, filter) of every jq filter applied to a decision trace in docs/."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        for n, line in enumerate(page.read_text().splitlines(), 1):
            # prose and tables: each `...` span is a command; a code block's line is one
            for part in re.findall(r"`([^`]+)`", line) or [line]:
                if not any(s in part for s in TRACE_SOURCES):
                    continue
                for m in JQ.finditer(part):
                    out.append((f"{page.relative_to(DOCS)}:{n}", m.group(1) or m.group(2)))
    return out


def traces() -> bytes:
    routed = DecisionTrace(
        decision_id="d-1", pool="default/inference-all", tenant="anonymous",
        model=ModelTrace(requested="qwen-2.5", canonical="qwen-2.5"), tags=["pii-none"],
        rules=[RuleTrace(name="burst", matched=True, outcome="Routed",
                         tiers=[TierTrace(index=0, type="PredictedTTFT", picked="Provider/default/databricks")])],
        outcome=OutcomeTrace(type="Routed", backend="Provider/default/databricks", rule="burst"), decide_us=12.0)
    refused = DecisionTrace(
        decision_id="d-2", pool="default/inference-all", tenant="anonymous",
        model=ModelTrace(requested="qwen-2.5", canonical="qwen-2.5"), tags=["pii-confirmed"],
        rules=[RuleTrace(name="burst", matched=True, outcome="Rejected")],
        outcome=OutcomeTrace(type="Rejected", reason="no candidate left", code="NoCandidates", rule="burst"),
        decide_us=9.0)
    local = DecisionTrace(
        decision_id="d-3", pool="default/inference-all", tenant="anonymous",
        model=ModelTrace(requested="qwen-2.5", canonical="qwen-2.5"), tags=["pii-none"], rules=[],
        outcome=OutcomeTrace(type="Routed", backend="InferenceWorkerSet/default/qwen-2-5-32b"), decide_us=5.0)
    return b"\n".join(encode_trace(t) for t in (routed, refused, local)) + b"\n"


def test_the_docs_have_recipes_on_traces() -> None:
    found = recipes()
    assert any("startswith" in f for _, f in found), found
    assert len(found) >= 4, found


@pytest.mark.parametrize(("where", "jq_filter"), recipes(), ids=[w for w, _ in recipes()])
def test_each_recipe_runs_on_routed_and_refused_decisions(where: str, jq_filter: str) -> None:
    jq = shutil.which("jq")
    assert jq is not None, "jq is not installed (make install installs it)"
    out = subprocess.run([jq, "-c", jq_filter], input=traces(), capture_output=True, timeout=30)
    assert out.returncode == 0 and not out.stderr, f"{where}: jq '{jq_filter}': {out.stderr.decode().strip()}"
