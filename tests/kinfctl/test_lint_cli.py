"""``kinfctl lint`` and ``kinfctl get`` as an operator runs them: the real
console script, exit codes 0/1/2, one-line errors, JSON that is exactly the
status the controllers compute."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from kinference_common.compiler import compile_paths

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "tests" / "compiler" / "seed_manifests"
KINFCTL = [sys.executable, "-m", "kinfctl"]

FLEET = (REPO / "tests" / "compiler" / "conftest.py").read_text().split('FLEET = """', 1)[1].split('"""', 1)[0]


def kinfctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KINFCTL, *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "policy.yaml").write_text((SEEDS / "000-burst-policy.yaml").read_text())
    (tmp_path / "pool.yaml").write_text((SEEDS / "002-pool.yaml").read_text().replace("policy-3", "my-policy"))
    return tmp_path


def test_clean_manifests_exit_0_and_print_status(good: Path) -> None:
    p = kinfctl("lint", str(good))
    assert p.returncode == 0, p.stderr
    assert "InferencePolicy default/my-policy: Accepted, 1 rule(s) (referenced by default/inference-all)" in p.stdout
    assert "asks pii (adds up to 20ms)" in p.stdout
    assert "InferencePool default/inference-all: Accepted, 3 destination(s), policy my-policy" in p.stdout
    assert p.stdout.rstrip().endswith("0 errors, 0 warnings")


def test_json_is_exactly_the_controllers_status(good: Path) -> None:
    p = kinfctl("lint", "-o", "json", str(good))
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"policies", "pools", "errors"}
    expected = compile_paths([good], now="X")
    policy = out["policies"][0]
    assert (policy["namespace"], policy["name"]) == ("default", "my-policy")
    want = msgspec.to_builtins(expected.policy_status[("default", "my-policy")])
    # identical except the transition timestamps, which are "now"
    for c in policy["status"]["conditions"] + want["conditions"]:
        c.pop("lastTransitionTime")
    assert policy["status"] == want
    pool = out["pools"][0]["status"]
    assert pool["state"] == "Accepted" and pool["destinationCount"] == 3
    assert pool["models"][1] == {"name": "qwen-2.5", "aliases": ["Qwen/Qwen2.5-32B-Instruct"],
                                 "servedBy": ["databricks", "qwen-2-5-32b"],
                                 "contextWindow": {"min": 32768, "max": 32768}}


def test_warnings_never_fail_but_strict_exits_2(good: Path) -> None:
    text = (SEEDS / "000-burst-policy.yaml").read_text().replace("[pii-confirmed, pii-unknown]", "[pii-confirmed]")
    (good / "policy.yaml").write_text(text)
    p = kinfctl("lint", str(good))
    assert p.returncode == 0
    assert "warning UncoveredFailureTag at rules[0].route.exclude[2].if.tag" in p.stdout
    assert kinfctl("lint", "--strict", str(good)).returncode == 2


def test_strict_fails_on_a_pool_with_an_unresolved_destination_or_a_missing_policy(good: Path) -> None:
    """The trial: a Kinference pool naming a missing policy and a worker set
    that does not exist passed ``--strict`` (exit 0): its faults are
    conditions, not warnings, where an Inference Extension pool's are warnings."""
    (good / "bad-pool.yaml").write_text(
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {name: bad, namespace: default}\n"
        "spec:\n  destinations: [{kind: InferenceWorkerSet, name: nope}]\n  policyRef: {name: missing}\n")
    p = kinfctl("lint", str(good))
    assert p.returncode == 0 and "1 pool with problems (default/bad)" in p.stdout, p.stdout
    assert kinfctl("lint", "--strict", str(good)).returncode == 2
    (good / "bad-pool.yaml").unlink()
    p = kinfctl("lint", "--strict", str(good))
    assert p.returncode == 0 and "with problems" not in p.stdout, p.stdout


def test_manifest_error_exits_1_naming_document_and_path(good: Path) -> None:
    (good / "broken.yaml").write_text(
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {name: broken}\n"
        "spec:\n  rules:\n    - name: r\n      route: {exclude: []}\n")
    p = kinfctl("lint", str(good))
    assert p.returncode == 1
    assert f"error: {good / 'broken.yaml'}#1 (InferencePolicy default/broken) at spec.rules[0].route (line 7): " \
           "missing required field `select`" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr
    # --strict does not hide an error behind exit 2
    assert kinfctl("lint", "--strict", str(good)).returncode == 1


def test_a_document_warning_names_its_file_like_an_error(good: Path) -> None:
    """User trial: an UnknownField warning of a worker set named no file and
    offered no field; it now reads as an error does (file#N (Kind ns/name))."""
    (good / "fleet.yaml").write_text(FLEET.replace("selector: {matchLabels: {app: gemma}}",
                                                   "selector: {matchLabels: {app: gemma}}\n  prot: 8000", 1))
    p = kinfctl("lint", str(good))
    assert p.returncode == 0, p.stdout
    assert f"warning UnknownField: {good / 'fleet.yaml'}#1 (InferenceWorkerSet default/gemma-4-12b) at spec.prot: " \
           "'prot' is not a field of `spec` of InferenceWorkerSet; the API server drops it; did you mean `port`?" in p.stdout


def test_stdin_and_missing_files() -> None:
    p = kinfctl("lint", "-", stdin=(SEEDS / "001-guide-policy-3.yaml").read_text())
    assert p.returncode == 0 and "InferencePolicy default/policy-3: NotReferenced" in p.stdout
    p = kinfctl("lint", "/no/such/file.yaml")
    assert p.returncode == 1 and "no such file or directory" in p.stdout
    assert "Traceback" not in p.stderr


def test_garbage_input_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_bytes(b"\xff\xfe\x00garbage: [")
    p = kinfctl("lint", str(tmp_path / "x.yaml"))
    assert p.returncode == 1 and "Traceback" not in p.stdout + p.stderr
    assert "cannot read" in p.stdout


@pytest.mark.parametrize("args", [[], ["lint"], ["get"], ["explode"], ["lint", "--output", "xml", "f"]])
def test_usage_errors_exit_1_with_usage(args: list[str]) -> None:
    p = kinfctl(*args)
    assert p.returncode == 1
    assert "usage: kinfctl" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("command", ["lint", "get"])
def test_help_on_every_command(command: str) -> None:
    p = kinfctl(command, "--help")
    assert p.returncode == 0 and f"usage: kinfctl {command}" in p.stdout


def test_get_prints_the_seeds_printer_columns(good: Path) -> None:
    p = kinfctl("get", "policies", "-f", str(good))
    assert p.returncode == 0, p.stderr
    header, row = p.stdout.splitlines()
    assert header.split() == ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"]
    assert row.split() == ["my-policy", "1", "Accepted", "ServeLocal", "<unknown>"]
    p = kinfctl("get", "infpools", "-f", str(good))
    header, row = p.stdout.splitlines()
    assert header.split() == ["NAME", "POLICY", "DESTINATIONS", "STATE", "AGE"]
    assert row.split() == ["inference-all", "my-policy", "3", "Accepted", "<unknown>"]
    p = kinfctl("get", "providers", "-f", str(good))
    assert p.stdout.splitlines()[0].split() == ["NAME", "URL", "MODELS", "READY", "AGE"]
    assert p.stdout.splitlines()[1].split()[3] == "True"
    p = kinfctl("get", "workersets", "-f", str(good))
    assert p.stdout.splitlines()[0].split() == ["NAME", "MODEL", "READY", "AGE"]


def test_get_without_f_or_cluster_says_what_to_do(tmp_path: Path) -> None:
    p = subprocess.run([*KINFCTL, "get", "pools"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 1 and "-f MANIFESTS" in p.stderr and "Traceback" not in p.stderr


def test_age_is_kubectls() -> None:
    from datetime import UTC, datetime

    from kinfctl.output import age

    now = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    assert age("2026-11-29T11:59:30Z", now) == "30s"
    assert age("2026-11-29T11:48:00Z", now) == "12m"
    assert age("2026-11-29T09:00:00Z", now) == "3h"
    assert age("2026-11-26T12:00:00Z", now) == "3d"
    assert age(None, now) == "<unknown>"
