"""CRDs applied with kubectl, as on a real cluster (review of the Kubernetes
mode: `kubectl apply -f deploy/k8s/crds` failed against the fake with "no
matches for kind CustomResourceDefinition"), and a missing CRD installed
while the compiler's informer waits for it."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from kinference_common.kube import kinds
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.kube.informer import Informer
from kinference_simulators.kubeapi import FakeKubeAPI

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "k8s" / "crds"
G = "kinference.buoyant.io"


@pytest.fixture
async def bare_api():
    api = FakeKubeAPI()  # built-in kinds only: no Kinference CRD installed
    await api.start()
    yield api
    await api.stop()


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_applies_the_crds_then_the_examples(bare_api, tmp_path):
    kc = bare_api.write_kubeconfig(tmp_path / "kc")

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["kubectl", "--kubeconfig", str(kc), *args], capture_output=True, text=True,
                              timeout=60)

    loop = asyncio.get_running_loop()
    out = await loop.run_in_executor(None, kubectl, "apply", "--validate=false", "-f", str(CRDS))
    assert out.returncode == 0, out.stderr
    assert "customresourcedefinition.apiextensions.k8s.io/inferencepolicies.kinference.buoyant.io created" \
        in out.stdout
    out = await loop.run_in_executor(None, kubectl, "apply", "--validate=false", "-f",
                                     str(REPO / "deploy" / "examples"))
    assert out.returncode == 0, out.stderr
    out = await loop.run_in_executor(None, kubectl, "get", "infpol")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0].split() == ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"]
    assert "ServeLocal" in out.stdout  # the CRD's default, filled in by the server
    out = await loop.run_in_executor(None, kubectl, "get", "crd")
    assert "inferencepools.kinference.buoyant.io" in out.stdout


async def test_an_informer_picks_up_a_crd_installed_later(bare_api, tmp_path):
    kc = bare_api.write_kubeconfig(tmp_path / "kc")
    api = await api_client(kc, "kinference-test")
    rc = ResourceClient(api)
    inf = Informer(rc, kinds.INFERENCE_POLICY, watch_timeout=30, missing_recheck=0.1)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)  # a missing kind counts as empty
        assert inf.missing
        import yaml

        crd = yaml.safe_load((CRDS / "inferencepolicies.yaml").read_text())
        bare_api.apply(crd)  # as kubectl apply does (the HTTP path is the test above)
        bare_api.apply({"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy",
                        "metadata": {"name": "late", "namespace": "default"}, "spec": {"rules": []}})
        loop = asyncio.get_running_loop()
        end = loop.time() + 5
        while inf.get("default", "late") is None:
            assert loop.time() < end, "the policy of the CRD installed later never arrived"
            await asyncio.sleep(0.02)
        assert not inf.missing
    finally:
        await inf.stop()
        await api.close()
