"""libs/kinference_common/kube against the fake API server, real client."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kinference_common.kube import kinds
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import KubeConfigError, api_client, load_configuration
from kinference_common.kube.events import EventRecorder, reference
from kinference_common.kube.informer import Informer
from kinference_common.kube.lease import LeaderElector
from kinference_common.kube.status import StatusWriter

G = "kinference.buoyant.io"


async def eventually(pred: Callable[[], Any], timeout: float = 10.0) -> None:
    """Poll until ``pred()`` is true (a deadline, not a speed assertion)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)


@pytest.fixture
async def rc(kube_api, kubeconfig):
    api = await api_client(kubeconfig, "kinference-test")
    yield ResourceClient(api)
    await api.close()


def pol(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy", "metadata": {"name": name, "namespace": ns},
            "spec": {"rules": [], **spec}}


async def test_config_errors_name_the_problem(tmp_path, monkeypatch):
    with pytest.raises(KubeConfigError, match="no such file"):
        await load_configuration(tmp_path / "missing")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nothing-here"))
    with pytest.raises(KubeConfigError, match="--kubeconfig"):
        await load_configuration(None)


async def test_informer_follows_changes_and_recovers(kube_api, rc):
    kube_api.apply(pol("a"))
    wakes = []
    inf = Informer(rc, kinds.INFERENCE_POLICY, on_change=lambda: wakes.append(1), watch_timeout=30,
                   backoff_base=0.05, backoff_cap=0.2)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert set(inf.items()) == {("default", "a")}
        kube_api.apply(pol("b", "other"))
        await eventually(lambda: ("other", "b") in inf.items())
        kube_api.delete(G, "InferencePolicy", "default", "a")
        await eventually(lambda: ("default", "a") not in inf.items())

        # a dropped watch: changes made before the new watch are not lost, and
        # the watch resumes from the last version (no relist), cut after cut
        lists = inf.lists
        for name in ("c", "c2", "c3"):
            await eventually(lambda: kube_api.open_watches == 1)
            kube_api.drop_watches()
            kube_api.apply(pol(name))
            await eventually(lambda name=name: ("default", name) in inf.items())
        assert inf.lists == lists and inf.gone == 0
        kube_api.delete(G, "InferencePolicy", "default", "c2")
        kube_api.delete(G, "InferencePolicy", "default", "c3")
        await eventually(lambda: ("default", "c3") not in inf.items())

        # 410 Gone: the watch ends at its timeout, the history was compacted
        # meanwhile, so resuming from the last version answers 410: relist
        await eventually(lambda: kube_api.open_watches == 1)
        inf.watch_timeout = 1
        kube_api.bookmark_interval = 60  # a bookmark would carry the new version
        watches = inf.watches
        kube_api.drop_watches()
        await eventually(lambda: inf.watches > watches and kube_api.open_watches == 1)  # the short one
        lists = inf.lists
        kube_api.compact()
        await eventually(lambda: inf.gone >= 1)
        kube_api.apply(pol("d"))
        await eventually(lambda: ("default", "d") in inf.items())
        assert inf.lists > lists
        inf.watch_timeout = 30

        # the API server down: errors, backoff, then the watch resumes from the
        # last version and sees what changed meanwhile, without a relist
        lists = inf.lists
        kube_api.go_down(0.6)
        await eventually(lambda: inf.errors > 0)
        kube_api.delete(G, "InferencePolicy", "default", "c")
        await eventually(lambda: ("default", "c") not in inf.items())
        assert set(inf.items()) == {("other", "b"), ("default", "d")}
        assert inf.lists == lists
    finally:
        await inf.stop()


async def test_informer_namespace_scope(kube_api, rc):
    kube_api.apply(pol("a", "one"))
    kube_api.apply(pol("b", "two"))
    kube_api.apply(pol("c", "three"))
    inf = Informer(rc, kinds.INFERENCE_POLICY, namespaces=["one", "two"])
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert set(inf.items()) == {("one", "a"), ("two", "b")}
        namespaces = {r.namespace for r in kube_api.requests if r.verb in ("list", "watch")}
        assert None not in namespaces  # never a cluster-wide list
    finally:
        await inf.stop()


async def test_status_writer_only_writes_differences_and_keeps_transition_times(kube_api, rc):
    kube_api.apply(pol("a"))
    obj = kube_api.get(G, "InferencePolicy", "default", "a")
    stale = obj  # no status yet
    w = StatusWriter(rc)
    cond = {"type": "Accepted", "status": "True", "reason": "Accepted", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1}
    assert await w.write(kinds.INFERENCE_POLICY, obj, {"state": "Accepted", "conditions": [cond]})
    obj = kube_api.get(G, "InferencePolicy", "default", "a")
    rv = obj["metadata"]["resourceVersion"]
    later = dict(cond, lastTransitionTime="2026-06-01T00:00:00Z")
    assert not await w.write(kinds.INFERENCE_POLICY, obj, {"state": "Accepted", "conditions": [later]})
    assert kube_api.get(G, "InferencePolicy", "default", "a")["metadata"]["resourceVersion"] == rv
    flipped = dict(later, status="False", reason="NotReferenced")
    assert await w.write(kinds.INFERENCE_POLICY, obj, {"state": "NotReferenced", "conditions": [flipped]})
    st = kube_api.get(G, "InferencePolicy", "default", "a")["status"]
    assert st["conditions"][0]["lastTransitionTime"] == "2026-06-01T00:00:00Z"

    # a stale observed copy: 409, fresh read, same generation -> retried
    assert await w.write(kinds.INFERENCE_POLICY, stale, {"state": "Accepted", "conditions": [cond]})
    assert w.conflicts == 1
    assert kube_api.get(G, "InferencePolicy", "default", "a")["status"]["state"] == "Accepted"
    # the spec moved on since the read: the stale status is not written
    kube_api.apply(pol("a", unmatched="Reject"))
    assert not await w.write(kinds.INFERENCE_POLICY, stale, {"state": "Stale", "conditions": [cond]})
    assert kube_api.get(G, "InferencePolicy", "default", "a")["status"]["state"] == "Accepted"


async def test_events_are_deduplicated_with_a_rising_count(kube_api, rc):
    kube_api.apply(pol("a"))
    ref = reference(kube_api.get(G, "InferencePolicy", "default", "a"))
    rec = EventRecorder(rc, "kinference.buoyant.io/policy-compiler", "test", min_interval=0)
    for _ in range(3):
        await rec.emit(ref, "Warning", "UnknownField", "spec.foo is not a field")
    await rec.emit(ref, "Warning", "Other", "something else")
    events = kube_api.list("events.k8s.io", "Event", "default")
    assert len(events) == 2
    dup = next(e for e in events if e["reason"] == "UnknownField")
    assert dup["series"]["count"] == 3 and dup["deprecatedCount"] == 3
    # another recorder (a new leader) continues the same Event
    rec2 = EventRecorder(rc, "kinference.buoyant.io/policy-compiler", "other", min_interval=0)
    await rec2.emit(ref, "Warning", "UnknownField", "spec.foo is not a field")
    events = kube_api.list("events.k8s.io", "Event", "default")
    assert len(events) == 2
    assert next(e for e in events if e["reason"] == "UnknownField")["series"]["count"] == 4
    # rate limited: within min_interval nothing is written
    rec3 = EventRecorder(rc, "c", "x", min_interval=3600)
    await rec3.emit(ref, "Normal", "Once", "once")
    before = len(kube_api.requests)
    await rec3.emit(ref, "Normal", "Once", "once")
    assert len(kube_api.requests) == before


async def test_leader_election_failover(kube_api, rc):
    timing = {"lease_duration": 2.0, "renew_deadline": 1.4, "retry_period": 0.1}
    a = LeaderElector(rc, "kinference-system", "lock", "a", **timing)
    b = LeaderElector(rc, "kinference-system", "lock", "b", **timing)
    a.start()
    await eventually(lambda: a.is_leader)
    b.start()
    await asyncio.sleep(0.5)
    assert a.is_leader and not b.is_leader
    lease = kube_api.get("coordination.k8s.io", "Lease", "kinference-system", "lock")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseTransitions"] == 0
    await a.stop(release=False)  # dies without releasing
    await eventually(lambda: b.is_leader)
    lease = kube_api.get("coordination.k8s.io", "Lease", "kinference-system", "lock")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    # renewal failing: the leader stops at once
    kube_api.go_down(0.5)
    await eventually(lambda: not b.is_leader)
    await eventually(lambda: b.is_leader)  # it still holds the lease when the server is back
    # a clean stop releases: a new candidate takes over without waiting the duration
    c = LeaderElector(rc, "kinference-system", "lock", "c", lease_duration=30, renew_deadline=10, retry_period=0.1)
    c.start()
    await b.stop(release=True)
    await eventually(lambda: c.is_leader, timeout=5)
    await c.stop()


async def test_informer_treats_an_unserved_kind_as_empty_until_installed(kube_api, rc):
    kube_api.unserve("llm-d.ai")
    inf = Informer(rc, kinds.INFERENCE_MODEL_REWRITES[1], missing_recheck=0.1)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert inf.missing and inf.items() == {}
        from kinference_simulators.kubeapi import BUILTIN_TYPES
        kube_api.serve(*[t for t in BUILTIN_TYPES if t.group == "llm-d.ai"])
        kube_api.apply({"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceModelRewrite",
                        "metadata": {"name": "r", "namespace": "default"}, "spec": {"rules": []}})
        await eventually(lambda: ("default", "r") in inf.items())
        assert not inf.missing
    finally:
        await inf.stop()


async def test_pods_from_the_helper_look_like_pods(kube_api, rc):
    from kinference_simulators.kubeapi import pod
    kube_api.apply(pod("qwen-0", "default", {"app": "qwen"}, "127.0.0.2"))
    kube_api.apply(pod("qwen-1", "default", {"app": "qwen"}, "127.0.0.3", ready=False))
    items, _ = await rc.list(kinds.POD, "default", label_selector="app=qwen")
    ready = {p["metadata"]["name"]: next(c["status"] for c in p["status"]["conditions"] if c["type"] == "Ready")
             for p in items}
    assert ready == {"qwen-0": "True", "qwen-1": "False"}
    assert {p["status"]["podIP"] for p in items} == {"127.0.0.2", "127.0.0.3"}
    kube_api.set_status("", "Pod", "default", "qwen-1", {"conditions": [{"type": "Ready", "status": "True"}]})
    got = await rc.get(kinds.POD, "default", "qwen-1")
    assert got["status"]["conditions"][0]["status"] == "True"
