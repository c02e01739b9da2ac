"""The router's Kubernetes mode: provider keys and tenant keys from watched
Secrets on the (fake) API server, with the real kubernetes_asyncio client, a
real nats-server and a real upstream. A rotated key is used for the next
request; no key ever shows in a log line or an error."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_common import logs
from kinference_common.compiled import SecretRef
from kinference_common.compiler import compile_documents
from kinference_common.kube import rbac
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.manifests import load_text
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import Router, RouterSettings
from kinference_router.kube_secrets import KubeSecrets, tenant_keys
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretError

PATIENCE = 10.0
PROVIDER_KEY_1 = "dapi-first-0123456789abcdef"
PROVIDER_KEY_2 = "dapi-rotated-fedcba9876543210"
ALICE_KEY_1 = "sk-alice-original-key"
ALICE_KEY_2 = "sk-alice-rotated-key"
SECRETS = (PROVIDER_KEY_1, PROVIDER_KEY_2, ALICE_KEY_1, ALICE_KEY_2)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(name: str, data: dict[str, str], labels: dict[str, str] | None = None,
           ns: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "data": {k: b64(v) for k, v in data.items()}}


def tenant_secret(name: str, tenant: str, key: str) -> dict[str, Any]:
    return secret(name, {"apiKey": key}, {"kinference.buoyant.io/tenant": tenant})


def test_tenant_keys_from_secrets() -> None:
    good = tenant_secret("alice-key", "alice", ALICE_KEY_1)
    unlabelled = secret("other", {"apiKey": "x"})
    no_key = secret("bob-key", {"token": "y"}, {"kinference.buoyant.io/tenant": "bob"})
    bad = {**tenant_secret("carol-key", "carol", "z"), "data": {"apiKey": "***not base64***"}}
    string_data = {"metadata": {"name": "dave", "labels": {"kinference.buoyant.io/tenant": "dave"}},
                   "stringData": {"apiKey": "sk-dave"}}
    assert tenant_keys([good, unlabelled, no_key, bad, string_data]) == [("alice", ALICE_KEY_1), ("dave", "sk-dave")]


def test_only_opaque_secrets_keep_their_data() -> None:
    from kinference_router.kube_secrets import slim_secret

    opaque = secret("databricks-token", {"token": PROVIDER_KEY_1})
    assert slim_secret(opaque)["data"] == opaque["data"]
    assert "data" in slim_secret({k: v for k, v in opaque.items() if k != "type"})  # Opaque is the default
    tls = {**secret("ingress-tls", {"tls.key": "-----BEGIN PRIVATE KEY-----"}), "type": "kubernetes.io/tls"}
    assert slim_secret(tls) == {"metadata": {"name": "ingress-tls", "namespace": "default", "labels": {}}}


def manifests(upstream_url: str, ns: str = "default", provider: str = "databricks",
              secret_name: str = "databricks-token") -> str:
    """A provider (its key in ``secret_name``), a policy that sends everything to it, and its pool ``cloud-pool``."""
    return f"""
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {{name: {provider}, namespace: {ns}}}
spec:
  url: {upstream_url}
  auth: {{secretRef: {{name: {secret_name}, key: token}}}}
  models: [{{name: qwen-2.5, upstreamName: db-qwen}}]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{name: cloud, namespace: {ns}}}
spec:
  rules:
    - name: all-cloud
      route:
        select: [{{type: Provider, minimize: EstimatedTTFT}}]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{name: cloud-pool, namespace: {ns}}}
spec:
  destinations: [{{kind: InferenceProvider, name: {provider}}}]
  policyRef: {{name: cloud}}
"""


@pytest.fixture
async def env(kube_api: Any, kubeconfig: Path, nats_server: Any) -> AsyncIterator[dict[str, Any]]:
    # everything logged, at the most verbose level, stdlib loggers included, into one buffer
    buf = io.StringIO()
    logs.configure("debug", "json")
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=buf))
    handler = logging.StreamHandler(buf)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"id": "x", "object": "chat.completion",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    upstream = TestServer(app, host="127.0.0.1")
    await upstream.start_server()
    kube_api.apply(secret("databricks-token", {"token": PROVIDER_KEY_1}))
    kube_api.apply(tenant_secret("alice-key", "alice", ALICE_KEY_1))
    api = await api_client(kubeconfig, "kinference-router")
    auth = Authenticator("apiKey")
    secrets = KubeSecrets(ResourceClient(api), auth)
    secrets.start()
    await secrets.wait_synced(PATIENCE)
    nc = await nats.connect(nats_server.url)
    res = compile_documents(load_text(manifests(f"http://127.0.0.1:{upstream.port}/v1"), "m"))
    assert not res.errors
    publisher = ConfigPublisher(nc)
    await publisher.start()
    await publisher.publish(res.pools)
    router = Router(RouterSettings(namespace="default", pool="cloud-pool"), auth, secrets, nc=nc)
    await router.start()
    server = router.data_server()
    await server.start("127.0.0.1", 0)
    session = aiohttp.ClientSession()
    try:
        yield {"api": kube_api, "secrets": secrets, "seen": seen, "session": session,
               "url": f"http://127.0.0.1:{server.port}/v1/chat/completions", "logs": buf}
    finally:
        await session.close()
        await server.close()
        await router.stop()
        await secrets.stop()
        await nc.close()
        await api.close()
        await upstream.close()
        root.removeHandler(handler)
        root.setLevel(old_level)
        structlog.reset_defaults()


async def until(cond: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def ask(env: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
    body = {"model": "qwen-2.5", "messages": [{"role": "user", "content": "hello"}]}
    async with env["session"].post(env["url"], json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, await r.json()


async def test_rotated_keys_are_used_for_the_next_request_and_never_logged(env: dict[str, Any]) -> None:
    api, secrets = env["api"], env["secrets"]
    status, _ = await ask(env, ALICE_KEY_1)
    assert status == 200 and env["seen"] == [f"Bearer {PROVIDER_KEY_1}"]
    assert (await ask(env, "sk-nobody"))[0] == 401

    # the provider's key is rotated: the next request carries the new one
    api.apply(secret("databricks-token", {"token": PROVIDER_KEY_2}))
    await until(lambda: secrets.read("default", SecretRef(name="databricks-token", key="token")) == PROVIDER_KEY_2,
                "the rotated provider key")
    status, _ = await ask(env, ALICE_KEY_1)
    assert status == 200 and env["seen"][-1] == f"Bearer {PROVIDER_KEY_2}"

    # the tenant's key is rotated: the old one is refused, the new one accepted
    api.apply(tenant_secret("alice-key", "alice", ALICE_KEY_2))
    await until(lambda: secrets.auth is not None and secrets.auth.tenant(
        {"authorization": f"Bearer {ALICE_KEY_2}"}) == "alice", "the rotated tenant key")
    assert (await ask(env, ALICE_KEY_1))[0] == 401
    assert (await ask(env, ALICE_KEY_2))[0] == 200
    # a new tenant appears with its Secret, and goes with it
    api.apply(tenant_secret("bob-key", "bob", "sk-bob"))
    await until(lambda: secrets.tenants == 2, "bob's key")
    assert (await ask(env, "sk-bob"))[0] == 200
    api.delete("", "Secret", "default", "bob-key")
    await until(lambda: secrets.tenants == 1, "bob's key gone")
    assert (await ask(env, "sk-bob"))[0] == 401

    # the provider's Secret is deleted: a 502 that names the Secret, not a key
    api.delete("", "Secret", "default", "databricks-token")
    await until(lambda: env["secrets"].informer.get("default", "databricks-token") is None, "secret deleted")
    status, body = await ask(env, ALICE_KEY_2)
    assert status == 502 and "databricks-token" in body["error"]["message"]
    with pytest.raises(SecretError, match="not found"):
        secrets.read("default", SecretRef(name="databricks-token", key="token"))

    text = env["logs"].getvalue()
    assert "tenant keys loaded" in text  # the log was captured ...
    for value in SECRETS + ("sk-bob",) + tuple(b64(v) for v in SECRETS):
        assert value not in text  # ... and holds no key, in clear or base64
    used = api.used("kinference-router")
    assert ("watch", "", "secrets") in used
    assert rbac.not_allowed("router", used) == []
