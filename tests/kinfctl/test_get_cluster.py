"""``kinfctl get`` against a cluster: the real kubernetes-asyncio client,
through a kubeconfig, against an in-process HTTP server that answers the
Kubernetes list protocol for our custom resources."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

GROUP, VERSION = "kinference.buoyant.io", "v1alpha1"

POLICIES = [
    {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePolicy",
     "metadata": {"name": "policy-1", "namespace": "default", "creationTimestamp": "2026-11-26T10:00:00Z"},
     "spec": {"unmatched": "ServeLocal", "rules": []},
     "status": {"ruleCount": 1, "state": "NotReferenced"}},
    {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePolicy",
     "metadata": {"name": "policy-3", "namespace": "default", "creationTimestamp": "2026-11-26T10:00:00Z"},
     "spec": {"unmatched": "Reject"},
     "status": {"ruleCount": 1, "state": "Accepted"}},
    # no status written (a namespace the router does not watch): RULES blank
    {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePolicy",
     "metadata": {"name": "policy-9", "namespace": "team-b"}, "spec": {}},
]


class FakeApiServer:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{{plural}}", self.list_namespaced)
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/{{plural}}", self.list_all)
        return app

    def _list(self, plural: str, items: list[dict[str, Any]]) -> web.Response:
        if plural != "inferencepolicies":
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                                     status=404)
        return web.json_response({"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferencePolicyList",
                                  "metadata": {"resourceVersion": "42"}, "items": items})

    async def list_namespaced(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.headers.get("Authorization")))
        ns = request.match_info["ns"]
        return self._list(request.match_info["plural"], [p for p in POLICIES if p["metadata"]["namespace"] == ns])

    async def list_all(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, request.headers.get("Authorization")))
        return self._list(request.match_info["plural"], POLICIES)


def kubeconfig(path: Path, port: int, namespace: str = "default") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "me", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "me", "namespace": namespace}}],
    }))
    return path


async def kinfctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kinfctl", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_get_policies_from_the_cluster(tmp_path: Path) -> None:
    fake = FakeApiServer()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        cfg = kubeconfig(tmp_path / "config", server.port)  # type: ignore[arg-type]
        code, out, err = await kinfctl("get", "infpol", "--kubeconfig", str(cfg))
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0].split() == ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"]
        assert lines[1].split()[:4] == ["policy-1", "1", "NotReferenced", "ServeLocal"]
        assert lines[2].split()[:4] == ["policy-3", "1", "Accepted", "Reject"]
        assert fake.requests[0] == (f"/apis/{GROUP}/{VERSION}/namespaces/default/inferencepolicies", "Bearer t0ken")

        code, out, _ = await kinfctl("get", "policies", "-A", "--kubeconfig", str(cfg))
        assert code == 0
        row = next(line for line in out.splitlines() if "policy-9" in line)
        # NAMESPACE NAME RULES STATE UNMATCHED AGE: no status, so RULES and STATE are blank
        assert row.split()[:3] == ["team-b", "policy-9", "ServeLocal"]

        code, _, err = await kinfctl("get", "pools", "--kubeconfig", str(cfg))
        assert code == 1 and "install the CRDs" in err and "Traceback" not in err
    finally:
        await server.close()


async def test_unreachable_cluster_and_no_kubeconfig(tmp_path: Path) -> None:
    cfg = kubeconfig(tmp_path / "config", 1)
    code, _, err = await kinfctl("get", "policies", "--kubeconfig", str(cfg))
    assert code == 1 and "cannot reach the cluster" in err and "Traceback" not in err
    code, _, err = await kinfctl("get", "policies", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 1 and "-f MANIFESTS" in err and "Traceback" not in err
