"""``kinference-policy-compiler --source kubernetes`` as a process against
the fake API server, then ``kubectl get`` / ``kubectl describe`` as an
operator would read the result."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from kinference_common.kube.rbac import not_allowed

from .conftest import eventually, load_docs
from .test_kube_compiler import MIXED

G = "kinference.buoyant.io"
pytestmark = pytest.mark.nats


async def kubectl(kubeconfig, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec("kubectl", "--kubeconfig", str(kubeconfig), *args,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_process_writes_statuses_kubectl_shows_them(kube_api, kubeconfig, nats_server, tmp_path):
    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)
    env = {**os.environ, "POD_NAME": "compiler-0", "POD_NAMESPACE": "kinference-system"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinference_policy_compiler", "--source", "kubernetes", "--kubeconfig",
        str(kubeconfig), "--nats-url", nats_server.url, "--http-port", "0", "--log-format", "json",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        await eventually(lambda: (kube_api.get(G, "InferencePolicy", "team", "team-policy").get("status") or {})
                         .get("state") == "Accepted", timeout=30, what="the process writes statuses")
        lease = kube_api.get("coordination.k8s.io", "Lease", "kinference-system", "kinference-policy-compiler")
        assert lease["spec"]["holderIdentity"] == "compiler-0"

        table = (await kubectl(kubeconfig, "get", "infpol", "-n", "team")).splitlines()
        assert table[0].split() == ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"]
        assert table[1].split()[:3] == ["team-policy", "1", "Accepted"]
        pools = (await kubectl(kubeconfig, "get", "infpool", "-n", "team")).splitlines()
        assert pools[0].split() == ["NAME", "POLICY", "DESTINATIONS", "STATE", "AGE"]
        assert pools[1].split()[:4] == ["shared", "team-policy", "1", "Accepted,UnresolvedDestinations"]

        async def described() -> str:
            return await kubectl(kubeconfig, "describe", "infpol", "team-policy", "-n", "team")
        text = ""
        for _ in range(100):
            text = await described()
            if "DuplicateRuleName" in text.split("Events:")[-1]:
                break
            await asyncio.sleep(0.1)
        events = text.split("Events:")[-1]
        assert "Warning" in events and "DuplicateRuleName" in events and "rules[1]" in events
        assert "kinference.buoyant.io/policy-compiler" in events
        assert "Rule Count:  1" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, out.decode()[-2000:]
    lease = kube_api.get("coordination.k8s.io", "Lease", "kinference-system", "kinference-policy-compiler")
    assert not lease["spec"].get("holderIdentity")  # released on SIGTERM
    assert b"apiKey" not in out
    assert not_allowed("policy-compiler", kube_api.used("kinference-policy-compiler")) == []


async def test_metrics_show_leadership_and_writes(kube_api, kube_compiler, tmp_path):
    from prometheus_client import generate_latest

    path = tmp_path / "mixed.yaml"
    path.write_text(MIXED)
    for doc in load_docs(path):
        kube_api.apply(doc)
    a = await kube_compiler("compiler-a")
    await eventually(lambda: (kube_api.get(G, "InferencePool", "team", "shared").get("status") or {}).get("state"))
    b = await kube_compiler("compiler-b")
    text_a = generate_latest(a.service.metrics.registry).decode()
    text_b = generate_latest(b.service.metrics.registry).decode()
    assert "kinference_leader 1.0" in text_a and "kinference_leader 0.0" in text_b
    assert 'kinference_kube_status_writes_total{outcome="written"}' in text_a
    assert 'kinference_kube_lists_total{resource="inferencepools.kinference.buoyant.io"} 1.0' in text_a
