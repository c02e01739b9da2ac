"""A streamed burst asks its provider for usage (``stream_options.include_usage``)
so that ``kinference_provider_tokens_total`` counts it, and the client gets
the usage event only when it asked for it."""

from __future__ import annotations

import asyncio

from kinference_router.stream_usage import UsageStripper

from .test_operator_metrics import POOL, value
from .test_router import CLEAN_PROMPT, Env, classifier, env  # noqa: F401  (fixtures)

ROLE = b'data: {"choices":[{"delta":{"content":"Hi"},"index":0}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"


def test_the_stripper_removes_only_the_usage_event_whatever_the_chunking() -> None:
    stream = ROLE + ROLE + USAGE + DONE
    for size in (1, 3, 7, 40, len(stream)):
        s = UsageStripper()
        out = b"".join(s.feed(stream[i:i + size]) for i in range(0, len(stream), size)) + s.flush()
        assert out == ROLE + ROLE + DONE, size
    # a content chunk that merely mentions "usage" is the client's
    text = b'data: {"choices":[{"delta":{"content":"\\"usage\\""},"index":0}]}\n\n'
    s = UsageStripper()
    assert s.feed(text) + s.flush() == text


async def test_a_streamed_burst_is_counted_and_the_client_gets_what_it_asked(env: Env, classifier) -> None:  # noqa: F811
    env.provider.usage_only_when_asked = True
    await env.saturate()
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert r.status == 200 and r.headers["x-kinference-backend"] == "Provider/databricks"
    text = (await r.read()).decode()
    assert env.provider.received[-1]["body"]["stream_options"] == {"include_usage": True}
    assert '"usage"' not in text and text.count("data: ") == 4 and text.rstrip().endswith("data: [DONE]")
    await asyncio.sleep(0.05)
    assert value(env, "kinference_provider_tokens_total", pool=POOL, provider="databricks", kind="prompt") == 7
    assert value(env, "kinference_provider_tokens_total", pool=POOL, provider="databricks", kind="completion") == 3
    # a client that asks for usage gets it
    r = await env.chat(CLEAN_PROMPT, stream=True, stream_options={"include_usage": True})
    text = (await r.read()).decode()
    assert '"usage"' in text and text.count("data: ") == 5
    await asyncio.sleep(0.05)
    assert value(env, "kinference_provider_tokens_total", pool=POOL, provider="databricks", kind="prompt") == 14
