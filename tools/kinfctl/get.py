"""``kinfctl get pools|policies|workersets|providers -f MANIFESTS``: list
resources with the printer columns of the seeds (kubectl's layout).

With ``-f`` the statuses are computed offline by the compiler, exactly as the
controllers would write them. Reading a live cluster needs the Kubernetes
integration, which is not built yet: without ``-f`` the command says so.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from kinference_common.compiler import CompileResult, compile_documents
from kinfctl.lint import read_inputs
from kinfctl.main import EXIT_INVALID, EXIT_OK, CommandError
from kinfctl.output import age, print_json, table

RESOURCES = {
    "policies": "InferencePolicy",
    "pools": "InferencePool",
    "workersets": "InferenceWorkerSet",
    "providers": "InferenceProvider",
}
ALIASES = {
    **{a: "policies" for a in ("policy", "policies", "infpol", "infpols", "inferencepolicy", "inferencepolicies")},
    **{a: "pools" for a in ("pool", "pools", "infpool", "infpools", "inferencepool", "inferencepools")},
    **{a: "workersets" for a in ("workerset", "workersets", "infws", "inferenceworkerset", "inferenceworkersets")},
    **{a: "providers" for a in ("provider", "providers", "infprov", "inferenceprovider", "inferenceproviders")},
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "get",
        help="list pools, policies, worker sets or providers with their printer columns",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument("resource", help="pools|policies|workersets|providers (or kubectl short names)")
    p.add_argument("-f", "--filename", action="append", metavar="FILE|DIR", help="read manifests offline")
    p.add_argument("-n", "--namespace", help="only this namespace")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default with -f)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    resource = ALIASES.get(args.resource.lower())
    if resource is None:
        raise CommandError(f"unknown resource {args.resource!r}; use pools, policies, workersets or providers")
    if not args.filename:
        raise CommandError(
            "reading a live cluster is not available in this build; pass -f MANIFESTS to read manifests offline"
        )
    res = compile_documents(read_inputs(args.filename))
    for e in res.errors:
        print(f"kinfctl: error: {e}", file=__import__("sys").stderr)
    items = sorted(res.objects[RESOURCES[resource]].items())
    if args.namespace:
        items = [(k, v) for k, v in items if k[0] == args.namespace]
    show_ns = not args.namespace and len({k[0] for k, _ in items}) > 1
    if args.output == "json":
        print_json([_object_json(res, resource, k, lo) for k, lo in items])
    else:
        headers, rows = _rows(res, resource, items)
        if show_ns:
            headers = ["NAMESPACE", *headers]
            rows = [[k[0], *row] for (k, _), row in zip(items, rows, strict=True)]
        if rows:
            table(headers, rows)
        else:
            print("No resources found" + (f" in {args.namespace} namespace." if args.namespace else "."))
    return EXIT_INVALID if res.errors else EXIT_OK


def _status(res: CompileResult, resource: str, key: tuple[str, str]) -> Any:
    return {
        "policies": res.policy_status,
        "pools": res.pool_status,
        "providers": res.provider_status,
    }.get(resource, {}).get(key)


def _object_json(res: CompileResult, resource: str, key: tuple[str, str], lo: Any) -> dict[str, Any]:
    obj = dict(lo.raw)
    status = _status(res, resource, key)
    if status is not None:
        obj["status"] = msgspec.to_builtins(status)
    return obj


def _rows(res: CompileResult, resource: str, items: list[Any]) -> tuple[list[str], list[list[str]]]:
    rows: list[list[str]] = []
    if resource == "policies":
        for key, lo in items:
            st = res.policy_status[key]
            rows.append([key[1], str(st.rule_count), st.state, lo.obj.spec.unmatched,
                         age(lo.obj.metadata.creation_timestamp)])
        return ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"], rows
    if resource == "pools":
        for key, lo in items:
            st = res.pool_status[key]
            ref = lo.obj.spec.policy_ref
            if isinstance(ref, list):
                ref = ref[0] if ref else None
            rows.append([key[1], ref.name if ref else "", str(st.destination_count), st.state,
                         age(lo.obj.metadata.creation_timestamp)])
        return ["NAME", "POLICY", "DESTINATIONS", "STATE", "AGE"], rows
    if resource == "workersets":
        for key, lo in items:
            ready = (lo.raw.get("status") or {}).get("readyEndpoints")
            rows.append([key[1], lo.obj.spec.model.name, "<unknown>" if ready is None else str(ready),
                         age(lo.obj.metadata.creation_timestamp)])
        return ["NAME", "MODEL", "READY", "AGE"], rows
    for key, lo in items:
        st = res.provider_status[key]
        ready = next((c.status for c in st.conditions if c.type == "Ready"), "Unknown")
        models = ",".join(m.name for m in (lo.obj.spec.models or []))
        rows.append([key[1], lo.obj.spec.url or "", models, ready, age(lo.obj.metadata.creation_timestamp)])
    return ["NAME", "URL", "MODELS", "READY", "AGE"], rows
