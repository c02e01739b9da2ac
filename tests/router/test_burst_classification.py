"""The router's classification (services/router/classification.py): lazy,
on the path the compiled policy names, with back-pressure; and the live
explain classifying as the request path does."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from kinference_common import subjects
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.classification import Pressure
from .manifests import example_documents
from tests.router.conftest import Served
from tests.router.test_router import REPO, Env, classifier, env  # noqa: F401 - fixtures

CARD_PROMPT = "My card is 4111 1111 1111 1111, summarise my statement."
CLEAN = "Write a haiku about autumn leaves."


def answered(svc: Any) -> float:
    """Classify requests the service answered."""
    return sum(sample.value for metric in svc.metrics.requests.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


async def explain(env: Env, body: dict[str, Any]) -> dict[str, Any]:
    served = await Served(env.router.admin_server()).start()
    try:
        async with served.post("/debug/explain", json=body) as r:
            assert r.status == 200
            return await r.json()
    finally:
        await served.close()


async def test_headroom_asks_no_classifier(env: Env, classifier: Any) -> None:  # noqa: F811
    r = await env.chat(CARD_PROMPT)
    assert r.status == 200 and r.headers["x-kinference-backend"].startswith("Local/")
    assert answered(classifier) == 0
    skipped = env.router.metrics.registry.get_sample_value("kinference_classifier_skipped_total",
                                                          {"classifier": "pii"})
    assert skipped == 1


async def test_saturated_asks_and_bursts_only_clean(env: Env, classifier: Any) -> None:  # noqa: F811
    await env.saturate()
    clean, pii = await asyncio.gather(env.chat(CLEAN), env.chat(CARD_PROMPT))
    assert clean.status == 200 and clean.headers["x-kinference-backend"] == "Provider/databricks"
    assert pii.status == 503
    assert answered(classifier) == 2
    assert all("4111" not in json.dumps(x["body"]) for x in env.provider.received)


async def test_live_explain_runs_the_classifiers_like_the_request_path(env: Env, classifier: Any) -> None:  # noqa: F811
    await env.saturate()
    body = {"model": "qwen-2.5", "messages": [{"role": "user", "content": CARD_PROMPT}]}
    t = await explain(env, body)
    pii = t["classifiers"][0]
    assert pii["name"] == "pii" and pii["outcome"] == "ok" and pii["path"] == "Service"
    assert pii["tags"] == ["pii-confirmed"] and pii["ms"] > 0
    assert t["tags"] == ["pii-confirmed"]
    ex = {e["exclusion"]: e for e in t["rules"][0]["excluded"]}
    assert ex["ensure-pii-never-leaves-cluster"]["applies"] is True
    assert t["outcome"]["type"] == "Rejected"
    # with headroom, explain says it was skipped and why
    for pod in env.pods:
        await env.telemetry(pod)
    await env.settle()
    t = await explain(env, body)
    assert t["classifiers"][0]["outcome"] == "skipped" and t["classifiers"][0]["why"]
    # caller's tags: no classifier runs
    t = await explain(env, {**body, "tags": ["pii-none"]})
    assert t["classifiers"] == [] and t["tags"] == ["pii-none"]


async def republish(env: Env, flow_control: str | None = None, **compile_kwargs: Any) -> None:
    def edit(name: str, text: str) -> str:
        if flow_control and name == "20-pool.yaml":
            return text.replace("  policyRef:", f"  flowControl: {flow_control}\n  policyRef:")
        return text

    res = compile_documents(example_documents(env.provider.address, edit), **compile_kwargs)
    publisher = ConfigPublisher(env.nc)
    await publisher.start()
    await publisher.publish(res.pools)
    await asyncio.sleep(0.2)


async def test_in_process_classifier_needs_no_service_and_puts_nothing_on_the_bus(env: Env) -> None:
    await republish(env, in_process_classifiers=["pii"])
    assert env.router.keeper.snapshot.pool.policy.in_process_classifiers == ["pii"]
    # the snapshot started loading the detectors in a thread; until then the failure tag
    for _ in range(200):
        if env.router.classification._detectors is not None:
            break
        await asyncio.sleep(0.05)
    assert env.router.classification._detectors is not None
    seen: list[str] = []

    async def on(msg: Any) -> None:
        seen.append(msg.subject)

    await env.nc.subscribe(f"{subjects.CLASSIFY_PREFIX}.>", cb=on)
    await env.saturate()
    clean, pii = await asyncio.gather(env.chat(CLEAN), env.chat(CARD_PROMPT))
    assert clean.status == 200 and clean.headers["x-kinference-backend"] == "Provider/databricks"
    assert pii.status == 503
    t = await explain(env, {"model": "qwen-2.5", "messages": [{"role": "user", "content": CARD_PROMPT}]})
    assert t["classifiers"][0]["path"] == "InProcess" and t["classifiers"][0]["tags"] == ["pii-confirmed"]
    await asyncio.sleep(0.1)
    assert seen == []


def test_in_process_status_names_path_and_deadline() -> None:
    docs = []
    for f in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        docs += load_text(f.read_text(), str(f))
    service = compile_documents(docs)
    local = compile_documents(docs, in_process_classifiers=["pii"])
    (s1,) = service.policy_status.values()
    (s2,) = local.policy_status.values()
    assert s1.rules[0].worst_case_classifier_latency == "20ms"
    assert "Service" in s1.rules[0].classifier_failure_mode["pii"]
    assert s2.rules[0].worst_case_classifier_latency == "5ms"
    assert "InProcess" in s2.rules[0].classifier_failure_mode["pii"]
    assert "no prompt on the bus" in s2.rules[0].classifier_failure_mode["pii"]


async def test_over_the_in_flight_limit_the_failure_tag_comes_at_once(env: Env, classifier: Any) -> None:  # noqa: F811
    p = env.router.classification.pressure["pii"]
    p.limit = 0.0
    await env.saturate()
    r = await env.chat(CLEAN)
    assert r.status == 503  # pii-unknown: stays local, and local is full
    assert answered(classifier) == 0
    assert env.router.metrics.registry.get_sample_value("kinference_classifier_shed_total",
                                                       {"classifier": "pii"}) == 1


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_pressure_shrinks_on_misses_grows_back_and_logs_rarely() -> None:
    clock = Clock()
    p = Pressure("pii", max_limit=64, clock=clock)
    lines = []
    for i in range(200):  # a sustained miss rate of 50 %
        clock.t += 0.01
        assert p.admit() or True
        p.in_flight = max(p.in_flight, 1)
        p.answered(missed=i % 2 == 0)
        over, line = p.check()
        if line:
            lines.append(line)
    assert p.limit < 64
    assert lines == ["start"]  # one line for two seconds of misses, not one per request
    assert p.overloaded
    clock.t += 31
    for _ in range(30):
        p.in_flight = 1
        p.answered(missed=False)
        clock.t += 0.1
        _, line = p.check()
        if line:
            lines.append(line)
    assert lines[-1] == "end" and not p.overloaded
    limit = p.limit
    for _ in range(500):
        p.in_flight = 1
        p.answered(missed=False)
    assert p.limit > limit


def test_pressure_refuses_over_its_limit() -> None:
    p = Pressure("pii", max_limit=4, min_limit=4)
    assert [p.admit() for _ in range(5)] == [True, True, True, True, False]
    assert p.rate()[2] == 1


async def test_sustained_misses_log_one_line_with_the_rate(env: Env) -> None:
    c = env.router.classification
    with capture_logs() as logs:
        for _ in range(100):
            c.pressure["pii"].in_flight += 1
            c._answered("pii", "deadline")
    warnings = [e for e in logs if e["event"] == "classifier missing its deadline"]
    assert len(warnings) == 1 and warnings[0]["miss_rate"] == 1.0
    assert env.router.metrics.registry.get_sample_value("kinference_classifier_overloaded",
                                                       {"classifier": "pii"}) == 1


async def test_not_ready_while_in_process_classifiers_load(env: Env) -> None:
    import threading

    from kinference_common.detectors.core import Classifiers

    c = env.router.classification
    release = threading.Event()

    def slow_load() -> None:
        release.wait(10)
        c._detectors = Classifiers()

    c._load = slow_load  # type: ignore[method-assign]
    client = env.client
    assert (await client.get("/readyz")).status == 200
    await republish(env, in_process_classifiers=["pii"])
    assert (await client.get("/readyz")).status == 503
    await env.saturate()
    r = await env.chat(CLEAN)
    assert r.status == 503  # the failure tag until loaded: stays local, local is full
    release.set()
    for _ in range(100):
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.05)
    assert (await client.get("/readyz")).status == 200
    await env.saturate()  # again: on a loaded machine the first scrapes may be stale (5 s) by now
    r = await env.chat(CLEAN)
    assert r.status == 200 and r.headers["x-kinference-backend"] == "Provider/databricks"


async def test_a_request_about_to_queue_is_classified_first(env: Env, classifier: Any) -> None:  # noqa: F811
    """With flow control, a request whose decision is no_capacity waits in
    the queue and is decided again without awaiting: it gets its tags first."""
    await republish(env, flow_control="{maxQueueWait: 300ms, maxQueued: 10}")
    assert env.router.keeper.snapshot.pool.flow_control is not None
    events: list[dict[str, Any]] = []

    async def on(msg: Any) -> None:
        events.append(json.loads(msg.data))

    await env.nc.subscribe(subjects.decisions_subject("default", "inference-all"), cb=on)
    await env.saturate()
    # the provider rate-limits: it cools down, so nothing can place any request
    env.provider.status, env.provider.retry_after = 429, "30"
    assert (await env.chat(CLEAN)).status == 429
    await env.settle()
    assert answered(classifier) == 1
    # every tag now gives no_capacity (lazy would skip pii), but the request
    # waits in the queue, where it is decided again without awaiting: asked first
    r = await env.chat(CARD_PROMPT)
    assert r.status == 503
    assert answered(classifier) == 2
    await asyncio.sleep(0.2)
    (event,) = [e for e in events if e["decision_id"] == r.headers["x-kinference-decision-id"]]
    assert event["tags"] == ["pii-confirmed"]
    assert event["classifiers"][0]["outcome"] == "ok"
