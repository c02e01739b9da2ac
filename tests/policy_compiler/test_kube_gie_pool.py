"""An Inference Extension InferencePool (inference.networking.k8s.io/v1) in
Kubernetes mode, against the fake API server and a real nats-server: it is
published under the same KV key as a Kinference pool, its parents[] entries
follow the Gateways that exist, its ResolvedRefs follows the EPP Service,
and another controller's entries are never touched."""

from __future__ import annotations

from typing import Any

import nats
import pytest

from kinference_common import subjects
from kinference_common.compiled import decode_pool

from .conftest import eventually

GIE = "inference.networking.k8s.io"
GW = "gateway.networking.k8s.io"
OTHER = {"parentRef": {"group": GW, "kind": "Gateway", "name": "gw", "namespace": "default"},
         "controllerName": "gateway.envoyproxy.io/gatewayclass-controller",
         "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                         "lastTransitionTime": "2026-12-01T00:00:00Z"}]}

OBJECTS: list[dict[str, Any]] = [
    {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceWorkerSet",
     "metadata": {"name": "qwen", "namespace": "default"},
     "spec": {"model": {"name": "qwen-2.5"}, "selector": {"matchLabels": {"app": "qwen", "tier": "a"}},
              "port": 8000}},
    {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceWorkerSet",
     "metadata": {"name": "gemma", "namespace": "default"},
     "spec": {"model": {"name": "gemma-4"}, "selector": {"matchLabels": {"app": "gemma"}}, "port": 8000}},
    {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy",
     "metadata": {"name": "p", "namespace": "default"},
     "spec": {"rules": [{"name": "all", "route": {"select": [{"type": "Local"}]}}]}},
    {"apiVersion": f"{GW}/v1", "kind": "GatewayClass", "metadata": {"name": "eg"},
     "spec": {"controllerName": "gateway.envoyproxy.io/gatewayclass-controller"}},
    {"apiVersion": f"{GW}/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "default"},
     "spec": {"gatewayClassName": "eg"}},
    {"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "llm", "namespace": "default"},
     "spec": {"parentRefs": [{"name": "gw"}, {"name": "ghost"}],
              "rules": [{"backendRefs": [{"group": GIE, "kind": "InferencePool", "name": "llm"}]}]}},
    {"apiVersion": f"{GIE}/v1", "kind": "InferencePool",
     "metadata": {"name": "llm", "namespace": "default", "annotations": {"kinference.buoyant.io/policy": "p"}},
     "spec": {"selector": {"matchLabels": {"app": "qwen"}}, "targetPorts": [{"number": 8000}],
              "endpointPickerRef": {"name": "kinference-epp", "port": {"number": 9002}, "failureMode": "FailOpen"}}},
]


@pytest.mark.nats
async def test_gie_pool_published_and_its_parents_told_truthfully(kube_api, kube_compiler, nats_server):
    for obj in OBJECTS:
        kube_api.apply(obj)
    # another controller already wrote its entry for Gateway gw
    kube_api._patch(kube_api.rtype(GIE, "InferencePool"), "default", "llm",
                    {"status": {"parents": [OTHER]}}, status=True)
    await kube_compiler()

    def parents() -> list[dict[str, Any]]:
        return (kube_api.get(GIE, "InferencePool", "default", "llm").get("status") or {}).get("parents") or []

    def ours() -> list[dict[str, Any]]:
        return [p for p in parents() if p.get("controllerName", "").startswith("kinference.buoyant.io/")]

    await eventually(lambda: len(ours()) == 1, what="Kinference's picker entry")
    [mine] = ours()
    assert mine["controllerName"] == "kinference.buoyant.io/endpoint-picker"
    assert mine["parentRef"]["name"] == "gw"  # not ghost: that Gateway does not exist
    conditions = {c["type"]: c for c in mine["conditions"]}
    assert (conditions["Accepted"]["status"], conditions["Accepted"]["reason"]) == ("True", "Accepted")
    assert (conditions["ResolvedRefs"]["status"], conditions["ResolvedRefs"]["reason"]) == (
        "False", "InvalidExtensionRef")
    assert parents()[0] == OTHER  # untouched

    # the compiled pool is under the same key as a Kinference pool's, with the worker set it reaches
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        pool = decode_pool((await kv.get("default.llm")).value)
        assert [d.name for d in pool.destinations] == ["qwen"] and pool.policy.name == "p"
    finally:
        await nc.close()

    # the EPP Service appears: ResolvedRefs turns True
    kube_api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kinference-epp", "namespace": "default"},
                    "spec": {"ports": [{"name": "grpc", "port": 9002}]}})
    await eventually(lambda: ours() and {c["type"]: c["status"] for c in ours()[0]["conditions"]}["ResolvedRefs"] == "True",
                     what="ResolvedRefs True")
    assert parents()[0] == OTHER

    # the annotation removed: the pool is another picker's now; Kinference's entry goes, the other stays
    kube_api._patch(kube_api.rtype(GIE, "InferencePool"), "default", "llm",
                    {"metadata": {"annotations": {"kinference.buoyant.io/policy": None}}}, status=False)
    await eventually(lambda: parents() == [OTHER], what="only the other controller's entry left")


@pytest.mark.nats
async def test_a_kinference_pool_loses_the_entry_of_a_gateway_that_does_not_exist(kube_api, kube_compiler):
    """The reported symptom: parents[] said Accepted for Gateway inference-gateway, which does not
    exist. The compiler removes its own stale entry and keeps another controller's."""
    g = "kinference.buoyant.io"
    kube_api.apply(OBJECTS[0])
    kube_api.apply({"apiVersion": f"{g}/v1alpha1", "kind": "InferencePool",
                    "metadata": {"name": "all", "namespace": "default"}, "spec": {}})
    kube_api.apply({"apiVersion": f"{GW}/v1", "kind": "HTTPRoute", "metadata": {"name": "all", "namespace": "default"},
                    "spec": {"parentRefs": [{"name": "inference-gateway"}],
                             "rules": [{"backendRefs": [{"group": g, "kind": "InferencePool", "name": "all"}]}]}})
    stale = {"parentRef": {"group": GW, "kind": "Gateway", "name": "inference-gateway", "namespace": "default"},
             "controllerName": "kinference.buoyant.io/router",
             "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted", "message": ""}]}
    kube_api._patch(kube_api.rtype(g, "InferencePool"), "default", "all",
                    {"status": {"parents": [OTHER, stale]}}, status=True)
    await kube_compiler()

    def status() -> dict[str, Any]:
        return kube_api.get(g, "InferencePool", "default", "all").get("status") or {}

    await eventually(lambda: status().get("state") == "Accepted" and status().get("parents") == [OTHER],
                     what="the stale entry removed, the other kept")
