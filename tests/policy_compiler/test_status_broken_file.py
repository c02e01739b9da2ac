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


def test_a_restarted_compiler_keeps_the_transition_times_and_removes_what_went_meanwhile(tmp_path: Path) -> None:
    """A compiler restarted (kill -9) wrote every status again with a new
    ``lastTransitionTime`` although no condition had changed; it now reads
    what the directory holds first, as the Kubernetes writer reads the
    cluster."""
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    source = DirectorySource(manifests)
    source.poll()
    res = compile_documents(source.documents(), now="2026-01-01T00:00:00Z")
    StatusDirectory(tmp_path / "status").write(res, res.errors, source.documents())
    files = sorted((tmp_path / "status").glob("*/*/*.yaml"))
    assert files
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files}
    gone = tmp_path / "status" / "InferencePolicy" / "default" / "deleted-while-down.yaml"
    gone.write_text(yaml.safe_dump({"status": {"conditions": []}}))

    restarted = StatusDirectory(tmp_path / "status")
    res = compile_documents(source.documents(), now="2026-02-02T00:00:00Z")
    restarted.write(res, res.errors, source.documents())
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == before  # not even rewritten
    assert not gone.exists()
    times = {c["lastTransitionTime"] for p in files
             for c in yaml.safe_load(p.read_text())["status"].get("conditions", [])}
    assert times == {"2026-01-01T00:00:00Z"}


def test_the_directory_read_leaves_other_files_alone_and_gie_pools_keep_their_times(tmp_path: Path) -> None:
    """Only the kinds the compiler writes are read back: a file of another
    kind saved there stays; an unreadable status file of an object gone is
    removed. An Inference Extension pool's parents (its only conditions)
    keep their ``lastTransitionTime`` across compiles and restarts."""
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    for name in ("pool.yaml", "httproute.yaml"):
        shutil.copy(REPO / "deploy" / "k8s" / "overlays" / "gateway" / name, manifests / f"30-gateway-{name}")
    (manifests / "30-gateway.yaml").write_text(yaml.safe_dump({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "inference-gateway", "namespace": "default"}, "spec": {"gatewayClassName": "eg"}}))
    status = tmp_path / "status"
    foreign = status / "exports" / "prod" / "deployment.yaml"
    foreign.parent.mkdir(parents=True)
    foreign.write_text(yaml.safe_dump({"kind": "Deployment", "status": {"replicas": 3}}))
    broken = status / "InferencePolicy" / "default" / "gone.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("status: [unclosed")
    source = DirectorySource(manifests)
    source.poll()

    def compile_at(now: str) -> None:
        res = compile_documents(source.documents(), now=now)
        statuses.write(res, res.errors, source.documents())

    def gie_times() -> set[str]:
        body = yaml.safe_load((status / "InferencePool.inference.networking.k8s.io" / "default" / "qwen.yaml")
                              .read_text())
        return {c["lastTransitionTime"] for p in body["status"]["parents"] for c in p["conditions"]}

    statuses = StatusDirectory(status)
    compile_at("2026-01-01T00:00:00Z")
    assert foreign.exists() and not broken.exists()
    assert gie_times() == {"2026-01-01T00:00:00Z"}
    compile_at("2026-01-02T00:00:00Z")  # the same process
    assert gie_times() == {"2026-01-01T00:00:00Z"}
    statuses = StatusDirectory(status)  # restarted
    compile_at("2026-01-03T00:00:00Z")
    assert gie_times() == {"2026-01-01T00:00:00Z"}
    assert foreign.exists()
