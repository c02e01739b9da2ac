"""The Kubernetes-mode compiler when the cluster misbehaves: watches
dropped, history compacted (410 Gone), the API server down; and leader
failover between two replicas. Statuses converge; none is written stale."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kinference_common.kube.rbac import not_allowed

from .conftest import eventually, load_docs
from .test_kube_compiler import MIXED

G = "kinference.buoyant.io"
pytestmark = pytest.mark.nats


def apply_mixed(kube_api: Any, tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)


def pool(kube_api: Any) -> dict[str, Any]:
    return kube_api.get(G, "InferencePool", "team", "shared")


def set_policy_ref(kube_api: Any, name: str) -> None:
    kube_api._patch(kube_api.rtype(G, "InferencePool"), "team", "shared",
                    {"spec": {"policyRef": {"name": name}}}, status=False)


def converged(kube_api: Any, state_token: str) -> bool:
    obj = pool(kube_api)
    st = obj.get("status") or {}
    return state_token in st.get("state", "") and all(
        c.get("observedGeneration") == obj["metadata"]["generation"] for c in st.get("conditions", []))


def observed_generations(kube_api: Any) -> list[int]:
    """The pool's conditions' observedGeneration in every version the server kept, in order."""
    out = []
    for _rv, key, _etype, obj in kube_api._history:
        if key == (G, "inferencepools") and obj["metadata"]["name"] == "shared":
            conds = (obj.get("status") or {}).get("conditions") or []
            if conds:
                out.append(conds[0]["observedGeneration"])
    return out


async def test_dropped_watches_compaction_and_downtime(kube_api, kube_compiler, tmp_path):
    apply_mixed(kube_api, tmp_path)
    kube_api.bookmark_interval = 60  # a bookmark would carry a version newer than the compaction
    mode = await kube_compiler(watch_timeout=2)
    await eventually(lambda: converged(kube_api, "Accepted"), what="first statuses")
    kube_api.compact()  # from here on the history is the test's record

    # 1. every watch dropped, then a change: picked up
    kube_api.drop_watches()
    set_policy_ref(kube_api, "missing")
    await eventually(lambda: converged(kube_api, "PolicyNotFound"), what="status after dropped watches")

    # 2. history compacted while watching: the next resume gets 410, relists
    gone_before = sum(i.gone for i in mode.source.informers.values())
    kube_api.compact()
    await eventually(lambda: sum(i.gone for i in mode.source.informers.values()) > gone_before, what="a 410")
    set_policy_ref(kube_api, "team-policy")
    await eventually(lambda: converged(kube_api, "Accepted") and "PolicyNotFound" not in pool(kube_api)["status"]
                     ["state"], what="status after 410")

    # 3. the API server down; the spec changes meanwhile (behind its back, as
    # another apiserver replica would): after it comes back, the new spec's
    # status, never an old one
    history_mark = len(observed_generations(kube_api))
    kube_api.go_down(1.5)
    set_policy_ref(kube_api, "missing-again")
    await asyncio.sleep(1.6)
    await eventually(lambda: converged(kube_api, "PolicyNotFound"), what="status after downtime")
    assert "missing-again" in next(c["message"] for c in pool(kube_api)["status"]["conditions"]
                                   if c["type"] == "ResolvedRefs")
    gens = observed_generations(kube_api)
    assert gens == sorted(gens), f"a status for an older generation was written after a newer one: {gens}"
    assert len(gens) > history_mark
    errors = sum(i.errors for i in mode.source.informers.values())
    assert errors > 0  # the downtime was seen, and survived
    assert not_allowed("policy-compiler", kube_api.used("compiler-a")) == []


async def test_leader_failover(kube_api, kube_compiler, tmp_path):
    apply_mixed(kube_api, tmp_path)
    timing = {"lease_duration": 2.5, "renew_deadline": 1.8, "retry_period": 0.2}
    a = await kube_compiler("compiler-a", **timing)
    await eventually(lambda: a.elector.is_leader, what="a leads")
    b = await kube_compiler("compiler-b", **timing)
    await eventually(lambda: converged(kube_api, "Accepted"), what="first statuses")
    await asyncio.sleep(0.5)
    assert a.elector.is_leader and not b.elector.is_leader
    status_writes = {u for u in kube_api.used("compiler-b") if u[2].endswith("/status")}
    assert status_writes == set()  # the standby compiles but never writes
    assert b.service.last_result is not None and b.service.last_result.pools  # ready to take over

    # the leader dies without releasing the Lease
    await a.stop(release=False)
    set_policy_ref(kube_api, "missing")
    await eventually(lambda: b.elector.is_leader, what="b takes over")
    await eventually(lambda: converged(kube_api, "PolicyNotFound"), what="b writes statuses")
    lease = kube_api.get("coordination.k8s.io", "Lease", "kinference-system", "kinference-policy-compiler")
    assert lease["spec"]["holderIdentity"] == "compiler-b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert {u for u in kube_api.used("compiler-b") if u[2].endswith("/status")}
    for who in ("compiler-a", "compiler-b"):
        assert not_allowed("policy-compiler", kube_api.used(who)) == []
