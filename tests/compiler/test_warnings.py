"""Every warning code of POLICY.md section 7 (and the ones added), each with
the manifest that causes it, its term, and its effect on the compiled form."""

from __future__ import annotations

from kinference_common.compiled import CompiledPolicy

from .conftest import FLEET, POOL_ALL, compile_text, policy_yaml


def compile_policy(spec: str, with_pool: bool = True):  # type: ignore[no-untyped-def]
    texts = [FLEET, policy_yaml("p", spec)]
    if with_pool:
        texts.append(POOL_ALL.replace("POLICY", "p"))
    res = compile_text(*texts)
    assert not res.errors, res.errors
    status = res.policy_status[("default", "p")]
    compiled: CompiledPolicy | None = res.pools[("default", "inference-all")].policy if with_pool else None
    return status, compiled


def rule(body: str, name: str = "r") -> str:
    return f"  - name: {name}\n" + "\n".join("    " + l for l in body.strip("\n").splitlines()) + "\n"


LOCAL = "route: {select: [{type: Local}]}"


def test_duplicate_rule_name_dropped_and_not_counted() -> None:
    st, pol = compile_policy("rules:\n" + rule("matches: [{tenant: a}]\n" + LOCAL) + rule(LOCAL))
    [w] = st.warnings
    assert (w.code, w.rule, w.term) == ("DuplicateRuleName", "r", "rules[1]")
    assert st.rule_count == 1 and [r.name for r in st.rules] == ["r"]
    assert len(pol.rules) == 1 and pol.rules[0].matches is not None


def test_shadowed_rule_kept_and_flagged_but_not_after_fall_through() -> None:
    st, pol = compile_policy("rules:\n" + rule(LOCAL, "all") + rule("matches: [{tenant: a}]\n" + LOCAL, "a"))
    assert [w.code for w in st.warnings] == ["ShadowedRule"]
    assert [r.shadowed for r in pol.rules] == [False, True]
    ft = "route: {onEmpty: FallThrough, select: [{type: Local}]}"
    st, pol = compile_policy("rules:\n" + rule(ft, "all") + rule("matches: [{tenant: a}]\n" + LOCAL, "a"))
    assert st.warnings == [] and not pol.rules[1].shadowed


def test_unknown_tag_removed_and_an_emptied_list_never_holds() -> None:
    st, pol = compile_policy("rules:\n" + rule("matches: [{tag: [pii-confirmed, pii-maybe]}]\n" + LOCAL)
                             + rule("matches: [{tag: toxic}]\n" + LOCAL, "t"))
    assert [(w.code, w.rule) for w in st.warnings] == [("UnknownTag", "r"), ("UnknownTag", "t")]
    assert "pii-maybe" in st.warnings[0].message and "toxic" in st.warnings[1].message
    assert pol.rules[0].matches[0].tags == ["pii-confirmed"]
    assert pol.rules[1].matches[0].tags == []  # never holds, not "no constraint"
    assert pol.rules[1].matches is not None  # and the rule is not a catch-all


def test_uncovered_failure_tag_in_matches_when_a_later_rule_bursts() -> None:
    spec = ("rules:\n" + rule("matches: [{tag: pii-confirmed}]\n" + LOCAL, "pii-local")
            + rule("route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
                   "  select: [{type: Local}, {type: Provider}]", "burst"))
    st, _ = compile_policy(spec)
    [w] = st.warnings
    assert (w.code, w.rule, w.term) == ("UncoveredFailureTag", "pii-local", "rules[0].matches[0].tag")
    assert "burst" in w.message and "pii-unknown" in w.message
    # listing the clean tag only is safe: a failed classifier is not clean
    safe = spec.replace("pii-local", "x").replace("tag: pii-confirmed", "tag: pii-none")
    st, _ = compile_policy(safe)
    assert st.warnings == []


BURST = ("route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
         "  select: [{type: Local}, {type: Provider}]")


def test_tagged_requests_kept_local_that_fall_through_to_a_provider_rule() -> None:
    """The trial: a rule keeping PII local with onEmpty: FallThrough before a
    rule that bursts linted clean, and a PII request then went to the provider."""
    keep = "matches: [{tag: [pii-confirmed, pii-unknown]}]\nroute: {select: [{type: Local}], onEmpty: FallThrough}"
    st, _ = compile_policy("rules:\n" + rule(keep, "pii") + rule(BURST, "rest"))
    [w] = st.warnings
    assert (w.code, w.rule, w.term) == ("TaggedFallThrough", "pii", "rules[0].route.onEmpty")
    assert "'rest'" in w.message and "onEmpty: Reject" in w.message
    assert "TaggedFallThrough in pii" in st.conditions[0].message
    # no warning when it rejects, or when the later rule cannot admit those tags
    st, _ = compile_policy("rules:\n" + rule(keep.replace("FallThrough", "Reject"), "pii") + rule(BURST, "rest"))
    assert st.warnings == []
    st, _ = compile_policy("rules:\n" + rule(keep, "pii") + rule("matches: [{tag: [pii-none]}]\n" + BURST, "rest"))
    assert st.warnings == []


PII_STAYS = ("  - name: pii-stays\n    if: {tag: [pii-confirmed, pii-unknown]}\n"
             "    drop: {backend: {type: Provider}}\n")


def codes(spec: str) -> list[tuple[str, str]]:
    st, _ = compile_policy(spec)
    return [(w.code, w.rule) for w in st.warnings]


def test_tagged_fall_through_follows_the_rules_as_the_decision_does() -> None:
    """The review's cases: where a tagged request can really reach a Provider
    after a FallThrough, and where it cannot."""
    keep = "matches: [{tag: [pii-confirmed, pii-unknown]}]\nroute: {select: [{type: Local}], onEmpty: FallThrough}"
    # the example's own rule (Provider barred for PII by an exclusion) falling through to an overflow rule
    example = ("route:\n  exclude:\n    - {name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}\n"
               + "\n".join("  " + line for line in ("exclude:\n" + PII_STAYS).splitlines()[1:]) + "\n"
               "  select: [{type: Local}, {type: Provider}]\n  onEmpty: FallThrough")
    overflow = "route: {select: [{type: Provider}]}"
    assert ("TaggedFallThrough", "example") in codes("rules:\n" + rule(example, "example") + rule(overflow, "overflow"))
    # a later rule for clean injection scans still takes a PII request (it carries both tags)
    inj = "matches: [{tag: [injection-none]}]\n" + BURST
    assert ("TaggedFallThrough", "pii") in codes("rules:\n" + rule(keep, "pii") + rule(inj, "inj"))
    # safe: the later rule bars PII from its Provider tier
    barred = ("route:\n  exclude:\n" + "".join("    " + line + "\n" for line in PII_STAYS.strip("\n").splitlines())
              + "  select: [{type: Local}, {type: Provider}]")
    assert "TaggedFallThrough" not in [c for c, _ in codes("rules:\n" + rule(keep, "pii") + rule(barred, "burst"))]
    # safe: a rule in between takes every such request and rejects
    catch = "matches: [{tag: [pii-confirmed, pii-unknown]}]\nroute: {select: [{type: Local}]}"
    assert "TaggedFallThrough" not in [c for c, _ in codes(
        "rules:\n" + rule(keep, "pii") + rule(catch, "pii-anywhere") + rule(BURST, "burst"))]
    # safe: the only rule after the catch-all that rejects never fires
    assert "TaggedFallThrough" not in [c for c, _ in codes(
        "rules:\n" + rule(keep, "pii") + rule(LOCAL, "all-local") + rule(BURST, "burst"))]


def test_provider_only_on_outage_not_when_consider_admits_only_providers() -> None:
    """The trial: consider [{backend: {type: Provider}}] then Local, Provider
    tiers was told its Provider tier is reached only on an outage; it is the
    only tier that can pick."""
    tiers = "  select: [{type: Local}, {type: Provider}]"
    st, _ = compile_policy("rules:\n" + rule("route:\n" + tiers))
    assert [w.code for w in st.warnings] == ["ProviderOnlyOnOutage"]
    st, _ = compile_policy("rules:\n" + rule("route:\n  consider: [{backend: {type: Provider}}]\n" + tiers))
    assert "ProviderOnlyOnOutage" not in [w.code for w in st.warnings], st.warnings
    # by name (the review): the pool says what kind each name is
    st, _ = compile_policy("rules:\n" + rule("route:\n  consider: [{backend: {names: [databricks]}}]\n" + tiers))
    assert "ProviderOnlyOnOutage" not in [w.code for w in st.warnings], st.warnings
    st, _ = compile_policy("rules:\n" + rule("route:\n  consider: [{backend: {names: [qwen-2-5-32b, databricks]}}]\n"
                                              + tiers))
    assert "ProviderOnlyOnOutage" in [w.code for w in st.warnings], st.warnings


def test_class_scoped_signal_in_exclusion_and_tier() -> None:
    spec = "rules:\n" + rule(
        "route:\n"
        "  exclude: [{name: slow, drop: {estimatedTTFT: {greaterThan: 2s}}}]\n"
        "  select:\n"
        "    - {type: Local, backends: {errorRate: {greaterThan: 0.1}, kvCacheUsage: {lessThan: 0.5}}}\n"
        "    - {type: Provider}\n")
    st, pol = compile_policy(spec)
    by_term = {w.term: w.code for w in st.warnings}
    assert by_term["rules[0].route.exclude[0].drop.estimatedTTFT"] == "ClassScopedSignal"
    assert by_term["rules[0].route.select[0].backends.errorRate"] == "ClassScopedSignal"
    assert pol.rules[0].exclude == []
    assert [s.signal for s in pol.rules[0].select[0].backends.signals] == ["kvCacheUsage"]


def test_in_flight_is_not_class_scoped() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route:\n  exclude: [{name: f, drop: {inFlight: {greaterThan: 10}}}]\n  select: [{type: Local}]"))
    assert st.warnings == [] and pol.rules[0].exclude[0].live


def test_signal_not_for_type_defaults_to_the_tiers_ttft() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
        "  select: [{type: Local, minimize: EstimatedTTFT}, {type: Provider, minimize: KVCacheUsage}]"))
    assert [(w.code, w.term) for w in st.warnings] == [
        ("SignalNotForType", "rules[0].route.select[0].minimize"),
        ("SignalNotForType", "rules[0].route.select[1].minimize"),
    ]
    assert [t.minimize for t in pol.rules[0].select] == ["PredictedTTFT", "EstimatedTTFT"]


def test_unknown_destination_removed_with_pool_named() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
        "  select: [{type: Local}, {type: Provider, order: [openai, databricks, gemma-4-12b]}]"))
    assert [w.code for w in st.warnings] == ["UnknownDestination", "UnknownDestination"]
    assert all("pool default/inference-all" in w.message for w in st.warnings)
    assert "Local destination but this term selects Provider" in st.warnings[1].message
    assert pol.rules[0].select[1].order == ["databricks"]


def test_pool_dependent_warnings_need_a_pool() -> None:
    spec = "rules:\n" + rule("route: {select: [{type: Provider, order: [nowhere]}]}")
    st, _ = compile_policy(spec, with_pool=False)
    assert st.warnings == []


def test_unreachable_tier() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route: {select: [{type: Local}, {type: Local, backends: {backend: {names: [gemma-4-12b]}}}]}"))
    [w] = st.warnings
    assert (w.code, w.term) == ("UnreachableTier", "rules[0].route.select[1]")
    assert [t.unreachable for t in pol.rules[0].select] == [False, True]
    # an earlier tier with a subset does not cover the type
    st, _ = compile_policy("rules:\n" + rule(
        "route: {select: [{type: Local, order: [gemma-4-12b]}, {type: Local}]}"))
    assert st.warnings == []


def test_no_tier_for_considered() -> None:
    st, _ = compile_policy("rules:\n" + rule(
        "route:\n  consider: [{models: {names: [qwen-2.5]}, backend: {type: Provider}}]\n  select: [{type: Local}]"))
    assert [w.code for w in st.warnings] == ["NoTierForConsidered"]
    # naming a provider destination is explicit about the kind (pool-dependent)
    st, _ = compile_policy("rules:\n" + rule(
        "route:\n  consider: [{backend: {names: [databricks]}}]\n  select: [{type: Local}]"))
    assert [w.code for w in st.warnings] == ["NoTierForConsidered"]
    assert "inference-all" in st.warnings[0].message
    # a consider that only names models (the guide's way) is not flagged,
    # even where a provider in the pool serves one of them
    st, _ = compile_policy("rules:\n" + rule(
        "route:\n  consider: [{models: {names: [qwen-2.5]}}]\n  select: [{type: Local}]"))
    assert st.warnings == []
    # the default consider never triggers it
    st, _ = compile_policy("rules:\n" + rule(LOCAL))
    assert st.warnings == []


def test_out_of_range_drops_the_term_or_the_whole_exclusion() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route:\n"
        "  exclude:\n"
        "    - {name: kv, drop: {backend: {type: Local}, kvCacheUsage: {greaterThan: 90}}}\n"
        "    - {name: both, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}, gpuUtilization: {greaterThan: 95}}}\n"
        "  select: [{type: Local}, {type: Provider}]"))
    codes = [(w.code, w.term) for w in st.warnings]
    assert ("OutOfRange", "rules[0].route.exclude[0].drop.kvCacheUsage") in codes
    assert ("OutOfRange", "rules[0].route.exclude[1].drop.gpuUtilization") in codes
    # "kv" would otherwise drop every Local candidate: it is dropped whole
    assert [e.name for e in pol.rules[0].exclude] == ["both"]
    assert [s.signal for s in pol.rules[0].exclude[0].drop.signals] == ["queuedPrompts"]


def test_an_unknown_field_of_a_policy_is_an_error_not_a_warning() -> None:
    # (tests/compiler/test_manifest_strictness.py has the cases and the messages)
    res = compile_text(FLEET, policy_yaml("p", "rules:\n" + rule("route: {select: [{type: Local}], retries: 3}")),
                       POOL_ALL.replace("POLICY", "p"))
    assert [e.path for e in res.errors] == ["spec.rules[0].route.retries"]


def test_unknown_model_with_pool_named() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "matches: [{model: Qwen/Qwen2.5-32B-Instruct}, {model: llama}]\n" + LOCAL))
    [w] = st.warnings
    assert w.code == "UnknownModel" and "'llama'" in w.message and "inference-all" in w.message
    # aliases are canonicalised with the pool's aliases
    assert pol.rules[0].matches[0].models == ["qwen-2.5"]


def test_unmatched_never_applies_and_empty_range() -> None:
    st, _ = compile_policy("unmatched: Reject\nrules:\n" + rule(
        "matches: [{promptTokens: {greaterThan: 1000, lessThan: 10}}]\n" + LOCAL, "a") + rule(LOCAL, "all"))
    assert sorted(w.code for w in st.warnings) == ["EmptyRange", "UnmatchedNeverApplies"]


def test_seed_burst_policy_compiles_to_the_executable_form() -> None:
    from pathlib import Path

    spec_text = (Path(__file__).parent / "seed_manifests" / "000-burst-policy.yaml").read_text()
    res = compile_text(FLEET, spec_text, POOL_ALL.replace("POLICY", "my-policy"))
    pol = res.pools[("default", "inference-all")].policy
    [r] = pol.rules
    assert r.matches is None and r.consider is None
    assert [(e.name, e.live, e.drop.backend_type) for e in r.exclude] == [
        ("drop-local-endpoints-with-big-queues", True, "Local"),
        ("drop-local-endpoints-with-no-kv-headroom", True, "Local"),
        ("ensure-pii-never-leaves-cluster", False, "Provider"),
    ]
    assert r.exclude[2].when.tags == ["pii-confirmed", "pii-unknown"]
    assert r.exclude[1].drop.signals[0].range.greater_than == 0.9
    assert [(t.type, t.minimize, t.order) for t in r.select] == [
        ("Local", "PredictedTTFT", None), ("Provider", None, ["databricks"])]
    assert r.requires_classifiers == ["pii"]
    st = res.policy_status[("default", "my-policy")]
    assert st.rules[0].worst_case_classifier_latency == "20ms"
    assert st.rules[0].emittable_tags == ["pii-confirmed", "pii-none", "pii-unknown"]
    assert st.rules[0].classifier_failure_mode["pii"].startswith("FailClosed: emits pii-unknown")


def test_durations_compile_to_seconds() -> None:
    st, pol = compile_policy("rules:\n" + rule(
        "route:\n  exclude: [{name: slow, drop: {backend: {type: Local}, predictedTTFT: {greaterThan: 800ms}}}]\n"
        "  select: [{type: Local}, {type: Provider}]"))
    assert pol.rules[0].exclude[0].drop.signals[0].range.greater_than == 0.8


def test_unmatched_serve_local_is_not_reported_as_it_is_the_crd_default() -> None:
    # On a cluster the API server fills in `unmatched: ServeLocal` (the CRD's
    # default) in every policy: a file that writes it must lint as the cluster
    # compiles it, with no warning the operator could not act on.
    st, _ = compile_policy("unmatched: ServeLocal\nrules:\n" + rule(LOCAL, "all"))
    assert [w.code for w in st.warnings] == []


def test_a_pii_leak_warning_shows_in_the_wide_columns() -> None:
    """``kubectl get infpol -o wide``: WARNINGS counts them, MESSAGE (the
    Accepted condition's) names a warning that lets PII reach a provider."""
    spec = ("rules:\n" + rule("matches: [{tag: pii-confirmed}]\n" + LOCAL, "pii-local")
            + rule("route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
                   "  select: [{type: Local}, {type: Provider}]", "burst"))
    st, _ = compile_policy(spec)
    assert st.warning_count == 1
    assert "UncoveredFailureTag in pii-local" in st.conditions[0].message
    st, _ = compile_policy("rules:\n" + rule(LOCAL))
    assert st.warning_count == 0 and "WARNING" not in st.conditions[0].message


def test_drops_everything_when_an_exclusion_names_nothing_and_has_no_if() -> None:
    """`drop: {}` holds for every candidate ("every field must hold": there
    is none), so a rule with it and no `if` rejected every request it
    matched, and lint said nothing (user trial)."""
    empty = "route:\n  exclude: [{name: e, drop: {}}]\n  select: [{type: Local}]"
    st, pol = compile_policy("rules:\n" + rule(empty, "r"))
    [w] = st.warnings
    assert (w.code, w.rule, w.term) == ("DropsEverything", "r", "rules[0].route.exclude[0].drop")
    assert "never picks" in w.message
    # the compiled exclusion still drops every candidate (the warning says what it does, it changes nothing)
    [ex] = pol.rules[0].exclude
    assert ex.drop.backend_type is None and ex.drop.backend_names is None and not ex.drop.signals
    # an empty backend filter is the same as none
    st, _ = compile_policy("rules:\n" + rule(empty.replace("drop: {}", "drop: {backend: {}}"), "r"))
    assert [w.code for w in st.warnings] == ["DropsEverything"]
    # with an `if` it is a way to refuse (or pass on) the requests it names: no warning
    gated = empty.replace("{name: e, drop: {}}", "{name: e, if: {tenant: [batch]}, drop: {}}")
    assert compile_policy("rules:\n" + rule(gated, "r"))[0].warnings == []
    # naming something to drop: no warning
    typed = empty.replace("drop: {}", "drop: {backend: {type: Provider}}")
    assert compile_policy("rules:\n" + rule(typed, "r"))[0].warnings == []


def test_a_rule_with_no_tier_is_a_manifest_error() -> None:
    res = compile_text(FLEET, policy_yaml("p", "rules:\n" + rule("route: {select: []}", "r")))
    assert [(e.path, e.message) for e in res.errors] == [
        ("spec.rules[0].route.select", "must hold at least 1 item")]
    assert ("default", "p") not in res.policy_status


def test_an_empty_consider_is_a_manifest_error_and_drop_everything_is_not_called_an_outage() -> None:
    """`consider: []` admitted no candidate (every request rejected, lint
    clean); `drop: {}` before a Local and a Provider tier also drew
    ProviderOnlyOnOutage, which says the Provider tier is reached when no
    local pod is ready (it is never reached)."""
    res = compile_text(FLEET, policy_yaml("p", "rules:\n" + rule(
        "route: {consider: [], select: [{type: Local}]}", "r")))
    assert [(e.path, e.message) for e in res.errors] == [
        ("spec.rules[0].route.consider", "must hold at least 1 item")]
    both = "route:\n  exclude: [{name: e, drop: {}}]\n  select: [{type: Local, minimize: PredictedTTFT}, {type: Provider}]"
    st, _ = compile_policy("rules:\n" + rule(both, "r"))
    assert [w.code for w in st.warnings] == ["DropsEverything"]


def test_a_misspelt_pii_tag_says_what_it_was_meant_to_be_and_what_it_switches_off() -> None:
    """User trial: `if: {tag: [pii-confirmd, pii-unknwn]}` in the PII guard
    removed both tags, so the guard never applied and a PII request went to
    the provider; lint said only that the tags 'can never be present'. Now
    each warning offers the tag meant, the emptied condition says the
    exclusion drops nothing, and the policy's Accepted message carries a
    WARNING, as for the other ways PII can leave."""
    guard = PII_STAYS.replace("pii-confirmed, pii-unknown", "pii-confirmd, pii-unknwn")
    assert guard != PII_STAYS
    body = ("route:\n  exclude:\n" + "".join("    " + line + "\n" for line in guard.strip("\n").splitlines())
            + "  select: [{type: Local}, {type: Provider}]")
    res = compile_text(FLEET, policy_yaml("p", "rules:\n" + rule(body, "r")), POOL_ALL.replace("POLICY", "p"))
    st = res.policy_status[("default", "p")]
    msgs = [w.message for w in st.warnings if w.code == "UnknownTag"]
    assert any("did you mean 'pii-confirmed'?" in m for m in msgs)
    assert any("did you mean 'pii-unknown'?" in m for m in msgs)
    assert any("this exclusion never applies" in m for m in msgs)
    assert "WARNING: a misspelt pii tag" in st.conditions[0].message
    # a tag meant for a matches list says only that the list never holds
    st, _ = compile_policy("rules:\n" + rule("matches: [{tag: [pii-confirmd]}]\n" + LOCAL, "m") + rule(LOCAL, "all"))
    [w] = [w for w in st.warnings if w.code == "UnknownTag"]
    assert "never applies" not in w.message and "did you mean 'pii-confirmed'?" in w.message


def test_a_misspelt_destination_in_a_guard_says_the_name_meant_and_that_the_guard_drops_nothing() -> None:
    guard = PII_STAYS.replace("drop: {backend: {type: Provider}}", "drop: {backend: {type: Provider, names: [databrick]}}")
    assert guard != PII_STAYS
    body = ("route:\n  exclude:\n" + "".join("    " + line + "\n" for line in guard.strip("\n").splitlines())
            + "  select: [{type: Local}, {type: Provider}]")
    st, pol = compile_policy("rules:\n" + rule(body, "r"))
    msgs = [w.message for w in st.warnings if w.code == "UnknownDestination"]
    assert any("'databrick' names no destination (did you mean 'databricks'?)" in m for m in msgs), msgs
    assert any("this exclusion now drops nothing" in m for m in msgs), msgs
