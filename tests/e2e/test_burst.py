"""The saturation trial, end to end, on exactly the stack ``make run`` starts
(NATS with per-service users, the example burst-unless-PII policy, the
classifier service): 180 clean and 20 PII streaming requests at once.

Invariants, not timings (the machine may be busy):

- zero PII-bearing prompts reach the provider (its own log is read);
- every clean prompt the classifier answered ``pii-none`` is routed (local
  or provider), none refused; the provider gets at most its limit (64) at
  once, and exactly as many as the router sent it;
- every PII prompt stays local or is refused;
- deadline misses are reported: the router's
  ``kinference_classifier_deadline_misses_total`` equals the number of
  decision events whose classifier missed its deadline;
- subscribed to ``>`` the whole time (a test-only user allowed everything),
  no message outside the classify subjects carries the card number or the
  e-mail address, while the classify subjects do (so the check can fail).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest

from bench.burst import CARD, EMAIL, PII_MARKERS, clean_prompt, parse_metrics, pii_prompt, wait_for_telemetry
from kinference_simulators.stack import Stack, StackError

# serial: the classifier's deadline is 20 ms; beside another worker's trials a
# whole wave can miss it (those prompts rightly stay local or are refused)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

AUDIT_PASSWORD = "audit-only-in-this-test"


class AuditedStack(Stack):
    """The make-run stack plus one test-only NATS user that may read everything."""

    def plan(self, speed_profile: str, time_scale: float) -> list[Any]:
        procs = super().plan(speed_profile, time_scale)
        conf = self.run_dir / "nats-auth" / "nats-server.conf"
        text = conf.read_text()
        body = json.loads(text[text.index("{"):])
        body["authorization"]["users"].append({"user": "audit", "password": AUDIT_PASSWORD,
                                               "permissions": {"subscribe": {"allow": [">"]},
                                                               "publish": {"allow": ["_INBOX.>"]}}})
        conf.write_text(json.dumps(body))
        return procs


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    last: Exception | None = None
    for attempt in range(5):
        # below the kernel's ephemeral range, varied per process so runs coexist
        offset = 11000 + ((os.getpid() + attempt * 7) % 80) * 50
        s = AuditedStack(tmp_path / f"run{attempt}", offset)
        s.prepare()
        try:
            await s.start("h100", 1.0, timeout=90)
        except StackError as exc:  # a port in use: another offset
            last = exc
            continue
        try:
            yield s
        finally:
            await s.stop()
        return
    raise AssertionError(f"no free ports for the stack: {last}")


async def one(http: aiohttp.ClientSession, url: str, content: str) -> tuple[int, str, str]:
    body = {"model": "qwen-2.5", "stream": True, "max_tokens": 32, "messages": [{"role": "user", "content": content}]}
    async with http.post(url, json=body) as r:
        async for _ in r.content.iter_any():
            pass
        return r.status, r.headers.get("x-kinference-backend", ""), r.headers.get("x-kinference-decision-id", "")


def provider_log(stack: Stack) -> list[str]:
    path = stack.run_dir / "provider-requests.jsonl"
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def burst_summary(results: list[tuple[str, int, str, str]], seen: list[tuple[str, bytes]]) -> str:
    """What happened instead, for a failure message: answers by kind, status
    and backend, and the decision events' outcomes and pii classifier outcomes."""
    answers = Counter((k, s, b.split("/")[0]) for k, s, b, _ in results)
    outcomes: Counter[tuple[str, str, str]] = Counter()
    for subject, data in seen:
        if subject.startswith("kinference.decisions."):
            e = json.loads(data)
            pii = next((c["outcome"] for c in e.get("classifiers", []) if c.get("name") == "pii"), "?")
            outcomes[(e["outcome"]["type"], str(e["outcome"].get("reason", "")), pii)] += 1
    return f"answers {dict(answers)}; decisions {dict(outcomes)}"


async def test_burst_holds_and_pii_stays_local_and_off_every_other_subject(stack: Stack) -> None:
    seen: list[tuple[str, bytes]] = []
    audit = await nats.connect(f"nats://127.0.0.1:{stack.port(4222)}", user="audit", password=AUDIT_PASSWORD)

    async def on(msg: Any) -> None:
        seen.append((msg.subject, msg.data))

    await audit.subscribe(">", cb=on)
    await audit.flush()
    url = f"http://127.0.0.1:{stack.port(8080)}/v1/chat/completions"
    admin = f"http://127.0.0.1:{stack.port(8081)}"
    results: list[tuple[str, int, str, str]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                     connector=aiohttp.TCPConnector(limit=0)) as http:
        await wait_for_telemetry(http, admin)
        # up to five waves, until one clean prompt bursts (a busy machine can
        # make a whole wave miss the classifier's deadline: those stay local)
        for wave in range(5):
            before = len(provider_log(stack))
            kinds = ["pii" if i % 10 == 3 else "clean" for i in range(200)]
            prompts = [pii_prompt(i) if k == "pii" else clean_prompt(i + 1000 * wave) for i, k in enumerate(kinds)]
            got = await asyncio.gather(*(one(http, url, p) for p in prompts))
            results += [(k, *g) for k, g in zip(kinds, got)]
            assert len(provider_log(stack)) - before <= 64, "more than the provider's maxConcurrency at once"
            if any(k == "clean" and b.startswith("Provider/") and s == 200 for k, s, b, _ in results):
                break
        async with http.get(f"{admin}/metrics") as r:
            metrics = parse_metrics(await r.text())
    await asyncio.sleep(0.5)  # decision events are published after the answers
    await audit.drain()

    # zero PII at the provider, by the provider's own log
    received = provider_log(stack)
    assert not [line for line in received if any(m in line for m in PII_MARKERS)]
    assert len(received) == sum(1 for k, s, b, _ in results if b.startswith("Provider/") and s == 200)
    assert any(k == "clean" and b.startswith("Provider/") for k, _, b, _ in results), \
        f"nothing burst: {burst_summary(results, seen)}"
    for kind, status, backend, _ in results:
        assert status in (200, 429, 503), status
        if kind == "pii":
            assert not backend.startswith("Provider/")

    events = {}
    for subject, data in seen:
        if subject.startswith("kinference.decisions."):
            e = json.loads(data)
            events[e["decision_id"]] = e
    by_id = {d: k for k, _, _, d in results}
    assert set(by_id) <= set(events), "a request without its decision event"
    misses = 0
    for did, kind in by_id.items():
        e = events[did]
        pii = next((c for c in e["classifiers"] if c["name"] == "pii"), None)
        assert pii is not None, e
        misses += pii["outcome"] == "deadline"
        if "pii-none" in e["tags"]:
            assert kind == "clean" and e["outcome"]["type"] == "Routed", e
        if kind == "pii":
            assert e["outcome"]["backend"] is None or e["outcome"]["backend"].startswith("Local/"), e
            assert "pii-none" not in e["tags"]
    reported = sum(v for k, v in metrics.items() if k.startswith("kinference_classifier_deadline_misses_total{"))
    assert metrics.get("kinference_events_dropped_total", 0) == 0
    assert reported == misses

    # prompts travel on the classify subjects only (authorised, in the deployment encrypted)
    secrets = tuple(m.encode() for m in PII_MARKERS)
    leaks = [s for s, d in seen if not s.startswith("kinference.classify.") and any(x in d for x in secrets)]
    assert leaks == []
    assert any(s.startswith("kinference.classify.") and CARD.encode() in d for s, d in seen), \
        "the audit subscription saw no classify request: the check above proves nothing"
    assert {s.split(".")[1] for s, _ in seen if s.startswith("kinference.")} >= {"decisions", "observations"}
