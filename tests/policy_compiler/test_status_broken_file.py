"""Local mode: a broken manifest keeps its last good version in force, and the
status files of its objects say so (they no longer read as plainly Accepted)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from kinference_common.compiler import compile_documents
from kinference_policy_compiler.source import DirectorySource
from kinference_policy_compiler.statuses import StatusDirectory

REPO = Path(__file__).resolve().parents[2]


def _pass(source: DirectorySource, statuses: StatusDirectory) -> None:
    source.poll()
    res = compile_documents(source.documents())
    statuses.write(res, [*source.errors(), *res.errors], source.documents())


def test_a_broken_file_is_reported_in_its_objects_status(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    source, statuses = DirectorySource(manifests), StatusDirectory(tmp_path / "status")
    _pass(source, statuses)
    policy_file = next(p for p in manifests.iterdir() if "kind: InferencePolicy" in p.read_text())
    name = yaml.safe_load(policy_file.read_text())["metadata"]["name"]
    status_file = tmp_path / "status" / "InferencePolicy" / "default" / f"{name}.yaml"

    def conditions() -> dict[str, dict]:
        return {c["type"]: c for c in yaml.safe_load(status_file.read_text())["status"]["conditions"]}

    assert set(conditions()) == {"Accepted"}
    good = policy_file.read_text()
    policy_file.write_text(good.replace("rules:", "rules: 7\n  oops:", 1))  # breaks a schema rule
    _pass(source, statuses)
    c = conditions()
    assert c["Accepted"]["status"] == "True"  # its last good version is in force
    assert c["ManifestValid"]["status"] == "False" and c["ManifestValid"]["reason"] == "InvalidManifest"
    assert policy_file.name in c["ManifestValid"]["message"]
    policy_file.write_text(good)  # fixed: the condition goes
    _pass(source, statuses)
    assert set(conditions()) == {"Accepted"}
