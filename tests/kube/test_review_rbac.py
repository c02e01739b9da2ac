"""RBAC denials (review of the Kubernetes mode): the fake API server
answers 403 to a user restricted to a service's declared rules, as RBAC
would; an informer denied its kind says so (forbidden, with the server's
message naming verb and resource), keeps retrying, stays unsynced, and
syncs once the permission is granted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
import structlog
import yaml

from kinference_common.kube import kinds
from kinference_common.kube.client import ApiException, ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.kube.informer import Informer
from kinference_common.kube.rbac import SERVICE_RULES

G = "kinference.buoyant.io"


async def test_a_restricted_user_gets_403_outside_its_rules(kube_api, tmp_path):
    kube_api.roles["router"] = SERVICE_RULES["router"]
    kube_api.role_namespaces["router"] = {"default"}  # its Secrets rule, bound in `default` only
    kc = kube_api.write_kubeconfig(tmp_path / "kc", user="router", token="router-token")
    api = await api_client(kc, "kinference-router")
    rc = ResourceClient(api)
    try:
        await rc.list(kinds.SECRET, "default")  # allowed
        for elsewhere in ("team-b", None):  # another namespace, and the cluster scope: no RoleBinding there
            with pytest.raises(ApiException) as info:
                await rc.list(kinds.SECRET, elsewhere)
            assert info.value.status == 403
        assert "at the cluster scope" in json.loads(info.value.body)["message"]
        with pytest.raises(ApiException) as info:
            await rc.list(kinds.INFERENCE_POLICY, "default")
        assert info.value.status == 403
        assert 'User "router" cannot list resource "inferencepolicies"' in json.loads(info.value.body)["message"]
    finally:
        await api.close()


async def test_an_informer_denied_its_kind_says_forbidden_and_syncs_once_granted(kube_api, tmp_path):
    kube_api.apply({"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy",
                    "metadata": {"name": "a", "namespace": "default"}, "spec": {}})
    kube_api.roles["collector"] = SERVICE_RULES["telemetry-collector"]  # no policies
    kc = kube_api.write_kubeconfig(tmp_path / "kc", user="collector", token="collector-token")
    api = await api_client(kc, "kinference-telemetry-collector")
    inf = Informer(ResourceClient(api), kinds.INFERENCE_POLICY, namespaces=["default"], watch_timeout=30,
                   backoff_base=0.02, backoff_cap=0.05)
    try:
        with structlog.testing.capture_logs() as logs:
            inf.start()
            loop = asyncio.get_running_loop()
            end = loop.time() + 5
            while inf.errors < 2 and loop.time() < end:
                await asyncio.sleep(0.02)
        assert not inf.synced.is_set()
        denied = [e for e in logs if e["event"].startswith("forbidden")]
        assert denied, logs
        assert 'cannot list resource "inferencepolicies"' in denied[0]["message"]
        assert denied[0]["namespace"] == "default"
        del kube_api.roles["collector"]  # the Role is fixed
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert inf.get("default", "a") is not None
    finally:
        await inf.stop()
        await api.close()


def test_the_process_writes_a_kubeconfig_per_token_and_applies_roles(tmp_path):
    kc = tmp_path / "kc"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kinference_simulators.kubeapi", "--port", "0", "--kubeconfig-out", str(kc),
         "--token", "router=tok-r", "--role", "router=router", "--role-namespaces", "router=default"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving on" in proc.stdout.readline()
        conf = yaml.safe_load((tmp_path / "kc.router").read_text())
        assert conf["users"][0]["user"]["token"] == "tok-r"

        async def probe() -> tuple[int, int, int]:
            api = await api_client(tmp_path / "kc.router", "probe")
            rc = ResourceClient(api)
            try:
                ok = len((await rc.list(kinds.SECRET, "default"))[0])
                statuses = []
                for kind, ns in ((kinds.SECRET, None), (kinds.POD, "default")):  # Secrets cluster-wide; pods
                    try:
                        await rc.list(kind, ns)
                        statuses.append(200)
                    except ApiException as exc:
                        statuses.append(exc.status)
                return ok, *statuses
            finally:
                await api.close()

        assert asyncio.run(probe()) == (0, 403, 403)
    finally:
        proc.terminate()
        proc.wait(10)
    bad = subprocess.run([sys.executable, "-m", "kinference_simulators.kubeapi", "--role", "x=nobody"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "expected USER=SERVICE" in bad.stderr and "Traceback" not in bad.stderr
