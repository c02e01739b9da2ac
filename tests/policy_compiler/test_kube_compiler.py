"""The policy compiler in Kubernetes mode (--source kubernetes) against the
fake API server (real kubernetes_asyncio client) and a real nats-server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest

from kinference_common import subjects
from kinference_common.compiled import decode_pool
from kinference_common.compiler import compile_paths
from kinference_common.kube.rbac import not_allowed

from .conftest import eventually, load_docs

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "tests" / "compiler" / "seed_manifests"
EXAMPLES = REPO / "deploy" / "examples"
G = "kinference.buoyant.io"

#: pools, routes, grants and the Inference Extension's kinds together: a
#: cross-namespace destination with and without a ReferenceGrant, an
#: HTTPRoute naming the pool, objectives and rewrites in both groups.
MIXED = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, namespace: models}
spec: {model: {name: qwen-2.5}, selector: {matchLabels: {app: qwen}}, port: 8000}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: gemma, namespace: private}
spec: {model: {name: gemma-4}, selector: {matchLabels: {app: gemma}}, port: 8000}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: pools-may-use-workers, namespace: models}
spec:
  from: [{group: kinference.buoyant.io, kind: InferencePool, namespace: team}]
  to: [{group: kinference.buoyant.io, kind: InferenceWorkerSet}]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: shared, namespace: team}
spec:
  destinations:
    - {kind: InferenceWorkerSet, name: qwen, namespace: models}
    - {kind: InferenceWorkerSet, name: gemma, namespace: private}
  policyRef: {name: team-policy}
  surprise: field
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: team-policy, namespace: team}
spec:
  rules:
    - name: all
      route:
        select: [{type: Local, minimize: PredictedTTFT}]
    - name: all
      route:
        select: [{type: Local, minimize: QueuedPrompts}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: chat, namespace: team}
spec:
  parentRefs: [{group: gateway.networking.k8s.io, kind: Gateway, name: edge, namespace: infra}]
  hostnames: [chat.example.com]
  rules: [{backendRefs: [{group: kinference.buoyant.io, kind: InferencePool, name: shared}]}]
---
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: team}
spec: {priority: 10, poolRef: {group: kinference.buoyant.io, kind: InferencePool, name: shared}}
---
apiVersion: llm-d.ai/v1alpha2
kind: InferenceModelRewrite
metadata: {name: mixed-weights, namespace: team}
spec:
  poolRef: {group: kinference.buoyant.io, kind: InferencePool, name: shared}
  rules:
    - matches: [{model: {type: Exact, value: qwen}}]
      targets: [{modelRewrite: qwen-2.5, weight: 50}, {modelRewrite: gemma-4}]
"""


def normalize(status: dict[str, Any]) -> dict[str, Any]:
    """Drop what differs between a file and a cluster by nature: times, and
    the generation a file does not have."""
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("lastTransitionTime", "observedGeneration")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(status)


def lint_json(path: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "kinfctl", "lint", "-o", "json", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def expected_from_lint(lint: dict[str, Any]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    out = {}
    for section, group, kind in (("policies", G, "InferencePolicy"), ("pools", G, "InferencePool"),
                                 ("objectives", None, "InferenceObjective"),
                                 ("rewrites", None, "InferenceModelRewrite")):
        for e in lint[section]:
            out[(e.get("group", group), kind, e["namespace"], e["name"])] = normalize(e["status"])
    return out


def cluster_statuses(kube_api, keys) -> dict[tuple[str, str, str, str], dict[str, Any] | None]:
    out = {}
    for (group, kind, ns, name) in keys:
        obj = kube_api.get(group, kind, ns, name)
        out[(group, kind, ns, name)] = normalize(obj["status"]) if obj and "status" in obj else None
    return out


@pytest.mark.nats
@pytest.mark.parametrize("case", [*[p.name for p in sorted(SEEDS.glob("*.yaml"))], "deploy/examples", "mixed"])
async def test_cluster_statuses_equal_kinfctl_lint(case, kube_api, kube_compiler, nats_server, tmp_path):
    if case == "mixed":
        path = tmp_path / "mixed.yaml"
        path.write_text(MIXED)
    elif case == "deploy/examples":
        path = EXAMPLES
    else:
        path = SEEDS / case
    for doc in load_docs(path):
        kube_api.apply(doc)
    expected = expected_from_lint(lint_json(path))
    assert expected, "the case has statuses to compare"
    mode = await kube_compiler()
    await eventually(lambda: cluster_statuses(kube_api, expected) == expected, what="statuses equal to lint's")

    # the same pools are published as from files: same KV keys, same content
    # (but for the policy's generation, which a file does not have)
    def comparable(pool: Any) -> bytes:
        policy = msgspec.structs.replace(pool.policy, generation=None)
        return msgspec.json.encode(msgspec.structs.replace(pool, revision="", policy=policy))

    from_files = compile_paths([path]).pools
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)

        async def published() -> dict[str, bytes]:
            out = {}
            for key in await kv.keys():
                out[key] = comparable(decode_pool((await kv.get(key)).value))
            return out
        want = {f"{ns}.{name}": comparable(p) for (ns, name), p in from_files.items()}
        got: dict[str, bytes] = {}
        for _ in range(100):
            try:
                got = await published()
            except Exception:  # no keys yet
                got = {}
            if got == want:
                break
            await asyncio.sleep(0.05)
        assert got == want
    finally:
        await nc.close()

    # conditions carry the cluster's generation
    for (group, kind, ns, name) in expected:
        obj = kube_api.get(group, kind, ns, name)
        gens = {c.get("observedGeneration") for c in obj["status"].get("conditions", [])}
        assert gens == {obj["metadata"]["generation"]}
    assert not_allowed("policy-compiler", kube_api.used("compiler-a")) == []
    assert mode.service is not None and mode.service.reconciles >= 1


@pytest.mark.nats
async def test_statuses_follow_edits_and_keep_transition_times(kube_api, kube_compiler, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)
    await kube_compiler()

    def pool():
        return kube_api.get(G, "InferencePool", "team", "shared")["status"]

    def policy():
        return kube_api.get(G, "InferencePolicy", "team", "team-policy")["status"]

    await eventually(lambda: policy()["state"] == "Accepted" and pool()["state"] == "Accepted,UnresolvedDestinations")
    assert pool()["unresolvedDestinations"][0]["reason"] == "CrossNamespaceNotGranted"
    assert pool()["parents"] == []  # the HTTPRoute's Gateway edge does not exist: nothing accepted the pool there
    accepted_at = next(c for c in pool()["conditions"] if c["type"] == "Accepted")["lastTransitionTime"]

    # the pool's policyRef patched to a policy that does not exist
    kube_api._patch(kube_api.rtype(G, "InferencePool"), "team", "shared",
                    {"spec": {"policyRef": {"name": "missing"}}}, status=False)
    await eventually(lambda: "PolicyNotFound" in pool()["state"] and policy()["state"] == "NotReferenced")
    st = pool()
    accepted = next(c for c in st["conditions"] if c["type"] == "Accepted")
    resolved = next(c for c in st["conditions"] if c["type"] == "ResolvedRefs")
    assert accepted["lastTransitionTime"] == accepted_at  # Accepted stayed True
    assert resolved["status"] == "False" and resolved["observedGeneration"] == 2

    # the policy edited: two rules now
    obj = kube_api.get(G, "InferencePolicy", "team", "team-policy")
    obj["spec"]["rules"].append({"name": "second", "route": {"select": [{"type": "Local"}]}})
    kube_api.apply(obj)
    await eventually(lambda: policy()["ruleCount"] == 2)
    assert policy()["conditions"][0]["observedGeneration"] == 2

    # a grant for the private namespace: the destination resolves
    kube_api.apply({"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
                    "metadata": {"name": "g", "namespace": "private"},
                    "spec": {"from": [{"group": G, "kind": "InferencePool", "namespace": "team"}],
                             "to": [{"group": G, "kind": "InferenceWorkerSet"}]}})
    await eventually(lambda: pool()["destinationCount"] == 2 and not pool()["unresolvedDestinations"])

    # warnings became deduplicated Events on the objects they concern
    events = kube_api.list("events.k8s.io", "Event", "team")
    reasons = {(e["regarding"]["kind"], e["reason"]) for e in events}
    assert ("InferencePolicy", "DuplicateRuleName") in reasons
    assert ("InferencePool", "UnknownField") in reasons
    assert ("InferenceModelRewrite", "InvalidWeights") in reasons
    assert ("InferencePool", "PolicyNotFound") in reasons
    keys = [(e["regarding"]["name"], e["reason"], e["note"]) for e in events]
    assert len(keys) == len(set(keys))


@pytest.mark.nats
async def test_namespace_scope(kube_api, kube_compiler, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)
    outside = {"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy",
               "metadata": {"name": "elsewhere", "namespace": "other"}, "spec": {"rules": []}}
    kube_api.apply(outside)
    await kube_compiler(namespaces=["team"])
    await eventually(lambda: (kube_api.get(G, "InferencePool", "team", "shared").get("status") or {}).get("state"))
    st = kube_api.get(G, "InferencePool", "team", "shared")["status"]
    # the router does not watch models/ or private/: both destinations are out of reach
    assert {u["reason"] for u in st["unresolvedDestinations"]} == {"CrossNamespaceNotGranted"}
    assert "status" not in kube_api.get(G, "InferencePolicy", "other", "elsewhere")
    assert {r.namespace for r in kube_api.requests if r.who == "compiler-a" and r.verb in ("list", "watch")
            and r.resource not in ("leases", "gatewayclasses")} == {"team"}  # GatewayClass is cluster-scoped


@pytest.mark.nats
async def test_runs_without_the_optional_crds(kube_api, kube_compiler):
    """A cluster without the Gateway API or the Inference Extension CRDs:
    those kinds count as empty; everything else is compiled and written."""
    for group in ("gateway.networking.k8s.io", "inference.networking.x-k8s.io", "llm-d.ai"):
        kube_api.unserve(group)
    for doc in load_docs(EXAMPLES):
        kube_api.apply(doc)
    mode = await kube_compiler()
    await eventually(lambda: (kube_api.get(G, "InferencePool", "default", "inference-all").get("status") or {})
                     .get("state") == "Accepted")
    assert mode.source is not None
    assert {str(k) for k, i in mode.source.informers.items() if i.missing} == {
        "httproutes.gateway.networking.k8s.io", "referencegrants.gateway.networking.k8s.io",
        "gateways.gateway.networking.k8s.io", "gatewayclasses.gateway.networking.k8s.io",
        "inferenceobjectives.inference.networking.x-k8s.io", "inferenceobjectives.llm-d.ai",
        "inferencemodelrewrites.inference.networking.x-k8s.io", "inferencemodelrewrites.llm-d.ai"}


async def test_a_refused_generation_says_so_in_the_status(kube_api, kube_compiler, tmp_path):
    """A generation that does not decode keeps the last good one in force and
    is named in the status (ManifestValid=False), not only in an Event."""
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)
    await kube_compiler()

    def policy():
        return kube_api.get(G, "InferencePolicy", "team", "team-policy")["status"]

    await eventually(lambda: policy()["state"] == "Accepted")
    assert "ManifestValid" not in {c["type"] for c in policy()["conditions"]}
    kube_api._patch(kube_api.rtype(G, "InferencePolicy"), "team", "team-policy",
                    {"spec": {"rules": 7}}, status=False)

    def refused():
        return next((c for c in policy()["conditions"] if c["type"] == "ManifestValid"), None)

    await eventually(lambda: refused() is not None)
    c = refused()
    assert c["status"] == "False" and c["reason"] == "InvalidManifest" and c["observedGeneration"] == 2
    assert "generation 2 refused" in c["message"] and policy()["ruleCount"] == 1  # the last good one
    assert "WARNING: a manifest of it is refused" in policy()["conditions"][0]["message"]  # MESSAGE column
