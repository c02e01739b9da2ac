"""The vLLM simulator over HTTP (in-process aiohttp server on a free port)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient
from kinference_simulators import tokens, vllm
from kinference_simulators.engine import Engine
from kinference_simulators.testing import serve, sse_events
from kinference_simulators.vllm_metrics import TTFT_BUCKETS
from prometheus_client.parser import text_string_to_metric_families

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BASE = vllm.VllmSimConfig(
    model=MODEL,
    speed_profile="fast",
    max_model_len=4096,
    pod_name="llama-0",
    time_scale=10.0,
    metrics_min_interval=0.0,
)


@pytest.fixture
async def client() -> AsyncIterator[TestClient]:
    async with serve(vllm.make_app(BASE)) as c:
        yield c


@pytest.fixture
async def realtime_client() -> AsyncIterator[TestClient]:
    """Simulated time = real time: requests last long enough to be watched mid-flight."""
    async with serve(vllm.make_app(dataclasses.replace(BASE, time_scale=1.0))) as c:
        yield c


def chat_body(content: str = "Hello, how are you?", **kw: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **kw}


async def metrics(client: TestClient) -> dict[str, object]:
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(await resp.text())}


def value(fams: dict[str, object], name: str, sample: str, **labels: str) -> float:
    fam = fams[name]
    for s in fam.samples:  # type: ignore[attr-defined]
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise KeyError((sample, labels))


# -------------------------------------------------------------------- API


async def test_models_and_health(client: TestClient) -> None:
    resp = await client.get("/v1/models")
    body = await resp.json()
    assert [m["id"] for m in body["data"]] == [MODEL]
    assert body["data"][0]["max_model_len"] == 4096
    assert (await client.get("/health")).status == 200
    assert "version" in await (await client.get("/version")).json()


async def test_chat_non_streaming_with_usage_and_max_tokens(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json=chat_body(max_tokens=7, ignore_eos=True))
    assert resp.status == 200
    body = await resp.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["role"] == "assistant"
    prompt = tokens.render_chat([{"role": "user", "content": "Hello, how are you?"}])
    assert body["usage"] == {
        "prompt_tokens": tokens.count_tokens(prompt),
        "completion_tokens": 7,
        "total_tokens": tokens.count_tokens(prompt) + 7,
    }
    assert len(choice["message"]["content"].split()) == 7


async def test_max_completion_tokens_wins_and_caps_natural_length(client: TestClient) -> None:
    resp = await client.post(
        "/v1/chat/completions",
        json=chat_body(max_tokens=50, max_completion_tokens=3, ignore_eos=True),
    )
    assert (await resp.json())["usage"]["completion_tokens"] == 3
    for i in range(5):
        resp = await client.post("/v1/chat/completions", json=chat_body(f"q{i}", max_tokens=4))
        body = await resp.json()
        n = body["usage"]["completion_tokens"]
        assert 1 <= n <= 4
        assert body["choices"][0]["finish_reason"] == ("length" if n == 4 else "stop")


async def test_chat_streaming_sse(client: TestClient) -> None:
    resp = await client.post(
        "/v1/chat/completions",
        json=chat_body(
            max_tokens=5, ignore_eos=True, stream=True, stream_options={"include_usage": True}
        ),
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(await resp.text())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 5
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert len({c["id"] for c in chunks}) == 1


async def test_prompt_tokens_details_report_what_the_prefix_cache_held(client: TestClient) -> None:
    """``--enable-prompt-tokens-details``: the usage says how many prompt
    tokens were found cached, as vLLM's does; without it, no such field."""
    prompt = "a long shared system prompt. " * 40  # ~290 tokens: many 16-token blocks
    cfg = dataclasses.replace(BASE, prompt_tokens_details=True, system_fingerprint="pod-7")
    async with serve(vllm.make_app(cfg)) as c:
        seen = []
        for question, stream in (("first?", False), ("second?", True), ("third?", False)):
            body = {"model": MODEL, "prompt": prompt + question, "max_tokens": 2, "stream": stream,
                    "stream_options": {"include_usage": True}}
            resp = await c.post("/v1/completions", json=body)
            text = await resp.text()
            answers = sse_events(text)[:-1] if stream else [await resp.json()]
            assert {a["system_fingerprint"] for a in answers} == {"pod-7"}
            seen.append(answers[-1]["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert seen[0] == 0
        shared = (tokens.count_tokens(prompt) // BASE.block_size) * BASE.block_size
        assert shared - BASE.block_size <= seen[1] <= shared and seen[2] == seen[1]
    for _ in range(2):  # the plain simulator: cached or not, no details
        resp = await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        answer = await resp.json()
        assert "prompt_tokens_details" not in answer["usage"] and "system_fingerprint" not in answer


async def test_streaming_without_include_usage_has_no_usage_chunk(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2, stream=True))
    events = sse_events(await resp.text())
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])


async def test_completions_stream_and_not(client: TestClient) -> None:
    resp = await client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "Once upon a time", "ignore_eos": True}
    )
    body = await resp.json()
    assert body["object"] == "text_completion"
    assert body["usage"]["completion_tokens"] == 16  # the completions API default
    assert body["usage"]["prompt_tokens"] == tokens.count_tokens("Once upon a time")
    resp = await client.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "Once",
            "max_tokens": 3,
            "ignore_eos": True,
            "stream": True,
        },
    )
    events = sse_events(await resp.text())
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None, None, "length"]
    assert events[-1] == "[DONE]"


async def test_same_prompt_same_answer(client: TestClient) -> None:
    a = await (
        await client.post("/v1/chat/completions", json=chat_body("same", max_tokens=20))
    ).json()
    b = await (
        await client.post("/v1/chat/completions", json=chat_body("same", max_tokens=20))
    ).json()
    assert a["choices"][0]["message"] == b["choices"][0]["message"]


async def test_tokenize_gives_ids_that_share_a_prefix_as_the_text_does(client: TestClient) -> None:
    """vLLM's /tokenize (vllm-router's cache_aware matches prefixes on these ids)."""
    system = "You are a careful assistant. " * 8
    body = {"model": MODEL, "prompt": system + "first?"}
    a = await (await client.post("/tokenize", json=body)).json()
    b = await (await client.post("/tokenize", json={"prompt": system + "second!"})).json()
    assert a["count"] == len(a["tokens"]) == tokens.count_tokens(system + "first?")
    assert a["max_model_len"] == 4096
    shared = len(system) // tokens.CHARS_PER_TOKEN
    assert a["tokens"][:shared] == b["tokens"][:shared]
    assert a["tokens"][shared:] != b["tokens"][shared:]
    messages = [{"role": "user", "content": "hi"}]
    chat = await (await client.post("/tokenize", json={"messages": messages})).json()
    assert chat["tokens"] == tokens.token_ids(tokens.render_chat(messages))


async def test_tokenize_errors_name_the_problem(client: TestClient) -> None:
    resp = await client.post("/tokenize", json={"model": "nope", "prompt": "x"})
    assert resp.status == 404 and "nope" in (await resp.json())["error"]["message"]
    resp = await client.post("/tokenize", json={"prompt": 3})
    assert resp.status == 400
    assert "prompt must be a string" in (await resp.json())["error"]["message"]
    both = {"prompt": "x", "messages": [{"role": "user", "content": "y"}]}
    resp = await client.post("/tokenize", json=both)
    assert resp.status == 400 and "not both" in (await resp.json())["error"]["message"]


async def test_errors_use_the_openai_envelope(client: TestClient) -> None:
    resp = await client.post("/v1/chat/completions", json={**chat_body(), "model": "nope"})
    assert resp.status == 404
    err = (await resp.json())["error"]
    assert err["type"] == "NotFoundError" and "nope" in err["message"] and err["code"] == 404
    resp = await client.post("/v1/chat/completions", data=b"{not json")
    assert resp.status == 400 and "error" in await resp.json()
    resp = await client.post("/v1/chat/completions", json=chat_body("x" * 4 * 5000))
    assert (
        resp.status == 400
        and "maximum context length is 4096" in (await resp.json())["error"]["message"]
    )
    resp = await client.post("/v1/chat/completions", json=chat_body(max_tokens=5000))
    assert resp.status == 400


async def test_served_model_names() -> None:
    cfg = dataclasses.replace(BASE, served_model_names=("llama", "llama-alias"))
    async with serve(vllm.make_app(cfg)) as c:
        for name in ("llama", "llama-alias"):
            resp = await c.post(
                "/v1/chat/completions", json={**chat_body(max_tokens=1), "model": name}
            )
            assert (await resp.json())["model"] == name
        resp = await c.post(
            "/v1/chat/completions", json={**chat_body(max_tokens=1), "model": MODEL}
        )
        assert resp.status == 404
        fams = await metrics(c)
        assert (
            value(
                fams, "vllm:generation_tokens", "vllm:generation_tokens_total", model_name="llama"
            )
            == 2
        )


# ---------------------------------------------------------------- metrics


REQUIRED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:cache_config_info": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


async def test_metrics_names_types_labels_and_buckets(client: TestClient) -> None:
    fams = await metrics(client)
    for name, kind in REQUIRED.items():
        assert fams[name].type == kind, name  # type: ignore[attr-defined]
        for s in fams[name].samples:  # type: ignore[attr-defined]
            assert s.labels["engine"] == "0"
            if name != "vllm:cache_config_info":
                assert s.labels["model_name"] == MODEL
    ttft = fams["vllm:time_to_first_token_seconds"]
    les = [s.labels["le"] for s in ttft.samples if s.name.endswith("_bucket")]  # type: ignore[attr-defined]
    assert les == [repr(float(b)) for b in TTFT_BUCKETS] + ["+Inf"]
    (info,) = fams["vllm:cache_config_info"].samples  # type: ignore[attr-defined]
    assert info.value == 1
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == "2048"
    assert info.labels["enable_prefix_caching"] == "True"
    text = await (await client.get("/metrics")).text()
    assert "vllm:prefix_cache_queries_total{" in text
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.02",model_name="' in text


async def test_metrics_count_what_was_served(client: TestClient) -> None:
    system = "You are a careful assistant. " * 40
    total_out = 0
    for i in range(3):
        body = {
            "model": MODEL,
            "max_tokens": 4,
            "ignore_eos": True,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        out = await (await client.post("/v1/chat/completions", json=body)).json()
        total_out += out["usage"]["completion_tokens"]
    fams = await metrics(client)
    assert value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") == total_out == 12
    assert (
        value(fams, "vllm:request_success", "vllm:request_success_total", finished_reason="length")
        == 3
    )
    assert (
        value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
        == 3
    )
    assert (
        value(fams, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")
        == 9
    )
    hits = value(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total")
    queries = value(fams, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total")
    assert hits > 0.5 * queries * 2 / 3  # the 2nd and 3rd request reuse the system prompt
    assert value(fams, "vllm:num_requests_running", "vllm:num_requests_running") == 0
    computed = value(
        fams,
        "vllm:request_prefill_kv_computed_tokens",
        "vllm:request_prefill_kv_computed_tokens_sum",
    )
    prompts = value(fams, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum")
    assert computed == prompts - hits


async def test_legacy_metric_names() -> None:
    async with serve(vllm.make_app(dataclasses.replace(BASE, legacy_metrics=True))) as c:
        fams = await metrics(c)
    for name in (
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_queries",
        "vllm:time_per_output_token_seconds",
        "vllm:kv_cache_usage_perc",
    ):
        assert name in fams


async def test_sim_state(client: TestClient) -> None:
    state = await (await client.get("/sim/state")).json()
    assert state["pod"] == "llama-0" and state["model"] == MODEL
    assert state["running"] == 0 and state["kv_cache_usage"] == 0.0
    assert state["num_gpu_blocks"] == 2048 and state["time_scale"] == 10.0


# ------------------------------------------------------------ load & faults


async def _wait_idle(client: TestClient) -> dict[str, float]:
    for _ in range(500):
        state = await (await client.get("/sim/state")).json()
        if state["running"] == 0 and state["waiting"] == 0:
            return state
        await asyncio.sleep(0.01)
    raise AssertionError(f"engine never went idle: {state}")


async def test_client_disconnect_aborts_and_frees_kv(realtime_client: TestClient) -> None:
    client = realtime_client
    resp = await client.post(
        "/v1/chat/completions",
        json=chat_body("x" * 4000, max_tokens=3000, ignore_eos=True, stream=True),
    )
    await resp.content.readline()
    state = await (await client.get("/sim/state")).json()
    assert state["running"] == 1 and state["kv_cache_usage"] > 0
    resp.close()
    state = await _wait_idle(client)
    assert state["kv_cache_usage"] == 0.0
    fams = await metrics(client)
    assert (
        value(fams, "vllm:request_success", "vllm:request_success_total", finished_reason="abort")
        == 1
    )


async def test_concurrent_load_shows_in_gauges(realtime_client: TestClient) -> None:
    client = realtime_client
    body = chat_body("y" * 2000, max_tokens=400, ignore_eos=True)
    tasks = [
        asyncio.create_task(
            client.post(
                "/v1/chat/completions",
                json={**body, "messages": [{"role": "user", "content": f"{i} " + "y" * 2000}]},
            )
        )
        for i in range(6)
    ]
    seen_running = 0.0
    seen_kv = 0.0
    for _ in range(500):
        fams = await metrics(client)
        seen_running = max(
            seen_running, value(fams, "vllm:num_requests_running", "vllm:num_requests_running")
        )
        seen_kv = max(seen_kv, value(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"))
        if seen_running == 6:
            break
        await asyncio.sleep(0.005)
    results = await asyncio.gather(*tasks)
    assert all(r.status == 200 for r in results)
    assert seen_running == 6 and seen_kv > 0


async def test_slow_start_fails_health_and_requests() -> None:
    async with serve(vllm.make_app(dataclasses.replace(BASE, slow_start=3600))) as c:
        assert (await c.get("/health")).status == 503
        resp = await c.post("/v1/chat/completions", json=chat_body())
        assert resp.status == 503 and "error" in await resp.json()


async def test_error_rate_one_always_fails() -> None:
    async with serve(vllm.make_app(dataclasses.replace(BASE, error_rate=1.0))) as c:
        for _ in range(3):
            resp = await c.post("/v1/chat/completions", json=chat_body())
            assert resp.status == 500
            assert (await resp.json())["error"]["type"] == "InternalServerError"


async def test_hang_rate_one_never_answers() -> None:
    async with serve(vllm.make_app(dataclasses.replace(BASE, hang_rate=1.0))) as c:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.post("/v1/chat/completions", json=chat_body()), 0.5)
        assert (await c.get("/health")).status == 200


async def test_error_rate_is_seeded() -> None:
    async def statuses(seed: int) -> list[int]:
        cfg = dataclasses.replace(BASE, error_rate=0.5, seed=seed)
        async with serve(vllm.make_app(cfg)) as c:
            return [
                (await c.post("/v1/chat/completions", json=chat_body(max_tokens=1))).status
                for _ in range(12)
            ]

    a = await statuses(3)
    assert a == await statuses(3)
    assert set(a) == {200, 500}


async def test_sim_clock_runs_time_scale_times_faster() -> None:
    now = [100.0]
    sched = vllm.Scheduler(BASE.scheduler_config(), vllm.get_profile("fast"))
    metrics_ = vllm.EngineMetrics(model_name="m", max_model_len=4096, cache_info={})
    engine = Engine(sched, metrics_.engine("0"), time_scale=50.0, clock=lambda: now[0])
    assert engine.sim_now() == 0.0
    now[0] = 100.5
    assert engine.sim_now() == pytest.approx(25.0)


def test_metrics_rendering_is_throttled_but_never_lost() -> None:
    now = [0.0]
    m = vllm.EngineMetrics(
        model_name="m",
        max_model_len=128,
        cache_info={},
        min_render_interval=1.0,
        clock=lambda: now[0],
    )
    series = m.engine("0")
    first = m.render()
    series.generation_tokens.inc(5)
    m.version += 1
    assert m.render() == first  # within the interval: the last page
    now[0] = 1.0
    assert b'vllm:generation_tokens_total{engine="0",model_name="m"} 5.0' in m.render()


async def test_data_parallel_engines_have_their_own_series() -> None:
    cfg = dataclasses.replace(BASE, data_parallel_size=2, time_scale=1.0)
    async with serve(vllm.make_app(cfg)) as c:
        st = c.app[vllm.STATE]  # type: ignore[index]
        body = chat_body("w" * 400, max_tokens=2000, ignore_eos=True, stream=True)
        r1 = await c.post("/v1/chat/completions", json=body)
        await r1.content.readline()
        r2 = await c.post(
            "/v1/chat/completions",
            json={**body, "messages": [{"role": "user", "content": "v" * 400}]},
        )
        await r2.content.readline()
        assert [e.scheduler.num_running for e in st.engines] == [1, 1]
        state = await (await c.get("/sim/state")).json()
        assert state["data_parallel_size"] == 2 and state["running"] == 2
        assert len(state["engines"]) == 2
        fams = await metrics(c)
        running = {s.labels["engine"]: s.value for s in fams["vllm:num_requests_running"].samples}  # type: ignore[attr-defined]
        assert running == {"0": 1.0, "1": 1.0}
        infos = fams["vllm:cache_config_info"].samples  # type: ignore[attr-defined]
        assert sorted(s.labels["engine"] for s in infos) == ["0", "1"]
        r1.close()
        r2.close()


async def test_short_kv_preempts_and_still_completes_over_http() -> None:
    cfg = dataclasses.replace(BASE, kv_blocks=256, time_scale=100.0)  # 4096 tokens of KV
    async with serve(vllm.make_app(cfg)) as c:

        async def one(i: int) -> dict[str, object]:
            body = chat_body(f"{i}" * 4000, max_tokens=1500, ignore_eos=True)
            resp = await c.post("/v1/chat/completions", json=body)
            assert resp.status == 200
            return await resp.json()  # type: ignore[no-any-return]

        outs = await asyncio.gather(*(one(i) for i in range(4)))
        assert all(o["usage"]["completion_tokens"] == 1500 for o in outs)  # type: ignore[index]
        fams = await metrics(c)
        assert value(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") > 0
        assert value(fams, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0
