"""The collector's Kubernetes mode: pods of worker sets from the (fake) API
server, their readiness, DCGM exporter pods, and the statuses it writes
(InferenceWorkerSet, InferenceProvider), with the real kubernetes_asyncio
client, a real nats-server and real vLLM-like pages on loopback addresses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import nats
import pytest
from aiohttp import web

from kinference_collector import pages
from kinference_collector.derive import DeriveConfig, EndpointTracker
from kinference_collector.discovery import Target
from kinference_collector.kube_discovery import (
    KubeDiscovery,
    dcgm_targets,
    parse_label_selector,
    pod_ready,
    selector_matches,
    worker_set_targets,
)
from kinference_collector.kube_status import provider_status, worker_set_status
from kinference_collector.publish import NatsBus, Publisher
from kinference_collector.service import Collector, CollectorConfig
from kinference_common import subjects
from kinference_common.kube import rbac
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.messages import EndpointState, Observation, ProviderState, encode
from kinference_common.natsserver import free_port

GROUP = "kinference.buoyant.io"
PATIENCE = 10.0


def pod(name: str, ip: str | None, *, ready: bool = True, labels: dict[str, str] | None = None,
        ns: str = "default", deleting: bool = False, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels if labels is not None else {"app": "qwen"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "vllm"}]},
            "status": status}


def worker_set(name: str = "qwen", port: int = 8000, selector: dict[str, Any] | None = None,
               ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceWorkerSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"name": "qwen-2.5"}, "engine": "vLLM", "port": port,
                     "selector": selector if selector is not None else {"matchLabels": {"app": "qwen"}}}}


# ---------------------------------------------------------------- pure part


def test_selectors_and_readiness() -> None:
    labels = {"app": "qwen", "tier": "gpu"}
    assert selector_matches({"matchLabels": {"app": "qwen"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "llama"}}, labels)
    assert not selector_matches({}, labels) and not selector_matches(None, labels)  # never "every pod"
    expr = [{"key": "tier", "operator": "In", "values": ["gpu", "tpu"]}, {"key": "spot", "operator": "DoesNotExist"}]
    assert selector_matches({"matchExpressions": expr}, labels)
    assert not selector_matches({"matchExpressions": expr}, {**labels, "spot": "1"})
    assert not selector_matches({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, labels)
    assert parse_label_selector("app=nvidia-dcgm-exporter, x==y") == {"app": "nvidia-dcgm-exporter", "x": "y"}
    with pytest.raises(ValueError, match="not key=value"):
        parse_label_selector("app")
    assert pod_ready(pod("a", "10.0.0.1"))
    assert not pod_ready(pod("a", "10.0.0.1", ready=False))
    assert not pod_ready(pod("a", "10.0.0.1", deleting=True))  # terminating = not ready


def test_targets_of_worker_sets() -> None:
    pods = [pod("q-0", "10.0.0.1"), pod("q-1", "10.0.0.2", ready=False), pod("q-2", None),
            pod("q-3", "10.0.0.4", phase="Succeeded"), pod("q-4", "fd00::5"),
            pod("other", "10.0.0.6", labels={"app": "llama"}), pod("q-elsewhere", "10.0.0.7", ns="team-b")]
    targets = worker_set_targets([worker_set(port=8000)], pods)
    assert [(t.pod, t.address, t.ready) for t in targets] == [
        ("q-0", "10.0.0.1:8000", True), ("q-1", "10.0.0.2:8000", False), ("q-4", "[fd00::5]:8000", True)]
    assert {t.namespace for t in targets} == {"default"} and {t.model for t in targets} == {"qwen-2.5"}
    assert worker_set_targets([worker_set(port=0)], pods) == []  # invalid spec: nothing to scrape
    exporters = [pod("dcgm-a", "10.1.0.1", labels={"app": "nvidia-dcgm-exporter"}, ns="gpu-operator"),
                 pod("dcgm-b", None, labels={"app": "nvidia-dcgm-exporter"})]
    assert dcgm_targets([*pods, *exporters], {"app": "nvidia-dcgm-exporter"}, 9400) == [
        Target(kind="dcgm", address="10.1.0.1:9400")]


def test_desired_statuses() -> None:
    ws = worker_set()
    t0 = Target(namespace="default", worker_set="qwen", pod="q-0", address="10.0.0.1:8000", model="qwen-2.5")
    t1 = Target(namespace="default", worker_set="qwen", pod="q-1", address="10.0.0.2:8000", model="qwen-2.5",
                ready=False)
    now = 1_800_000_047.0
    tr = EndpointTracker(t0, DeriveConfig(stale_after=1.0))
    tr.last_success = now - 0.2
    st = worker_set_status(ws, [t0, t1], {t0.key: tr}, now, scrape_granularity=30)
    assert st["readyEndpoints"] == 1
    assert st["endpoints"] == [
        {"pod": "q-0", "address": "10.0.0.1:8000", "ready": True, "lastScrape": "2027-01-15T08:00:30Z"},
        {"pod": "q-1", "address": "10.0.0.2:8000", "ready": False}]
    (cond,) = st["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Ready", "True", "EndpointsReady")
    # a scrape 5 s later within the same 30 s step changes nothing (no write)
    tr.last_success = now + 5
    assert worker_set_status({**ws, "status": st}, [t0, t1], {t0.key: tr}, now + 5.2)["endpoints"] == st["endpoints"]
    none = worker_set_status(ws, [], {}, now)
    assert none["readyEndpoints"] == 0 and none["conditions"][0]["reason"] == "NoEndpoints"

    prov = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceProvider",
            "metadata": {"name": "db", "namespace": "default", "generation": 3},
            "spec": {"url": "https://x", "auth": {"secretRef": {"name": "s", "key": "token"}},
                     "models": [{"name": "qwen-2.5"}]}}
    unseen = provider_status(prov, None, now)
    assert unseen["conditions"][0]["status"] == "True" and unseen["conditions"][0]["observedGeneration"] == 3
    assert unseen["estimatedTTFT"] is None and unseen["errorRate"] is None
    seen = provider_status(prov, ProviderState(namespace="default", name="db", estimated_ttft_seconds=0.8437,
                                               error_rate=0.1234, observations=9), now)
    assert (seen["estimatedTTFT"], seen["errorRate"]) == ("840ms", 0.12)
    failing = provider_status(prov, ProviderState(namespace="default", name="db", error_rate=0.8,
                                                  observations=10), now)
    assert failing["conditions"][0]["reason"] == "HighErrorRate"
    incomplete = provider_status({**prov, "spec": {"url": "https://x"}}, None, now)
    assert incomplete["conditions"][0]["reason"] == "Incomplete"
    assert "spec.auth.secretRef" in incomplete["conditions"][0]["message"]


# ------------------------------------------------------ against the fake API


class Engine:
    """A vLLM-like /metrics page on its own loopback address (a simulated pod)."""

    def __init__(self, ip: str, port: int) -> None:
        self.ip, self.port = ip, port
        self.page = pages.VllmPage(model="qwen-2.5")
        self._runner: web.AppRunner | None = None

    async def start(self) -> Engine:
        app = web.Application()

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=pages.render_vllm(self.page), content_type="text/plain")

        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.ip, self.port).start()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def until(cond: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + PATIENCE
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def running(kube_api: Any, kubeconfig: Any, nats_server: Any) -> AsyncIterator[dict[str, Any]]:
    api = await api_client(kubeconfig, "kinference-telemetry-collector")
    client = await nats.connect(nats_server.url)
    nats_bus = NatsBus(client)
    await nats_bus.start()
    cfg = CollectorConfig(interval=0.1, timeout=0.3, derive=DeriveConfig(window=5.0, stale_after=1.0))
    discovery = KubeDiscovery(ResourceClient(api), dcgm_selector="app=nvidia-dcgm-exporter")
    c = Collector(cfg, discovery, Publisher(nats_bus, cfg.min_publish_interval))
    await c.start()
    task = asyncio.create_task(discovery.attach(c))
    env = {"api": kube_api, "collector": c, "discovery": discovery, "nc": client, "engines": []}
    try:
        yield env
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await c.stop()
        for e in env["engines"]:
            await e.stop()
        await client.drain()
        await api.close()


def ws_status(api: Any, name: str = "qwen") -> dict[str, Any]:
    return (api.get(GROUP, "InferenceWorkerSet", "default", name) or {}).get("status") or {}


def status_writes(api: Any) -> int:
    return sum(1 for r in api.requests if r.who == "kinference-telemetry-collector" and r.verb == "patch"
               and r.resource.endswith("/status"))


async def test_pods_scheduled_ready_terminating_deleted(running: dict[str, Any]) -> None:
    api, c = running["api"], running["collector"]
    port = free_port()
    for ip in ("127.0.0.2", "127.0.0.3"):
        running["engines"].append(await Engine(ip, port).start())
    states: dict[str, list[EndpointState]] = {}
    dec = msgspec.json.Decoder(EndpointState)

    async def on_state(msg: Any) -> None:
        st = dec.decode(msg.data)
        states.setdefault(st.pod, []).append(st)

    await running["nc"].subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=on_state)

    api.apply(worker_set(port=port))
    api.apply(pod("qwen-0", "127.0.0.2"))
    api.apply(pod("qwen-1", None, ready=False))  # scheduled, no IP yet
    await until(lambda: ws_status(api).get("readyEndpoints") == 1, "one ready endpoint")
    st = ws_status(api)
    assert [e["pod"] for e in st["endpoints"]] == ["qwen-0"]
    assert st["endpoints"][0]["address"] == f"127.0.0.2:{port}" and "lastScrape" in st["endpoints"][0]
    assert st["conditions"][0]["status"] == "True"
    assert states["qwen-0"][-1].ready and states["qwen-0"][-1].address == f"127.0.0.2:{port}"

    # qwen-1 gets its IP (not ready yet), then turns ready
    api.set_status("", "Pod", "default", "qwen-1", pod("qwen-1", "127.0.0.3", ready=False)["status"])
    await until(lambda: len(ws_status(api).get("endpoints", [])) == 2, "two endpoints")
    assert ws_status(api)["readyEndpoints"] == 1
    assert [e["ready"] for e in ws_status(api)["endpoints"]] == [True, False]
    api.set_status("", "Pod", "default", "qwen-1", pod("qwen-1", "127.0.0.3")["status"])
    await until(lambda: ws_status(api).get("readyEndpoints") == 2, "two ready endpoints")
    await until(lambda: states.get("qwen-1") and states["qwen-1"][-1].ready, "qwen-1 published ready")

    # nothing changes: no more status writes (lastScrape moves every 30 s only)
    writes = status_writes(api)
    await asyncio.sleep(2.5)
    assert status_writes(api) <= writes + 1  # at most one 30 s lastScrape step can fall in the window

    # qwen-0 terminates: not ready at once (still serving), then gone
    api.apply({**pod("qwen-0", "127.0.0.2"), "metadata": {**pod("qwen-0", "127.0.0.2")["metadata"],
                                                             "deletionTimestamp": "2026-12-01T00:00:00Z"}})
    await until(lambda: states["qwen-0"][-1].ready is False, "qwen-0 published not ready")
    await until(lambda: ws_status(api).get("readyEndpoints") == 1, "qwen-0 not ready in status")
    api.delete("", "Pod", "default", "qwen-0")
    await until(lambda: [e["pod"] for e in ws_status(api).get("endpoints", [])] == ["qwen-1"], "qwen-0 gone")
    kv = await running["nc"].jetstream().key_value(subjects.TELEMETRY_BUCKET)

    async def key_exists() -> bool:
        try:
            entry = await kv.get(subjects.endpoint_key("default", "qwen", "qwen-0"))
            return bool(entry.value)
        except Exception:
            return False

    deadline = time.monotonic() + PATIENCE
    while await key_exists():
        assert time.monotonic() < deadline, "qwen-0's telemetry key was not removed"
        await asyncio.sleep(0.05)
    assert ("default", "qwen", "qwen-0") not in {k[1:] for k in c.trackers}

    # every call the collector made is in its declared RBAC rules
    used = api.used("kinference-telemetry-collector")
    assert ("watch", "", "pods") in used and ("patch", GROUP, "inferenceworkersets/status") in used
    assert rbac.not_allowed("telemetry-collector", used) == []


async def test_provider_status_and_dcgm_exporters(running: dict[str, Any]) -> None:
    api, c, d = running["api"], running["collector"], running["discovery"]
    api.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceProvider",
               "metadata": {"name": "databricks", "namespace": "default"},
               "spec": {"url": "https://example.invalid/serving-endpoints",
                        "auth": {"secretRef": {"name": "databricks-token", "key": "token"}},
                        "models": [{"name": "qwen-2.5", "upstreamName": "db-qwen"}]}})
    api.apply({"apiVersion": f"{GROUP}/v1alpha1", "kind": "InferenceProvider",
               "metadata": {"name": "half", "namespace": "default"}, "spec": {"url": "https://x.invalid"}})

    def prov(name: str) -> dict[str, Any]:
        return (api.get(GROUP, "InferenceProvider", "default", name) or {}).get("status") or {}

    await until(lambda: prov("databricks").get("conditions"), "provider status")
    assert prov("databricks")["conditions"][0]["reason"] == "Configured"
    assert "estimatedTTFT" not in prov("databricks")
    await until(lambda: prov("half").get("conditions"), "incomplete provider status")
    assert prov("half")["conditions"][0]["reason"] == "Incomplete"
    first_transition = prov("databricks")["conditions"][0]["lastTransitionTime"]

    for ttft in (0.5, 2.0):
        c.on_observation(encode(Observation(decision_id="d", namespace="default", pool="p", backend_type="Provider",
                                            backend_name="databricks", outcome="ok", ttft_seconds=ttft)))
    await until(lambda: prov("databricks").get("estimatedTTFT") == "1s", "estimatedTTFT written")
    assert prov("databricks")["errorRate"] == 0.0
    assert prov("databricks")["conditions"][0]["lastTransitionTime"] == first_transition  # status unchanged

    # DCGM exporters from the same pod watch, by label, on --dcgm-port
    api.apply(pod("dcgm-x", "127.0.0.9", labels={"app": "nvidia-dcgm-exporter"}))
    await until(lambda: c._dcgm, "a DCGM target")
    assert all(t.kind == "vllm" for t in d.vllm_targets())
    assert [v.target.address for v in c._dcgm.values()] == ["127.0.0.9:9400"]
    assert rbac.not_allowed("telemetry-collector", api.used("kinference-telemetry-collector")) == []


async def test_reporter_waits_for_a_first_scrape_and_writes_only_changes() -> None:
    from kinference_collector.kube_status import StatusReporter

    writes: list[tuple[str, dict[str, Any]]] = []
    now = [1_800_000_000.0]

    async def write(kind: str, observed: dict[str, Any], desired: dict[str, Any]) -> bool:
        writes.append((kind, desired))
        observed["status"] = desired  # what the API server now shows
        return True

    ws = worker_set()
    t0 = Target(namespace="default", worker_set="qwen", pod="q-0", address="10.0.0.1:8000", model="qwen-2.5")
    tr = EndpointTracker(t0, DeriveConfig(stale_after=1.0))
    rep = StatusReporter(write, clock=lambda: now[0])
    await rep.report([ws], [], [t0], {t0.key: tr}, lambda ns, n: None)
    assert writes == []  # q-0 never scraped yet: its readiness is unknown, nothing written
    tr.last_success = now[0]
    await rep.report([ws], [], [t0], {t0.key: tr}, lambda ns, n: None)
    assert len(writes) == 1 and writes[0][1]["readyEndpoints"] == 1
    for _ in range(5):  # scrapes go on, a second apart: nothing changes, nothing written
        now[0] += 1
        tr.last_success = now[0] - 0.1
        await rep.report([ws], [], [t0], {t0.key: tr}, lambda ns, n: None)
    assert len(writes) == 1
    now[0] += 30  # the next lastScrape step
    tr.last_success = now[0]
    await rep.report([ws], [], [t0], {t0.key: tr}, lambda ns, n: None)
    assert len(writes) == 2 and writes[1][1]["endpoints"][0]["lastScrape"] != writes[0][1]["endpoints"][0]["lastScrape"]


async def test_api_server_outage_keeps_targets_and_converges(running: dict[str, Any]) -> None:
    api, c = running["api"], running["collector"]
    port = free_port()
    running["engines"].append(await Engine("127.0.0.2", port).start())
    running["engines"].append(await Engine("127.0.0.3", port).start())
    api.apply(worker_set(port=port))
    api.apply(pod("qwen-0", "127.0.0.2"))
    api.apply(pod("qwen-1", "127.0.0.3", ready=False))
    await until(lambda: ws_status(api).get("readyEndpoints") == 1, "one ready endpoint")
    api.go_down(3.0)  # every request 503, watches cut
    # meanwhile qwen-1 turns ready (a direct store write: nobody can see it until the API is back)
    api.set_status("", "Pod", "default", "qwen-1", pod("qwen-1", "127.0.0.3")["status"])
    await asyncio.sleep(1.0)
    assert {t.pod for t in (tr.target for tr in c.trackers.values())} == {"qwen-0", "qwen-1"}  # still scraped
    assert all(tr.ready(time.time()) == (tr.target.pod == "qwen-0") for tr in c.trackers.values())
    await until(lambda: ws_status(api).get("readyEndpoints") == 2, "the relist after the outage")
    assert running["discovery"].pods.errors >= 1  # it did see the outage
