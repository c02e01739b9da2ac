"""The CRDs under deploy/k8s/crds: generated from the code's types (never
drifting), structural as Kubernetes requires, with the seeds' printer columns,
and accepting every seed example while rejecting what the schema forbids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from kinference_common import crds

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "k8s" / "crds"
SEEDS = REPO / "tests" / "compiler" / "seed_manifests"


def load_crds() -> dict[str, dict[str, Any]]:
    out = {}
    for path in CRD_DIR.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text())
        kind = doc["spec"]["names"]["kind"]
        out[kind if doc["spec"]["group"] == "kinference.buoyant.io" else f"{kind}.{doc['spec']['group']}"] = doc
    return out


def test_committed_crds_equal_a_fresh_generation() -> None:
    for entry in crds.KINDS:
        committed = (CRD_DIR / entry.get("file", f"{entry['plural']}.yaml")).read_text()
        assert committed == crds.render(entry), f"regenerate: python -m kinference_common.crds {CRD_DIR}"


def walk(node: dict[str, Any], path: str) -> list[str]:
    """Structural-schema violations: a node with neither type nor preserve-unknown-fields."""
    bad = []
    if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        bad.append(path)
    for key, sub in node.get("properties", {}).items():
        bad += walk(sub, f"{path}.{key}")
    if "items" in node:
        bad += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        bad += walk(node["additionalProperties"], f"{path}{{}}")
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf"):
        if forbidden in node:
            bad.append(f"{path} uses {forbidden}")
    return bad


@pytest.mark.parametrize("kind", ["InferencePolicy", "InferencePool", "InferenceWorkerSet", "InferenceProvider"])
def test_structural_with_status_short_names_and_columns(kind: str) -> None:
    crd = load_crds()[kind]
    version = crd["spec"]["versions"][0]
    assert walk(version["schema"]["openAPIV3Schema"], "") == []
    assert version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority")]
    expected = {
        "InferencePolicy": ["RULES", "STATE", "UNMATCHED", "AGE"],
        "InferencePool": ["POLICY", "DESTINATIONS", "STATE", "AGE"],
        "InferenceWorkerSet": ["MODEL", "READY", "AGE"],
        "InferenceProvider": ["URL", "MODELS", "READY", "AGE"],
    }[kind]
    assert columns == expected  # NAME is always first in kubectl
    wide = [c["name"].upper() for c in version["additionalPrinterColumns"] if c.get("priority")]
    assert wide == (["WARNINGS", "MESSAGE"] if kind == "InferencePolicy" else [])
    assert crd["spec"]["names"]["shortNames"] == [
        {"InferencePolicy": "infpol", "InferencePool": "infpool", "InferenceWorkerSet": "infws",
         "InferenceProvider": "infprov"}[kind]]


def validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(load_crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("example", sorted(p.name for p in SEEDS.glob("*.yaml")))
def test_seed_examples_pass_the_schema(example: str) -> None:
    for doc in yaml.safe_load_all((SEEDS / example).read_text()):
        errors = list(validator(doc["kind"]).iter_errors(doc))
        assert errors == [], [e.message for e in errors]


def test_schema_rejects_what_the_compiler_rejects() -> None:
    v = validator("InferencePolicy")
    bad = {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy", "metadata": {"name": "p"},
           "spec": {"unmatched": "Maybe", "rules": [{"name": "r", "route": {"exclude": []}}]}}
    messages = sorted(e.message for e in v.iter_errors(bad))
    assert any("'select' is a required property" in m for m in messages)
    assert any("'Maybe' is not one of" in m for m in messages)


def test_the_unmatched_column_has_a_default_to_show() -> None:
    spec = load_crds()["InferencePolicy"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["unmatched"]["default"] == "ServeLocal"


GIE_POOL = "InferencePool.inference.networking.k8s.io"


def test_the_inference_extension_pool_crd_has_the_v1_api_fields() -> None:
    crd = load_crds()[GIE_POOL]
    assert crd["metadata"]["name"] == "inferencepools.inference.networking.k8s.io"
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1" and version["subresources"] == {"status": {}}
    root = version["schema"]["openAPIV3Schema"]
    assert walk(root, "") == []
    spec = root["properties"]["spec"]
    assert set(spec["properties"]) == {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    assert spec["required"] == ["selector", "targetPorts"]
    epp = spec["properties"]["endpointPickerRef"]
    assert epp["properties"]["failureMode"]["default"] == "FailClose"
    assert epp["properties"]["kind"]["default"] == "Service"
    parents = root["properties"]["status"]["properties"]["parents"]
    assert parents["maxItems"] == 32 and parents["items"]["properties"]["conditions"]["maxItems"] == 8
    # `kubectl get infpool` stays Kinference's pool
    assert "shortNames" not in crd["spec"]["names"]


def test_the_inference_extension_pool_schema_checks_a_pool() -> None:
    v = jsonschema.Draft7Validator(load_crds()[GIE_POOL]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    good = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "x"},
            "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}}
    assert list(v.iter_errors(good)) == []
    for bad in ({"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]},
                {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []},
                {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]},
                {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 1}],
                 "endpointPickerRef": {"name": "e", "failureMode": "Sometimes"}}):
        assert list(v.iter_errors({**good, "spec": bad})), bad


def test_a_crd_of_a_protected_group_carries_the_api_approval_annotation() -> None:
    """HA trial, reading Kubernetes' rules: a CRD whose group ends in .k8s.io
    (the Inference Extension's InferencePool) is refused by the API server
    without `api-approved.kubernetes.io` (a URL, or a value starting with
    "unapproved"), and every documented apply carried it. Kinference's own
    group needs none."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        group = doc["spec"]["group"]
        annotations = doc["metadata"].get("annotations") or {}
        if group.endswith(".k8s.io") or group.endswith(".kubernetes.io"):
            value = annotations.get("api-approved.kubernetes.io", "")
            assert value.startswith(("unapproved", "https://")), (path.name, value)
        else:
            assert "api-approved.kubernetes.io" not in annotations, path.name
