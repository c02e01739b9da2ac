"""``kinfctl lint`` refuses what a cluster would refuse or what would widen a
policy (user trial): a typo inside a predicate, a kind or version Kinference
does not serve, a key written twice. Exit 1, the file and the path named,
no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
KINFCTL = [sys.executable, "-m", "kinfctl"]


def kinfctl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KINFCTL, *args], input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path / "examples"


def test_the_examples_lint_clean() -> None:
    p = kinfctl("lint", "--strict", str(EXAMPLES))
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_typo_in_a_drop_fails_the_lint(examples: Path) -> None:
    policy = examples / "10-burst-policy.yaml"
    policy.write_text(policy.read_text().replace("queuedPrompts:", "queuedPrompt:"))
    p = kinfctl("lint", str(examples))
    assert p.returncode == 1, p.stdout
    assert (f"error: {policy}#1 (InferencePolicy default/burst-unless-pii) at "
            "spec.rules[0].route.exclude[0].drop.queuedPrompt (line 14): `queuedPrompt` is not a field of an exclusion's "
            "`drop`: ignoring it would widen the predicate") in p.stdout
    assert "did you mean `queuedPrompts`?" in p.stdout
    assert "warning UnknownField" not in p.stdout
    assert "Traceback" not in p.stdout + p.stderr
    assert p.stdout.rstrip().endswith("0 policies, 1 pool: 1 error, 0 warnings, 1 pool with problems (default/inference-all)")


def test_a_typo_in_a_pii_condition_fails_the_lint(examples: Path) -> None:
    policy = examples / "10-burst-policy.yaml"
    policy.write_text(policy.read_text().replace("if: { tag:", "if: { tags:"))
    p = kinfctl("lint", "-o", "json", str(examples))
    assert p.returncode == 1
    assert '"path": "spec.rules[0].route.exclude[2].if.tags"' in p.stdout


def test_an_unknown_field_anywhere_in_a_policy_is_an_error(examples: Path) -> None:
    # `exlude` would drop every exclusion of the rule, the PII one included
    policy = examples / "10-burst-policy.yaml"
    policy.write_text(policy.read_text().replace("exclude:", "exlude:", 1))
    p = kinfctl("lint", str(examples))
    assert p.returncode == 1, p.stdout
    assert "at spec.rules[0].route.exlude" in p.stdout and "did you mean `exclude`?" in p.stdout


def test_an_unknown_field_of_another_kind_stays_a_warning(examples: Path) -> None:
    pool = examples / "20-pool.yaml"
    pool.write_text(pool.read_text().replace("spec:\n", "spec:\n  replicas: 3\n", 1))
    p = kinfctl("lint", str(examples))
    assert p.returncode == 0, p.stdout
    assert "UnknownField" in p.stdout and "replicas" in p.stdout
    assert kinfctl("lint", "--strict", str(examples)).returncode == 2


@pytest.mark.parametrize(
    ("api_version", "kind", "words"),
    [("kinference.buoyant.io/v1alpha1", "InferencePolicyy",
      "at kind (line 4): kinference.buoyant.io defines no kind `InferencePolicyy`"),
     ("kinference.buoyant.io/v1alpha1", "inferencepolicy", "did you mean `InferencePolicy`?"),
     ("kinference.buoyant.io/v1", "InferencePolicy",
      "at apiVersion (line 3): kinference.buoyant.io serves InferencePolicy in version v1alpha1 only, not v1")],
)
def test_a_kind_or_version_we_do_not_serve_fails_the_lint(api_version: str, kind: str, words: str) -> None:
    text = (EXAMPLES / "10-burst-policy.yaml").read_text()
    text = text.replace("apiVersion: kinference.buoyant.io/v1alpha1", f"apiVersion: {api_version}")
    text = text.replace("kind: InferencePolicy", f"kind: {kind}")
    p = kinfctl("lint", "-", stdin=text)
    assert p.returncode == 1, p.stdout
    assert "error: <stdin>#1" in p.stdout and words in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


def test_a_duplicate_key_fails_the_lint(examples: Path) -> None:
    pool = examples / "20-pool.yaml"
    pool.write_text(pool.read_text() + "metadata: {name: other, namespace: default}\n")
    p = kinfctl("lint", str(examples))
    assert p.returncode == 1
    assert f"error: {pool}: not valid YAML: line" in p.stdout and "duplicate key `metadata`" in p.stdout
    # the concatenation the trial ran: two documents merged into one, every key twice
    cat = "".join(f.read_text() for f in sorted(EXAMPLES.glob("*.yaml")))
    p = kinfctl("lint", "-", stdin=cat)
    assert p.returncode == 1 and "duplicate key `apiVersion`" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


def test_input_with_no_kinference_manifest_is_said_so() -> None:
    p = kinfctl("lint", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert p.returncode == 1
    assert "no Kinference manifests found in -" in p.stderr and "Traceback" not in p.stderr

