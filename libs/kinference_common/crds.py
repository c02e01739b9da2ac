"""CustomResourceDefinitions for Kinference's four kinds, generated from the
msgspec types in :mod:`kinference_common.resources` so the cluster's schema
and the code's can never drift apart.

``python -m kinference_common.crds deploy/k8s/crds`` writes one YAML file per
kind; a test checks the committed files equal a fresh generation.

What the generator emits, per Kubernetes' rules for structural schemas:

- every node has a ``type``; Optional fields are simply not ``required``;
- a field that is "a string or a list" (``matches[].model`` and friends) or
  "an object or a one-element list" (``policyRef``, see seeds/INDEX.md) has no
  single type, so it is declared ``x-kubernetes-preserve-unknown-fields`` and
  its shape is checked by a CEL rule instead;
- the rules of :mod:`kinference_common.compiler.validate` become CEL rules
  (``x-kubernetes-validations``), so the API server rejects what
  ``kinfctl lint`` calls a manifest error;
- the status subresource, short names and the seeds' printer columns.

Unknown fields are pruned by the API server (no preserve-unknown-fields on
objects); ``kinfctl lint`` refuses them in a policy and warns about them in
the other kinds (``UnknownField``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import yaml

from kinference_common import API_GROUP, API_VERSION
from kinference_common import resources as r
from kinference_common.compiler import status as st

DURATION_PATTERN = r"^(0|([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h))+$"

#: (struct, field) -> CEL rules on that field's schema
_FIELD_RULES: dict[tuple[type, str], list[dict[str, str]]] = {
    (r.InferencePoolSpec, "policyRef"): [{
        "rule": "type(self) == map || (type(self) == list && size(self) == 1)",
        "message": "policyRef is an object (a one-element list is accepted)",
    }],
}
_STRUCT_RULES: dict[type, list[dict[str, str]]] = {
    r.NumberComparison: [{"rule": "has(self.greaterThan) || has(self.lessThan)",
                          "message": "a comparison needs greaterThan or lessThan"}],
    r.IntComparison: [{"rule": "has(self.greaterThan) || has(self.lessThan)",
                       "message": "a comparison needs greaterThan or lessThan"}],
    r.DurationComparison: [{"rule": "has(self.greaterThan) || has(self.lessThan)",
                            "message": "a comparison needs greaterThan or lessThan"}],
    r.SelectTier: [{"rule": "!(has(self.minimize) && has(self.order))",
                    "message": "a tier takes at most one of minimize and order"}],
    r.PoolDestination: [{"rule": "!(has(self.name) && has(self.selector))",
                         "message": "give name or selector, not both"}],
    r.EndpointPickerRef: [{"rule": "self.kind != 'Service' || has(self.port)",
                           "message": "port is required when kind is 'Service' or unspecified (defaults to 'Service')"}],
}
_FIELD_RULES[(r.GieInferencePoolSpec, "targetPorts")] = [{
    "rule": "self.all(p1, self.exists_one(p2, p1.number==p2.number))", "message": "port number must be unique"}]
_STRING_OR_LIST_RULE = [{"rule": "type(self) == string || (type(self) == list && size(self) > 0)",
                         "message": "a string or a non-empty list of strings"}]
_DURATION_FIELDS = {
    (r.DurationComparison, "greaterThan"), (r.DurationComparison, "lessThan"),
    (r.ProviderTimeouts, "connect"), (r.ProviderTimeouts, "firstToken"),
    (r.FlowControl, "maxQueueWait"),
}


def schema_of(t: msgspec.inspect.Type, owner: type | None = None, name: str = "") -> dict[str, Any]:
    """An OpenAPI v3 structural schema for a msgspec type."""
    i = msgspec.inspect
    if isinstance(t, i.UnionType):
        members = [m for m in t.types if not isinstance(m, i.NoneType)]
        if len(members) == 1:
            return schema_of(members[0], owner, name)
        out: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}
        rules = _FIELD_RULES.get((owner, name)) if owner else None  # type: ignore[arg-type]
        kinds = {type(m) for m in members}
        if rules is None and kinds == {i.StrType, i.ListType}:
            rules = _STRING_OR_LIST_RULE
        if rules:
            out["x-kubernetes-validations"] = rules
        return out
    if isinstance(t, i.StructType):
        props = {f.encode_name: schema_of(f.type, t.cls, f.encode_name) for f in t.fields}
        for f in t.fields:
            if f.default not in (None, i.NODEFAULT) and isinstance(f.default, (str, int, float, bool)):
                props[f.encode_name]["default"] = f.default
        out = {"type": "object", "properties": props}
        required = [f.encode_name for f in t.fields if f.required]
        if required:
            out["required"] = required
        if t.cls in _STRUCT_RULES:
            out["x-kubernetes-validations"] = _STRUCT_RULES[t.cls]
        return out
    if isinstance(t, i.ListType):
        out = {"type": "array", "items": schema_of(t.item_type, owner, name)}
        if t.min_length is not None:
            out["minItems"] = t.min_length
        if t.max_length is not None:
            out["maxItems"] = t.max_length
        rules = _FIELD_RULES.get((owner, name)) if owner else None  # type: ignore[arg-type]
        if rules:
            out["x-kubernetes-validations"] = rules
        return out
    if isinstance(t, i.DictType):
        out = {"type": "object", "additionalProperties": schema_of(t.value_type, owner, name)}
        if t.min_length is not None:
            out["minProperties"] = t.min_length
        if t.max_length is not None:
            out["maxProperties"] = t.max_length
        return out
    if isinstance(t, i.LiteralType):
        return {"type": "string", "enum": list(t.values)}
    if isinstance(t, i.StrType):
        out = {"type": "string"}
        if t.min_length is not None:
            out["minLength"] = t.min_length
        if t.max_length is not None:
            out["maxLength"] = t.max_length
        if (owner, name) in _DURATION_FIELDS:
            out["pattern"] = DURATION_PATTERN
        elif t.pattern is not None:
            out["pattern"] = t.pattern
        return out
    if isinstance(t, i.BoolType):
        return {"type": "boolean"}
    if isinstance(t, i.IntType):
        out = {"type": "integer"}
        if t.ge is not None:
            out["minimum"] = t.ge
        if t.gt is not None:
            out["minimum"] = t.gt + 1
        if t.le is not None:
            out["maximum"] = t.le
        return out
    if isinstance(t, i.FloatType):
        return {"type": "number"}
    if isinstance(t, i.AnyType):
        return {"x-kubernetes-preserve-unknown-fields": True}
    raise TypeError(f"no schema for {t!r}")


class WorkerSetEndpoint(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    pod: str
    address: str
    ready: bool = False
    last_scrape: str | None = None


class WorkerSetStatus(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """InferenceWorkerSet status (RESOURCES.md); written by the collector side."""

    ready_endpoints: int = 0
    endpoints: list[WorkerSetEndpoint] = []
    conditions: list[st.Condition] = []


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

KINDS: list[dict[str, Any]] = [
    {
        "kind": "InferencePolicy", "plural": "inferencepolicies", "singular": "inferencepolicy",
        "short": ["infpol"], "spec": r.InferencePolicySpec, "status": st.PolicyStatus,
        "columns": [
            {"name": "Rules", "type": "integer", "jsonPath": ".status.ruleCount"},
            {"name": "State", "type": "string", "jsonPath": ".status.state"},
            {"name": "Unmatched", "type": "string", "jsonPath": ".spec.unmatched"},
            _AGE,
            # -o wide only (priority 1): the seeds' default columns stay as they are
            {"name": "Warnings", "type": "integer", "jsonPath": ".status.warningCount", "priority": 1},
            {"name": "Message", "type": "string", "jsonPath": ".status.conditions[0].message", "priority": 1},
        ],
    },
    {
        "kind": "InferencePool", "plural": "inferencepools", "singular": "inferencepool",
        "short": ["infpool"], "spec": r.InferencePoolSpec, "status": st.PoolStatus,
        "columns": [
            {"name": "Policy", "type": "string", "jsonPath": ".spec.policyRef.name"},
            {"name": "Destinations", "type": "integer", "jsonPath": ".status.destinationCount"},
            {"name": "State", "type": "string", "jsonPath": ".status.state"},
            _AGE,
        ],
    },
    {
        "kind": "InferenceWorkerSet", "plural": "inferenceworkersets", "singular": "inferenceworkerset",
        "short": ["infws"], "spec": r.InferenceWorkerSetSpec, "status": WorkerSetStatus,
        "columns": [
            {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyEndpoints"},
            _AGE,
        ],
    },
    {
        # The Inference Extension's pool, for clusters that do not have its CRD
        # yet (the upstream CRD serves the same schema). No short name: `infpool`
        # stays Kinference's pool.
        "kind": "InferencePool", "plural": "inferencepools", "singular": "inferencepool",
        "group": r.GIE_POOL_GROUP, "version": r.GIE_POOL_VERSION, "short": [], "categories": [],
        "spec": r.GieInferencePoolSpec, "status": st.GiePoolStatus, "columns": [], "spec_required": True,
        "file": f"inferencepools.{r.GIE_POOL_GROUP}.yaml",
    },
    {
        "kind": "InferenceProvider", "plural": "inferenceproviders", "singular": "inferenceprovider",
        "short": ["infprov"], "spec": r.InferenceProviderSpec, "status": st.ProviderStatus,
        "columns": [
            {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
            {"name": "Models", "type": "string", "jsonPath": ".spec.models[*].name"},
            {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
            _AGE,
        ],
    },
]


#: the annotation a CRD of a ``*.k8s.io`` group must carry (Kubernetes API review)
API_APPROVAL = "api-approved.kubernetes.io"
UNAPPROVED = ("unapproved, Kinference's copy of the Gateway API Inference Extension's CRD, for clusters "
              "without it")


def crd(entry: dict[str, Any]) -> dict[str, Any]:
    spec_schema = schema_of(msgspec.inspect.type_info(entry["spec"]))
    status_schema = schema_of(msgspec.inspect.type_info(entry["status"]))
    group = entry.get("group", API_GROUP)
    names: dict[str, Any] = {
        "kind": entry["kind"], "listKind": f"{entry['kind']}List", "plural": entry["plural"],
        "singular": entry["singular"],
    }
    if entry["short"]:
        names["shortNames"] = entry["short"]
    categories = entry.get("categories", ["kinference"])
    if categories:
        names["categories"] = categories
    version: dict[str, Any] = {
        "name": entry.get("version", API_VERSION),
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
    }
    if entry["columns"]:
        version["additionalPrinterColumns"] = entry["columns"]
    root: dict[str, Any] = {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    if entry.get("spec_required"):
        root["required"] = ["spec"]
    version["schema"] = {"openAPIV3Schema": root}
    metadata: dict[str, Any] = {"name": f"{entry['plural']}.{group}"}
    if group == "k8s.io" or group.endswith((".k8s.io", ".kubernetes.io")):
        # a protected group: the API server refuses a CRD without this annotation
        # (KEP-1111); "unapproved, ..." is accepted, and says this copy is not the upstream's
        metadata["annotations"] = {API_APPROVAL: UNAPPROVED}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": names,
            "versions": [version],
        },
    }


class _NoAliases(yaml.SafeDumper):
    """Repeated rule lists are written out, not as YAML anchors (kubectl and
    reviewers read them more easily)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(entry: dict[str, Any]) -> str:
    header = ("# Generated by `python -m kinference_common.crds` from libs/kinference_common/resources.py.\n"
              "# Do not edit by hand: change the types and regenerate.\n")
    body = yaml.dump(crd(entry), Dumper=_NoAliases, sort_keys=False, allow_unicode=True, width=100)
    return header + body


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "deploy/k8s/crds")
    out.mkdir(parents=True, exist_ok=True)
    for entry in KINDS:
        path = out / entry.get("file", f"{entry['plural']}.yaml")
        path.write_text(render(entry), encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
