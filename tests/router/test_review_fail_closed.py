"""Adversarial review of burst-to-cloud classification: a prompt whose
classifier did not run never reaches a Provider, whatever the path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from kinference_common.compiler import compile_documents
from kinference_policy_compiler.publisher import ConfigPublisher
from .manifests import example_documents
from tests.router.test_router import Env, classifier, env  # noqa: F401 - fixtures

CARD_PROMPT = "My card is 4111 1111 1111 1111, summarise my statement."

FLOW = "{maxQueueWait: 1500ms, maxQueued: 10}"


async def publish(env: Env, edit: Callable[[str, str], str]) -> None:
    res = compile_documents(example_documents(env.provider.address, edit))
    publisher = ConfigPublisher(env.nc)
    await publisher.start()
    await publisher.publish(res.pools)
    await asyncio.sleep(0.2)


def with_flow(name: str, text: str) -> str:
    if name == "20-pool.yaml":
        return text.replace("  policyRef:", f"  flowControl: {FLOW}\n  policyRef:")
    return text


def local_only(name: str, text: str) -> str:
    """The example policy without its Provider tier and PII exclusion: it requires no classifier."""
    if name == "10-burst-policy.yaml":
        text = text.replace("          - name: ensure-pii-never-leaves-cluster\n"
                            "            if: { tag: [pii-confirmed, pii-unknown] }\n"
                            "            drop: { backend: { type: Provider } }\n", "")
        text = text.replace("          - { type: Provider, order: [databricks] }\n", "")
    return with_flow(name, text)


async def test_a_queued_request_decided_on_a_newer_policy_fails_closed(env: Env, classifier: Any) -> None:  # noqa: F811
    """A request queues under a policy that requires no classifier; while it
    waits, a policy with the PII exclusion arrives and a Provider becomes
    reachable. Its re-decisions cannot await a classifier, so the classifier
    the new policy requires counts as failed (its failure tag): the card stays
    in the cluster."""
    await publish(env, local_only)
    snap = env.router.keeper.snapshot
    assert snap.pool.flow_control is not None
    await env.saturate()
    waiting = asyncio.ensure_future(env.chat(CARD_PROMPT))
    await asyncio.sleep(0.4)
    assert not waiting.done()  # queued: no local capacity, no provider in the policy
    await publish(env, with_flow)  # the example policy: burst unless PII
    r = await waiting
    assert all("4111" not in json.dumps(x["body"]) for x in env.provider.received)
    assert r.status == 503
