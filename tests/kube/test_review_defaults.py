"""The API server fills in the CRDs' ``default:`` values (review of the
Kubernetes mode; the fake now does too): in a status, a writer's desired
value that left a defaulted field out is no difference (else every pass
writes again), and in a spec, the compiler's warnings must not change (the
seed policy on a cluster got a warning its author could not act on)."""

from __future__ import annotations

from kinference_common.kube import kinds
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.kube.status import StatusWriter, covers
from kinference_simulators.kubeapi import apply_defaults

G = "kinference.buoyant.io"


def test_covers_ignores_what_the_desired_value_leaves_out():
    assert covers({"a": 1, "b": ""}, {"a": 1})
    assert covers({"c": [{"type": "T", "message": ""}]}, {"c": [{"type": "T"}]})
    assert not covers({"c": [{"type": "T"}, {"type": "U"}]}, {"c": [{"type": "T"}]})
    assert not covers({"c": [{"type": "T", "message": "x"}]}, {"c": [{"type": "T", "message": "y"}]})
    assert covers({}, {"gone": None}) and not covers({"gone": 1}, {"gone": None})
    assert not covers({}, {"a": {}})


def test_fake_defaults_objects_and_list_items():
    schema = {"properties": {"spec": {"properties": {
        "mode": {"type": "string", "default": "ServeLocal"},
        "rules": {"type": "array", "items": {"properties": {"onEmpty": {"default": "Reject"}}}}}}}}
    obj = apply_defaults(schema, {"spec": {"rules": [{"name": "a"}, {"onEmpty": "FallThrough"}]}})
    assert obj == {"spec": {"mode": "ServeLocal", "rules": [{"name": "a", "onEmpty": "Reject"},
                                                              {"onEmpty": "FallThrough"}]}}


async def test_a_status_the_server_defaulted_is_not_written_again(kube_api, kubeconfig):
    kube_api.apply({"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy",
                    "metadata": {"name": "a", "namespace": "default"}, "spec": {"rules": []}})
    assert kube_api.get(G, "InferencePolicy", "default", "a")["spec"]["unmatched"] == "ServeLocal"
    api = await api_client(kubeconfig, "kinference-test")
    try:
        w = StatusWriter(ResourceClient(api))
        # a condition with no message (msgspec omits the empty default): the CRD defaults it to ''
        desired = {"state": "Accepted", "conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "observedGeneration": 1,
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        assert await w.write(kinds.INFERENCE_POLICY, kube_api.get(G, "InferencePolicy", "default", "a"), desired)
        obj = kube_api.get(G, "InferencePolicy", "default", "a")
        assert obj["status"]["conditions"][0]["message"] == ""
        rv = obj["metadata"]["resourceVersion"]
        for _ in range(3):
            assert not await w.write(kinds.INFERENCE_POLICY, obj, desired)
        assert kube_api.get(G, "InferencePolicy", "default", "a")["metadata"]["resourceVersion"] == rv
        assert w.writes == 1
    finally:
        await api.close()
