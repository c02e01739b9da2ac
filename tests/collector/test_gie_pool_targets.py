"""An Inference Extension pool's endpoints are found by the collector as any
pool's: through the InferenceWorkerSets it compiles to. The targets are
exactly the pods the pool's selector selects, on its targetPorts."""

from __future__ import annotations

from typing import Any

import yaml

from kinference_collector.kube_discovery import worker_set_targets
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text

from .test_kube_discovery import pod, worker_set

POOL = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "llm", "namespace": "default", "annotations": {"kinference.buoyant.io/policy": "p"}},
        "spec": {"selector": {"matchLabels": {"app": "qwen"}}, "targetPorts": [{"number": 8000}],
                 "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}


def test_the_collector_targets_exactly_the_pods_a_gie_pool_selects() -> None:
    sets = [worker_set("qwen", selector={"matchLabels": {"app": "qwen", "tier": "gpu"}}),
            worker_set("qwen-any", selector={"matchLabels": {"tier": "gpu"}}),   # not covered by the pool's selector
            worker_set("qwen-9000", port=9000)]                                 # port not in targetPorts
    policy = {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy",
              "metadata": {"name": "p", "namespace": "default"},
              "spec": {"rules": [{"name": "all", "route": {"select": [{"type": "Local"}]}}]}}
    res = compile_documents(load_text(yaml.safe_dump_all([*sets, policy, POOL]), "m.yaml"))
    destinations = {d.name for d in res.pools[("default", "llm")].destinations}
    assert destinations == {"qwen"}
    pods = [pod("q-0", "10.0.0.1", labels={"app": "qwen", "tier": "gpu"}),
            pod("q-1", "10.0.0.2", labels={"app": "qwen", "tier": "gpu"}, ready=False),
            pod("cpu-0", "10.0.0.3", labels={"tier": "gpu"})]
    in_pool: list[dict[str, Any]] = [s for s in sets if s["metadata"]["name"] in destinations]
    targets = worker_set_targets(in_pool, pods)
    selected = [p for p in pods if all(p["metadata"]["labels"].get(k) == v
                                       for k, v in POOL["spec"]["selector"]["matchLabels"].items())]
    assert sorted(t.address for t in targets) == sorted(f"{p['status']['podIP']}:8000" for p in selected)
    assert {t.worker_set for t in targets} == {"qwen"}
