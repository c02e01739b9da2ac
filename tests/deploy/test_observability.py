"""deploy/observability: the alert rules pass `promtool check rules` and their
unit tests (`promtool test rules`), the dashboard's queries parse as PromQL,
and every metric the rules and the dashboard use is one a service exports;
the dashboard has a panel for each thing an operator asked to see."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
OBS = REPO / "deploy" / "observability"

spec = importlib.util.spec_from_file_location("docgen", REPO / "tools" / "docgen.py")
docgen = importlib.util.module_from_spec(spec)
sys.modules["docgen"] = docgen
spec.loader.exec_module(docgen)


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is needed: make install (apt-get install prometheus)"
    return found


def run(*args: str, cwd: Path = OBS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_are_valid() -> None:
    out = run("check", "rules", "alerts.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 8 rules found" in out.stdout


def test_rules_unit_tests_pass() -> None:
    out = run("test", "rules", "alerts.test.yaml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_a_broken_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: an alert expected where the rule must stay quiet."""
    shutil.copy(OBS / "alerts.yaml", tmp_path / "alerts.yaml")
    tests = yaml.safe_load((OBS / "alerts.test.yaml").read_text())
    first = tests["tests"][0]["alert_rule_test"][0]
    assert first["exp_alerts"] == []
    first["exp_alerts"] = [{"exp_labels": {"severity": "warning"}}]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(tests))
    assert run("test", "rules", "t.yaml", cwd=tmp_path).returncode != 0


ALERTS = {"KinferenceProviderErrorRate", "KinferenceClassifierFailingClosed", "KinferenceTelemetryStale",
          "KinferenceNoCapacity", "KinferencePIIFailClosedRate", "KinferenceCollectorReplicasTakenForDead"}


def rules() -> list[dict]:
    return [r for g in yaml.safe_load((OBS / "alerts.yaml").read_text())["groups"] for r in g["rules"]]


def test_the_alerts_asked_for_exist_and_each_has_a_unit_test() -> None:
    names = {r["alert"] for r in rules()}
    assert ALERTS <= names
    tested = {t["alertname"] for case in yaml.safe_load((OBS / "alerts.test.yaml").read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == names  # every alert is shown firing at least once
    for r in rules():
        assert r["labels"]["severity"] in ("warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def dashboard() -> dict:
    return json.loads((OBS / "grafana-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "5m").replace('"$pool"', '".*"')


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables filled in, as a recording
    rule: promtool parses it."""
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    groups = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": grafana_to_promql(e)} for i, e in enumerate(exprs)]}]}
    (tmp_path / "dash.yaml").write_text(yaml.safe_dump(groups))
    out = run("check", "rules", "dash.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dashboard_is_importable() -> None:
    d = dashboard()
    assert d["uid"] == "kinference" and d["title"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in d["templating"]["list"]}
    assert variables == {"datasource", "pool"}
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            for axis in ("x", "y", "w", "h"):
                assert isinstance(p["gridPos"][axis], int)


METRIC = re.compile(r"\b(kinference_[a-z_]+)\b")


def used_metrics() -> dict[str, str]:
    used = {}
    for e in dashboard_exprs():
        for m in METRIC.findall(e):
            used[m] = "dashboard"
    for r in rules():
        for m in METRIC.findall(r["expr"]):
            used[m] = f"alert {r['alert']}"
    return used


def test_every_metric_used_is_exported_by_a_service() -> None:
    exported = {s for m in docgen.exported_metrics() for s in m.samples()}
    missing = {m: where for m, where in used_metrics().items() if m not in exported}
    assert missing == {}


def test_every_label_used_is_one_the_metric_has() -> None:
    labels = {s: set(m.labels) | ({"le"} if s.endswith("_bucket") else set())
              for m in docgen.exported_metrics() for s in m.samples()}
    matcher = re.compile(r"(kinference_[a-z_]+)\{([^}]*)\}")
    for e in [*dashboard_exprs(), *(r["expr"] for r in rules())]:
        for name, inner in matcher.findall(e):
            for label in re.findall(r"([a-z_]+)\s*(?:=~|!=|=)", inner):
                assert label in labels[name], (name, label, e)
        for by in re.findall(r"by \(([^)]*)\)", e):
            metrics = METRIC.findall(e)
            for label in (x.strip() for x in by.split(",")):
                assert any(label in labels[m] for m in metrics), (label, e)


@pytest.mark.parametrize(("ask", "metric"), [
    ("per-endpoint TTFT", "kinference_endpoint_ttft_seconds_bucket"),
    ("per-endpoint requests", "kinference_endpoint_requests_total"),
    ("requests by backend and outcome", "kinference_backend_requests_total"),
    ("decision latency", "kinference_decision_seconds_bucket"),
    ("classifier outcomes", "kinference_classifier_seconds_count"),
    ("burst share", "kinference_requests_total"),
    ("provider cost in tokens", "kinference_provider_tokens_total"),
    ("queue depth", "kinference_queue_depth"),
])
def test_the_dashboard_shows_what_operators_asked_for(ask: str, metric: str) -> None:
    assert any(metric in e for e in dashboard_exprs()), ask
    if ask == "burst share":
        assert any('backend_type="Provider"' in e for e in dashboard_exprs())
    if ask == "per-endpoint TTFT":
        assert any("pod" in e and metric in e for e in dashboard_exprs())


def test_dashboard_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
