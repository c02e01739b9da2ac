"""What a cluster refuses, lint refuses too (user trial):

- an unknown field of a policy is an error, not a warning (inside a predicate it widens it):
  ignored, it widens the predicate (``queuedPrompt`` in a ``drop`` drops every
  Local pod, so all traffic bursts to a paid provider);
- a kind Kinference's group does not define, a known kind in the wrong case,
  a version the group does not serve;
- a key written twice in one YAML mapping."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kinference_common.manifests import (
    DocumentRef,
    LoadedObject,
    ManifestError,
    SkippedDocument,
    decode_document,
    load_text,
)

from .conftest import FLEET, POOL_ALL, compile_text, policy_yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"


def _rule(body: str) -> str:
    return "rules:\n  - name: r\n" + "\n".join("    " + line for line in body.strip("\n").splitlines())


# ------------------------------------------------------------ predicates

PREDICATE_TYPOS = [
    # (rule body, path, words the message must hold, suggestion)
    ("matches: [{tenantt: batch}]\nroute: {select: [{type: Local}]}",
     "spec.rules[0].matches[0].tenantt", "a rule's `matches` entry", "`tenant`"),
    ("route:\n  consider: [{models: {names: [qwen-2.5]}, backnd: {type: Local}}]\n  select: [{type: Local}]",
     "spec.rules[0].route.consider[0].backnd", "a `consider` entry", "`backend`"),
    ("route:\n  exclude: [{name: pii, if: {tags: [pii-confirmed, pii-unknown]}, drop: {backend: {type: Provider}}}]\n"
     "  select: [{type: Local}, {type: Provider}]",
     "spec.rules[0].route.exclude[0].if.tags", "an exclusion's `if`", "`tag`"),
    ("route:\n  exclude: [{name: busy, drop: {backend: {type: Local}, queuedPrompt: {greaterThan: 4}}}]\n"
     "  select: [{type: Local}, {type: Provider}]",
     "spec.rules[0].route.exclude[0].drop.queuedPrompt", "an exclusion's `drop`", "`queuedPrompts`"),
    ("route:\n  exclude: [{name: busy, drop: {backend: {typ: Local}, queuedPrompts: {greaterThan: 4}}}]\n"
     "  select: [{type: Local}, {type: Provider}]",
     "spec.rules[0].route.exclude[0].drop.backend.typ", "`backend` in an exclusion's `drop`", "`type`"),
    ("route:\n  select: [{type: Local, backends: {backend: {type: Local}, kvCacheUsge: {lessThan: 0.5}}}, "
     "{type: Provider}]",
     "spec.rules[0].route.select[0].backends.kvCacheUsge", "a tier's `backends`", "`kvCacheUsage`"),
    ("route:\n  select: [{type: Local, backends: {PredictedTtft: {lessThan: 800ms}}}]",
     "spec.rules[0].route.select[0].backends.PredictedTtft", "a tier's `backends`", "`predictedTTFT`"),
]


@pytest.mark.parametrize(("body", "path", "where", "guess"), PREDICATE_TYPOS)
def test_unknown_field_in_a_predicate_is_an_error(body: str, path: str, where: str, guess: str) -> None:
    res = compile_text(FLEET, POOL_ALL.replace("POLICY", "p"), policy_yaml("p", _rule(body)))
    [err] = res.errors
    assert err.path == path
    assert err.document.kind == "InferencePolicy" and err.document.name == "p"
    key = path.rsplit(".", 1)[1]
    assert f"`{key}` is not a field of {where}" in err.message
    assert "widen" in err.message
    assert f"did you mean {guess}?" in err.message
    # the policy is refused, as a wrong type is: not compiled, never in force
    assert ("default", "p") not in res.policy_status
    assert res.pool_status[("default", "inference-all")].state == "Accepted,PolicyNotFound"
    assert not any(w.code == "UnknownField" for st in res.policy_status.values() for w in st.warnings)


def test_no_suggestion_lists_the_fields() -> None:
    res = compile_text(policy_yaml("p", _rule(
        "route:\n  exclude: [{name: x, drop: {backend: {type: Local}, zzzz: 1}}]\n  select: [{type: Local}]")))
    [err] = res.errors
    assert "did you mean" not in err.message
    assert "its fields: backend, queuedPrompts" in err.message


def test_every_unknown_field_in_predicates_is_listed_by_lint_and_decode_gives_the_first() -> None:
    text = policy_yaml("p", _rule(
        "matches: [{tenantt: a}]\n"
        "route:\n  exclude: [{name: x, drop: {backend: {type: Local}, queuedPrompt: {greaterThan: 1}}}]\n"
        "  select: [{type: Local}]"))
    errors = load_text(text, "p.yaml")
    assert [e.path for e in errors if isinstance(e, ManifestError)] == [
        "spec.rules[0].matches[0].tenantt", "spec.rules[0].route.exclude[0].drop.queuedPrompt"]
    # the Kubernetes source decodes one object at a time: it is refused too
    one = decode_document(yaml.safe_load(text), DocumentRef("kinference.buoyant.io/v1alpha1", 1))
    assert isinstance(one, ManifestError) and one.path == "spec.rules[0].matches[0].tenantt"


def test_unknown_fields_outside_predicates_are_errors_too() -> None:
    # each would change the policy without a word: a rule's exclusions dropped, a catch-all, ...
    res = compile_text(policy_yaml("p", "unmached: Reject\n" + _rule(
        "nonsense: 1\n"
        "route:\n  retries: 3\n"
        "  exclude: [{name: x, iff: {tenant: a}, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 1}}}]\n"
        "  select: [{type: Local, weight: 2}]")))
    assert sorted(e.path for e in res.errors) == [
        "spec.rules[0].nonsense", "spec.rules[0].route.exclude[0].iff", "spec.rules[0].route.retries",
        "spec.rules[0].route.select[0].weight", "spec.unmached"]
    iff = next(e for e in res.errors if e.path.endswith(".iff"))
    assert "did you mean `if`?" in iff.message, iff.message
    assert ("default", "p") not in res.policy_status or not res.policy_status[("default", "p")].warnings


def test_the_trial_typo_in_the_burst_example() -> None:
    """deploy/examples/10-burst-policy.yaml with ``queuedPrompt``: the
    exclusion would have dropped every local pod."""
    texts = [p.read_text() for p in sorted(EXAMPLES.glob("*.yaml"))]
    assert compile_text(*texts).errors == []
    typo = [t.replace("queuedPrompts:", "queuedPrompt:") for t in texts]
    res = compile_text(*typo)
    [err] = res.errors
    assert err.path == "spec.rules[0].route.exclude[0].drop.queuedPrompt"
    assert "did you mean `queuedPrompts`?" in err.message
    # the default policy (never a provider) is what the pool gets, not a policy that bursts everything
    pool = res.pools[("default", "inference-all")]
    assert pool.policy.name == "" and pool.policy.unmatched == "ServeLocal"


# ------------------------------------------------------------ kinds and versions


def _doc(api_version: str, kind: str) -> str:
    return f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: x}}\nspec: {{}}\n"


@pytest.mark.parametrize(
    ("kind", "guess"),
    [("InferencePolicyy", "InferencePolicy"), ("inferencepolicy", "InferencePolicy"),
     ("INFERENCEPOOL", "InferencePool"), ("InferenceWorkerset", "InferenceWorkerSet"), ("Policy", None)],
)
def test_a_kind_our_group_does_not_define_is_an_error(kind: str, guess: str | None) -> None:
    [err] = load_text(_doc("kinference.buoyant.io/v1alpha1", kind), "k.yaml")
    assert isinstance(err, ManifestError) and err.path == "kind"
    assert f"kinference.buoyant.io defines no kind `{kind}`" in err.message
    assert "InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet" in err.message
    if guess:
        assert err.message.endswith(f"did you mean `{guess}`?")
    else:
        assert "did you mean" not in err.message
    res = compile_text(_doc("kinference.buoyant.io/v1alpha1", kind))
    assert len(res.errors) == 1 and not res.skipped


@pytest.mark.parametrize(
    ("api_version", "kind", "guess"),
    [("gateway.networking.k8s.io/v1", "httproute", "HTTPRoute"), ("v1", "service", "Service"),
     ("inference.networking.k8s.io/v1", "Inferencepool", "InferencePool")],
)
def test_a_known_kind_in_the_wrong_case_is_an_error(api_version: str, kind: str, guess: str) -> None:
    [err] = load_text(_doc(api_version, kind), "k.yaml")
    assert isinstance(err, ManifestError) and err.path == "kind"
    assert "case-sensitive" in err.message and f"did you mean `{guess}`?" in err.message


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("networking.istio.io/v1", "Gateway"), ("networking.istio.io/v1beta1", "VirtualService"),
     ("gateway.networking.k8s.io/v1", "GRPCRoute"), ("gateway.networking.k8s.io/v1alpha2", "TLSRoute"),
     ("v1", "ConfigMap"), ("apps/v1", "Deployment"), ("inference.networking.x-k8s.io/v1alpha2", "InferenceModel"),
     ("example.com/v1", "Anything")],
)
def test_other_kinds_stay_skipped(api_version: str, kind: str) -> None:
    [d] = load_text(_doc(api_version, kind), "k.yaml")
    assert isinstance(d, SkippedDocument)


@pytest.mark.parametrize(
    ("api_version", "kind", "served"),
    [("kinference.buoyant.io/v1", "InferencePolicy", "`kinference.buoyant.io/v1alpha1`"),
     ("kinference.buoyant.io/v1beta1", "InferencePool", "`kinference.buoyant.io/v1alpha1`"),
     ("kinference.buoyant.io/", "InferenceProvider", "`kinference.buoyant.io/v1alpha1`")],
)
def test_a_version_the_group_does_not_serve_is_an_error(api_version: str, kind: str, served: str) -> None:
    [err] = load_text(_doc(api_version, kind), "v.yaml")
    assert isinstance(err, ManifestError) and err.path == "apiVersion"
    assert "serves" in err.message and served in err.message


def test_every_kind_read_has_its_served_versions() -> None:
    from kinference_common import resources as r
    from kinference_common.kube import kinds

    assert set(r.SERVED_VERSIONS) == set(r.KINDS)
    # the version each kind is watched in is one a document may name
    for k in kinds.COMPILER_INPUTS:
        assert k.version in r.SERVED_VERSIONS[(k.group, k.kind)], k


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("gateway.networking.k8s.io/v1beta1", "HTTPRoute"), ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"),
     ("gateway.networking.k8s.io/v1", "Gateway"),
     # another project's versions are its API server's to judge (a CRD may serve one this table lacks)
     ("gateway.networking.k8s.io/v2", "HTTPRoute"), ("llm-d.ai/v1", "InferenceObjective")],
)
def test_every_served_version_is_accepted(api_version: str, kind: str) -> None:
    text = {
        "HTTPRoute": "spec: {}\n",
        "ReferenceGrant": "spec: {from: [], to: []}\n",
        "Gateway": "spec: {gatewayClassName: c}\n",
        "InferenceObjective": "spec: {poolRef: {name: p}}\n",
    }[kind]
    [x] = load_text(f"apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: x}}\n" + text, "ok.yaml")
    assert isinstance(x, LoadedObject)


# ------------------------------------------------------------ duplicate keys


def test_a_duplicate_key_is_an_error_naming_file_line_and_key() -> None:
    text = policy_yaml("p", "unmatched: Reject\nrules: []\nunmatched: ServeLocal")
    [err] = load_text(text, "dup.yaml")
    assert isinstance(err, ManifestError)
    assert str(err).startswith("dup.yaml: not valid YAML: line 7, column 3: duplicate key `unmatched` "
                               "(first at line 5, column 3)")
    # in a flow mapping, and in JSON
    [err] = load_text(policy_yaml("p", _rule(
        "route:\n  exclude: [{name: x, drop: {backend: {type: Local}, queuedPrompts: {greaterThan: 4, "
        "greaterThan: 8}}}]\n  select: [{type: Local}]")), "flow.yaml")
    assert isinstance(err, ManifestError) and "duplicate key `greaterThan`" in err.message
    [err] = load_text('{"apiVersion": "v1", "kind": "ConfigMap", "kind": "Secret"}', "d.json")
    assert isinstance(err, ManifestError) and "line 1" in err.message and "`kind`" in err.message


def test_concatenated_examples_no_longer_merge_silently() -> None:
    """``cat deploy/examples/*.yaml``: a file's last document and the next
    file's first one become one mapping, every key twice."""
    text = "".join(p.read_text() for p in sorted(EXAMPLES.glob("*.yaml")))
    errors = [x for x in load_text(text, "<stdin>") if isinstance(x, ManifestError)]
    assert errors and "duplicate key `apiVersion`" in errors[0].message


def test_merge_keys_still_work() -> None:
    text = policy_yaml("p", _rule(
        "route:\n  exclude:\n"
        "    - {name: a, drop: &busy {backend: {type: Local}, queuedPrompts: {greaterThan: 4}}}\n"
        "    - {name: b, drop: {<<: *busy, queuedPrompts: {greaterThan: 8}}}\n"
        "  select: [{type: Local}, {type: Provider}]"))
    [x] = load_text(text, "merge.yaml")
    assert isinstance(x, LoadedObject)
    drops = [e.drop for e in x.obj.spec.rules[0].route.exclude]  # type: ignore[union-attr]
    assert [d.queued_prompts.greater_than for d in drops] == [4, 8]  # type: ignore[union-attr]
    assert drops[1].backend is not None and drops[1].backend.type == "Local"


# ------------------------------------------------------------ every type error at once

def _errors(text: str) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in load_text(text, "t.yaml") if isinstance(e, ManifestError)]


def test_every_type_error_of_a_document_is_reported_in_one_run() -> None:
    """msgspec stops at a document's first type error, so a worker set with
    three mistakes took three runs of lint (an API server reports them all).
    Each bad value is replaced by one of the type expected, or taken out, and
    the document read again."""
    text = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {name: w}
spec:
  model: {name: qwen-2.5, contextWindow: "big"}
  engine: vLLm
  selector: {matchLabels: {app: qwen}}
  port: "eighty"
"""
    assert _errors(text) == [
        ("spec.model.contextWindow", "expected an integer, got a string"),
        ("spec.engine", "invalid value 'vLLm'; allowed: vLLM"),
        ("spec.port", "expected an integer, got a string"),
    ]


def test_a_required_field_of_the_wrong_type_is_not_also_reported_missing() -> None:
    """The key of a secretRef is required: replaced by a string, not taken
    out, so the search goes on past it and adds no "missing required field"
    of its own making."""
    text = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: p}
spec:
  url: 5
  auth: {secretRef: {name: x, key: 7}}
  models: [{name: qwen-2.5, contextWindow: "x"}]
  limits: {maxConcurrency: "64"}
"""
    got = _errors(text)
    assert got == [
        ("spec.url", "expected a string, got an integer"),
        ("spec.auth.secretRef.key", "expected a string, got an integer"),
        ("spec.models[0].contextWindow", "expected an integer, got a string"),
        ("spec.limits.maxConcurrency", "expected an integer, got a string"),
    ]
    assert not any("missing" in m for _, m in got)


def test_the_search_stops_where_it_would_guess() -> None:
    """A list item of the wrong kind cannot be stood in for (which fields
    would it hold?): reported, and nothing after it is made up. A real
    missing field is reported as before, once."""
    text = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: {name: p}
spec:
  url: https://x/v1
  auth: {secretRef: {name: x, key: k}}
  models: ["oops"]
  limits: {maxConcurrency: "64"}
"""
    assert _errors(text) == [("spec.models[0]", "expected a mapping, got a string")]
    missing = text.replace('["oops"]', "[{name: a}]").replace("{name: x, key: k}", "{name: x}")
    assert _errors(missing) == [("spec.auth.secretRef", "missing required field `key`")]
    # a good document still decodes, and decode_document gives the first error
    good = text.replace('["oops"]', "[{name: a}]").replace('"64"', "64")
    assert _errors(good) == []
    first = decode_document(yaml.safe_load(text.replace('url: https://x/v1', 'url: 5')), DocumentRef("x", 1))
    assert isinstance(first, ManifestError) and first.path == "spec.url"


@pytest.mark.parametrize("meta, path", [
    ("{name: Burst_Unless PII}", "metadata.name"),
    ("{name: burst, namespace: Default}", "metadata.namespace"),
    ("{name: -burst}", "metadata.name"),
    ("{name: burst., namespace: default}", "metadata.name"),
    ("{name: a, namespace: team.a}", "metadata.namespace"),
])
def test_a_name_the_api_server_refuses_is_an_error(meta: str, path: str) -> None:
    """User trial: `name: "Burst_Unless PII"` and `namespace: Default` linted
    clean, though the page says lint judges as `kubectl apply` would."""
    text = FLEET.split("---")[0].replace("metadata: {name: gemma-4-12b, namespace: default}", f"metadata: {meta}")
    assert text != FLEET.split("---")[0]
    errors = [e for e in load_text(text, "t.yaml") if isinstance(e, ManifestError)]
    res = compile_text(text)
    assert [e.path for e in res.errors] == [path] and "(the API server refuses it)" in res.errors[0].message
    assert not errors  # it reads; the rule is the API server's, checked beside the schema's


def test_names_the_api_server_takes_are_fine() -> None:
    text = FLEET.split("---")[0].replace("metadata: {name: gemma-4-12b, namespace: default}",
                                         "metadata: {name: gemma.4-12b.v2, namespace: team-a}")
    assert compile_text(text).errors == []


@pytest.mark.parametrize("where, doc", [
    ("spec.rules[0].route.exclude[0].drop.predictedTTFT.greaterThan", policy_yaml("p", _rule(
        "route:\n  exclude: [{name: s, drop: {backend: {type: Local}, predictedTTFT: {greaterThan: 500}}}]\n"
        "  select: [{type: Local}]"))),
    ("spec.timeouts.connect", "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\n"
     "metadata: {name: p}\nspec:\n  url: http://x/v1\n  auth: {secretRef: {name: a, key: b}}\n"
     "  models: [{name: m}]\n  timeouts: {connect: 2}\n"),
])
def test_a_number_where_a_duration_goes_says_how_to_write_one(where: str, doc: str) -> None:
    """User trial: `predictedTTFT: {greaterThan: 500}` said only "expected a
    string, got an integer", where "0.5" got a hint on durations."""
    errors = [e for e in load_text(doc, "t.yaml") if isinstance(e, ManifestError)]
    assert [(e.path, e.message) for e in errors] == [
        (where, "expected a string, got an integer: a duration is written with its unit, such as '800ms', "
                "'2s' or '1m30s'")]


def test_the_trials_six_mistakes_in_one_policy_are_reported_in_one_run() -> None:
    """A policy author fixed six mistakes in six runs of lint (one type error
    a run, then the unknown fields together). All six in one run now: wrong
    enum values are stood in for by an allowed one (a required `type: local`
    no longer ends the search) and a policy's unknown fields come with the
    type errors."""
    text = policy_yaml("p", """
unmatched: reject
rules:
  - name: a
    route:
      exclude: [{name: s, drop: {backend: {type: local}, queuedPrompt: {greaterThan: 4}}}]
      select: [{type: local, minimize: PredictedTTFt}, {type: Provider, order: databricks}]
      onEmtpy: Reject
""")
    got = [e.path for e in load_text(text, "t.yaml") if isinstance(e, ManifestError)]
    assert got == [
        "spec.unmatched",
        "spec.rules[0].route.exclude[0].drop.backend.type",
        "spec.rules[0].route.select[0].type",
        "spec.rules[0].route.select[0].minimize",
        "spec.rules[0].route.select[1].order",
        "spec.rules[0].route.exclude[0].drop.queuedPrompt",
        "spec.rules[0].route.onEmtpy",
    ]


@pytest.mark.parametrize("field", ["tenant", "model", "tag", "objective"])
def test_an_empty_list_in_a_request_condition_is_an_error(field: str) -> None:
    """User trial: `matches: [{tenant: []}]` never matched and linted clean
    (a matches entry *without* the field holds for every request)."""
    res = compile_text(FLEET, policy_yaml("p", _rule(f"matches: [{{{field}: []}}]\nroute: {{select: [{{type: Local}}]}}")))
    assert [(e.path, e.message.split(":")[0]) for e in res.errors] == [
        (f"spec.rules[0].matches[0].{field}", "an empty list holds for no request")]
    ok = compile_text(FLEET, policy_yaml("p", _rule(f"matches: [{{{field}: [x]}}]\nroute: {{select: [{{type: Local}}]}}")))
    assert not [e for e in ok.errors if e.path.endswith(field)]


def test_the_search_for_type_errors_makes_none_up_and_goes_past_enum_fields() -> None:
    """Review: a bad value at the top (metadata as a list) was also reported
    as a missing `metadata`; a wrong type in a field of a few values
    (`engine: 1`) was stood in for by "x", which failed there again and ended
    the search (`port: "8000"` after it went unreported); bounds read as
    msgspec's `Expected int >= 1`."""
    root = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: [default, x]\nspec: {}\n"
    assert _errors(root) == [("metadata", "expected a mapping, got a list")]
    ws = FLEET.split("---")[0].replace("selector: {matchLabels: {app: gemma}}",
                                       'selector: {matchLabels: {app: gemma}}\n  engine: 1\n  port: "8000"')
    assert _errors(ws) == [("spec.engine", "expected a string, got an integer"),
                           ("spec.port", "expected an integer, got a string")]
    bound = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {name: p}\nspec:\n"
             "  url: http://x/v1\n  auth: {secretRef: {name: a, key: b}}\n  models: [{name: m}]\n"
             "  limits: {requestsPerMinute: 0}\n")
    assert _errors(bound) == [("spec.limits.requestsPerMinute", "must be at least 1")]


# ------------------------------------------------------------ where, by line

LINED = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: unrelated}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata:
  name: p
spec:
  rules:
    - name: r
      route:
        select:
          - type: Local
            minimize: FastestTTFT
"""


def test_an_error_names_the_line_of_the_field_at_fault() -> None:
    [_, err] = load_text(LINED, "p.yaml")
    assert isinstance(err, ManifestError) and err.path == "spec.rules[0].route.select[0].minimize"
    assert err.line == 15
    assert str(err).startswith("p.yaml#2 (InferencePolicy default/p) at spec.rules[0].route.select[0].minimize "
                               "(line 15): invalid value 'FastestTTFT'")
    assert err.to_dict()["line"] == 15


def test_a_missing_field_is_placed_at_its_parent_and_list_items_at_their_own_lines() -> None:
    text = ("apiVersion: v1\nkind: List\nitems:\n"
            "- apiVersion: kinference.buoyant.io/v1alpha1\n  kind: InferencePolicy\n  metadata: {name: a}\n"
            "  spec: {rules: [{name: r, route: {select: [{type: Local}]}}]}\n"
            "- apiVersion: kinference.buoyant.io/v1alpha1\n  kind: InferencePolicy\n  metadata: {name: b}\n"
            "  spec:\n    rules:\n    - name: r\n")
    errors = [x for x in load_text(text, "l.yaml") if isinstance(x, ManifestError)]
    assert [(e.document.name, e.path, e.line) for e in errors] == [("b", "spec.rules[0]", 13)]
    assert "missing required field `route`" in errors[0].message


def test_documents_without_lines_say_what_they_said() -> None:
    err = ManifestError(DocumentRef("kinference.buoyant.io/v1alpha1", 1, "InferencePolicy", "ns", "p"), "spec", "bad")
    assert err.line is None and str(err) == "kinference.buoyant.io/v1alpha1#1 (InferencePolicy ns/p) at spec: bad"
    assert str(ManifestError(DocumentRef("gone.yaml", 0), "", "no such file or directory")) == \
        "gone.yaml: no such file or directory"


def test_recursive_and_repeated_aliases_are_read_at_once() -> None:
    # review: the line map walked aliases again and again (a recursive anchor never ended)
    [skipped] = load_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: &a [*a]\n", "r.yaml")
    assert isinstance(skipped, SkippedDocument)
    errors = load_text("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: {name: p}\n"
                       "spec: &a {rules: [*a]}\n", "r.yaml")
    assert errors and all(isinstance(e, ManifestError) for e in errors)
    laughs = "a: &a [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(7))
    [skipped] = load_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n" + laughs, "r.yaml")
    assert isinstance(skipped, SkippedDocument)


def test_a_field_written_over_a_merge_key_is_placed_where_it_is_written() -> None:
    text = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata:\n  name: p\n"
            "x-base: &b\n  type: Local\n  minimize: InFlight\n"
            "spec:\n  rules:\n    - name: r\n      route:\n        select:\n          - <<: *b\n"
            "            minimize: FastestTTFT\n")
    errors = [e for e in load_text(text, "m.yaml") if isinstance(e, ManifestError) and "minimize" in e.path]
    assert [(e.path, e.line) for e in errors] == [("spec.rules[0].route.select[0].minimize", 14)]


def test_an_anchor_keeps_its_lines_and_a_merge_chain_gives_the_anchors() -> None:
    # second review: the walk went last path first, so an alias written after its anchor took the anchor's lines
    text = ("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata:\n  name: p\n"
            "x-a: &a {minimize: Bad}\n"          # line 5
            "x-b: &b {<<: *a, type: Local}\n"    # line 6
            "spec:\n  rules:\n"
            "    - &r\n      name: r\n      route:\n        select:\n          - {type: Local, minimize: Bad2}\n"
            "    - *r\n"
            "    - name: s\n      route:\n        select:\n          - <<: *b\n")  # line 19
    errors = {e.path: e.line for e in load_text(text, "a.yaml") if isinstance(e, ManifestError) and "minimize" in e.path}
    assert errors["spec.rules[0].route.select[0].minimize"] == 13  # where the anchored rule writes it
    assert errors["spec.rules[2].route.select[0].minimize"] == 5  # merged from b, which merges a
