"""The whole stack in Kubernetes mode: every service a process pointed at the
in-process fake API server through a kubeconfig (policy-compiler, collector
and router with ``--source kubernetes``, the classifier), vLLM simulators as
"pods": each binds its own loopback address (127.0.0.2, 127.0.0.3, ...) on
its worker set's ``spec.port``, and the fake's Pod objects carry that address
as ``status.podIP`` with a ``Ready`` condition.

Shown: requests routed by HTTPRoute (two pools, one router), statuses written
(worker sets by the collector, pools by the compiler), a scale-up picked up,
terminating and deleted pods never routed to, a tenant key from a Secret, and
every API call each service made covered by its RBAC rules."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from kinference_common import natsserver, subjects
from kinference_common.kube import rbac

pytestmark = [pytest.mark.slow, pytest.mark.nats]

REPO = Path(__file__).resolve().parents[2]
GROUP = "kinference.buoyant.io"
TENANT_KEY = "sk-e2e-tenant-0f1e2d3c4b5a"
PATIENCE = 20.0


def free_port(hosts: tuple[str, ...]) -> int:
    """A port free on every one of ``hosts`` (each simulated pod binds its own address)."""
    for _ in range(50):
        port = natsserver.free_port()
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every loopback address")


class Procs:
    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.stopped: set[str] = set()

    async def start(self, name: str, *argv: str) -> None:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        self.procs[name] = await asyncio.create_subprocess_exec(
            sys.executable, *argv, stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL, cwd=str(REPO),
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()

    def log(self, name: str) -> str:
        p = self.logs / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def check(self) -> None:
        for name, p in self.procs.items():
            if p.returncode is not None and name not in self.stopped:
                raise AssertionError(f"{name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")

    async def stop(self, name: str) -> None:
        p = self.procs[name]
        self.stopped.add(name)
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(p.wait(), 5)
            except TimeoutError:
                p.kill()
                await p.wait()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(n) for n in list(self.procs)))


def engine(procs: Procs, pod: str, ip: str, port: int, model: str) -> Any:
    return procs.start(pod, "-m", "kinference_simulators.vllm", "--host", ip, "--port", str(port), "--model", model,
                       "--pod-name", pod, "--speed-profile", "fast", "--output-len-mean", "8", "--log-format", "json")


def pod(name: str, ip: str, app: str, *, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "labels": {"app": app}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "vllm"}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def manifests(port: int) -> list[dict[str, Any]]:
    def ws(name: str, model: str, app: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceWorkerSet",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"model": {"name": model}, "engine": "vLLM", "port": port,
                         "selector": {"matchLabels": {"app": app}}}}

    def pool(name: str, ws_name: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferencePool",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"destinations": [{"kind": "InferenceWorkerSet", "name": ws_name}],
                         "policyRef": {"name": "local-fastest"}}}

    def route(name: str, host: str, pool_name: str) -> dict[str, Any]:
        return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"parentRefs": [{"name": "inference-gateway"}], "hostnames": [host],
                         "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                                    "backendRefs": [{"group": GROUP, "kind": "InferencePool", "name": pool_name}]}]}}

    return [
        ws("qwen", "qwen-2.5", "qwen"), ws("llama", "llama-3", "llama"),
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferencePolicy",
         "metadata": {"name": "local-fastest", "namespace": "default"},
         "spec": {"rules": [{"name": "everything-local",
                             "route": {"select": [{"type": "Local", "minimize": "PredictedTTFT"}]}}]}},
        pool("qwen-pool", "qwen"), pool("llama-pool", "llama"),
        route("qwen-route", "qwen.example.com", "qwen-pool"), route("llama-route", "llama.example.com", "llama-pool"),
        {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceProvider",
         "metadata": {"name": "databricks", "namespace": "default"},
         "spec": {"url": "http://127.0.0.1:9/v1", "auth": {"secretRef": {"name": "databricks-token", "key": "token"}},
                  "models": [{"name": "qwen-2.5", "upstreamName": "db-qwen"}]}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "alice-key", "namespace": "default",
                                                            "labels": {"kinference.buoyant.io/tenant": "alice"}},
         "data": {"apiKey": base64.b64encode(TENANT_KEY.encode()).decode()}},
    ]


@pytest.fixture
async def stack(kube_api: Any, tmp_path: Path, nats_server: Any) -> AsyncIterator[dict[str, Any]]:
    ips = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    port = free_port(ips)
    kubeconfig = str(kube_api.write_kubeconfig(tmp_path / "kubeconfig"))
    for obj in manifests(port):
        kube_api.apply(obj)
    kube_api.apply(pod("qwen-0", "127.0.0.2", "qwen"))
    kube_api.apply(pod("qwen-1", "127.0.0.3", "qwen"))
    kube_api.apply(pod("llama-0", "127.0.0.5", "llama"))
    (tmp_path / "logs").mkdir()
    procs = Procs(tmp_path / "logs")
    data_port, admin_port, compiler_port, classifier_port = (free_port(("127.0.0.1",)) for _ in range(4))
    url = nats_server.url
    kube = ("--source", "kubernetes", "--kubeconfig", kubeconfig)
    await asyncio.gather(
        engine(procs, "qwen-0", "127.0.0.2", port, "qwen-2.5"),
        engine(procs, "qwen-1", "127.0.0.3", port, "qwen-2.5"),
        engine(procs, "llama-0", "127.0.0.5", port, "llama-3"),
        procs.start("policy-compiler", "-m", "kinference_policy_compiler", *kube, "--no-leader-elect",
                    "--nats-url", url, "--http-host", "127.0.0.1", "--http-port", str(compiler_port),
                    "--log-format", "json"),
        procs.start("classifier", "-m", "kinference_classifier", "--nats-url", url, "--health-host", "127.0.0.1",
                    "--health-port", str(classifier_port), "--log-format", "json"),
        procs.start("telemetry-collector", "-m", "kinference_collector", *kube, "--nats-url", url,
                    "--http-port", "0", "--dcgm-selector", "", "--log-format", "json"),
        procs.start("router", "-m", "kinference_router", *kube, "--nats-url", url, "--port", str(data_port),
                    "--admin-port", str(admin_port), "--log-level", "debug", "--log-format", "json"),
    )
    nc = await nats.connect(url)
    decisions: list[dict[str, Any]] = []

    async def on_decision(msg: Any) -> None:
        decisions.append(json.loads(msg.data))

    await nc.subscribe(f"{subjects.DECISIONS_PREFIX}.>", cb=on_decision)
    session = aiohttp.ClientSession()
    env = {"api": kube_api, "procs": procs, "port": port, "session": session, "decisions": decisions,
           "data": f"http://127.0.0.1:{data_port}", "admin": f"http://127.0.0.1:{admin_port}"}
    try:
        yield env
    finally:
        await session.close()
        await nc.close()
        await procs.stop_all()


async def until(env: dict[str, Any], cond: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + PATIENCE
    while True:
        env["procs"].check()
        got = cond()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def ws_status(env: dict[str, Any], name: str) -> dict[str, Any]:
    return (env["api"].get(GROUP, "InferenceWorkerSet", "default", name) or {}).get("status") or {}


async def ask(env: dict[str, Any], host: str, model: str, key: str = TENANT_KEY) -> tuple[int, dict[str, Any]]:
    status, body, _ = await ask_with_id(env, host, model, key)
    return status, body


async def ask_with_id(env: dict[str, Any], host: str, model: str,
                      key: str = TENANT_KEY) -> tuple[int, dict[str, Any], str]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
    async with env["session"].post(f"{env['data']}/v1/chat/completions", json=body,
                                   headers={"Host": host, "Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json(), r.headers.get("x-kinference-decision-id", "")


async def endpoints_of(env: dict[str, Any], host: str, model: str, n: int) -> set[str]:
    """Send ``n`` requests; the pods their own decision events name (an event
    is published after its answer: an earlier request's may still arrive)."""
    ids = []
    for _ in range(n):
        status, body, did = await ask_with_id(env, host, model)
        assert status == 200 and did, body
        ids.append(did)

    def mine() -> dict[str, dict[str, Any]] | None:
        got = {d["decision_id"]: d for d in env["decisions"] if d["decision_id"] in ids}
        return got if len(got) == n else None

    events = await until(env, mine, "the requests' decision events")
    return {d["outcome"]["endpoint"] for d in events.values()}


async def test_kubernetes_stack(stack: dict[str, Any]) -> None:
    env, api = stack, stack["api"]

    async def ready() -> bool:
        try:
            async with env["session"].get(f"{env['data']}/readyz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    await until(env, ready, "the router to have configuration")
    await until(env, lambda: ws_status(env, "qwen").get("readyEndpoints") == 2, "qwen's two ready endpoints")
    st = ws_status(env, "qwen")
    assert sorted((e["pod"], e["address"], e["ready"]) for e in st["endpoints"]) == [
        ("qwen-0", f"127.0.0.2:{env['port']}", True), ("qwen-1", f"127.0.0.3:{env['port']}", True)]
    assert st["conditions"][0]["type"] == "Ready" and st["conditions"][0]["status"] == "True"
    await until(env, lambda: (api.get(GROUP, "InferenceProvider", "default", "databricks") or {}).get("status"),
                "the provider's status (the collector's)")
    prov = api.get(GROUP, "InferenceProvider", "default", "databricks")["status"]
    assert prov["conditions"][0]["type"] == "Ready" and prov["conditions"][0]["reason"] == "Configured"
    pool_status = api.get(GROUP, "InferencePool", "default", "qwen-pool")["status"]
    # the route's Gateway inference-gateway does not exist: no parents[] entry claims it accepted the pool
    assert pool_status["parents"] == []

    # routed, by route: each host to its pool's pods; a tenant key from a Secret
    async def routable() -> bool:
        return (await ask(env, "qwen.example.com", "qwen-2.5"))[0] == 200 and \
            (await ask(env, "llama.example.com", "llama-3"))[0] == 200

    await until(env, routable, "both pools routable")
    assert await endpoints_of(env, "qwen.example.com", "qwen-2.5", 6) <= {"qwen-0", "qwen-1"}
    assert await endpoints_of(env, "llama.example.com", "llama-3", 2) == {"llama-0"}
    status, body = await ask(env, "nowhere.example.com", "qwen-2.5")
    assert status == 404 and body["error"]["code"] == "route_not_found"
    assert (await ask(env, "qwen.example.com", "qwen-2.5", key="sk-wrong"))[0] == 401

    # scale up: a new pod (and its engine) is picked up
    await engine(env["procs"], "qwen-2", "127.0.0.4", env["port"], "qwen-2.5")
    api.apply(pod("qwen-2", "127.0.0.4", "qwen", ready=False))  # scheduled, starting
    await until(env, lambda: len(ws_status(env, "qwen").get("endpoints", [])) == 3, "qwen-2 listed")
    api.set_status("", "Pod", "default", "qwen-2", pod("qwen-2", "127.0.0.4", "qwen")["status"])
    await until(env, lambda: ws_status(env, "qwen").get("readyEndpoints") == 3, "qwen-2 ready")

    # scale down: qwen-0 and qwen-1 terminate; from then on only qwen-2 serves
    for name, ip in (("qwen-0", "127.0.0.2"), ("qwen-1", "127.0.0.3")):
        api.apply(pod(name, ip, "qwen", deleting=True))
    await until(env, lambda: ws_status(env, "qwen").get("readyEndpoints") == 1, "terminating pods not ready")
    await asyncio.sleep(0.5)  # the collector's next scrape publishes them not ready; the router rebuilds
    assert await endpoints_of(env, "qwen.example.com", "qwen-2.5", 6) == {"qwen-2"}
    for name in ("qwen-0", "qwen-1"):
        api.delete("", "Pod", "default", name)
        await env["procs"].stop(name)
    await until(env, lambda: [e["pod"] for e in ws_status(env, "qwen").get("endpoints", [])] == ["qwen-2"],
                "deleted pods gone from the status")
    assert await endpoints_of(env, "qwen.example.com", "qwen-2.5", 4) == {"qwen-2"}

    # every API call of each service is covered by its RBAC rules; the router's are exactly them
    for ua, service in (("kinference-router", "router"), ("kinference-telemetry-collector", "telemetry-collector"),
                        ("kinference-policy-compiler", "policy-compiler")):
        used = api.used(ua)
        assert used, f"{ua} made no API call (User-Agent not recorded?)"
        assert rbac.not_allowed(service, used) == [], service
    assert api.used("kinference-router") == {("list", "", "secrets"), ("watch", "", "secrets")}
    # the tenant key never reached a log, even at debug level
    for name in env["procs"].procs:
        assert TENANT_KEY not in env["procs"].log(name)
        assert base64.b64encode(TENANT_KEY.encode()).decode() not in env["procs"].log(name)
