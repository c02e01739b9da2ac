"""The policy compiler refuses a policy with an unknown field inside a
predicate as it refuses any invalid manifest: the last good version stays in
force and the policy's status says so (``ManifestValid=False``), the same
verdict ``kinfctl lint`` gives (user trial: ``queuedPrompt`` in a drop would
otherwise drop every local pod and burst everything to the provider)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from kinference_common.compiler import compile_documents
from kinference_common.kube import kinds
from kinference_policy_compiler.kube_source import KubernetesSource
from kinference_policy_compiler.source import DirectorySource
from kinference_policy_compiler.statuses import StatusDirectory

REPO = Path(__file__).resolve().parents[2]


def _pass(source: DirectorySource, statuses: StatusDirectory):  # type: ignore[no-untyped-def]
    source.poll()
    res = compile_documents(source.documents())
    statuses.write(res, [*source.errors(), *res.errors], source.documents())
    return res


def test_a_predicate_typo_keeps_the_last_good_policy(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    source, statuses = DirectorySource(manifests), StatusDirectory(tmp_path / "status")
    res = _pass(source, statuses)
    policy_file = manifests / "10-burst-policy.yaml"
    status_file = tmp_path / "status" / "InferencePolicy" / "default" / "burst-unless-pii.yaml"

    def conditions() -> dict[str, dict]:
        return {c["type"]: c for c in yaml.safe_load(status_file.read_text())["status"]["conditions"]}

    def exclusions(res) -> list[str]:  # type: ignore[no-untyped-def]
        return [e.name for e in res.pools[("default", "inference-all")].policy.rules[0].exclude]

    good = exclusions(res)
    assert "drop-local-endpoints-with-big-queues" in good and set(conditions()) == {"Accepted"}

    policy_file.write_text(policy_file.read_text().replace("queuedPrompts:", "queuedPrompt:"))
    res = _pass(source, statuses)
    [err] = source.errors()
    assert err.path == "spec.rules[0].route.exclude[0].drop.queuedPrompt"
    assert exclusions(res) == good  # the last good version is in force, not a widened drop
    c = conditions()
    assert c["ManifestValid"]["status"] == "False" and c["ManifestValid"]["reason"] == "InvalidManifest"
    assert "queuedPrompt" in c["ManifestValid"]["message"]
    # the first condition (kubectl get's MESSAGE column) says it too (user trial: it read "in force on ...")
    first = yaml.safe_load(status_file.read_text())["status"]["conditions"][0]
    assert first["type"] == "Accepted" and "WARNING: a manifest of it is refused" in first["message"]
    policy_file.write_text(policy_file.read_text().replace("queuedPrompt:", "queuedPrompts:"))
    _pass(source, statuses)
    assert set(conditions()) == {"Accepted"} and "refused" not in conditions()["Accepted"]["message"]


def test_an_object_from_the_api_server_is_refused_the_same_way() -> None:
    """Kubernetes mode decodes each object as a file's document. (A real API
    server prunes unknown fields at admission, so the compiler sees one only
    from a server that keeps them, such as the tests' fake one.)"""
    doc = yaml.safe_load((REPO / "deploy" / "examples" / "10-burst-policy.yaml").read_text())
    doc["spec"]["rules"][0]["route"]["exclude"][0]["drop"]["queuedPrompt"] = \
        doc["spec"]["rules"][0]["route"]["exclude"][0]["drop"].pop("queuedPrompts")
    decoded = KubernetesSource._decode(kinds.INFERENCE_POLICY, "default", "burst-unless-pii", "1", doc)
    [err] = decoded.errors
    assert err.path == "spec.rules[0].route.exclude[0].drop.queuedPrompt"


def test_a_second_definition_refused_is_not_called_a_broken_file(tmp_path: Path) -> None:
    """Review: the policy in force, whose own file is fine, was told "the
    file's current version is broken, its last good version stays in force"
    when another file defined it too."""
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "deploy" / "examples", manifests)
    source, statuses = DirectorySource(manifests), StatusDirectory(tmp_path / "status")
    _pass(source, statuses)
    (manifests / "05-other.yaml").write_text(
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\n"
        "metadata: {name: burst-unless-pii, namespace: default}\n"
        "spec: {rules: [{name: all-out, route: {select: [{type: Provider}]}}]}\n")
    res = _pass(source, statuses)
    assert [r.name for r in res.pools[("default", "inference-all")].policy.rules] == [
        "local-first-then-provider-unless-pii"]
    status = yaml.safe_load((tmp_path / "status" / "InferencePolicy" / "default" / "burst-unless-pii.yaml")
                            .read_text())["status"]
    c = {x["type"]: x for x in status["conditions"]}
    assert c["ManifestValid"]["message"].startswith("another file defines it too, and that definition is refused")
    assert "05-other.yaml" in c["ManifestValid"]["message"] and "broken" not in c["ManifestValid"]["message"]
    assert status["conditions"][0]["message"].endswith("WARNING: a manifest of it is refused (ManifestValid=False "
                                                       "says which and why)")
