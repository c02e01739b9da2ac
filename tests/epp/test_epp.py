"""The Endpoint Picker (services/router/epp.py) driven as Envoy drives it
(tests/epp/client.py), on the router tests' pool: its picks are the router's
decisions, and what it says goes out in the protocol's order and shape."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from tests.epp.conftest import Epp
from tests.router.test_router import CLEAN_PROMPT, Env

CHAT = "/v1/chat/completions"


def chat_body(content: str = CLEAN_PROMPT, **extra: Any) -> bytes:
    return json.dumps({"model": "qwen-2.5", "messages": [{"role": "user", "content": content}], **extra}).encode()


def inflight(env: Env) -> int:
    return sum(env.router.metrics.inflight.values())


async def test_plain_request_picks_a_pod_and_forwards(start_epp: Any, classifier: Any) -> None:
    epp: Epp = await start_epp()
    env = epp.env
    rt = await epp.client.roundtrip(CHAT, chat_body(), session=epp.session)
    rq = rt.request
    assert rq.kinds[0] == "request_headers" and set(rq.kinds[1:]) == {"request_body"}
    assert rq.clear_route_cache
    dest = rq.destination
    pods = {p.address: p for p in env.pods.values()}
    assert dest is not None and dest.split(",")[0] in pods
    # the same value, twice
    assert rq.dynamic_metadata == {"envoy.lb": {"x-gateway-destination-endpoint": dest}}
    assert rq.set_headers["content-length"] == str(len(rq.body))
    got = pods[dest.split(",")[0]].received[-1]
    assert got["body"]["model"] == "Qwen/Qwen2.5-32B-Instruct"  # the worker set's servedName
    assert rt.status == 200
    # restored for the client
    assert msgspec.json.decode(rt.body)["model"] == "qwen-2.5"
    assert rt.headers["x-kinference-backend"].startswith("Local/qwen-2-5-32b")
    assert env.provider.received == []
    assert inflight(env) == 0
