"""Checks the API server's schema makes beyond types and enums.

These are the rules the CRDs under ``deploy/k8s`` carry as CEL validations
(``x-kubernetes-validations``): a document that fails one is rejected by the
API server, so ``kinfctl lint`` reports it as a manifest error, not a warning.

- a comparison (``greaterThan``/``lessThan``) must give at least one bound;
- durations (``predictedTTFT``, ``estimatedTTFT``, provider timeouts,
  ``flowControl.maxQueueWait``) must parse;
- a select tier has at most one of ``minimize`` / ``order``;
- a pool destination has at most one of ``name`` / ``selector``;
- a pool's ``policyRef`` written as a list has at most one element;
- a request condition's ``model``/``tenant``/``tag``/``objective`` written
  as a list lists at least one (``tenant: []`` held for no request);
- ``metadata.name`` is a DNS-1123 subdomain and ``metadata.namespace`` a
  DNS-1123 label, as the API server requires of every object (it refuses
  ``Burst_Unless PII`` or namespace ``Default``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kinference_common import resources as r
from kinference_common.durations import DurationError, parse_duration

_COMPARISON_FIELDS = (
    "queued_prompts",
    "running_prompts",
    "kv_cache_usage",
    "gpu_utilization",
    "gpu_memory_usage",
    "predicted_ttft",
    "estimated_ttft",
    "error_rate",
    "in_flight",
)

#: python attribute -> wire name, for the candidate predicate fields
WIRE_NAMES = {
    "queued_prompts": "queuedPrompts",
    "running_prompts": "runningPrompts",
    "kv_cache_usage": "kvCacheUsage",
    "gpu_utilization": "gpuUtilization",
    "gpu_memory_usage": "gpuMemoryUsage",
    "predicted_ttft": "predictedTTFT",
    "estimated_ttft": "estimatedTTFT",
    "error_rate": "errorRate",
    "in_flight": "inFlight",
}

Problem = tuple[str, str]  # (path, message)


def _comparison(cmp: object, path: str) -> Iterator[Problem]:
    gt = getattr(cmp, "greater_than", None)
    lt = getattr(cmp, "less_than", None)
    if gt is None and lt is None:
        yield path, "a comparison needs `greaterThan` or `lessThan`"
    if isinstance(cmp, r.DurationComparison):
        for key, value in (("greaterThan", gt), ("lessThan", lt)):
            if value is not None:
                try:
                    parse_duration(value)
                except DurationError as exc:
                    yield f"{path}.{key}", str(exc)


def _request_match(m: r.RequestMatch, path: str) -> Iterator[Problem]:
    for field_name in ("model", "tenant", "tag", "objective"):
        if getattr(m, field_name) == []:
            yield (f"{path}.{field_name}", "an empty list holds for no request: list at least one, or leave "
                                           "the field out (a matches entry without it holds for any)")
    if m.priority is not None:
        yield from _comparison(m.priority, f"{path}.priority")
    if m.prompt_tokens is not None:
        yield from _comparison(m.prompt_tokens, f"{path}.promptTokens")


def _candidate(p: r.CandidatePredicate, path: str) -> Iterator[Problem]:
    for attr in _COMPARISON_FIELDS:
        cmp = getattr(p, attr)
        if cmp is not None:
            yield from _comparison(cmp, f"{path}.{WIRE_NAMES[attr]}")


def policy_problems(policy: r.InferencePolicy) -> list[Problem]:
    out: list[Problem] = []
    for i, rule in enumerate(policy.spec.rules):
        base = f"spec.rules[{i}]"
        for j, m in enumerate(rule.matches or []):
            out.extend(_request_match(m, f"{base}.matches[{j}]"))
        route = rule.route
        for j, ex in enumerate(route.exclude or []):
            if ex.if_ is not None:
                out.extend(_request_match(ex.if_, f"{base}.route.exclude[{j}].if"))
            out.extend(_candidate(ex.drop, f"{base}.route.exclude[{j}].drop"))
        for j, tier in enumerate(route.select):
            tpath = f"{base}.route.select[{j}]"
            if tier.minimize is not None and tier.order is not None:
                out.append((tpath, "a tier takes at most one of `minimize` and `order`"))
            if tier.backends is not None:
                out.extend(_candidate(tier.backends, f"{tpath}.backends"))
    return out


def pool_problems(pool: r.InferencePool) -> list[Problem]:
    out: list[Problem] = []
    for i, d in enumerate(pool.spec.destinations or []):
        if d.name is not None and d.selector is not None:
            out.append((f"spec.destinations[{i}]", "give `name` or `selector`, not both"))
    ref = pool.spec.policy_ref
    if isinstance(ref, list) and len(ref) > 1:
        out.append(("spec.policyRef", f"a pool has one policy; policyRef lists {len(ref)}"))
    if pool.spec.flow_control is not None:
        try:
            parse_duration(pool.spec.flow_control.max_queue_wait)
        except DurationError as exc:
            out.append(("spec.flowControl.maxQueueWait", str(exc)))
    return out


def provider_problems(provider: r.InferenceProvider) -> list[Problem]:
    out: list[Problem] = []
    t = provider.spec.timeouts
    if t is not None:
        for key, value in (("connect", t.connect), ("firstToken", t.first_token)):
            if value is not None:
                try:
                    parse_duration(value)
                except DurationError as exc:
                    out.append((f"spec.timeouts.{key}", str(exc)))
    return out


_SUBDOMAIN = re.compile(r.DNS1123_SUBDOMAIN)
_LABEL = re.compile(r.DNS1123_LABEL)


def metadata_problems(obj: object) -> list[Problem]:
    """The API server's rules for an object's name and namespace."""
    meta = getattr(obj, "metadata", None)
    out: list[Problem] = []
    name = getattr(meta, "name", None)
    if isinstance(name, str) and name and (len(name) > 253 or not _SUBDOMAIN.fullmatch(name)):
        out.append(("metadata.name", f"{name!r} is not a valid name: lowercase letters, digits, '-' and '.', "
                                     "starting and ending with a letter or digit, at most 253 characters "
                                     "(the API server refuses it)"))
    ns = getattr(meta, "namespace", None)
    if isinstance(ns, str) and ns and (len(ns) > 63 or not _LABEL.fullmatch(ns)):
        out.append(("metadata.namespace", f"{ns!r} is not a valid namespace: lowercase letters, digits and '-', "
                                          "starting and ending with a letter or digit, at most 63 characters "
                                          "(the API server refuses it)"))
    return out


def problems(obj: r.Resource) -> list[Problem]:
    found = metadata_problems(obj)
    if isinstance(obj, r.InferencePolicy):
        return found + policy_problems(obj)
    if isinstance(obj, r.InferencePool):
        return found + pool_problems(obj)
    if isinstance(obj, r.InferenceProvider):
        return found + provider_problems(obj)
    return found
