"""Manifest validation: errors name the document and the field path, with the
API server's strictness (required fields, enums, types); nothing raises."""

from __future__ import annotations

import pytest

from kinference_common import resources as r
from kinference_common.durations import DurationError, format_duration, parse_duration
from kinference_common.manifests import (
    LoadedObject,
    ManifestError,
    SkippedDocument,
    load_paths,
    load_text,
    unknown_fields,
)

from .conftest import compile_text, policy_yaml


def only_error(text: str) -> ManifestError:
    res = compile_text(text)
    assert len(res.errors) == 1, res.errors
    return res.errors[0]


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ("rules:\n  - route: {select: [{type: Local}]}", "spec.rules[0]", "`name`"),
        ("rules:\n  - name: a", "spec.rules[0]", "`route`"),
        ("rules:\n  - name: a\n    route: {}", "spec.rules[0].route", "`select`"),
        ("unmatched: Maybe", "spec.unmatched", "ServeLocal"),
        ("rules:\n  - name: a\n    route: {select: [{type: Cloud}]}", "spec.rules[0].route.select[0].type", "Local"),
        ("rules:\n  - name: a\n    route: {select: [{type: Local, minimize: Latency}]}",
         "spec.rules[0].route.select[0].minimize", "PredictedTTFT"),
        ("rules:\n  - name: a\n    route: {onEmpty: Drop, select: [{type: Local}]}",
         "spec.rules[0].route.onEmpty", "FallThrough"),
        ("rules:\n  - name: a\n    route: {tieBreak: [Fastest], select: [{type: Local}]}",
         "spec.rules[0].route.tieBreak[0]", "LeastInFlight"),
        ("rules: {name: a}", "spec.rules", "expected a list, got a mapping"),
        ("rules:\n  - name: a\n    route:\n      exclude: [{name: x, drop: {queuedPrompts: {greaterThan: four}}}]\n"
         "      select: [{type: Local}]", "spec.rules[0].route.exclude[0].drop.queuedPrompts.greaterThan", "number"),
        ("rules:\n  - name: a\n    route:\n      exclude: [{drop: {backend: {type: Local}}}]\n      select: [{type: Local}]",
         "spec.rules[0].route.exclude[0]", "`name`"),
        ("rules:\n  - name: a\n    matches: [{priority: {greaterThan: true}}]\n    route: {select: [{type: Local}]}",
         "spec.rules[0].matches[0].priority.greaterThan", "expected an integer, got true or false"),
    ],
)
def test_schema_errors_name_document_and_path(spec: str, path: str, words: str) -> None:
    err = only_error(policy_yaml("p", spec))
    assert err.path == path
    assert words in err.message
    assert err.document.kind == "InferencePolicy" and err.document.name == "p"
    assert "doc0.yaml#1 (InferencePolicy default/p)" in str(err)


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        ("rules:\n  - name: a\n    route:\n      exclude: [{name: x, drop: {backend: {type: Local}, predictedTTFT: {greaterThan: 800}}}]\n"
         "      select: [{type: Local}]", "spec.rules[0].route.exclude[0].drop.predictedTTFT", "expected a string"),
        ("rules:\n  - name: a\n    route:\n      exclude: [{name: x, drop: {backend: {type: Local}, predictedTTFT: {greaterThan: 800 ms}}}]\n"
         "      select: [{type: Local}]", "spec.rules[0].route.exclude[0].drop.predictedTTFT.greaterThan", "'800ms'"),
        ("rules:\n  - name: a\n    route:\n      exclude: [{name: x, drop: {backend: {type: Local}, queuedPrompts: {}}}]\n"
         "      select: [{type: Local}]", "spec.rules[0].route.exclude[0].drop.queuedPrompts", "greaterThan"),
        ("rules:\n  - name: a\n    route: {select: [{type: Provider, minimize: EstimatedTTFT, order: [x]}]}",
         "spec.rules[0].route.select[0]", "at most one"),
    ],
)
def test_cel_rules_are_errors(spec: str, path: str, words: str) -> None:
    err = only_error(policy_yaml("p", spec))
    assert err.path.startswith(path)
    assert words in err.message


def test_pool_schema_rules() -> None:
    pool = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: p}
spec:
  destinations:
    - {kind: InferenceWorkerSet, name: a, selector: {matchLabels: {x: y}}}
  policyRef: [{name: a}, {name: b}]
"""
    res = compile_text(pool)
    assert sorted(e.path for e in res.errors) == ["spec.destinations[0]", "spec.policyRef"]
    assert not res.pool_status  # the API server rejects it: no object, no status


def test_destination_kind_outside_the_enum_is_an_error() -> None:
    pool = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
            "spec: {destinations: [{kind: Service, name: a}]}\n")
    err = only_error(pool)
    assert err.path == "spec.destinations[0].kind"


def test_not_yaml_and_not_a_mapping() -> None:
    [err] = load_text("a: [unclosed", "bad.yaml")
    assert isinstance(err, ManifestError)
    assert "not valid YAML" in err.message and "line" in err.message
    [err2] = load_text("- just\n- a list\n", "list.yaml")
    assert isinstance(err2, ManifestError) and "mapping" in err2.message


def test_missing_kind_or_apiversion_and_wrong_group() -> None:
    [a] = load_text("apiVersion: v1\nmetadata: {name: x}\n", "a.yaml")
    assert isinstance(a, ManifestError) and a.path == "kind"
    [b] = load_text("kind: InferencePolicy\nmetadata: {name: x}\n", "b.yaml")
    assert isinstance(b, ManifestError) and b.path == "apiVersion"
    [c] = load_text("apiVersion: example.com/v1\nkind: InferencePolicy\nmetadata: {name: x}\n", "c.yaml")
    assert isinstance(c, ManifestError) and "kinference.buoyant.io" in c.message


def test_other_kinds_are_skipped_not_errors() -> None:
    [d] = load_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "cm.yaml")
    assert isinstance(d, SkippedDocument)
    res = compile_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert not res.errors and len(res.skipped) == 1


def test_kubectl_list_documents_are_flattened() -> None:
    text = ("apiVersion: v1\nkind: List\nitems:\n"
            "- {apiVersion: kinference.buoyant.io/v1alpha1, kind: InferencePolicy, metadata: {name: a}, spec: {}}\n"
            "- {apiVersion: kinference.buoyant.io/v1alpha1, kind: InferencePolicy, metadata: {name: b}, spec: {}}\n")
    loaded = load_text(text, "list.yaml")
    assert [x.obj.metadata.name for x in loaded if isinstance(x, LoadedObject)] == ["a", "b"]


def test_duplicate_objects_keep_the_first() -> None:
    a = policy_yaml("p", "unmatched: Reject")
    b = policy_yaml("p", "unmatched: ServeLocal")
    res = compile_text(a, b)
    assert len(res.errors) == 1 and "defined twice" in res.errors[0].message
    assert res.objects["InferencePolicy"][("default", "p")].obj.spec.unmatched == "Reject"


def test_missing_paths_and_empty_dirs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    errors = load_paths([tmp_path / "nope.yaml", tmp_path])
    assert [e.message for e in errors] == [  # type: ignore[union-attr]
        "no such file or directory",
        "directory holds no .yaml, .yml or .json file",
    ]


def test_json_manifests_load() -> None:
    text = '{"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy", "metadata": {"name": "j"}}'
    [x] = load_text(text, "p.json")
    assert isinstance(x, LoadedObject) and x.obj.metadata.name == "j"


def test_unknown_fields_are_found_with_paths() -> None:
    raw = {
        "apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferencePolicy",
        "metadata": {"name": "x", "whatever": 1},
        "spec": {"unmatchd": "Reject", "rules": [{"name": "a", "route": {"select": [{"type": "Local", "weight": 3}],
                                                                       "exclude": [{"name": "e", "drop": {"queuedPrompt": {"greaterThan": 1}}}]}}]},
        "status": {"anything": True},
    }
    assert sorted(unknown_fields(raw, r.InferencePolicy)) == [
        "spec.rules[0].route.exclude[0].drop.queuedPrompt",
        "spec.rules[0].route.select[0].weight",
        "spec.unmatchd",
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("800ms", 0.8), ("2s", 2.0), ("1m30s", 90.0), ("1.5s", 1.5), ("250us", 0.00025), ("0", 0.0), ("1h", 3600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["800", "fast", "", "1 s", "-2s", 0.8, None, True])
def test_bad_durations_say_what_to_write(bad: object) -> None:
    with pytest.raises(DurationError, match="800ms"):
        parse_duration(bad)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 0.02, 0.8, 2, 90)] == ["0s", "20ms", "800ms", "2s", "1m30s"]
