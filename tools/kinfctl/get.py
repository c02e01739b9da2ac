"""``kinfctl get pools|policies|workersets|providers``: list resources with
the CRDs' printer columns (kubectl's layout).

With ``-f MANIFESTS`` the statuses are computed offline by the compiler,
exactly as the controllers would write them. Without ``-f`` the objects and
their statuses are read from the cluster of the current kubeconfig context
(``--kubeconfig``, ``--context``; in a pod, the service account), as
``kubectl get`` would show them: a column whose status field was never
written stays blank (an object outside the namespaces Kinference watches
shows RULES and STATE blank).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from kinference_common import API_GROUP, API_VERSION
from kinference_common.compiler import compile_documents
from kinfctl.lint import read_inputs
from kinfctl.main import EXIT_INVALID, EXIT_OK, CommandError
from kinfctl.output import age, print_json, table

#: resource -> (kind, plural)
RESOURCES = {
    "policies": ("InferencePolicy", "inferencepolicies"),
    "pools": ("InferencePool", "inferencepools"),
    "workersets": ("InferenceWorkerSet", "inferenceworkersets"),
    "providers": ("InferenceProvider", "inferenceproviders"),
}
ALIASES = {
    **{a: "policies" for a in ("policy", "policies", "infpol", "infpols", "inferencepolicy", "inferencepolicies")},
    **{a: "pools" for a in ("pool", "pools", "infpool", "infpools", "inferencepool", "inferencepools")},
    **{a: "workersets" for a in ("workerset", "workersets", "infws", "inferenceworkerset", "inferenceworkersets")},
    **{a: "providers" for a in ("provider", "providers", "infprov", "inferenceprovider", "inferenceproviders")},
}

Item = tuple[dict[str, Any], dict[str, Any]]  # (object, status)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "get",
        help="list pools, policies, worker sets or providers with their printer columns",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("resource", help="pools|policies|workersets|providers (or kubectl short names)")
    p.add_argument("-f", "--filename", action="append", metavar="FILE|DIR", help="read manifests offline")
    p.add_argument("-n", "--namespace", help="only this namespace (cluster default: the context's)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format (default table)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    resource = ALIASES.get(args.resource.lower())
    if resource is None:
        raise CommandError(f"unknown resource {args.resource!r}; use pools, policies, workersets or providers")
    code = EXIT_OK
    if args.filename:
        items, code = _offline(args, resource)
    else:
        items = asyncio.run(_from_cluster(args, resource))
    if args.namespace:
        items = [i for i in items if _ns(i[0]) == args.namespace]
    items.sort(key=lambda i: (_ns(i[0]), i[0].get("metadata", {}).get("name", "")))
    if not items and code != EXIT_OK:
        return code  # the errors (printed) say why: "No resources found." would say the input was read
    if args.output == "json":
        print_json([{**obj, **({"status": st} if st else {})} for obj, st in items])
        return code
    if not items:
        where = f" in {args.namespace} namespace" if args.namespace else ""
        print(f"No resources found{where}.")
        return code
    headers, rows = columns(resource, items)
    if len({_ns(o) for o, _ in items}) > 1 or args.all_namespaces:
        headers = ["NAMESPACE", *headers]
        rows = [[_ns(o), *row] for (o, _), row in zip(items, rows, strict=True)]
    table(headers, rows)
    return code


def _ns(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "default")


def _offline(args: argparse.Namespace, resource: str) -> tuple[list[Item], int]:
    res = compile_documents(read_inputs(args.filename))
    for e in res.errors:
        print(f"kinfctl: error: {e}", file=sys.stderr)
    kind = RESOURCES[resource][0]
    statuses = {"policies": res.policy_status, "pools": res.pool_status, "providers": res.provider_status}
    items = []
    for key, lo in res.objects[kind].items():
        st = statuses.get(resource, {}).get(key)
        items.append((dict(lo.raw), msgspec.to_builtins(st) if st is not None else dict(lo.raw.get("status") or {})))
    return items, EXIT_INVALID if res.errors else EXIT_OK


def _default_kubeconfig_exists() -> bool:
    """Whether kubectl would find a kubeconfig without --kubeconfig."""
    env = os.environ.get("KUBECONFIG")
    paths = [p for p in env.split(os.pathsep) if p] if env else ["~/.kube/config"]
    return any(Path(p).expanduser().is_file() for p in paths)


async def _from_cluster(args: argparse.Namespace, resource: str) -> list[Item]:
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.config.config_exception import ConfigException

    if args.kubeconfig and not Path(args.kubeconfig).expanduser().is_file():
        raise CommandError(f"--kubeconfig {args.kubeconfig}: no such file (or -f MANIFESTS to read manifests offline)")
    if not args.kubeconfig and not _default_kubeconfig_exists() and "KUBERNETES_SERVICE_HOST" not in os.environ:
        # asking the library anyway only adds its own "Config not found" line
        raise CommandError("no cluster to read: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod; "
                           "pass --kubeconfig FILE, or -f MANIFESTS to read manifests offline")
    try:
        try:
            await config.load_kube_config(config_file=args.kubeconfig, context=args.context)
            _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
            default_ns = (active.get("context") or {}).get("namespace") or "default"
        except (ConfigException, FileNotFoundError, TypeError):
            if args.kubeconfig:
                raise
            config.load_incluster_config()
            default_ns = "default"
    except (ConfigException, FileNotFoundError, TypeError) as exc:
        raise CommandError(f"no cluster to read ({exc}); pass -f MANIFESTS to read manifests offline") from None
    plural = RESOURCES[resource][1]
    async with client.ApiClient() as api:
        objects = client.CustomObjectsApi(api)
        try:
            if args.all_namespaces:
                listed = await objects.list_cluster_custom_object(API_GROUP, API_VERSION, plural)
            else:
                ns = args.namespace or default_ns
                listed = await objects.list_namespaced_custom_object(API_GROUP, API_VERSION, ns, plural)
        except ApiException as exc:
            if exc.status == 404:
                raise CommandError(f"the cluster does not serve {plural}.{API_GROUP}: install the CRDs "
                                   "(kubectl apply -f deploy/k8s/crds)") from None
            raise CommandError(f"the cluster refused to list {plural}: {exc.status} {exc.reason}") from None
        except Exception as exc:  # connection refused, TLS, DNS
            raise CommandError(f"cannot reach the cluster: {exc}") from None
    return [(item, item.get("status") or {}) for item in listed.get("items", [])]


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def columns(resource: str, items: list[Item]) -> tuple[list[str], list[list[str]]]:
    """The printer columns of the CRDs (deploy/k8s/crds), from object and status."""
    rows: list[list[str]] = []
    for obj, st in items:
        meta, spec = obj.get("metadata", {}), obj.get("spec") or {}
        name, created = meta.get("name", ""), age(meta.get("creationTimestamp"))
        if resource == "policies":
            rows.append([name, _cell(st.get("ruleCount")), _cell(st.get("state")),
                         spec.get("unmatched", "ServeLocal"), created])
        elif resource == "pools":
            ref = spec.get("policyRef")
            if isinstance(ref, list):
                ref = ref[0] if ref else None
            policy = ref.get("name", "") if isinstance(ref, dict) else ""
            rows.append([name, policy, _cell(st.get("destinationCount")), _cell(st.get("state")), created])
        elif resource == "workersets":
            model = (spec.get("model") or {}).get("name", "")
            rows.append([name, model, _cell(st.get("readyEndpoints")), created])
        else:
            ready = next((c.get("status") for c in st.get("conditions", []) if c.get("type") == "Ready"), None)
            models = ",".join(m.get("name", "") for m in spec.get("models") or [] if isinstance(m, dict))
            rows.append([name, spec.get("url", ""), models, _cell(ready), created])
    headers = {
        "policies": ["NAME", "RULES", "STATE", "UNMATCHED", "AGE"],
        "pools": ["NAME", "POLICY", "DESTINATIONS", "STATE", "AGE"],
        "workersets": ["NAME", "MODEL", "READY", "AGE"],
        "providers": ["NAME", "URL", "MODELS", "READY", "AGE"],
    }[resource]
    return headers, rows
