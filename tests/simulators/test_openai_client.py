"""The official OpenAI client talks to both simulators (stream and not)."""

from __future__ import annotations

import openai
import pytest
from kinference_simulators import provider, vllm
from kinference_simulators.testing import serve

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


async def test_openai_client_against_the_engine_simulator() -> None:
    cfg = vllm.VllmSimConfig(model=MODEL, speed_profile="fast", max_model_len=4096)
    async with serve(vllm.make_app(cfg)) as c:
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{c.port}/v1", api_key="unused")
        try:
            models = await client.models.list()
            assert [m.id for m in models.data] == [MODEL]
            out = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_completion_tokens=5,
                extra_body={"ignore_eos": True},
            )
            assert out.model == MODEL and out.usage is not None
            assert out.usage.completion_tokens == 5
            assert out.choices[0].finish_reason == "length"
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            pieces = []
            usage = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
            assert len(pieces) == 4 and usage is not None and usage.completion_tokens == 4
            comp = await client.completions.create(model=MODEL, prompt="abc", max_tokens=3)
            assert comp.usage is not None and 1 <= comp.usage.completion_tokens <= 3
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(
                    model="other", messages=[{"role": "user", "content": "hi"}]
                )
        finally:
            await client.close()


async def test_openai_client_against_the_provider_simulator() -> None:
    cfg = provider.ProviderSimConfig(
        api_keys=("sk-1",),
        models=("gpt-4o-mini",),
        ttft_ms=1,
        ttft_jitter_ms=0,
        tokens_per_second=5000,
        rate_429=0.0,
    )
    async with serve(provider.make_app(cfg)) as c:
        base = f"http://127.0.0.1:{c.port}/v1"
        good = openai.AsyncOpenAI(base_url=base, api_key="sk-1", max_retries=0)
        bad = openai.AsyncOpenAI(base_url=base, api_key="sk-2", max_retries=0)
        try:
            out = await good.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], max_tokens=3
            )
            assert out.choices[0].message.content
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
                )
        finally:
            await good.close()
            await bad.close()
    limited = provider.ProviderSimConfig(api_keys=("sk-1",), models=("m",), rate_429=1.0)
    async with serve(provider.make_app(limited)) as c:
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{c.port}/v1", api_key="sk-1", max_retries=0
        )
        try:
            with pytest.raises(openai.RateLimitError) as err:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x"}]
                )
            assert err.value.response.headers["retry-after"] == "1"
        finally:
            await client.close()
