"""The router against a real nats-server, real upstream HTTP servers (small
aiohttp stand-ins for vLLM pods and a provider, which record what they
receive) and, where tags matter, the real classifier service."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_classifier.service import ClassifierService
from kinference_common import bus, subjects
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.compiler import compile_documents
from kinference_common.engine import PrefixIndex
from kinference_common.engine.candidates import endpoint_key
from kinference_common.engine.tokens import estimate_prompt_tokens
from kinference_common.messages import EndpointState, encode
from kinference_common.natsserver import NatsServer
from kinference_common.request_body import parse
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import Router, RouterSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles
from .manifests import example_documents

REPO = Path(__file__).resolve().parents[2]
PII_PROMPT = "Please email the contract to jane.doe@example.com and call me back."
CLEAN_PROMPT = "Write a haiku about autumn leaves."


@dataclass
class Upstream:
    """An OpenAI-compatible stand-in that records every request."""

    name: str
    api_key: str | None = None
    status: int = 200
    retry_after: str | None = None
    received: list[dict[str, Any]] = field(default_factory=list)
    server: TestServer | None = None
    #: as OpenAI's API: a stream's usage event only for ``stream_options.include_usage``
    usage_only_when_asked: bool = False
    #: a stream cut (the connection closed) after this many events; None: whole
    cut_after: int | None = None
    #: the prompt tokens its usage reports (its tokenizer's count)
    prompt_tokens: int = 7

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append({"body": body, "auth": request.headers.get("Authorization")})
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        if self.status != 200:
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.json_response({"error": {"message": "nope"}}, status=self.status, headers=headers)
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for n, word in enumerate(("Hello", " from", f" {self.name}")):
                if self.cut_after is not None and n >= self.cut_after:
                    assert request.transport is not None
                    request.transport.close()  # the provider's connection breaks mid-answer
                    return resp
                chunk = {"choices": [{"delta": {"content": word}, "index": 0}], "model": body["model"]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(0.01)
            usage = {"choices": [], "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": 3}}
            if not self.usage_only_when_asked or (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"id": "x", "model": body["model"], "object": "chat.completion",
                                  "choices": [{"message": {"role": "assistant", "content": f"hi from {self.name}"}}],
                                  "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": 3}})

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"


@dataclass
class Env:
    nats: NatsServer
    nc: nats.NATS
    pods: dict[str, Upstream]
    provider: Upstream
    router: Router
    client: Any  # tests/router/conftest.py's Served
    tmp: Path

    @staticmethod
    def worker_set(pod: str) -> str:
        return "qwen-2-5-32b-spot" if pod == "qwen-spot-0" else "qwen-2-5-32b"

    def key(self, pod: str) -> str:
        """The pod's endpoint key (the in-flight ledger's and the prefix index's)."""
        return endpoint_key("default", self.worker_set(pod), pod)

    async def telemetry(self, pod: str, address: str | None = None, **signals: Any) -> None:
        ws = self.worker_set(pod)
        values = {"queued": 0, "running": 0, "kv_cache_usage": 0.1, "prefill_tokens_per_second": 10000.0,
                  **signals}
        state = EndpointState(namespace="default", worker_set=ws, pod=pod, address=address or self.pods[pod].address,
                              model="qwen-2.5", ready=True, scraped_at=time.time(), **values)
        await self.nc.publish(subjects.endpoint_subject("default", ws, pod), encode(state))
        await bus.sync(self.nc)

    async def settle(self) -> None:
        await asyncio.sleep(0.15)  # subjects delivered, snapshot rebuilt (every 50 ms)

    async def saturate(self) -> None:
        for pod in self.pods:
            await self.telemetry(pod, queued=10)
        await self.settle()

    async def chat(self, content: str, **extra: Any) -> aiohttp.ClientResponse:
        body = {"model": "qwen-2.5", "messages": [{"role": "user", "content": content}], **extra}
        return await self.client.post("/v1/chat/completions", json=body)


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path, serve: Any) -> AsyncIterator[Env]:
    pods = {p: Upstream(p) for p in ("qwen-0", "qwen-1", "qwen-spot-0")}
    provider = Upstream("databricks", api_key="sk-test")
    for up in (*pods.values(), provider):
        up.server = TestServer(up.app())
        await up.server.start_server()
    # the example manifests, with the provider pointing at the stand-in
    res = compile_documents(example_documents(provider.address))
    assert not res.errors
    nc = await nats.connect(nats_server.url)
    publisher = ConfigPublisher(nc)
    await publisher.start()
    await publisher.publish(res.pools)
    secret = tmp_path / "secrets" / "default" / "databricks-token"
    secret.mkdir(parents=True)
    (secret / "token").write_text("sk-test\n")
    router = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path / "secrets"), nc=nc)
    await router.start()
    client = await serve(router.data_server())
    e = Env(nats_server, nc, pods, provider, router, client, tmp_path)
    for pod in pods:
        await e.telemetry(pod)
    await e.settle()
    try:
        yield e
    finally:
        await client.close()
        await router.stop()
        for up in (*pods.values(), provider):
            await up.server.close()  # type: ignore[union-attr]
        await nc.close()


@pytest.fixture
async def classifier(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClassifierService]:
    """The classifier service, answering in this process. Its 20 ms deadline
    is stretched to 2 s here: these tests are about what the router does with
    the answers, and on a busy machine one late answer would turn a clean
    prompt into pii-unknown (the deadline itself is tested without it)."""
    for name, info in list(BUILTIN_CLASSIFIERS.items()):
        monkeypatch.setitem(BUILTIN_CLASSIFIERS, name, msgspec.structs.replace(info, deadline_seconds=2.0))
    svc = ClassifierService(nats_url=nats_server.url, health_host="127.0.0.1", health_port=0)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


def total(env: Env) -> int:
    return sum(len(p.received) for p in env.pods.values())


async def test_routes_locally_with_headers_and_model_renamed(env: Env, classifier: ClassifierService) -> None:
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 200, await r.text()
    assert r.headers["x-kinference-backend"].startswith("Local/qwen-2-5-32b")
    assert r.headers["x-kinference-rule"] == "local-first-then-provider-unless-pii"
    assert len(r.headers["x-kinference-decision-id"]) == 32
    got = next(p.received[-1] for p in env.pods.values() if p.received)
    assert got["body"]["model"] == "Qwen/Qwen2.5-32B-Instruct"  # the worker set's servedName
    assert got["auth"] is None  # nothing of the client's credentials goes upstream
    assert env.provider.received == []


async def test_streaming_passes_chunks_through(env: Env, classifier: ClassifierService) -> None:
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert r.status == 200
    assert r.headers["Content-Type"].startswith("text/event-stream")
    text = (await r.read()).decode()
    assert text.count("data: ") == 5 and text.rstrip().endswith("data: [DONE]")


async def test_an_answers_usage_sets_the_prefix_index_fill_of_its_endpoint(env: Env,
                                                                          classifier: ClassifierService) -> None:
    """Fix 13 in the router: a local answer's usage (tokens generated) and
    the endpoint's scraped KV usage set how much of its cache the prefix
    index keeps of prompts. The prompt the endpoint computed is the router's
    estimate in the engine's tokens: by the usage's count of the prompt, or
    for a stream without usage (its client did not ask for it) by what the
    pod's counts taught, against a token an event less the closing [DONE]."""
    prompt = "Summarise the attached meeting notes in three bullet points. " * 20  # several prompt blocks
    prior = 0.4 + 0.6 * PrefixIndex.PROMPT_SHARE  # the telemetry's KV usage 0.4, no answer observed yet
    for pod in env.pods:  # fresh (the fixtures' start can take longer than a scrape stays fresh)
        await env.telemetry(pod, kv_cache_usage=0.4)
    await env.settle()
    for up in env.pods.values():
        up.prompt_tokens = 300
    r = await env.chat(prompt)
    assert r.status == 200, await r.text()
    pod = next(name for name, p in env.pods.items() if p.received)
    key = env.key(pod)
    index = env.router.prefix
    assert index.blocks(key) > 0
    after_one = index.fill(key)
    # 3 tokens generated against 300 computed: the share moves towards 1
    assert PrefixIndex.MIN_FILL < prior < after_one < PrefixIndex.KV_FILL
    # the same short prompt (no prefix blocks: its prefill is the whole prompt, wherever it goes)
    # answered whole (usage: 3 tokens), then streamed without usage: 3 token events and [DONE]
    w = PrefixIndex.SHARE_WEIGHT
    shares = {k: index.prompt_share(k) for k in map(env.key, env.pods)}

    def answer_share() -> tuple[str, float]:
        """The endpoint of the one answer observed since ``shares``, and its
        share (its prefill / (prefill + generated))."""
        (k,) = [k for k in shares if index.prompt_share(k) != shares[k]]
        x = (index.prompt_share(k) - shares[k] * (1 - w)) / w
        shares[k] = index.prompt_share(k)
        return k, x

    estimate = router_estimate(CLEAN_PROMPT)
    for counted in (7, 4 * estimate):  # the engine's tokenizer counts other than the router's estimate
        for up in env.pods.values():
            up.prompt_tokens = counted
        r = await env.chat(CLEAN_PROMPT)
        assert r.status == 200
        assert answer_share()[1] == pytest.approx(counted / (counted + 3), rel=1e-9)  # in the engine's tokens
    for k in shares:  # the pods the answers above did not go to learn a ratio too (the stream may go there)
        if index.tokens_per_estimated(k) == 1.0:
            index.observe_output(k, 0, 1, 10, 30)
            shares[k] = index.prompt_share(k)
    for up in env.pods.values():
        up.usage_only_when_asked = True
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert r.status == 200
    text = (await r.read()).decode()
    assert '"usage"' not in text and text.count("data: ") == 4
    # no count of the prompt: the router's estimate in the pod's tokens as its answers counted them,
    # against 3 tokens counted from the events
    k, x = answer_share()
    assert index.tokens_per_estimated(k) != 1.0
    prompt = estimate * index.tokens_per_estimated(k)
    assert x == pytest.approx(prompt / (prompt + 3), rel=1e-9)
    assert x != pytest.approx(estimate / (estimate + 3), rel=1e-6)


def router_estimate(content: str) -> int:
    """The router's estimate of the prompt tokens of a one-message chat of ``content``."""
    body = {"model": "qwen-2.5", "messages": [{"role": "user", "content": content}]}
    return estimate_prompt_tokens(parse(json.dumps(body).encode(), chat=True).texts)


def _models(text: str) -> set[str]:
    """The ``model`` of every event of a stream that has one."""
    return {e["model"] for e in (json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {"))
            if "model" in e}


async def test_the_client_gets_back_the_model_name_it_asked_for(env: Env, classifier: ClassifierService) -> None:
    """As through the Endpoint Picker: the pod's served name and the
    provider's upstream name never reach the client, whole or streamed."""
    r = await env.chat(CLEAN_PROMPT)
    assert r.headers["x-kinference-backend"].startswith("Local/")
    assert (await r.json())["model"] == "qwen-2.5"
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert _models((await r.read()).decode()) == {"qwen-2.5"}
    await env.saturate()
    r = await env.chat(CLEAN_PROMPT)
    assert r.headers["x-kinference-backend"] == "Provider/databricks"
    assert env.provider.received[-1]["body"]["model"] == "databricks-qwen25-32b"
    assert (await r.json())["model"] == "qwen-2.5"
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert _models((await r.read()).decode()) == {"qwen-2.5"}


async def test_bursts_only_clean_traffic_when_local_is_saturated(env: Env, classifier: ClassifierService) -> None:
    await env.saturate()
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 200, await r.text()
    assert r.headers["x-kinference-backend"] == "Provider/databricks"
    assert env.provider.received[-1]["body"]["model"] == "databricks-qwen25-32b"
    assert env.provider.received[-1]["auth"] == "Bearer sk-test"  # injected from the secret file
    before = len(env.provider.received)
    r = await env.chat(PII_PROMPT)
    assert r.status == 503
    err = await r.json()
    assert err["error"]["code"] == "no_capacity" and r.headers["Retry-After"]
    assert len(env.provider.received) == before  # PII never reached the provider


async def test_classifier_down_keeps_everything_local(env: Env) -> None:
    # no classifier service: pii fails to pii-unknown, which the policy keeps local
    await env.saturate()
    for prompt in (CLEAN_PROMPT, PII_PROMPT):
        r = await env.chat(prompt)
        assert r.status == 503
    assert env.provider.received == []
    await asyncio.gather(*(env.telemetry(p) for p in env.pods))
    await env.settle()
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 200 and r.headers["x-kinference-backend"].startswith("Local/")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_request"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "bad_request"),
        (b'{"model": 3, "messages": []}', 400, "bad_request"),
        (b'{"model": "llama-9", "messages": [{"role": "user", "content": "x"}]}', 404, "model_not_found"),
    ],
)
async def test_bad_requests_get_documented_4xx(env: Env, body: bytes, status: int, code: str) -> None:
    r = await env.client.post("/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    assert r.status == status
    err = (await r.json())["error"]
    assert err["code"] == code and err["decision_id"] and err["message"]


async def test_payload_too_large(env: Env) -> None:
    r = await env.client.post("/v1/chat/completions", data=b"x" * (5 * 1024 * 1024),
                              headers={"Content-Type": "application/json"})
    assert r.status == 413 and (await r.json())["error"]["code"] == "payload_too_large"


async def test_api_key_mode(env: Env, tmp_path: Path) -> None:
    keys = tmp_path / "tenants.yaml"
    keys.write_text("tenants:\n  - name: alice\n    apiKeys: [sk-alice]\n")
    env.router.auth = Authenticator.from_file("apiKey", keys)
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 401 and (await r.json())["error"]["code"] == "unauthorized"
    r = await env.client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-wrong"},
                              json={"model": "qwen-2.5", "messages": [{"role": "user", "content": "x"}]})
    assert r.status == 401
    assert total(env) == 0  # rejected before any other work
    # a valid key, whatever the case of the header's name, is its tenant's
    for name in ("Authorization", "authorization"):
        r = await env.client.post("/v1/chat/completions", headers={name: "Bearer sk-alice"},
                                  json={"model": "qwen-2.5", "messages": [{"role": "user", "content": CLEAN_PROMPT}],
                                        "max_tokens": 2})
        assert r.status == 200, await r.text()


async def test_connect_failure_tries_the_next_endpoint_then_ejects(env: Env, classifier: ClassifierService) -> None:
    dead = env.pods["qwen-0"]
    await dead.server.close()  # type: ignore[union-attr]
    # make the dead pod the best candidate so it is tried first
    await env.telemetry("qwen-1", queued=3)
    await env.telemetry("qwen-spot-0", queued=3)
    await env.settle()
    for _ in range(4):
        r = await env.chat(CLEAN_PROMPT)
        assert r.status == 200  # answered by a live pod after the refused connection
    assert len(env.pods["qwen-1"].received) + len(env.pods["qwen-spot-0"].received) == 4
    # three refused connections in a row eject the endpoint (with backoff)
    assert "default/qwen-2-5-32b/qwen-0" in env.router.health.excluded()


async def test_provider_429_starts_a_cooldown(env: Env, classifier: ClassifierService) -> None:
    await env.saturate()
    env.provider.status, env.provider.retry_after = 429, "30"
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 429 and (await r.json())["error"]["code"] == "rate_limited"
    env.provider.status = 200
    sent = len(env.provider.received)
    await env.settle()
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 503  # the provider is cooling down and local is saturated
    assert len(env.provider.received) == sent


async def test_keeps_serving_when_nats_goes_away(env: Env) -> None:
    env.nats.kill()
    await asyncio.sleep(0.2)
    for _ in range(3):
        r = await env.chat(CLEAN_PROMPT)
        assert r.status == 200  # classifier unreachable: pii-unknown, local only
        assert r.headers["x-kinference-backend"].startswith("Local/")


async def test_models_readyz_and_decision_events(env: Env, classifier: ClassifierService) -> None:
    r = await env.client.get("/v1/models")
    models = (await r.json())["data"]
    assert [m["id"] for m in models] == ["qwen-2.5"]
    assert (await env.client.get("/readyz")).status == 200
    events: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg: Any) -> None:
        await events.put(msg.data)

    await env.nc.subscribe(subjects.decisions_subject("default", "inference-all"), cb=on_msg)
    await bus.sync(env.nc)
    r = await env.chat(CLEAN_PROMPT)
    event = json.loads(await asyncio.wait_for(events.get(), 5))
    assert event["decision_id"] == r.headers["x-kinference-decision-id"]
    assert event["outcome"]["type"] == "Routed"
    pii = event["classifiers"][0]
    assert pii["name"] == "pii"
    # with headroom the pick is local whatever pii says: it is not asked
    # (lazy classification), and the trace says why
    assert pii["outcome"] == "skipped" and "same outcome" in pii["why"], pii
    assert event["tags"] == []


async def test_client_disconnect_cancels_the_upstream_request(env: Env, classifier: ClassifierService) -> None:
    """A client that goes away mid-stream: the router closes its upstream
    request (the upstream's handler sees the disconnect) and its in-flight
    ledger and gauge return to zero."""
    ended = asyncio.Event()
    state: dict[str, object] = {}

    async def slow_stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(200):  # 20 s if nobody stops it
                await resp.write(f"data: {{\"i\": {i}}}\n\n".encode())
                await asyncio.sleep(0.1)
            state["finished"] = True
        except (ConnectionResetError, asyncio.CancelledError):
            state["cancelled"] = True
            raise
        finally:
            ended.set()
        return resp

    slow = TestServer(_app_with(slow_stream))
    await slow.start_server()
    try:
        for pod in env.pods:  # every endpoint now points at the slow upstream
            await env.telemetry(pod, address=f"127.0.0.1:{slow.port}")
        await env.settle()
        session = aiohttp.ClientSession()
        r = await session.post(f"http://127.0.0.1:{env.client.port}/v1/chat/completions",
                               json={"model": "qwen-2.5", "stream": True,
                                     "messages": [{"role": "user", "content": CLEAN_PROMPT}]})
        assert r.status == 200
        await r.content.readline()  # the first chunk arrived
        r.close()  # the client goes away
        await session.close()
        await asyncio.wait_for(ended.wait(), 10)
        assert state.get("cancelled") and not state.get("finished")
        for _ in range(50):
            if sum(env.router.ledger.in_flight(k) for k in env.router.ledger.loads) == 0:
                break
            await asyncio.sleep(0.05)
        assert sum(env.router.ledger.in_flight(k) for k in env.router.ledger.loads) == 0
    finally:
        await slow.close()


def _app_with(handler):  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def test_decision_events_are_trimmed_but_explain_is_not(env: Env, classifier: ClassifierService,
                                                              serve: Any) -> None:
    events: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg: Any) -> None:
        await events.put(msg.data)

    await env.nc.subscribe(subjects.decisions_subject("default", "inference-all"), cb=on_msg)
    await bus.sync(env.nc)
    await env.chat(CLEAN_PROMPT)
    event = json.loads(await asyncio.wait_for(events.get(), 5))
    rule = event["rules"][0]
    assert rule["candidates"] and rule["tiers"] and rule["scores"] == []
    admin = await serve(env.router.admin_server())
    try:
        r = await admin.post("/debug/explain", json={"model": "qwen-2.5", "tags": ["pii-none"],
                                                     "messages": [{"role": "user", "content": "x"}]})
        trace = await r.json()
        assert len(trace["rules"][0]["scores"]) == 4  # three pods and the provider, with their signals
    finally:
        await admin.close()
