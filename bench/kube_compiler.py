"""The policy compiler in Kubernetes mode: ``make bench-kube``
(``python -m bench.kube_compiler``).

Against the in-process fake API server and a real nats-server, with a fleet
of N namespaces, each holding a policy, a pool, two worker sets and a
provider (``--namespaces-count``, default 50):

1. start-up: from start to every status written, and the API requests that took;
2. edit-to-status latency: a policy's spec patched, until its status shows
   the new generation (p50 / p95 / max over ``--edits``);
3. idle: API writes in ``--idle`` seconds with nothing changing (a
   level-triggered controller that writes only differences makes none);
4. failover: the leader stops without releasing its Lease; time until the
   standby has written a status changed meanwhile (bounded below by the
   lease duration, here 3 s).

Results: a table on stdout and ``bench/results/kube_compiler.json``.
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

from kinference_common import logs, natsserver
from kinference_policy_compiler.kube_mode import KubernetesMode, KubeSettings
from kinference_policy_compiler.service import Settings
from kinference_simulators.kubeapi import FakeKubeAPI

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "kube_compiler.json"
G = "kinference.buoyant.io"
V = f"{G}/v1alpha1"


def fleet(ns: str) -> list[dict[str, Any]]:
    meta = lambda name: {"name": name, "namespace": ns}  # noqa: E731
    return [
        {"apiVersion": V, "kind": "InferenceWorkerSet", "metadata": meta("qwen"),
         "spec": {"model": {"name": "qwen-2.5"}, "selector": {"matchLabels": {"app": "qwen"}}, "port": 8000}},
        {"apiVersion": V, "kind": "InferenceWorkerSet", "metadata": meta("gemma"),
         "spec": {"model": {"name": "gemma-4"}, "selector": {"matchLabels": {"app": "gemma"}}, "port": 8000}},
        {"apiVersion": V, "kind": "InferenceProvider", "metadata": meta("cloud"),
         "spec": {"url": "https://example.com/v1", "auth": {"secretRef": {"name": "k", "key": "token"}},
                  "models": [{"name": "qwen-2.5"}]}},
        {"apiVersion": V, "kind": "InferencePolicy", "metadata": meta("policy"),
         "spec": {"rules": [{"name": "r0", "route": {"select": [{"type": "Local", "minimize": "PredictedTTFT"},
                                                               {"type": "Provider"}]}}]}},
        {"apiVersion": V, "kind": "InferencePool", "metadata": meta("pool"),
         "spec": {"destinations": [{"kind": "InferenceWorkerSet", "name": "qwen"},
                                   {"kind": "InferenceWorkerSet", "name": "gemma"},
                                   {"kind": "InferenceProvider", "name": "cloud"}],
                  "policyRef": {"name": "policy"}}},
    ]


def status_gen(api: FakeKubeAPI, kind: str, ns: str, name: str) -> int | None:
    obj = api.get(G, kind, ns, name) or {}
    conds = (obj.get("status") or {}).get("conditions") or []
    return conds[0].get("observedGeneration") if conds else None


async def wait_for(pred: Any, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


def writes(api: FakeKubeAPI, since: int) -> int:
    return sum(1 for r in api.requests[since:] if r.verb in ("create", "update", "patch")
               and r.resource != "leases")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    api = FakeKubeAPI([REPO / "deploy" / "k8s" / "crds"])
    await api.start()
    namespaces = [f"team-{i:03d}" for i in range(args.namespaces_count)]
    for ns in namespaces:
        for obj in fleet(ns):
            api.apply(obj)
    tmp = Path(tempfile.mkdtemp(prefix="bench-kube-"))
    modes: list[KubernetesMode] = []
    out: dict[str, Any] = {"namespaces": len(namespaces), "objects": len(namespaces) * 5}
    with natsserver.start() as nats:
        def make(identity: str) -> KubernetesMode:
            kc = api.write_kubeconfig(tmp / identity, user=identity, token=f"t-{identity}")
            m = KubernetesMode(Settings(manifests=Path("."), nats_url=nats.url, interval=0.05, http_port=None),
                               KubeSettings(kubeconfig=str(kc), identity=identity, lease_namespace="default",
                                            lease_duration=3.0, renew_deadline=2.0, retry_period=0.4))
            modes.append(m)
            return m
        try:
            mark = len(api.requests)
            t0 = time.perf_counter()
            leader = make("a")
            await leader.start()
            await wait_for(lambda: all(status_gen(api, "InferencePool", ns, "pool") == 1 for ns in namespaces)
                           and all(status_gen(api, "InferencePolicy", ns, "policy") == 1 for ns in namespaces))
            out["startup_s"] = time.perf_counter() - t0
            out["startup_requests"] = len(api.requests) - mark
            out["startup_writes"] = writes(api, mark)

            standby = make("b")
            await standby.start()
            lat = []
            for i in range(args.edits):
                ns = namespaces[i % len(namespaces)]
                obj = api.get(G, "InferencePolicy", ns, "policy")
                assert obj is not None
                obj["spec"]["rules"][0]["name"] = f"r{i + 1}"
                t = time.perf_counter()
                gen = api.apply(obj)["metadata"]["generation"]
                await wait_for(lambda ns=ns, gen=gen: status_gen(api, "InferencePolicy", ns, "policy") == gen)
                lat.append((time.perf_counter() - t) * 1000)
            lat.sort()
            out["edit_to_status_ms"] = {"p50": statistics.median(lat), "p95": lat[int(len(lat) * 0.95) - 1],
                                        "max": lat[-1], "n": len(lat)}

            await asyncio.sleep(1.0)
            mark = len(api.requests)
            await asyncio.sleep(args.idle)
            out["idle_s"] = args.idle
            out["idle_writes"] = writes(api, mark)
            out["idle_requests"] = len(api.requests) - mark

            await leader.stop(release=False)
            obj = api.get(G, "InferencePolicy", namespaces[0], "policy")
            assert obj is not None
            obj["spec"]["unmatched"] = "Reject"
            t = time.perf_counter()
            gen = api.apply(obj)["metadata"]["generation"]
            await wait_for(lambda: status_gen(api, "InferencePolicy", namespaces[0], "policy") == gen)
            out["failover_to_status_s"] = time.perf_counter() - t
            out["lease_duration_s"] = 3.0
        finally:
            for m in modes:
                await m.stop()
            await api.stop()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namespaces-count", type=int, default=50)
    p.add_argument("--edits", type=int, default=40)
    p.add_argument("--idle", type=float, default=10.0)
    args = p.parse_args()
    logs.configure("error", "console")
    res = asyncio.run(run(args))
    res["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    e = res["edit_to_status_ms"]
    rows = [
        ("objects in the cluster", f"{res['objects']} ({res['namespaces']} namespaces)"),
        ("start-up to every status written", f"{res['startup_s']:.2f} s, {res['startup_requests']} requests, "
                                             f"{res['startup_writes']} writes"),
        ("edit -> status, p50 / p95 / max", f"{e['p50']:.0f} / {e['p95']:.0f} / {e['max']:.0f} ms (n={e['n']})"),
        (f"idle {res['idle_s']:.0f} s: writes / requests", f"{res['idle_writes']} / {res['idle_requests']}"),
        ("failover: leader gone -> status", f"{res['failover_to_status_s']:.2f} s (lease 3 s)"),
    ]
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=2))
    print(f"-> {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
