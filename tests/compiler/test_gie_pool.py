"""The Inference Extension's InferencePool (inference.networking.k8s.io/v1):
compiled into the same form as a Kinference pool when its annotations name a
Kinference policy; left alone otherwise; its parents[] as that API defines."""

from __future__ import annotations

from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text

from .conftest import FLEET, NOW, compile_text, policy_yaml

BURST = """
rules:
  - name: all
    route:
      select: [{type: Local}]
"""


def gie_pool(annotations: str = "kinference.buoyant.io/policy: p", *, selector: str = "{app: gemma}",
             ports: str = "[{number: 8000}]", epp: str = "{name: kinference-epp, port: {number: 9002}}",
             name: str = "llm") -> str:
    ann = f"\n  annotations: {{{annotations}}}" if annotations else ""
    ref = f"\n  endpointPickerRef: {epp}" if epp else ""
    return (f"apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n"
            f"metadata:\n  name: {name}\n  namespace: default{ann}\n"
            f"spec:\n  selector: {{matchLabels: {selector}}}\n  targetPorts: {ports}{ref}\n")


ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm, namespace: default}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{group: inference.networking.k8s.io, kind: InferencePool, name: llm, port: 8000}]}]
"""

GATEWAY = """
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: eg}
spec: {controllerName: gateway.envoyproxy.io/gatewayclass-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default}
spec: {gatewayClassName: eg}
"""

EPP_SERVICE = """
apiVersion: v1
kind: Service
metadata: {name: kinference-epp, namespace: default}
spec:
  ports: [{name: grpc, port: 9002, targetPort: 9002, appProtocol: kubernetes.io/h2c}]
"""


def test_an_annotated_pool_compiles_like_a_kinference_pool_of_the_worker_sets_it_reaches() -> None:
    res = compile_text(FLEET, policy_yaml("p", BURST), gie_pool(selector="{app: gemma}"))
    compiled = res.pools[("default", "llm")]
    # only gemma-4-12b's pods carry app=gemma: the other worker sets are out of the pool's reach
    assert [d.name for d in compiled.destinations] == ["gemma-4-12b"]
    assert compiled.policy.name == "p"
    assert res.policy_status[("default", "p")].referenced_by == ["default/llm"]
    out = [w for w in res.document_warnings if w.code == "OutsidePoolSelector"]
    assert {w.kind for w in out} == {"InferencePool.inference.networking.k8s.io"}
    assert any("qwen-2-5-32b is left out: its selector does not require app=gemma" in w.message for w in out)
    # no Kinference pool status is made for it
    assert ("default", "llm") not in res.pool_status


def test_a_port_outside_target_ports_is_left_out_with_the_reason() -> None:
    res = compile_text(FLEET, policy_yaml("p", BURST), gie_pool(ports="[{number: 9000}]"))
    assert res.pools[("default", "llm")].destinations == []
    assert any("port 8000 is not in the pool's targetPorts [9000]" in w.message for w in res.document_warnings)


def test_destinations_annotation_names_worker_sets_and_providers() -> None:
    ann = ('kinference.buoyant.io/policy: p, kinference.buoyant.io/destinations: '
           '"InferenceWorkerSet/gemma-4-12b, InferenceProvider/databricks, nonsense"')
    res = compile_text(FLEET, policy_yaml("p", BURST), gie_pool(ann))
    compiled = res.pools[("default", "llm")]
    assert sorted((d.type, d.name) for d in compiled.destinations) == [
        ("Local", "gemma-4-12b"), ("Provider", "databricks")]
    [bad] = [w for w in res.document_warnings if w.code == "InvalidAnnotation"]
    assert "'nonsense' is not InferenceWorkerSet/<name>" in bad.message


def test_a_pool_without_the_annotation_is_another_pickers_and_left_alone() -> None:
    res = compile_text(FLEET, ROUTE, GATEWAY, gie_pool(""))
    assert res.pools == {} and res.gie_pool_status == {}
    assert not [w for w in res.document_warnings if w.name == "llm"]


def test_a_kinference_pool_of_the_same_name_wins() -> None:
    kpool = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\n"
             "metadata: {name: llm, namespace: default}\nspec: {}\n")
    res = compile_text(FLEET, policy_yaml("p", BURST), kpool, gie_pool())
    assert len(res.pools[("default", "llm")].destinations) == 4  # the Kinference pool: every worker set
    assert ("default", "llm") not in res.gie_pool_status
    [w] = [w for w in res.document_warnings if w.code == "PoolNameTaken"]
    assert w.kind == "InferencePool.inference.networking.k8s.io"


def _parents(*texts: str, **kw: object):
    loaded = []
    for i, t in enumerate(texts):
        loaded.extend(load_text(t, f"doc{i}.yaml"))
    return compile_documents(loaded, now=NOW, **kw).gie_pool_status[("default", "llm")].parents  # type: ignore[arg-type]


def test_parents_are_written_as_the_picker_only_for_gateways_that_exist() -> None:
    assert _parents(FLEET, policy_yaml("p", BURST), ROUTE, gie_pool()) == []  # no Gateway gw
    [parent] = _parents(FLEET, policy_yaml("p", BURST), ROUTE, GATEWAY, EPP_SERVICE, gie_pool(),
                        services_visible=True)
    assert parent.controller_name == "kinference.buoyant.io/endpoint-picker"
    assert (parent.parent_ref.group, parent.parent_ref.kind, parent.parent_ref.name) == (
        "gateway.networking.k8s.io", "Gateway", "gw")
    assert [(c.type, c.status, c.reason) for c in parent.conditions] == [
        ("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs")]


def test_resolved_refs_false_when_the_epp_service_does_not_exist() -> None:
    [parent] = _parents(FLEET, policy_yaml("p", BURST), ROUTE, GATEWAY, gie_pool(), services_visible=True)
    [_, refs] = parent.conditions
    assert (refs.status, refs.reason) == ("False", "InvalidExtensionRef")
    assert "Service default/kinference-epp named by endpointPickerRef does not exist" in refs.message


def test_accepted_false_when_the_pool_has_no_endpoint_picker_ref() -> None:
    [parent] = _parents(FLEET, policy_yaml("p", BURST), ROUTE, GATEWAY, gie_pool(epp=""))
    [accepted, _] = parent.conditions
    assert (accepted.status, accepted.reason) == ("False", "EndpointPickerRefMissing")


def test_objectives_naming_the_gie_pool_apply_to_it() -> None:
    objective = """
apiVersion: inference.networking.x-k8s.io/v1alpha2
kind: InferenceObjective
metadata: {name: critical, namespace: default}
spec: {priority: 10, poolRef: {name: llm}}
"""
    res = compile_text(FLEET, policy_yaml("p", BURST), gie_pool(), objective)
    assert res.pools[("default", "llm")].objectives == {"critical": 10}
