"""The fake API server (kinference_simulators.kubeapi) against the real
kubernetes_asyncio client: the semantics the controllers rely on."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

G, V = "kinference.buoyant.io", "v1alpha1"


@pytest.fixture
async def api_client(kube_api, kubeconfig):
    c = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=c)
    async with client.ApiClient(c) as ac:
        yield ac


def policy(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "InferencePolicy",
            "metadata": {"name": name, "namespace": ns, "labels": {"team": "a"}},
            "spec": {"rules": [], **spec}, "status": {"state": "from-client"}}


async def test_create_list_get_and_resource_versions(api_client, kube_api):
    co = client.CustomObjectsApi(api_client)
    a = await co.create_namespaced_custom_object(G, V, "default", "inferencepolicies", policy("a"))
    b = await co.create_namespaced_custom_object(G, V, "other", "inferencepolicies", policy("b", "other"))
    assert "status" not in a  # a CRD with a status subresource drops status on create
    assert a["metadata"]["uid"] and a["metadata"]["creationTimestamp"] and a["metadata"]["generation"] == 1
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    listed = await co.list_namespaced_custom_object(G, V, "default", "inferencepolicies")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    assert listed["metadata"]["resourceVersion"] == b["metadata"]["resourceVersion"]
    everywhere = await co.list_cluster_custom_object(G, V, "inferencepolicies")
    assert sorted(o["metadata"]["name"] for o in everywhere["items"]) == ["a", "b"]
    got = await co.get_namespaced_custom_object(G, V, "other", "inferencepolicies", "b")
    assert got["metadata"]["uid"] == b["metadata"]["uid"]
    with pytest.raises(ApiException) as exc:
        await co.get_namespaced_custom_object(G, V, "default", "inferencepolicies", "nope")
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        await co.create_namespaced_custom_object(G, V, "default", "inferencepolicies", policy("a"))
    assert exc.value.status == 409


async def test_status_subresource_generation_and_conflicts(api_client):
    co = client.CustomObjectsApi(api_client)
    a = await co.create_namespaced_custom_object(G, V, "default", "inferencepolicies", policy("a"))
    st = await co.patch_namespaced_custom_object_status(
        G, V, "default", "inferencepolicies", "a", {"status": {"state": "Accepted"}, "spec": {"unmatched": "Reject"}},
        _content_type="application/merge-patch+json")
    assert st["status"] == {"state": "Accepted", "ruleCount": 0, "warningCount": 0}  # ruleCount, warningCount: the CRD's defaults
    assert st["spec"]["unmatched"] == "ServeLocal"  # /status changes only status (the CRD's default stays)
    assert st["metadata"]["generation"] == 1
    main = await co.patch_namespaced_custom_object(
        G, V, "default", "inferencepolicies", "a", {"spec": {"unmatched": "Reject"}, "status": {"state": "x"}},
        _content_type="application/merge-patch+json")
    assert main["status"] == {"state": "Accepted", "ruleCount": 0, "warningCount": 0}  # main writes never change status
    assert main["metadata"]["generation"] == 2
    labelled = await co.patch_namespaced_custom_object(
        G, V, "default", "inferencepolicies", "a", {"metadata": {"labels": {"x": "y"}}},
        _content_type="application/merge-patch+json")
    assert labelled["metadata"]["generation"] == 2  # metadata is not spec
    # a no-op write does not move the resourceVersion
    again = await co.patch_namespaced_custom_object_status(
        G, V, "default", "inferencepolicies", "a", {"status": {"state": "Accepted"}},
        _content_type="application/merge-patch+json")
    assert again["metadata"]["resourceVersion"] == labelled["metadata"]["resourceVersion"]
    stale = dict(a, spec={"rules": [], "unmatched": "ServeLocal"})
    with pytest.raises(ApiException) as exc:
        await co.replace_namespaced_custom_object(G, V, "default", "inferencepolicies", "a", stale)
    assert exc.value.status == 409
    with pytest.raises(ApiException) as exc:
        await co.patch_namespaced_custom_object_status(
            G, V, "default", "inferencepolicies", "a",
            {"metadata": {"resourceVersion": a["metadata"]["resourceVersion"]}, "status": {"state": "old"}},
            _content_type="application/merge-patch+json")
    assert exc.value.status == 409
    fresh = await co.get_namespaced_custom_object(G, V, "default", "inferencepolicies", "a")
    fresh["status"] = {"state": "Replaced"}
    put = await co.replace_namespaced_custom_object_status(G, V, "default", "inferencepolicies", "a", fresh)
    assert put["status"] == {"state": "Replaced", "ruleCount": 0, "warningCount": 0}


async def test_watch_streams_changes_bookmarks_and_410(api_client, kube_api):
    kube_api.bookmark_interval = 0.2
    co = client.CustomObjectsApi(api_client)
    await co.create_namespaced_custom_object(G, V, "default", "inferencepolicies", policy("a"))
    listed = await co.list_namespaced_custom_object(G, V, "default", "inferencepolicies")
    rv = listed["metadata"]["resourceVersion"]
    events: list[tuple[str, str]] = []

    async def collect() -> None:
        async with watch.Watch() as w:
            async for ev in w.stream(co.list_namespaced_custom_object, G, V, "default",
                                     "inferencepolicies", resource_version=rv, timeout_seconds=3,
                                     allow_watch_bookmarks=True):
                events.append((ev["type"], ev["raw_object"]["metadata"].get("name", "")))
                if ev["type"] == "DELETED":
                    return

    task = asyncio.create_task(collect())
    loop = asyncio.get_running_loop()
    end = loop.time() + 5  # a bookmark every 0.2 s; a loaded machine may take longer than one interval
    while ("BOOKMARK", "") not in events and loop.time() < end:
        await asyncio.sleep(0.02)
    await co.patch_namespaced_custom_object(G, V, "default", "inferencepolicies", "a",
                                            {"spec": {"unmatched": "Reject"}},
                                            _content_type="application/merge-patch+json")
    await co.create_namespaced_custom_object(G, V, "other", "inferencepolicies", policy("elsewhere", "other"))
    await co.create_namespaced_custom_object(G, V, "default", "inferencepolicies", policy("b"))
    await co.delete_namespaced_custom_object(G, V, "default", "inferencepolicies", "b")
    await asyncio.wait_for(task, 5)
    changes = [e for e in events if e[0] != "BOOKMARK"]
    assert changes == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "b")]
    assert ("BOOKMARK", "") in events

    kube_api.compact()
    with pytest.raises(ApiException) as exc:
        async for _ in watch.Watch().stream(co.list_namespaced_custom_object, G, V, "default",
                                            "inferencepolicies", resource_version=rv, timeout_seconds=2):
            pass
    assert exc.value.status == 410


async def test_selectors_on_list_and_watch(api_client, kube_api):
    v1 = client.CoreV1Api(api_client)
    for name, labels in (("t1", {"kinference.buoyant.io/tenant": "alice"}), ("t2", {"other": "x"})):
        await v1.create_namespaced_secret("default", {"metadata": {"name": name, "labels": labels},
                                                      "data": {"apiKey": "c2VjcmV0"}})
    got = await v1.list_namespaced_secret("default", label_selector="kinference.buoyant.io/tenant")
    assert [s.metadata.name for s in got.items] == ["t1"]
    got = await v1.list_namespaced_secret("default", label_selector="kinference.buoyant.io/tenant in (bob,alice)")
    assert [s.metadata.name for s in got.items] == ["t1"]
    got = await v1.list_namespaced_secret("default", label_selector="!kinference.buoyant.io/tenant")
    assert [s.metadata.name for s in got.items] == ["t2"]
    got = await v1.list_secret_for_all_namespaces(field_selector="metadata.name=t2")
    assert [s.metadata.name for s in got.items] == ["t2"]
    seen = []
    async for ev in watch.Watch().stream(v1.list_namespaced_secret, "default", label_selector="other=x",
                                         timeout_seconds=1):
        seen.append((ev["type"], ev["object"].metadata.name))
    assert seen == [("ADDED", "t2")]  # a watch from no version starts with the current objects


async def test_hooks_down_drop_and_request_log(api_client, kube_api):
    v1 = client.CoordinationV1Api(api_client)
    lease = {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 5}}
    await v1.create_namespaced_lease("kinference-system", lease)
    kube_api.go_down(30)
    with pytest.raises(ApiException) as exc:
        await v1.read_namespaced_lease("l", "kinference-system")
    assert exc.value.status == 503
    kube_api.come_back()
    got = await v1.read_namespaced_lease("l", "kinference-system")
    assert got.spec.holder_identity == "me"

    co = client.CustomObjectsApi(api_client)
    ended = asyncio.Event()

    async def watch_forever() -> None:
        async for _ in watch.Watch().stream(co.list_cluster_custom_object, G, V, "inferencepools",
                                            timeout_seconds=60):
            pass
        ended.set()

    task = asyncio.create_task(watch_forever())
    await asyncio.sleep(0.2)
    kube_api.drop_watches()
    await asyncio.wait_for(ended.wait(), 5)
    await task
    used = {(r.verb, r.group, r.resource) for r in kube_api.requests}
    assert {("create", "coordination.k8s.io", "leases"), ("get", "coordination.k8s.io", "leases"),
            ("watch", G, "inferencepools")} <= used


async def test_events_are_served_in_both_groups(api_client):
    ev = client.EventsV1Api(api_client)
    body = {"metadata": {"name": "e1"}, "eventTime": "2026-12-01T09:00:00.000000Z",
            "regarding": {"kind": "InferencePolicy", "name": "p", "namespace": "default", "apiVersion": f"{G}/{V}"},
            "reason": "UnknownField", "note": "hello", "type": "Warning", "action": "Compile",
            "reportingController": "kinference.buoyant.io/policy-compiler", "reportingInstance": "x"}
    await ev.create_namespaced_event("default", body)
    await ev.patch_namespaced_event("e1", "default", {"series": {"count": 3, "lastObservedTime":
                                                                   "2026-12-01T09:05:00.000000Z"}})
    core = client.CoreV1Api(api_client)
    got = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=p,involvedObject.kind=InferencePolicy")
    assert [(e.reason, e.message, e.count) for e in got.items] == [("UnknownField", "hello", 3)]


async def test_kubectl_get_prints_the_printer_columns(kube_api, kubeconfig):
    kube_api.apply(policy("burst"))
    kube_api.set_status(G, "InferencePolicy", "default", "burst", {"ruleCount": 2, "state": "Accepted"})
    proc = await asyncio.create_subprocess_exec(
        "kubectl", "--kubeconfig", str(kubeconfig), "get", "infpol", "-n", "default",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split() == ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"]
    assert lines[1].split()[:3] == ["burst", "2", "Accepted"]
