"""The provider simulator: API keys, OpenAI responses, faults, and its record of prompts."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from kinference_simulators import provider
from kinference_simulators.testing import serve, sse_events

KEY = "sk-test-123"
BASE = provider.ProviderSimConfig(
    api_keys=(KEY,),
    models=("gpt-4o-mini", "gpt-4o"),
    ttft_ms=5,
    ttft_jitter_ms=1,
    tokens_per_second=2000,
)
AUTH = {"Authorization": f"Bearer {KEY}"}


def chat(content: str = "hello", **kw: object) -> dict[str, object]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **kw}


async def test_api_key_is_checked_and_attempts_are_recorded() -> None:
    async with serve(provider.make_app(BASE)) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            resp = await c.post("/v1/chat/completions", json=chat("secret 1"), headers=headers)
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == 401
        resp = await c.post("/v1/chat/completions", json=chat("fine"), headers=AUTH)
        assert resp.status == 200
        records = await (await c.get("/sim/requests")).json()
    assert [r["authorized"] for r in records] == [False, False, False, True]
    assert [r["status"] for r in records] == [401, 401, 401, 200]
    assert records[0]["prompt_text"] == "secret 1"
    assert records[0]["prompt_sha256"] == hashlib.sha256(b"secret 1").hexdigest()
    assert records[-1]["model"] == "gpt-4o-mini" and records[-1]["stream"] is False


async def test_chat_and_completions_stream_and_not() -> None:
    async with serve(provider.make_app(BASE)) as c:
        resp = await c.post(
            "/v1/chat/completions", headers=AUTH, json=chat(max_tokens=5, ignore_eos=True)
        )
        body = await resp.json()
        assert body["model"] == "gpt-4o-mini" and body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["finish_reason"] == "length"
        resp = await c.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={
                **chat(max_tokens=3, ignore_eos=True, stream=True),
                "model": "gpt-4o",
                "stream_options": {"include_usage": True},
            },
        )
        events = sse_events(await resp.text())
        assert events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 3
        assert all(e["model"] == "gpt-4o" for e in events[:-1])
        resp = await c.post(
            "/v1/completions",
            headers=AUTH,
            json={"model": "gpt-4o", "prompt": "abc", "max_tokens": 2},
        )
        assert (await resp.json())["object"] == "text_completion"
        resp = await c.post("/v1/chat/completions", headers=AUTH, json={**chat(), "model": "x"})
        assert resp.status == 404
        records = await (await c.get("/sim/requests")).json()
        assert [r["stream"] for r in records] == [False, True, False, False]
        assert (await c.delete("/sim/requests")).status == 204
        assert await (await c.get("/sim/requests")).json() == []


async def test_429_with_retry_after_and_500() -> None:
    async with serve(
        provider.make_app(dataclasses.replace(BASE, rate_429=1.0, retry_after=7))
    ) as c:
        resp = await c.post("/v1/chat/completions", headers=AUTH, json=chat())
        assert resp.status == 429 and resp.headers["Retry-After"] == "7"
        assert (await resp.json())["error"]["type"] == "rate_limit_error"
    async with serve(provider.make_app(dataclasses.replace(BASE, rate_5xx=1.0))) as c:
        resp = await c.post("/v1/chat/completions", headers=AUTH, json=chat())
        assert resp.status == 500
        assert (await (await c.get("/sim/requests")).json())[0]["status"] == 500


async def test_timeout_rate_never_answers() -> None:
    async with serve(provider.make_app(dataclasses.replace(BASE, timeout_rate=1.0))) as c:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.post("/v1/chat/completions", headers=AUTH, json=chat()), 0.5)
        records = await (await c.get("/sim/requests")).json()
        assert len(records) == 1 and records[0]["authorized"] is True


async def test_faults_are_seeded_and_mixed() -> None:
    async def statuses() -> list[int]:
        cfg = dataclasses.replace(BASE, rate_429=0.3, rate_5xx=0.3, seed=11)
        async with serve(provider.make_app(cfg)) as c:
            return [
                (await c.post("/v1/chat/completions", headers=AUTH, json=chat(max_tokens=1))).status
                for _ in range(20)
            ]

    a = await statuses()
    assert a == await statuses()
    assert set(a) == {200, 429, 500}


async def test_ttft_and_token_rate_shape_the_stream() -> None:
    cfg = dataclasses.replace(BASE, ttft_ms=200, ttft_jitter_ms=0, tokens_per_second=20)
    async with serve(provider.make_app(cfg)) as c:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        resp = await c.post(
            "/v1/chat/completions",
            headers=AUTH,
            json=chat(max_tokens=3, ignore_eos=True, stream=True),
        )
        arrivals = []
        async for line in resp.content:
            if (
                line.startswith(b"data: {")
                and b'"content":"' in line
                and b'"content":""' not in line
            ):
                arrivals.append(loop.time() - t0)
    # lower bounds only: the simulator waits at least this long
    assert len(arrivals) == 3
    assert arrivals[0] >= 0.2
    assert arrivals[2] >= 0.2 + 2 * 0.05


async def test_log_file_gets_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "provider.jsonl"
    async with serve(provider.make_app(dataclasses.replace(BASE, log_file=str(log)))) as c:
        await c.post("/v1/chat/completions", json=chat("alpha"), headers=AUTH)
        await c.post("/v1/chat/completions", json=chat("beta"))
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(r["prompt_text"], r["authorized"]) for r in lines] == [
        ("alpha", True),
        ("beta", False),
    ]
    assert set(lines[0]) >= {"model", "stream", "authorized", "prompt_sha256", "prompt_text"}


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        provider.make_app(dataclasses.replace(BASE, api_keys=()))
    with pytest.raises(ValueError):
        provider.make_app(dataclasses.replace(BASE, rate_429=0.7, rate_5xx=0.7))


async def test_malformed_and_odd_requests_are_recorded_with_their_body() -> None:
    async with serve(provider.make_app(BASE)) as c:
        resp = await c.post(
            "/v1/chat/completions", data=b'{"oops": "4111-1111-1111-1111"', headers=AUTH
        )
        assert resp.status == 400
        resp = await c.post(
            "/v1/chat/completions",
            headers=AUTH,
            json={**chat("hi", max_tokens=1), "user": "jane@example.com"},
        )
        assert resp.status == 200
        records = await (await c.get("/sim/requests")).json()
        assert records[0]["status"] == 400 and "4111-1111-1111-1111" in records[0]["prompt_text"]
        assert "jane@example.com" in records[1]["body"]
        assert records[1]["prompt_text"] == "hi"
        last = await (await c.get("/sim/requests?limit=1")).json()
        assert last == records[-1:]
        assert (await c.get("/sim/requests?limit=x")).status == 400
