"""Kubernetes-mode data plane: how fast a pod change reaches the status and
the router. ``make bench-kube-dataplane`` (``python -m bench.kube_dataplane``).

In one process: the fake API server (kinference_simulators.kubeapi), a real
nats-server, the collector with ``KubeDiscovery`` (real kubernetes_asyncio
client) scraping two vLLM-like pages on 127.0.0.2 and 127.0.0.3, and a
``MultiPoolRouter`` following the pool. Each round flips one pod's Ready
condition (False, then True) on the API server and measures, from that
write, until

- ``router``: the router's telemetry for the pod shows the new readiness
  (what its next decision uses);
- ``status``: the InferenceWorkerSet's ``status.readyEndpoints`` shows it.

Results: a table on stdout and ``bench/results/kube_dataplane.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "kube_dataplane.json"
REPO = Path(__file__).resolve().parents[1]
GROUP = "kinference.buoyant.io"


def _pod(name: str, ip: str, ready: bool) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                            "labels": {"app": "qwen"}},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


async def run(rounds: int) -> dict[str, Any]:
    import nats
    from aiohttp import web

    from kinference_collector import pages
    from kinference_collector.derive import DeriveConfig
    from kinference_collector.kube_discovery import KubeDiscovery
    from kinference_collector.publish import NatsBus, Publisher
    from kinference_collector.service import Collector, CollectorConfig
    from kinference_common import natsserver
    from kinference_common.compiler import compile_documents
    from kinference_common.kube.client import ResourceClient
    from kinference_common.kube.config import api_client
    from kinference_common.manifests import load_text
    from kinference_policy_compiler.publisher import ConfigPublisher
    from kinference_router.app import RouterSettings
    from kinference_router.pools import MultiPoolRouter
    from kinference_router.tenants import Authenticator
    from kinference_router.upstream import SecretFiles
    from kinference_simulators.kubeapi import FakeKubeAPI

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    runners = []
    for ip in ("127.0.0.2", "127.0.0.3"):
        app = web.Application()
        page = pages.VllmPage(model="qwen-2.5")
        app.router.add_get("/metrics", lambda _r, page=page: web.Response(text=pages.render_vllm(page)))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, ip, port).start()
        runners.append(runner)

    manifests = f"""
apiVersion: {GROUP}/v1alpha1
kind: InferenceWorkerSet
metadata: {{name: qwen, namespace: default}}
spec: {{model: {{name: qwen-2.5}}, engine: vLLM, port: {port}, selector: {{matchLabels: {{app: qwen}}}}}}
---
apiVersion: {GROUP}/v1alpha1
kind: InferencePool
metadata: {{name: qwen-pool, namespace: default}}
spec: {{destinations: [{{kind: InferenceWorkerSet, name: qwen}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: qwen, namespace: default}}
spec:
  hostnames: [qwen.example.com]
  rules: [{{backendRefs: [{{group: {GROUP}, kind: InferencePool, name: qwen-pool}}]}}]
"""
    api = FakeKubeAPI([REPO / "deploy" / "k8s" / "crds"])
    await api.start()
    import yaml

    for doc in yaml.safe_load_all(manifests):
        api.apply(doc)
    api.apply(_pod("qwen-0", "127.0.0.2", True))
    api.apply(_pod("qwen-1", "127.0.0.3", True))
    results: dict[str, list[float]] = {"router": [], "status": []}
    with natsserver.start() as server, tempfile.TemporaryDirectory() as tmp:
        kc = api.write_kubeconfig(Path(tmp) / "kubeconfig")
        kapi = await api_client(kc, "kinference-telemetry-collector")
        cnc = await nats.connect(server.url)
        bus = NatsBus(cnc)
        await bus.start()
        cfg = CollectorConfig(interval=0.1, timeout=0.3, derive=DeriveConfig(stale_after=1.0))
        discovery = KubeDiscovery(ResourceClient(kapi), dcgm_selector="")
        collector = Collector(cfg, discovery, Publisher(bus, cfg.min_publish_interval))
        await collector.start()
        attached = asyncio.create_task(discovery.attach(collector))
        rnc = await nats.connect(server.url)
        pub = ConfigPublisher(rnc)
        await pub.start()
        await pub.publish(compile_documents(load_text(manifests, "m")).pools)
        router = MultiPoolRouter(RouterSettings(), Authenticator("none"), SecretFiles(None), nc=rnc)
        await router.start()

        def status_ready() -> int | None:
            return ((api.get(GROUP, "InferenceWorkerSet", "default", "qwen") or {}).get("status") or {}
                    ).get("readyEndpoints")

        def router_ready(pod: str) -> bool | None:
            st = router.keeper.endpoints.get(f"default/qwen/{pod}")
            return None if st is None else st.ready

        async def wait(cond: Any, timeout: float = 10.0) -> float:
            t0 = time.perf_counter()
            while not cond():
                if time.perf_counter() - t0 > timeout:
                    raise RuntimeError("timed out")
                await asyncio.sleep(0.005)
            return time.perf_counter() - t0

        await wait(lambda: status_ready() == 2 and router_ready("qwen-1"), 20.0)
        try:
            for i in range(rounds):
                ready = i % 2 == 1
                t0 = time.perf_counter()
                api.set_status("", "Pod", "default", "qwen-1", _pod("qwen-1", "127.0.0.3", ready)["status"])
                want = 2 if ready else 1
                pending = {"router", "status"}
                while pending:
                    if "router" in pending and router_ready("qwen-1") is ready:
                        results["router"].append(time.perf_counter() - t0)
                        pending.discard("router")
                    if "status" in pending and status_ready() == want:
                        results["status"].append(time.perf_counter() - t0)
                        pending.discard("status")
                    if time.perf_counter() - t0 > 10:
                        raise RuntimeError(f"round {i}: {pending} not reached")
                    await asyncio.sleep(0.005)
                await asyncio.sleep(1.1)  # status writes are at most once a second per object
        finally:
            await router.stop()
            attached.cancel()
            await asyncio.gather(attached, return_exceptions=True)
            await collector.stop()
            await rnc.close()
            await cnc.close()
            await kapi.close()
            await api.stop()
            for r in runners:
                await r.cleanup()
    return {k: {"n": len(v), "p50_ms": statistics.median(v) * 1e3, "p95_ms": sorted(v)[int(0.95 * (len(v) - 1))] * 1e3,
                "max_ms": max(v) * 1e3} for k, v in results.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kube_dataplane", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    out = asyncio.run(run(args.rounds))
    print(f"{'pod Ready flip reaches':<24}{'n':>4}{'p50 ms':>10}{'p95 ms':>10}{'max ms':>10}")
    for k, v in out.items():
        print(f"{k:<24}{v['n']:>4}{v['p50_ms']:>10.0f}{v['p95_ms']:>10.0f}{v['max_ms']:>10.0f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.platform(), "results": out}, indent=2))
    print(f"-> {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
