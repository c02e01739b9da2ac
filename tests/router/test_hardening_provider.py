"""What leaves the cluster: under saturation (local pods full, clean traffic
bursts to the provider) a provider receives only the router's own headers
and a body whose every string was classified; private fields (``user``,
``metadata``) are dropped, and PII anywhere the provider would read it
(a tool's description, a schema, ``stop``, a tool result) keeps the request
local. Asserted on what the provider simulator itself recorded."""

from __future__ import annotations

import asyncio
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
from kinference_common.messages import EndpointState, encode
from kinference_common.natsserver import NatsServer
from kinference_common.prompt_texts import texts_from_body
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router import provider_request
from kinference_router.app import Router, RouterSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles
from kinference_simulators.provider import STATE, ProviderSimConfig, make_app
from .manifests import example_documents
from .prompt_read import strings_read, was_read

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
CARD_DIGITS = "4111111111111111"
PHONE = "+1 415 555 0100"
#: what a client may send that must never reach a provider
CLIENT_HEADERS = {"X-User-Email": EMAIL, "Cookie": f"session=abc; email={EMAIL}",
                  "X-Forwarded-For": "203.0.113.7, 10.0.0.1", "X-Api-Key": "sk-client-secret",
                  "X-Real-IP": "203.0.113.7", "User-Agent": f"my-app/1.0 ({EMAIL})",
                  "X-Request-Id": f"req-{CARD_DIGITS}", "Forwarded": "for=203.0.113.7"}
SECRETS = (EMAIL, CARD, CARD_DIGITS, "203.0.113.7", "sk-client-secret", "session=abc", "555 0100")


@dataclass
class Pod:
    """A local vLLM stand-in recording bodies and headers."""

    received: list[dict[str, Any]] = field(default_factory=list)
    server: TestServer | None = None

    async def chat(self, request: web.Request) -> web.Response:
        self.received.append({"body": await request.json(), "headers": dict(request.headers)})
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [
            {"message": {"role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})


@dataclass
class Env:
    nc: nats.NATS
    router: Router
    pods: dict[str, Pod]
    provider: TestServer
    session: aiohttp.ClientSession
    url: str
    log_dir: Path

    def provider_records(self) -> list[Any]:
        return list(self.provider.app[STATE].records)

    async def telemetry(self, queued: int) -> None:
        for pod, up in self.pods.items():
            ws = "qwen-2-5-32b-spot" if pod == "qwen-spot-0" else "qwen-2-5-32b"
            assert up.server is not None
            state = EndpointState(namespace="default", worker_set=ws, pod=pod, address=f"127.0.0.1:{up.server.port}",
                                  model="qwen-2.5", ready=True, scraped_at=time.time(), queued=queued, running=0,
                                  kv_cache_usage=0.1, prefill_tokens_per_second=10000.0)
            await self.nc.publish(subjects.endpoint_subject("default", ws, pod), encode(state))
        await bus.sync(self.nc)
        await _wait_for(lambda: [c.queued for c in self._local()] == [queued] * len(self.pods))

    def _local(self) -> list[Any]:
        snap = self.router.keeper.snapshot
        return [c for c in snap.candidates if c.is_local and c.endpoint] if snap is not None else []

    async def chat(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> aiohttp.ClientResponse:
        r = await self.session.post(self.url, json=body, headers=headers or {})
        await r.read()
        return r


async def _wait_for(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


@pytest.fixture
async def classifier(nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ClassifierService]:
    """The classifier service in this process, its deadline stretched to 2 s
    (a late answer on a busy machine is pii-unknown, which keeps the request
    local: these tests are about what reaches the provider when it is clean)."""
    for name, info in list(BUILTIN_CLASSIFIERS.items()):
        monkeypatch.setitem(BUILTIN_CLASSIFIERS, name, msgspec.structs.replace(info, deadline_seconds=2.0))
    svc = ClassifierService(nats_url=nats_server.url, health_host="127.0.0.1", health_port=0)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.stop()


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path, classifier: ClassifierService) -> AsyncIterator[Env]:
    pods = {p: Pod() for p in ("qwen-0", "qwen-1", "qwen-spot-0")}
    for pod in pods.values():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", pod.chat)
        pod.server = TestServer(app)
        await pod.server.start_server()
    provider = TestServer(make_app(ProviderSimConfig(api_keys=("sk-test",), models=("databricks-qwen25-32b",),
                                                     ttft_ms=1.0, ttft_jitter_ms=0.0, tokens_per_second=0.0,
                                                     output_len_mean=4.0,
                                                     log_file=str(tmp_path / "provider-requests.jsonl"))))
    await provider.start_server()
    res = compile_documents(example_documents(f"127.0.0.1:{provider.port}"))
    assert not res.errors
    nc = await nats.connect(nats_server.url)
    publisher = ConfigPublisher(nc)
    await publisher.start()
    await publisher.publish(res.pools)
    secret = tmp_path / "secrets" / "default" / "databricks-token"
    secret.mkdir(parents=True)
    (secret / "token").write_text("sk-test\n")
    router = Router(RouterSettings(provider_headers=frozenset({"openai-beta"})), Authenticator("none"),
                    SecretFiles(tmp_path / "secrets"), nc=nc)
    await router.start()
    server = router.data_server()
    await server.start("127.0.0.1", 0)
    session = aiohttp.ClientSession()
    e = Env(nc, router, pods, provider, session, f"http://127.0.0.1:{server.port}/v1/chat/completions", tmp_path)
    try:
        yield e
    finally:
        await session.close()
        await server.close(grace=1.0)
        await router.stop()
        for pod in pods.values():
            await pod.server.close()  # type: ignore[union-attr]
        await provider.close()
        await nc.close()


def _chat(content: str = "Write a haiku about autumn leaves.", **extra: Any) -> dict[str, Any]:
    return {"model": "qwen-2.5", "messages": [{"role": "user", "content": content}], **extra}


def _leaks(records: list[Any]) -> list[str]:
    """Every secret found anywhere in what the provider recorded (body and headers)."""
    found = []
    for rec in records:
        text = rec.body + "\n" + "\n".join(f"{k}: {v}" for k, v in rec.headers.items())
        found += [s for s in SECRETS if s in text]
    return found


async def test_saturated_burst_carries_no_private_fields_and_no_client_headers(env: Env) -> None:
    await env.telemetry(queued=10)  # every local endpoint full: clean traffic bursts
    body = _chat(user=EMAIL, metadata={"card": CARD_DIGITS, "who": EMAIL}, safety_identifier=EMAIL,
                 prompt_cache_key=EMAIL, temperature=0.2, stream_options={"include_usage": True})
    r = await env.chat(body, headers={**CLIENT_HEADERS, "OpenAI-Beta": "test=v1"})
    assert r.status == 200
    assert r.headers["x-kinference-backend"] == "Provider/databricks"
    records = env.provider_records()
    assert len(records) == 1
    assert _leaks(records) == []
    sent = msgspec.json.decode(records[0].body)
    assert sent == {"model": "databricks-qwen25-32b", "messages": body["messages"], "temperature": 0.2,
                    "stream_options": {"include_usage": True}}
    names = {k.lower() for k in records[0].headers}
    assert names == {"host", "content-length", "content-type", "accept", "user-agent", "x-client-request-id",
                     "authorization", "openai-beta"}
    got = {k.lower(): v for k, v in records[0].headers.items()}
    assert records[0].authorized  # the provider's key, from its Secret (the simulator masks it)
    assert got["user-agent"] == provider_request.USER_AGENT
    assert got["x-client-request-id"] == r.headers["x-kinference-decision-id"]
    assert got["openai-beta"] == "test=v1"  # named by the operator's allowlist
    # the simulator's own log of what it received (what `make run` and the chaos suite read) agrees
    logged = [msgspec.json.decode(line) for line in (env.log_dir / "provider-requests.jsonl").read_bytes().splitlines()]
    assert [rec["headers"] for rec in logged] == [records[0].headers]


#: PII where a provider would read it, and what the classifiers must see it in
PII_PLACES: list[tuple[str, dict[str, Any]]] = [
    ("tool description", {"tools": [{"type": "function", "function": {
        "name": "charge", "description": f"charges card {CARD}", "parameters": {"type": "object"}}}]}),
    ("tool parameter name", {"tools": [{"type": "function", "function": {
        "name": "mail", "parameters": {"type": "object", "properties": {EMAIL: {"type": "string"}}}}}]}),
    ("response_format schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": {"type": "object", "description": f"reply to {EMAIL}"}}}}),
    ("stop", {"stop": [f"call {PHONE}"]}),
    ("an unknown field", {"x_vendor_hint": {"owner": EMAIL}}),
    ("a number", {"x_vendor_account": int(CARD_DIGITS)}),
    ("a tool result", {"messages": [
        {"role": "user", "content": "What is on file?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"card on file: {CARD}"}]}),
    ("a content part", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "summarise"}, {"type": "text", "text": f"mail {EMAIL}"}]}]}),
]


async def test_pii_anywhere_the_provider_would_read_it_stays_local(env: Env) -> None:
    await env.telemetry(queued=10)
    for where, extra in PII_PLACES:  # one stack for all (the classifier takes a while to start)
        r = await env.chat(_chat(**extra), headers=CLIENT_HEADERS)
        # local is full and the provider is excluded for PII: nowhere to go
        assert r.status in (403, 503), where  # rejected (policy or capacity), never sent
        assert env.provider_records() == [], where
    r = await env.chat(_chat(), headers=CLIENT_HEADERS)  # the same request without the PII bursts
    assert r.status == 200 and len(env.provider_records()) == 1


async def test_clean_traffic_with_an_email_only_in_user_still_bursts(env: Env) -> None:
    """``user`` is dropped for providers, so it is not classified: an email
    there does not keep a clean prompt in the cluster."""
    await env.telemetry(queued=10)
    r = await env.chat(_chat(user=EMAIL))
    assert r.status == 200 and r.headers["x-kinference-backend"] == "Provider/databricks"
    assert _leaks(env.provider_records()) == []


async def test_local_pods_receive_what_the_client_sent(env: Env) -> None:
    await env.telemetry(queued=0)
    body = _chat(user=EMAIL, metadata={"card": CARD_DIGITS})
    r = await env.chat(body, headers={"X-User-Email": EMAIL, "X-Forwarded-For": "203.0.113.7"})
    assert r.status == 200 and r.headers["x-kinference-backend"].startswith("Local/")
    got = [rec for pod in env.pods.values() for rec in pod.received]
    assert len(got) == 1
    assert got[0]["body"]["user"] == EMAIL and got[0]["body"]["metadata"] == {"card": CARD_DIGITS}
    assert got[0]["headers"]["X-User-Email"] == EMAIL
    assert got[0]["headers"]["X-Forwarded-For"] == "203.0.113.7"
    assert env.provider_records() == []


def test_the_allowlist_refuses_credentials_cookies_and_forwarding_chains() -> None:
    for name in ("Cookie", "authorization", "X-Forwarded-For", "x-user-email", "Forwarded", "X-Real-IP",
                 "X-Api-Key", "Proxy-Authorization", ""):
        with pytest.raises(ValueError, match="--provider-header"):
            provider_request.check_allowlist([name])
    assert provider_request.check_allowlist(["OpenAI-Beta"]) == frozenset({"openai-beta"})


def _strings(value: Any) -> list[str]:
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
            out.extend(str(k) for k in v)
        elif isinstance(v, list):
            stack.extend(v)
    return out


def test_every_string_in_a_provider_body_was_read_by_the_classifiers() -> None:
    """The invariant itself, on bodies drawn at random: each string of what a
    provider receives (values and object keys outside the API's own
    vocabulary) is among the texts the classifiers read, unless it is the
    router-set model or sits in a part counted unreadable."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from kinference_common.prompt_texts import KNOWN_KEYS

    leaf = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.booleans(), st.none())
    tree = st.recursive(leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                        max_leaves=12)
    content = st.text(max_size=6) | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=6)}),
                                             max_size=2)
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": content},
                                    optional={"name": st.text(max_size=4), "tool_calls": tree, "extra": tree})
    body = st.fixed_dictionaries({"model": st.just("m"), "messages": st.lists(message, min_size=1, max_size=3)},
                                 optional={"tools": tree, "response_format": tree, "stop": tree, "user": tree,
                                           "metadata": tree, "temperature": tree, "seed": tree, "x": tree})

    @settings(max_examples=300, deadline=None)
    @given(body)
    def check(b: dict[str, Any]) -> None:
        sent = msgspec.json.decode(provider_request.body(b, "provider-model"))
        read = strings_read(texts_from_body(b).texts)
        sent.pop("model")
        for s in _strings(sent):
            assert was_read(s, read) or s in KNOWN_KEYS or s in provider_request_vocabulary() or s == "", (s, b)

    check()


def provider_request_vocabulary() -> frozenset[str]:
    """The API's own field names, roles and part types: never content."""
    from kinference_common import prompt_texts
    return (prompt_texts.KNOWN_FIELDS | prompt_texts.SETTINGS | prompt_texts.ROLES
            | {"messages", "prompt", "model", "text", "input_text", "output_text"})
