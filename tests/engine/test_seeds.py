"""The seed examples, compiled by the policy compiler from their manifests."""

from __future__ import annotations

import itertools

import pytest
from kinference_common.compiled import CompiledPool
from kinference_common.compiler import compile_documents
from kinference_common.engine import decide, required_classifiers
from kinference_common.manifests import load_text

from .helpers import ep, pstate, req, snap
from .seed_manifests import ALICE, BURST, WORKLOADS


def compiled(text: str) -> dict[tuple[str, str], CompiledPool]:
    result = compile_documents(load_text(WORKLOADS + "\n---\n" + text, "seed.yaml"))
    assert not result.errors, result.errors
    return result.pools


@pytest.fixture(scope="module")
def burst_pool() -> CompiledPool:
    return compiled(BURST)[("default", "inference-all")]


# each local endpoint: fine, past the queue threshold, past the KV threshold
STATES = {"ok": {"queued": 2, "kv": 0.5}, "queue": {"queued": 5, "kv": 0.5}, "kv": {"queued": 0, "kv": 0.95}}


@pytest.mark.parametrize("states", list(itertools.product(STATES, repeat=3)))
def test_burst_policy_bursts_only_when_every_local_endpoint_is_past_its_thresholds(
    burst_pool: CompiledPool, states: tuple[str, ...]
) -> None:
    eps = [ep("qwen-2-5-32b", f"qwen-{i}", **STATES[s]) for i, s in enumerate(states)]
    s = snap(burst_pool, eps, [pstate("databricks", 0.9)])
    d = decide(s, req("qwen-2.5"))
    if all(st != "ok" for st in states):
        assert d.backend == "Provider/databricks" and d.model == "databricks-qwen25-32b"
    else:
        assert d.backend == "Local/qwen-2-5-32b"
        assert states[int(d.endpoint.split("-")[1])] == "ok"
        assert d.model == "Qwen/Qwen2.5-32B-Instruct"


@pytest.mark.parametrize("tag", ["pii-confirmed", "pii-unknown"])
@pytest.mark.parametrize("local", ["ok", "queue", "kv", "none", "notReady"])
def test_pii_never_reaches_a_provider(burst_pool: CompiledPool, tag: str, local: str) -> None:
    if local == "none":
        eps = []
    elif local == "notReady":
        eps = [ep("qwen-2-5-32b", "qwen-0", ready=False)]
    else:
        eps = [ep("qwen-2-5-32b", "qwen-0", **STATES[local])]
    s = snap(burst_pool, eps, [pstate("databricks", 0.01)])
    d = decide(s, req("qwen-2.5", tags={tag}))
    assert d.backend != "Provider/databricks"
    if local == "ok":
        assert d.backend == "Local/qwen-2-5-32b"
    else:
        assert not d.routed and d.code in ("no_capacity", "policy_rejected")


def test_pii_none_may_burst(burst_pool: CompiledPool) -> None:
    s = snap(burst_pool, [ep("qwen-2-5-32b", "qwen-0", queued=9)], [pstate("databricks", 0.9)])
    assert decide(s, req("qwen-2.5", tags={"pii-none"})).backend == "Provider/databricks"


def test_burst_policy_requires_the_pii_classifier(burst_pool: CompiledPool) -> None:
    assert required_classifiers(burst_pool.policy, req("qwen-2.5")) == ["pii"]


def test_alice_qwen_goes_to_gemma_renamed() -> None:
    p = compiled(ALICE)[("default", "inference-local")]
    s = snap(p, [ep("qwen-2-5-32b", "qwen-0"), ep("gemma-4-12b", "gemma-0", queued=20)])
    for model in ("qwen-2.5", "Qwen/Qwen2.5-32B-Instruct"):
        d = decide(s, req(model, tenant="alice"))
        assert d.backend == "Local/gemma-4-12b" and d.rule == "alice-qwen-to-gemma"
        assert d.model == "google/gemma-4-12b-it"
        t = d.trace()
        assert t.model.requested == model and t.model.canonical == "qwen-2.5"
    d = decide(s, req("qwen-2.5", tenant="bob"))
    assert d.backend == "Local/qwen-2-5-32b" and d.model == "Qwen/Qwen2.5-32B-Instruct" and d.rule == "unmatched"


def test_policy_3_considers_both_models_and_drops_overloaded() -> None:
    p = compiled(ALICE)[("default", "inference-3")]
    s = snap(p, [ep("qwen-2-5-32b", "qwen-0", queued=1), ep("gemma-4-12b", "gemma-0", queued=3)])
    d = decide(s, req("qwen-2.5", tenant="alice"))
    assert d.backend == "Local/qwen-2-5-32b"  # lower PredictedTTFT
    s2 = snap(p, [ep("qwen-2-5-32b", "qwen-0", queued=5), ep("gemma-4-12b", "gemma-0", queued=3)])
    d2 = decide(s2, req("qwen-2.5", tenant="alice"))
    assert d2.backend == "Local/gemma-4-12b" and d2.model == "google/gemma-4-12b-it"
    assert d2.trace().rules[0].excluded[0].dropped == ["Local/qwen-2-5-32b/qwen-0"]
