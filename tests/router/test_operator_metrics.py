"""The metrics an operator asks of the router (docs/reference/metrics.md),
through the real router against stand-in pods and provider: per-pod TTFT and
requests, requests by backend and outcome (a client that went away counts as
abandoned), the provider's billed tokens, the classifiers' tags; and the
per-pod series stay bounded as pods come and go."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kinference_router import metrics as metrics_module
from kinference_router.metrics import RouterMetrics

from .test_router import CLEAN_PROMPT, Env, _app_with, classifier, env  # noqa: F401  (fixtures)

POOL = "default/inference-all"


def value(env: Env, name: str, **labels: str) -> float:
    return env.router.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_streamed_local_request_counts_per_pod_and_per_backend(env: Env, classifier) -> None:  # noqa: F811
    r = await env.chat(CLEAN_PROMPT, stream=True)
    assert r.status == 200
    await r.read()
    backend = r.headers["x-kinference-backend"]
    ws = backend.split("/", 1)[1]
    pod = next(name for name, p in env.pods.items() if p.received)
    await asyncio.sleep(0.05)
    assert value(env, "kinference_backend_requests_total", pool=POOL, backend=backend, outcome="ok") == 1
    assert value(env, "kinference_endpoint_requests_total", pool=POOL, worker_set=ws, pod=pod, outcome="ok") == 1
    assert value(env, "kinference_endpoint_ttft_seconds_count", pool=POOL, worker_set=ws, pod=pod) == 1
    assert value(env, "kinference_endpoint_ttft_seconds_sum", pool=POOL, worker_set=ws, pod=pod) > 0
    # with headroom the pick is local whatever pii says: it is not asked (lazy classification)
    assert value(env, "kinference_classifier_skipped_total", classifier="pii") == 1
    page = (await env.router.metrics_page(None)).body.decode()  # what the admin port's /metrics serves
    assert f'kinference_endpoint_ttft_seconds_count{{pod="{pod}",pool="{POOL}",worker_set="{ws}"}} 1.0' in page
    # saturated, its answer decides: asked, and its tag counted
    await env.saturate()
    await (await env.chat(CLEAN_PROMPT)).read()
    assert value(env, "kinference_classifier_tags_total", classifier="pii", tag="pii-none") >= 1


async def test_a_whole_answer_counts_per_pod_but_is_no_ttft(env: Env, classifier) -> None:  # noqa: F811
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 200
    await r.read()
    pod = next(name for name, p in env.pods.items() if p.received)
    ws = r.headers["x-kinference-backend"].split("/", 1)[1]
    await asyncio.sleep(0.05)
    assert value(env, "kinference_endpoint_requests_total", pool=POOL, worker_set=ws, pod=pod, outcome="ok") == 1
    assert value(env, "kinference_endpoint_ttft_seconds_count", pool=POOL, worker_set=ws, pod=pod) == 0


async def test_burst_counts_provider_tokens(env: Env, classifier) -> None:  # noqa: F811
    await env.saturate()
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 200 and r.headers["x-kinference-backend"] == "Provider/databricks"
    await r.read()
    await asyncio.sleep(0.05)
    assert value(env, "kinference_backend_requests_total", pool=POOL, backend="Provider/databricks",
                 outcome="ok") == 1
    # the stand-in's usage: 7 prompt tokens, 3 completion tokens
    assert value(env, "kinference_provider_tokens_total", pool=POOL, provider="databricks", kind="prompt") == 7
    assert value(env, "kinference_provider_tokens_total", pool=POOL, provider="databricks", kind="completion") == 3
    routed = {bt: value(env, "kinference_requests_total", pool=POOL, rule="local-first-then-provider-unless-pii",
                        outcome="routed", backend_type=bt) for bt in ("Local", "Provider")}
    assert routed == {"Local": 0, "Provider": 1}  # the burst share's two halves


async def test_a_provider_error_counts_against_the_provider(env: Env, classifier) -> None:  # noqa: F811
    await env.saturate()
    env.provider.status = 500
    r = await env.chat(CLEAN_PROMPT)
    assert r.status == 502
    await asyncio.sleep(0.05)
    assert value(env, "kinference_backend_requests_total", pool=POOL, backend="Provider/databricks",
                 outcome="error") == 1


async def test_a_client_that_goes_away_is_counted_as_abandoned(env: Env, classifier) -> None:  # noqa: F811
    async def slow_stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(100):
            await resp.write(f'data: {{"i": {i}}}\n\n'.encode())
            await asyncio.sleep(0.1)
        return resp

    slow = TestServer(_app_with(slow_stream))
    await slow.start_server()
    try:
        for pod in env.pods:
            await env.telemetry(pod, address=f"127.0.0.1:{slow.port}")
        await env.settle()
        async with aiohttp.ClientSession() as session:
            r = await session.post(f"http://127.0.0.1:{env.client.port}/v1/chat/completions",
                                   json={"model": "qwen-2.5", "stream": True,
                                         "messages": [{"role": "user", "content": CLEAN_PROMPT}]})
            assert r.status == 200
            backend = r.headers["x-kinference-backend"]
            await r.content.readline()
            r.close()
        for _ in range(100):
            if value(env, "kinference_backend_requests_total", pool=POOL, backend=backend, outcome="abandoned"):
                break
            await asyncio.sleep(0.05)
        assert value(env, "kinference_backend_requests_total", pool=POOL, backend=backend, outcome="abandoned") == 1
        assert value(env, "kinference_backend_requests_total", pool=POOL, backend=backend, outcome="ok") == 0
        # and in the requests by outcome (whenever the client leaves: queued, classifying or streaming)
        assert value(env, "kinference_requests_total", pool=POOL, rule="", outcome="abandoned", backend_type="") == 1
    finally:
        await slow.close()


def test_per_pod_series_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_module, "MAX_PODS", 3)
    m = RouterMetrics()
    for i in range(10):  # a rollout replaces pods one by one
        m.sent("ns/p", "Local/ws", "ws", f"pod-{i}", True, "ok", None, None)
        m.first_token("ns/p", "ws", f"pod-{i}", 0.1)
    pods = {s.labels["pod"] for fam in m.registry.collect() if fam.name.startswith("kinference_endpoint_")
            for s in fam.samples}
    assert pods == {"pod-7", "pod-8", "pod-9"}
    # a pod used again is kept over older ones
    m.sent("ns/p", "Local/ws", "ws", "pod-7", True, "ok", None, None)
    m.sent("ns/p", "Local/ws", "ws", "pod-10", True, "ok", None, None)
    pods = {s.labels["pod"] for fam in m.registry.collect() if fam.name == "kinference_endpoint_requests"
            for s in fam.samples}
    assert pods == {"pod-7", "pod-9", "pod-10"}
    assert m.registry.get_sample_value("kinference_endpoint_requests_total",
                                       {"pool": "ns/p", "worker_set": "ws", "pod": "pod-7", "outcome": "ok"}) == 2
    # the backend series has no pod label: one series whatever the churn
    assert m.registry.get_sample_value("kinference_backend_requests_total",
                                       {"pool": "ns/p", "backend": "Local/ws", "outcome": "ok"}) == 12


async def test_a_spread_move_is_counted() -> None:
    """``kinference_spread_moves_total`` counts the requests the spread moved
    to a pod that joined empty, whichever way the decision was taken (the
    engine's own tests cover when it moves one)."""
    import random
    from types import SimpleNamespace

    from kinference_common.engine import InFlightLedger, TTFTModel
    from kinference_router.director import Director

    from ..engine.helpers import snap
    from ..engine.test_routing_fixes import _fleet_world, _group_request, _pool

    class Tags:  # a request whose classification is done
        req = None
        traces: list = []

        async def decide(self, s, avoid, decide_fn, **_):  # noqa: ANN001, ANN003, ANN201
            self.req = _group_request()
            return decide_fn(self.req, s, avoid)

    eps, index = _fleet_world()
    pool_ = _pool(["PrefixAffinity", "LeastInFlight"])
    keeper = SimpleNamespace(snapshot=snap(pool_, eps))
    m = RouterMetrics()
    dr = Director(settings=SimpleNamespace(namespace="default", pool="p"), auth=None, keeper=keeper,  # type: ignore[arg-type]
                  ledger=InFlightLedger(), prefix=index, metrics=m, flow=None, classification=None,  # type: ignore[arg-type]
                  events=SimpleNamespace(publish=lambda *a: None), limiter=None, calibration=None,  # type: ignore[arg-type]
                  rng=random.Random(0))
    d = await dr.routing(Tags(), "d1").next()  # type: ignore[arg-type]
    assert d is not None and d.endpoint == "n"
    assert m.registry.get_sample_value("kinference_spread_moves_total") == 1.0
    # a decision the spread did not move is not counted
    keeper.snapshot = snap(pool_, eps, ttft_model=TTFTModel(spread_fraction=0.0))
    d = await dr.routing(Tags(), "d2").next()  # type: ignore[arg-type]
    assert d is not None and d.endpoint == "a"
    assert m.registry.get_sample_value("kinference_spread_moves_total") == 1.0
    await asyncio.sleep(0)  # the decision events, published a turn later


async def _routed(m: RouterMetrics, world: tuple, request, n: int):  # noqa: ANN001, ANN202 - Decision
    """The director's decision on ``request`` (its classification done) in
    ``world`` (the engine tests' ``(eps, index, ledger)``), counted in ``m``."""
    import random
    from types import SimpleNamespace

    from kinference_router.director import Director

    from ..engine.helpers import snap
    from ..engine.test_routing_fixes import NO_SPREAD, _pool

    class Tags:  # a request whose classification is done
        req = None
        traces: list = []

        async def decide(self, s, avoid, decide_fn, **_):  # noqa: ANN001, ANN003, ANN201
            self.req = request
            return decide_fn(self.req, s, avoid)

    eps, index, ledger = world
    keeper = SimpleNamespace(snapshot=snap(_pool(["PrefixAffinity"]), eps, ttft_model=NO_SPREAD))
    dr = Director(settings=SimpleNamespace(namespace="default", pool="p"), auth=None, keeper=keeper,  # type: ignore[arg-type]
                  ledger=ledger, prefix=index, metrics=m, flow=None, classification=None,  # type: ignore[arg-type]
                  events=SimpleNamespace(publish=lambda *a: None), limiter=None, calibration=None,  # type: ignore[arg-type]
                  rng=random.Random(0))
    d = await dr.routing(Tags(), f"d{n}").next()  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the decision events, published a turn later
    return d


async def test_a_copy_made_under_the_relief_is_counted() -> None:
    """``kinference_stickiness_relief_copies_total`` counts the requests sent
    to a pod without their prefix while the holder's charge was relieved;
    a decision without the relief is not counted (the engine's own tests
    cover when the relief holds)."""
    from ..engine.test_routing_fixes import IDLE_REQUEST, _relief_world

    m = RouterMetrics()
    picks = []
    for o in ({"running": 20, "queued": 1}, {"running": 34, "queued": 1}):
        d = await _routed(m, _relief_world(o), IDLE_REQUEST, len(picks))
        picks.append((d.endpoint, d.context.relief is not None))
    # relieved and sent to o (a copy); then h's load within 1.25x of the mean: no relief, h keeps it
    assert picks == [("o", True), ("h", False)]
    assert m.registry.get_sample_value("kinference_stickiness_relief_copies_total") == 1.0


async def test_a_turn_moved_off_its_conversations_pod_is_counted() -> None:
    """``kinference_conversation_moves_total`` counts a conversation's next
    turn sent to a pod without its earlier turns; a turn that stays, and a
    prompt that continues nothing, are not counted."""
    from ..engine.test_routing_fixes import IDLE, TURN, TURN_REQUEST, _turn_world

    m = RouterMetrics()
    picks = []
    for o, sent in ((IDLE, TURN), ({"running": 30, "queued": 2, "kv": 0.4}, TURN),
                    (IDLE, TURN + "user: which zone is the largest? " * 60)):
        d = await _routed(m, _turn_world(o, sent), TURN_REQUEST, len(picks))
        picks.append((d.endpoint, d.context.continued))
    # moved to o (nothing waiting); kept on h (o has a queue); kept on h (h's prompt was another question)
    assert picks == [("o", True), ("h", True), ("h", False)]
    assert m.registry.get_sample_value("kinference_conversation_moves_total") == 1.0
