"""The router reads Secrets only in the namespaces it is told
(``--secret-namespaces``), with the RBAC the deployment grants (a RoleBinding
per namespace, nothing cluster-wide), enforced by the fake API server; a
provider whose Secret lies elsewhere shows on its status, through the
router's key report and the real telemetry-collector, and clears once the
namespace is added."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import yaml

from kinference_collector.derive import DeriveConfig
from kinference_collector.kube_discovery import KubeDiscovery
from kinference_collector.publish import NatsBus, Publisher
from kinference_collector.service import Collector, CollectorConfig
from kinference_common import subjects
from kinference_common.compiled import SecretRef
from kinference_common.compiler import compile_documents
from kinference_common.kube import rbac
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.manifests import load_text
from kinference_router.__main__ import parse_args
from kinference_router.key_report import NOT_WATCHED, UNAVAILABLE, KeyReporter, provider_keys
from kinference_router.kube_secrets import KubeSecrets, secret_namespaces
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretNotWatched

from .test_kube_secrets import manifests, secret

PATIENCE = 15.0
GROUP = "kinference.buoyant.io"
ROUTER = "kinference-router"


async def until(cond: Any, what: str) -> Any:
    deadline = time.monotonic() + PATIENCE
    while not (got := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return got


def test_the_flag_defaults_to_the_routers_own_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "kinference-system")
    assert secret_namespaces(parse_args(["--source", "kubernetes"]).secret_namespaces) == ["kinference-system"]
    assert secret_namespaces(parse_args(["--secret-namespaces", "team-b, default"]).secret_namespaces) == [
        "default", "team-b"]
    assert secret_namespaces(parse_args(["--namespaces", "a"]).secret_namespaces) == ["a"]  # the old name
    assert secret_namespaces("*") is None
    with pytest.raises(ValueError, match=r"--secret-namespaces: 'Team_B' is not a namespace name"):
        secret_namespaces("default,Team_B")


@pytest.fixture
async def env(kube_api: Any, kubeconfig: Any, nats_server: Any) -> AsyncIterator[dict[str, Any]]:
    # the router's ServiceAccount as deployed: its rules, the Secrets one bound in `default` only
    kube_api.roles[ROUTER] = rbac.SERVICE_RULES["router"]
    kube_api.role_namespaces[ROUTER] = {"default"}
    kube_api.apply(secret("databricks-token", {"token": "dapi-default"}))
    kube_api.apply(secret("other-token", {"token": "dapi-team-b"}, ns="team-b"))
    kube_api.apply(secret("eve-key", {"apiKey": "sk-eve"}, {"kinference.buoyant.io/tenant": "eve"}, ns="team-b"))
    url = "https://provider.example.invalid/v1"
    text = manifests(url) + "---" + manifests(url, "team-b", "other", "other-token")
    for d in yaml.safe_load_all(text):
        if d:
            kube_api.apply(d)
    compiled = compile_documents(load_text(text, "m"))
    assert not compiled.errors
    pools = list(compiled.pools.values())

    router_api = await api_client(kubeconfig, ROUTER)
    collector_api = await api_client(kubeconfig, "kinference-telemetry-collector")
    nc = await nats.connect(nats_server.url)
    bus = NatsBus(nc)
    await bus.start()
    cfg = CollectorConfig(interval=0.1, timeout=0.3, derive=DeriveConfig(window=5.0, stale_after=1.0))
    discovery = KubeDiscovery(ResourceClient(collector_api), dcgm_selector="")
    collector = Collector(cfg, discovery, Publisher(bus, cfg.min_publish_interval))
    await collector.start()
    attached = asyncio.create_task(discovery.attach(collector))

    async def on_msg(msg: Any) -> None:  # what the collector's service subscribes to
        collector.on_routers_message(msg.subject, msg.data)

    sub = await nc.subscribe(f"{subjects.OBSERVATIONS_PREFIX}.>", cb=on_msg)
    auth = Authenticator("apiKey")
    secrets = KubeSecrets(ResourceClient(router_api), auth, namespaces=["default"])
    secrets.start()
    reporter = KeyReporter(nc, lambda: pools, secrets, "router-test-1", interval=0.2)
    env = {"api": kube_api, "secrets": secrets, "auth": auth, "reporter": reporter, "pools": pools,
           "rc": ResourceClient(router_api), "stop": [secrets]}
    try:
        yield env
    finally:
        await reporter.stop()
        for s in env["stop"]:
            await s.stop()
        await sub.unsubscribe()
        attached.cancel()
        await asyncio.gather(attached, return_exceptions=True)
        await collector.stop()
        await nc.drain()
        await router_api.close()
        await collector_api.close()


def ready(api: Any, ns: str, name: str) -> dict[str, Any]:
    conds = ((api.get(GROUP, "InferenceProvider", ns, name) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), {})


async def test_secrets_are_watched_per_namespace_and_an_unwatched_one_is_on_the_providers_status(
        env: dict[str, Any]) -> None:
    api, secrets, auth = env["api"], env["secrets"], env["auth"]
    await secrets.wait_synced(PATIENCE)
    ref = SecretRef(name="databricks-token", key="token")
    assert secrets.read("default", ref) == "dapi-default"
    assert auth.tenant({"authorization": "Bearer sk-eve"}) is None  # team-b's tenant Secret is not seen
    with pytest.raises(SecretNotWatched, match="does not watch the Secrets of namespace team-b"):
        secrets.read("team-b", SecretRef(name="other-token", key="token"))

    # the API calls: list and watch of Secrets in `default` only, never at the cluster scope, none refused
    def calls() -> list[Any]:
        return [r for r in api.requests if r.who == ROUTER and r.resource == "secrets"]

    await until(lambda: any(r.verb == "watch" for r in calls()), "the watch")
    calls = calls()
    assert {(r.verb, r.namespace) for r in calls} == {("list", "default"), ("watch", "default")}
    assert {r.namespace for r in calls} == {"default"}
    assert secrets.informer.errors == 0

    # the report names the provider, the namespace and the fix; the collector writes it as its status
    keys = {(k.namespace, k.name): k for k in provider_keys(env["pools"], secrets)}
    assert keys[("default", "databricks")].problem is None
    other = keys[("team-b", "other")]
    assert other.problem == NOT_WATCHED and other.secret == "team-b/other-token"
    for words in ("team-b", "--secret-namespaces", "kinference-router-secrets", "it watches default"):
        assert words in other.message
    env["reporter"].start()
    cond = await until(lambda: ready(api, "team-b", "other").get("reason") == NOT_WATCHED
                       and ready(api, "team-b", "other"), "SecretNotWatched on the provider's status")
    assert cond["status"] == "False" and "router router-test-1:" in cond["message"]
    assert "--secret-namespaces" in cond["message"] and "dapi" not in cond["message"]
    await until(lambda: ready(api, "default", "databricks").get("reason") == "Configured", "the readable one")

    # the operator adds the namespace: a RoleBinding there and the flag; the condition clears
    api.role_namespaces[ROUTER].add("team-b")
    wider = KubeSecrets(env["rc"], auth, namespaces=["default", "team-b"])
    env["stop"].append(wider)
    wider.start()
    await wider.wait_synced(PATIENCE)
    env["reporter"].secrets = wider
    await until(lambda: ready(api, "team-b", "other").get("reason") == "Configured", "the condition cleared")
    assert wider.read("team-b", SecretRef(name="other-token", key="token")) == "dapi-team-b"
    await until(lambda: auth.tenant({"authorization": "Bearer sk-eve"}) == "eve", "team-b's tenant")

    # a Secret that goes away in a watched namespace: SecretUnavailable, naming it
    api.delete("", "Secret", "team-b", "other-token")
    cond = await until(lambda: ready(api, "team-b", "other").get("reason") == UNAVAILABLE
                       and ready(api, "team-b", "other"), "SecretUnavailable")
    assert "team-b/other-token not found" in cond["message"]
    assert rbac.not_allowed("router", {(r.verb, r.group, r.resource) for r in api.requests if r.who == ROUTER}) == []


async def test_watching_every_namespace_without_a_cluster_binding_is_refused(env: dict[str, Any]) -> None:
    """What RBAC answers a cluster-wide list when the Secrets role is bound per
    namespace: 403, so the router never reads a namespace it was not given."""
    everywhere = KubeSecrets(env["rc"], None, namespaces=None)
    env["stop"].append(everywhere)
    everywhere.start()
    await until(lambda: everywhere.informer.errors >= 1, "a refused cluster-wide list")
    assert not everywhere.synced and everywhere.informer.items() == {}
    refused = [r for r in env["api"].requests if r.who == ROUTER and r.resource == "secrets" and r.namespace is None]
    assert refused and all(r.verb == "list" for r in refused)


async def test_a_watched_namespace_without_its_rolebinding_is_reported_after_the_grace(env: dict[str, Any]) -> None:
    """team-b in the flag but not bound: its list is refused, and once the
    router has had time to list, its providers say why instead of looking healthy."""
    half = KubeSecrets(env["rc"], None, namespaces=["default", "team-b"])
    env["stop"].append(half)
    half.start()
    await until(lambda: half.listed("default") and half.informer.errors >= 1, "default listed, team-b refused")
    assert not half.listed("team-b")
    early = {(k.namespace, k.name): k for k in provider_keys(env["pools"], half, unlisted=False)}
    assert set(early) == {("default", "databricks")} and early[("default", "databricks")].problem is None
    late = {(k.namespace, k.name): k for k in provider_keys(env["pools"], half)}
    assert late[("team-b", "other")].problem == UNAVAILABLE
    assert "no RoleBinding of the ClusterRole kinference-router-secrets in team-b" in late[("team-b", "other")].message
