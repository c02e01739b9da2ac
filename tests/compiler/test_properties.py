"""Property-based: random and malformed manifests get errors or warnings from
the compiler, never an exception; and compiling is deterministic."""

from __future__ import annotations

from typing import Any

import msgspec
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kinference_common.compiler import compile_documents
from kinference_common.manifests import decode_document, DocumentRef, load_text

NAMES = st.sampled_from(["a", "b", "gemma-4-12b", "qwen-2-5-32b", "databricks", "pii-confirmed", "x"])
TAGS = st.sampled_from(["pii-confirmed", "pii-unknown", "pii-none", "injection-detected", "bogus", "pii-x"])
SIGNALS = st.sampled_from(["queuedPrompts", "runningPrompts", "kvCacheUsage", "gpuUtilization", "gpuMemoryUsage",
                           "predictedTTFT", "estimatedTTFT", "errorRate", "inFlight", "unknownSignal"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 200), st.floats(-2, 200, allow_nan=False),
                    st.sampled_from(["800ms", "2s", "fast", "", "Local", "Provider"]))
ANY_JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=10)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(None), strategy, ANY_JSON)


comparison = st.fixed_dictionaries({}, optional={"greaterThan": SCALARS, "lessThan": SCALARS})
backend = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["Local", "Provider", "GPU"]),
                                              "names": st.lists(NAMES, max_size=3)})
predicate = st.builds(lambda b, sigs: {**({"backend": b} if b else {}), **sigs},
                      st.one_of(st.none(), backend), st.dictionaries(SIGNALS, comparison, max_size=3))
match = st.fixed_dictionaries({}, optional={
    "model": st.one_of(NAMES, st.lists(NAMES, max_size=2)), "tenant": NAMES,
    "tag": st.one_of(TAGS, st.lists(TAGS, max_size=3)), "priority": comparison,
    "headers": st.lists(st.fixed_dictionaries({"name": NAMES, "value": NAMES}), max_size=2)})
tier = st.fixed_dictionaries({"type": st.sampled_from(["Local", "Provider", "Cloud"])}, optional={
    "minimize": st.sampled_from(["PredictedTTFT", "EstimatedTTFT", "QueuedPrompts", "KVCacheUsage", "InFlight", "X"]),
    "order": st.lists(NAMES, max_size=3), "backends": predicate})
route = st.fixed_dictionaries({"select": maybe(st.lists(tier, max_size=3))}, optional={
    "consider": st.lists(st.fixed_dictionaries({}, optional={"models": st.fixed_dictionaries({"names": st.lists(NAMES, max_size=2)}),
                                                             "backend": backend}), max_size=2),
    "exclude": st.lists(st.fixed_dictionaries({"name": NAMES, "drop": predicate}, optional={"if": match}), max_size=3),
    "tieBreak": st.lists(st.sampled_from(["LeastInFlight", "PrefixAffinity", "Random", "Nope"]), max_size=2),
    "onEmpty": st.sampled_from(["Reject", "FallThrough", "Maybe"])})
rule = st.fixed_dictionaries({"name": maybe(NAMES), "route": maybe(route)},
                             optional={"matches": maybe(st.lists(match, max_size=2))})
policy = st.builds(
    lambda name, spec: {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy",
                        "metadata": {"name": name}, "spec": spec},
    NAMES,
    st.fixed_dictionaries({}, optional={"rules": maybe(st.lists(rule, max_size=4)),
                                        "unmatched": st.sampled_from(["ServeLocal", "Reject", "Other"])}),
)
destination = st.fixed_dictionaries({}, optional={
    "kind": st.sampled_from(["InferenceWorkerSet", "InferenceProvider", "Service"]), "name": NAMES,
    "namespace": st.sampled_from(["default", "other"]), "selector": st.fixed_dictionaries({"matchLabels": st.dictionaries(NAMES, NAMES, max_size=2)})})
pool = st.builds(
    lambda name, dests, ref: {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePool",
                              "metadata": {"name": name}, "spec": {"destinations": dests, "policyRef": ref}},
    NAMES, maybe(st.lists(destination, max_size=4)),
    maybe(st.one_of(st.fixed_dictionaries({"name": NAMES}), st.lists(st.fixed_dictionaries({"name": NAMES}), max_size=2))),
)
worker_set = st.builds(
    lambda name, model: {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceWorkerSet",
                         "metadata": {"name": name}, "spec": {"model": {"name": model, "aliases": [model + "-x"]},
                                                              "selector": {"matchLabels": {"app": name}}}},
    NAMES, NAMES)
provider = st.builds(
    lambda name, spec: {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceProvider",
                        "metadata": {"name": name}, "spec": spec},
    NAMES, st.fixed_dictionaries({}, optional={"url": st.just("https://x"),
                                               "auth": st.just({"secretRef": {"name": "s", "key": "k"}}),
                                               "models": st.lists(st.fixed_dictionaries({"name": NAMES}), max_size=2)}))
documents = st.lists(st.one_of(policy, pool, worker_set, provider, ANY_JSON), max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_manifests_never_raise(docs: list[Any]) -> None:
    loaded = [decode_document(d, DocumentRef("gen.yaml", i + 1)) for i, d in enumerate(docs)]
    res = compile_documents(loaded, now="T")
    # everything is accounted for: an object, an error, or a skipped document
    assert len(res.errors) + len(res.skipped) + sum(len(t) for t in res.objects.values()) >= len(docs)
    for compiled in res.pools.values():
        encoded = msgspec.json.encode(compiled)  # publishable
        assert msgspec.json.decode(encoded, type=type(compiled)) == compiled
    for status in res.policy_status.values():
        assert status.rule_count == len({r.name for r in status.rules})
        for w in status.warnings:
            assert w.code and w.message and (w.term or w.code == "UnknownField")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    loaded = load_text(text, "fuzz.yaml")
    compile_documents(loaded, now="T")


@settings(max_examples=100, deadline=None)
@given(documents)
def test_yaml_round_trip_gives_the_same_result(docs: list[Any]) -> None:
    text = yaml.safe_dump_all(docs)
    a = compile_documents(load_text(text, "a.yaml"), now="T")
    b = compile_documents(load_text(text, "a.yaml"), now="T")
    assert a.pools == b.pools and a.policy_status == b.policy_status
