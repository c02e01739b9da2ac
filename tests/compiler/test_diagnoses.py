"""Every row of the seeds' "Diagnoses" tables that a compiler can observe:
the manifest that causes the symptom, and the status or warning an operator
reads. (Seed 000's "A provider is picked on its first request" is a runtime
behaviour of the decision engine and is tested there.)"""

from __future__ import annotations

from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text

from .conftest import FLEET, POOL_ALL, compile_text, policy_yaml

BURST = """
rules:
  - name: burst
    route:
      exclude:
        - name: busy
          drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}
        - name: pii
          if: {tag: [pii-confirmed, pii-unknown]}
          drop: {backend: {type: Provider}}
      select:
        - {type: Local, minimize: PredictedTTFT}
        - {type: Provider, order: [databricks]}
"""


def codes(res, policy="p"):  # type: ignore[no-untyped-def]
    return [w.code for w in res.policy_status[("default", policy)].warnings]


# ------------------------------------------------------------------- seed 000


def test_rules_blank_when_the_namespace_is_not_watched() -> None:
    res = compile_text(policy_yaml("p", BURST, namespace="team-a"), watched_namespaces={"default"})
    assert ("team-a", "p") not in res.policy_status  # no status written: RULES blank


def test_state_not_referenced_until_a_pool_names_it() -> None:
    res = compile_text(FLEET, policy_yaml("p", BURST))
    st = res.policy_status[("default", "p")]
    assert st.state == "NotReferenced" and st.referenced_by == []
    [cond] = st.conditions
    assert (cond.type, cond.status, cond.reason) == ("Accepted", "False", "NotReferenced")
    res = compile_text(FLEET, policy_yaml("p", BURST), POOL_ALL.replace("POLICY", "p"))
    st = res.policy_status[("default", "p")]
    assert st.state == "Accepted" and st.referenced_by == ["default/inference-all"]
    assert st.conditions[0].status == "True"


def test_rules_column_is_compiled_not_live() -> None:
    spec = BURST + "  - name: second\n    route: {select: [{type: Local}]}\n" \
                   "  - name: burst\n    route: {select: [{type: Local}]}\n"
    a = compile_text(FLEET, policy_yaml("p", spec))
    b = compile_text(FLEET, policy_yaml("p", spec), POOL_ALL.replace("POLICY", "p"))
    # the duplicate is not counted, with or without a pool
    assert a.policy_status[("default", "p")].rule_count == 2
    assert b.policy_status[("default", "p")].rule_count == 2


def test_rule_after_a_catch_all_never_fires() -> None:
    spec = """
rules:
  - name: everything
    route: {select: [{type: Local}]}
  - name: alice
    matches: [{tenant: alice}]
    route: {select: [{type: Local}]}
"""
    res = compile_text(policy_yaml("p", spec))
    [w] = res.policy_status[("default", "p")].warnings
    assert (w.code, w.rule, w.term) == ("ShadowedRule", "alice", "rules[1]")
    assert "everything" in w.message and "FallThrough" in w.message


def test_rule_matching_a_tag_no_classifier_emits_never_fires() -> None:
    spec = """
rules:
  - name: secret
    matches: [{tag: pii-detected}]
    route: {select: [{type: Local}]}
"""
    res = compile_text(policy_yaml("p", spec))
    [w] = res.policy_status[("default", "p")].warnings
    assert (w.code, w.term) == ("UnknownTag", "rules[0].matches[0].tag")
    assert "pii-confirmed" in w.message  # says what the classifier does emit
    [rule] = res.objects and compile_text(policy_yaml("p", spec)).policy_status[("default", "p")].rules
    assert rule.requires_classifiers == []  # the removed tag asks no classifier


def test_providers_never_picked_when_the_local_tier_keeps_everything() -> None:
    spec = """
rules:
  - name: r
    route:
      select:
        - {type: Local, minimize: PredictedTTFT}
        - {type: Provider, order: [databricks]}
"""
    res = compile_text(FLEET, policy_yaml("p", spec), POOL_ALL.replace("POLICY", "p"))
    assert codes(res) == ["ProviderOnlyOnOutage"]
    w = res.policy_status[("default", "p")].warnings[0]
    assert w.term == "rules[0].route.select[1]" and "queuedPrompts" in w.message
    # the seed's burst policy drops busy Local endpoints, so it is fine
    ok = compile_text(FLEET, policy_yaml("p", BURST), POOL_ALL.replace("POLICY", "p"))
    assert codes(ok) == []


def test_pii_reached_a_provider_because_the_if_missed_pii_unknown() -> None:
    spec = BURST.replace("[pii-confirmed, pii-unknown]", "[pii-confirmed]")
    res = compile_text(FLEET, policy_yaml("p", spec), POOL_ALL.replace("POLICY", "p"))
    [w] = res.policy_status[("default", "p")].warnings
    assert (w.code, w.term) == ("UncoveredFailureTag", "rules[0].route.exclude[1].if.tag")
    assert "pii-unknown" in w.message


def test_exclusion_did_nothing_class_scoped_signal_without_backend_type() -> None:
    spec = BURST.replace("drop: {backend: {type: Local}, queuedPrompts", "drop: {queuedPrompts")
    res = compile_text(policy_yaml("p", spec))
    assert "ClassScopedSignal" in codes(res)
    w = next(w for w in res.policy_status[("default", "p")].warnings if w.code == "ClassScopedSignal")
    assert w.term == "rules[0].route.exclude[0].drop.queuedPrompts"
    assert "backend: {type: Local}" in w.message
    compiled = compile_text(FLEET, policy_yaml("p", spec), POOL_ALL.replace("POLICY", "p")).pools[
        ("default", "inference-all")]
    assert [e.name for e in compiled.policy.rules[0].exclude] == ["pii"]  # "busy" is gone


def test_refused_with_no_obvious_cause_shows_in_unmatched_and_on_empty() -> None:
    res = compile_text(FLEET, policy_yaml("p", "unmatched: Reject\n" + BURST), POOL_ALL.replace("POLICY", "p"))
    policy = res.pools[("default", "inference-all")].policy
    assert policy.unmatched == "Reject"
    assert policy.rules[0].on_empty == "Reject"  # the default, made explicit in the compiled form


# ------------------------------------------------------------------- seed 002


def pool(destinations: str, policy: str = "", ns: str = "default", name: str = "pool") -> str:
    ref = f"\n  policyRef: {{name: {policy}}}" if policy else ""
    return (f"apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\n"
            f"metadata: {{name: {name}, namespace: {ns}}}\nspec:\n  destinations:\n{destinations}{ref}\n")


def test_destination_count_lower_than_the_list_names_the_reason() -> None:
    res = compile_text(FLEET, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"
                                   "    - {kind: InferenceWorkerSet, name: llama}\n"))
    st = res.pool_status[("default", "pool")]
    assert st.destination_count == 1
    [u] = st.unresolved_destinations
    assert (u.kind, u.name, u.reason) == ("InferenceWorkerSet", "llama", "NotFound")
    assert st.state == "Accepted,UnresolvedDestinations"


def test_ambiguous_name_across_kinds() -> None:
    twin = FLEET + """
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: gemma-4-12b}
spec:
  url: https://x
  auth: {secretRef: {name: s, key: k}}
  models: [{name: gemma-4}]
"""
    res = compile_text(twin, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"
                                  "    - {kind: InferenceProvider, name: gemma-4-12b}\n"
                                  "    - {kind: InferenceWorkerSet, name: qwen-2-5-32b}\n"))
    st = res.pool_status[("default", "pool")]
    assert sorted((u.kind, u.reason) for u in st.unresolved_destinations) == [
        ("InferenceProvider", "AmbiguousName"), ("InferenceWorkerSet", "AmbiguousName")]
    assert st.destination_count == 1


def test_cross_namespace_needs_a_reference_grant() -> None:
    other = FLEET.replace("namespace: default", "namespace: gpu")
    entry = "    - {kind: InferenceWorkerSet, name: gemma-4-12b, namespace: gpu}\n"
    res = compile_text(other, pool(entry))
    [u] = res.pool_status[("default", "pool")].unresolved_destinations
    assert u.reason == "CrossNamespaceNotGranted" and "ReferenceGrant" in u.message
    grant = """
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: pools-may-use-workers, namespace: gpu}
spec:
  from: [{group: kinference.buoyant.io, kind: InferencePool, namespace: default}]
  to: [{group: kinference.buoyant.io, kind: InferenceWorkerSet}]
"""
    res = compile_text(other, grant, pool(entry))
    st = res.pool_status[("default", "pool")]
    assert st.destination_count == 1 and not st.unresolved_destinations
    # ... unless the router is scoped to its own namespace and cannot see it
    res = compile_text(other, grant, pool(entry), watched_namespaces={"default"})
    [u] = res.pool_status[("default", "pool")].unresolved_destinations
    assert u.reason == "CrossNamespaceNotGranted" and "watches" in u.message


def test_grant_for_another_namespace_or_kind_does_not_count() -> None:
    other = FLEET.replace("namespace: default", "namespace: gpu")
    grant = """
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: g, namespace: gpu}
spec:
  from: [{group: kinference.buoyant.io, kind: InferencePool, namespace: elsewhere}]
  to: [{group: kinference.buoyant.io, kind: InferenceWorkerSet}]
"""
    res = compile_text(other, grant, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b, namespace: gpu}\n"))
    assert res.pool_status[("default", "pool")].unresolved_destinations[0].reason == "CrossNamespaceNotGranted"


def test_incomplete_missing_kind_or_provider_field() -> None:
    broken_provider = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: openai}
spec:
  url: https://api.openai.com/v1
  models: [{name: gpt}]
"""
    res = compile_text(FLEET, broken_provider, pool("    - {name: gemma-4-12b}\n"
                                                    "    - {kind: InferenceProvider, name: openai}\n"))
    st = res.pool_status[("default", "pool")]
    reasons = {(u.kind, u.name): (u.reason, u.message) for u in st.unresolved_destinations}
    assert reasons[("", "gemma-4-12b")][0] == "Incomplete"
    assert reasons[("InferenceProvider", "openai")] == (
        "Incomplete", "InferenceProvider default/openai is missing spec.auth.secretRef")
    assert st.state == "NoDestinations,UnresolvedDestinations"
    ready = res.provider_status[("default", "openai")].conditions[0]
    assert (ready.status, ready.reason) == ("False", "Incomplete")


def test_a_destination_that_exists_but_is_invalid_says_so_not_that_it_is_missing() -> None:
    """An operator's typo in a provider (a bad duration) or a worker set (a
    port as a string) made the pool say "no InferenceProvider default/openai",
    and the policy "'openai' names no destination": both pointed away from
    the object to fix. Each names it, why it is invalid, and that it resolves
    once fixed; an object that is really missing is still NotFound."""
    bad_provider = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: openai}
spec:
  url: https://api.openai.com/v1
  auth: {secretRef: {name: k, key: token}}
  models: [{name: gemma-4}]
  timeouts: {connect: 2x}
"""
    bad_worker_set = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: broken, namespace: default}
spec:
  model: {name: gemma-4}
  selector: {matchLabels: {app: broken}}
  port: "eighty"
"""
    rule = policy_yaml("p", BURST.replace("order: [databricks]", "order: [openai]"))
    res = compile_text(FLEET, bad_provider, bad_worker_set, rule,
                       pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"
                            "    - {kind: InferenceWorkerSet, name: broken}\n"
                            "    - {kind: InferenceProvider, name: openai}\n"
                            "    - {kind: InferenceProvider, name: ghost}\n", policy="p"))
    st = res.pool_status[("default", "pool")]
    got = {u.name: (u.reason, u.message) for u in st.unresolved_destinations}
    assert got["openai"][0] == "Incomplete"
    assert got["openai"][1].startswith("InferenceProvider default/openai is invalid (spec.timeouts.connect: '2x' "
                                       "is not a duration")
    assert got["broken"] == ("Incomplete", "InferenceWorkerSet default/broken is invalid (spec.port: expected an "
                                           "integer, got a string); it resolves once fixed")
    assert got["ghost"] == ("NotFound", "no InferenceProvider default/ghost")
    [w] = [w for w in res.policy_status[("default", "p")].warnings if w.code == "UnknownDestination"]
    assert "'openai' is a destination the pool could not resolve (Incomplete" in w.message
    assert "names no destination" not in w.message
    # the errors themselves are still reported, once each
    assert sorted(e.document.name for e in res.errors) == ["broken", "openai"]


def test_a_policy_that_exists_but_is_invalid_is_not_called_missing() -> None:
    broken = policy_yaml("p", BURST.replace("greaterThan: 4", 'greaterThan: "four"'))
    res = compile_text(FLEET, broken, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n", policy="p"))
    cond = {c.type: c for c in res.pool_status[("default", "pool")].conditions}["ResolvedRefs"]
    assert cond.reason == "PolicyNotFound"
    assert "an InferencePolicy in default that is invalid (spec.rules[0].route.exclude[0].drop.queuedPrompts" \
           ".greaterThan: expected a number, got a string) and applies once fixed" in cond.message
    missing = compile_text(FLEET, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n", policy="p"))
    cond = {c.type: c for c in missing.pool_status[("default", "pool")].conditions}["ResolvedRefs"]
    assert "which is no InferencePolicy in default" in cond.message


def test_a_destination_selector_with_no_label_takes_nothing() -> None:
    """User trial: `selector: {matchLabel: {tier: cheap}}` (a typo) left an
    empty selector, which took every provider of the namespace, an expensive
    one included, with only an UnknownField warning. A selector naming no
    label resolves to nothing (Incomplete), as a worker set's pod selector
    does; the typo's warning names the file and the field meant."""
    typo = pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"
                "    - {kind: InferenceProvider, selector: {matchLabel: {tier: cheap}}}\n")
    res = compile_text(FLEET, typo)
    st = res.pool_status[("default", "pool")]
    assert [d for d in st.models for d in d.served_by] == ["gemma-4-12b"]
    [u] = st.unresolved_destinations
    assert (u.kind, u.reason, u.selector) == ("InferenceProvider", "Incomplete", {})
    assert "names no label" in u.message and "every InferenceProvider in default" in u.message
    [w] = [w for w in res.document_warnings if w.code == "UnknownField"]
    assert w.message == ("'matchLabel' is not a field of `spec.destinations[1].selector` of InferencePool; "
                         "the API server drops it; did you mean `matchLabels`?")
    empty = compile_text(FLEET, pool("    - {kind: InferenceWorkerSet, selector: {matchLabels: {}}}\n"))
    assert empty.pool_status[("default", "pool")].destination_count == 0


def test_resolved_refs_false_with_all_destinations_resolved_means_policy_missing() -> None:
    res = compile_text(FLEET, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n", policy="nope"))
    st = res.pool_status[("default", "pool")]
    assert not st.unresolved_destinations
    cond = {c.type: c for c in st.conditions}
    assert (cond["ResolvedRefs"].status, cond["ResolvedRefs"].reason) == ("False", "PolicyNotFound")
    assert cond["Accepted"].status == "True"
    assert st.state == "Accepted,PolicyNotFound"
    # ... and the pool routes with the default policy, which never reaches a Provider
    compiled = res.pools[("default", "pool")]
    assert compiled.policy.is_default and compiled.policy.rules == []


def test_policy_ref_of_the_wrong_kind() -> None:
    text = pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n").replace(
        "spec:\n", "spec:\n  policyRef: {group: example.com, kind: Policy, name: p}\n")
    res = compile_text(FLEET, text, policy_yaml("p", BURST))
    assert res.pool_status[("default", "pool")].state == "Accepted,PolicyRefWrongKind"
    assert res.policy_status[("default", "p")].state == "NotReferenced"


def test_one_served_by_entry_not_two_when_canonical_names_diverge() -> None:
    provider = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: openai}
spec:
  url: https://x
  auth: {secretRef: {name: s, key: k}}
  models: [{name: Qwen/Qwen2.5-32B-Instruct}]
"""
    res = compile_text(FLEET, provider, pool("    - {kind: InferenceWorkerSet, name: qwen-2-5-32b}\n"
                                             "    - {kind: InferenceProvider, name: openai}\n"))
    models = {m.name: m.served_by for m in res.pool_status[("default", "pool")].models}
    assert models == {"qwen-2.5": ["qwen-2-5-32b"], "Qwen/Qwen2.5-32B-Instruct": ["openai"]}
    [w] = [w for w in res.document_warnings if w.code == "DivergentModelName"]
    assert "qwen-2.5" in w.message and "upstreamName" in w.message


def test_providers_listed_but_never_picked() -> None:
    res = compile_text(FLEET, POOL_ALL.replace("POLICY", "local-only"),
                       policy_yaml("local-only", "rules:\n  - name: r\n    route: {select: [{type: Local}]}"))
    # a note, not a warning: nothing in the manifest is dropped or defaulted
    assert res.document_warnings == []
    [w] = [w for w in res.notes if w.code == "ProvidersNeverPicked"]
    assert "databricks" in w.message and w.name == "inference-all"
    # the default policy too
    res = compile_text(FLEET, POOL_ALL.replace("  policyRef: {name: POLICY}\n", ""))
    assert [w.code for w in res.notes] == ["ProvidersNeverPicked"]


def test_empty_destinations_means_every_worker_set_of_the_namespace() -> None:
    text = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\n"
            "metadata: {name: pool}\nspec: {}\n")
    res = compile_text(FLEET, text)
    compiled = res.pools[("default", "pool")]
    assert [d.name for d in compiled.destinations] == ["gemma-4-12b", "gemma-4-vllm", "qwen-2-5-32b", "qwen-2-5-vllm"]
    assert all(d.type == "Local" for d in compiled.destinations)  # never a provider
    models = {m.name: m for m in res.pool_status[("default", "pool")].models}
    assert models["gemma-4"].served_by == ["gemma-4-12b", "gemma-4-vllm"]
    assert models["gemma-4"].context_window == {"min": 8192, "max": 8192}
    assert models["qwen-2.5"].aliases == ["Qwen/Qwen2.5-32B-Instruct"]


def test_no_destinations_state() -> None:
    res = compile_text(pool("    - {kind: InferenceWorkerSet, name: ghost}\n"))
    st = res.pool_status[("default", "pool")]
    assert st.state == "NoDestinations,UnresolvedDestinations" and st.destination_count == 0


def test_selector_destinations() -> None:
    labelled = FLEET.replace("metadata: {name: gemma-4-12b, namespace: default}",
                             "metadata: {name: gemma-4-12b, namespace: default, labels: {tier: gold}}")
    res = compile_text(labelled, pool("    - {kind: InferenceWorkerSet, selector: {matchLabels: {tier: gold}}}\n"
                                      "    - {kind: InferenceWorkerSet, selector: {matchLabels: {tier: lead}}}\n"))
    st = res.pool_status[("default", "pool")]
    assert st.destination_count == 1
    [u] = st.unresolved_destinations
    assert (u.reason, u.selector) == ("NotFound", {"tier": "lead"})


def test_http_route_parents() -> None:
    route = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: llm}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{group: kinference.buoyant.io, kind: InferencePool, name: pool}]}]
"""
    # no Gateway gw: no parents[] entry (nothing accepted the pool there), and a warning says so
    res = compile_text(FLEET, route, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"))
    assert res.pool_status[("default", "pool")].parents == []
    [w] = [w for w in res.document_warnings if w.code == "ParentNotFound"]
    assert "Gateway default/gw, which does not exist" in w.message
    # a Gateway of a class the router implements: its entry, under the router's controllerName
    gateway = """
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: kinference}
spec: {controllerName: kinference.buoyant.io/router}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw}
spec: {gatewayClassName: kinference}
"""
    res = compile_text(FLEET, route, gateway, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"))
    [parent] = res.pool_status[("default", "pool")].parents
    assert parent.parent_ref.name == "gw" and parent.parent_ref.namespace == "default"
    assert parent.controller_name == "kinference.buoyant.io/router"
    assert {c.type for c in parent.conditions} == {"Accepted", "ResolvedRefs"}
    # a Gateway another implementation serves cannot reach a Kinference pool: no entry, a warning
    other = gateway.replace("kinference.buoyant.io/router", "gateway.envoyproxy.io/gatewayclass-controller")
    res = compile_text(FLEET, route, other, pool("    - {kind: InferenceWorkerSet, name: gemma-4-12b}\n"))
    assert res.pool_status[("default", "pool")].parents == []
    assert any(w.code == "ParentNotServed" and "gateway.envoyproxy.io" in w.message for w in res.document_warnings)


def test_compile_never_touches_input_order_dependence() -> None:
    docs = load_text(FLEET + "---\n" + POOL_ALL.replace("POLICY", "p") + "---\n" + policy_yaml("p", BURST), "a")
    forward = compile_documents(docs, now="t")
    backward = compile_documents(list(reversed(docs)), now="t")
    assert forward.pools == backward.pools
    assert forward.policy_status == backward.policy_status
