"""A replica that loses the Lease in the middle of a pass stops recording
Events at once, as it stops writing statuses (review of the Kubernetes mode:
"a standby never writes")."""

from __future__ import annotations

from kinference_common.compiler import compile_documents
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_policy_compiler.kube_source import KubernetesSource
from kinference_policy_compiler.kube_status import KubernetesStatusSink

G = "kinference.buoyant.io"


def pool(name: str) -> dict:
    return {"apiVersion": f"{G}/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"destinations": [], "policyRef": {"name": "missing"}}}


async def test_no_event_after_leadership_is_lost_mid_pass(kube_api, kubeconfig):
    for name in ("p1", "p2", "p3"):
        kube_api.apply(pool(name))
    api = await api_client(kubeconfig, "kinference-policy-compiler")
    rc = ResourceClient(api)
    source = KubernetesSource(rc, watch_timeout=30)
    source.start()
    try:
        await source.wait_synced(10)
        assert source.poll()
        res = compile_documents(source.documents())
        leading = {"now": True}
        sink = KubernetesStatusSink(rc, source, "replica-a", is_leader=lambda: leading["now"])
        emit = sink.recorder.emit

        async def emit_then_lose(*args, **kw):
            await emit(*args, **kw)
            leading["now"] = False  # the renewal failed while this pass was under way

        sink.recorder.emit = emit_then_lose  # type: ignore[method-assign]
        await sink.write(res, [])
        events = kube_api.list("events.k8s.io", "Event", "default")
        # each pool warrants a Warning (PolicyNotFound; a pool with no destination
        # also NoDestinations): only the one recorded while still leader exists
        assert len(events) == 1, [e["reason"] for e in events]
        assert sink.recorder.created == 1
    finally:
        await source.stop()
        await api.close()
