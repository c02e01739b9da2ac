"""Write deploy/k8s/base/rbac.yaml from SERVICE_RULES
(libs/kinference_common/kube/rbac.py), the rules each service's code needs.

    .venv/bin/python deploy/k8s/rbac_gen.py            # rewrite base/rbac.yaml
    .venv/bin/python deploy/k8s/rbac_gen.py --check    # exit 1 when it differs

(the project's venv: the rules come from ``kinference_common``, installed
there by ``make install``; another Python says so in one line).

Per service: a ClusterRole (+ binding) with every rule, except
- rules on resources in ``NAMESPACED_RESOURCES`` (leases), which go in a Role
  (+ binding) in Kinference's namespace;
- rules marked ``per_namespace`` (the router's Secrets), which go in a
  ClusterRole ``kinference-<service>-<resources>`` that no ClusterRoleBinding
  binds: a RoleBinding grants it in Kinference's namespace here, and one more
  RoleBinding per namespace grants it there (the example overlay has the
  ``default`` namespace's; docs/kubernetes-dataplane.md shows the command).
The ServiceAccounts are in each service's file.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

try:
    import yaml

    from kinference_common.kube import rbac
except ModuleNotFoundError as _missing:
    if __name__ != "__main__":
        raise
    sys.exit(f"rbac_gen.py: {_missing.name} is not importable by {sys.executable}: run it with the "
             "project's venv (make install): .venv/bin/python deploy/k8s/rbac_gen.py")

OUT = Path(__file__).resolve().parent / "base" / "rbac.yaml"
#: the classifier has no API use: it gets no role at all
SERVICES = ("policy-compiler", "telemetry-collector", "router")


def _field(rule: object, *names: str, index: int) -> list[str]:
    for n in names:
        if hasattr(rule, n):
            return list(getattr(rule, n))
        if isinstance(rule, dict) and n in rule:
            return list(rule[n])
    return list(rule[index])  # type: ignore[index]


def triples(rules: Iterable[object]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) a list of rules grants, whatever the
    rule's shape (a NamedTuple, a dataclass, a dict as in a Role)."""
    out = set()
    for r in rules:
        for g in _field(r, "api_groups", "apiGroups", "groups", index=0):
            for res in _field(r, "resources", index=1):
                for v in _field(r, "verbs", index=2):
                    out.add((g, res, v))
    return out


def _namespaced() -> frozenset[str]:
    return frozenset(getattr(rbac, "NAMESPACED_RESOURCES", {"leases"}))


def _rules(ts: set[tuple[str, str, str]]) -> list[dict]:
    """Rules grouped by (group, resource) so each lists its verbs."""
    by: dict[tuple[str, str], set[str]] = {}
    for g, res, v in ts:
        by.setdefault((g, res), set()).add(v)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (g, res), verbs in sorted(by.items()):
        grouped.setdefault((g, tuple(sorted(verbs))), []).append(res)
    return [{"apiGroups": [g], "resources": sorted(res), "verbs": list(verbs)}
            for (g, verbs), res in sorted(grouped.items())]


def per_namespace_role(svc: str) -> str | None:
    """The name of the service's ClusterRole of per-namespace rules (None: it has none)."""
    rules = [r for r in rbac.SERVICE_RULES.get(svc, []) if getattr(r, "per_namespace", False)]
    if not rules:
        return None
    return f"kinference-{svc}-" + "-".join(sorted({res.replace("/", "-") for r in rules for res in r.resources}))


def role_binding(svc: str, namespace: str | None, *, subject_name: str | None = None,
                 subject_namespace: str = "kinference-system") -> dict:
    """A RoleBinding of the service's per-namespace ClusterRole in ``namespace``
    (None: the kustomization's namespace) to its ServiceAccount (or another)."""
    role = per_namespace_role(svc)
    assert role is not None, f"{svc} has no per-namespace rules"
    meta: dict = {"name": role}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["labels"] = {"app.kubernetes.io/name": svc}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": subject_name or svc, "namespace": subject_namespace}]}


def documents() -> list[dict]:
    docs: list[dict] = []
    ns_res = _namespaced()
    for svc in SERVICES:
        rules = rbac.SERVICE_RULES.get(svc, [])
        per_ns = triples(r for r in rules if getattr(r, "per_namespace", False))
        ts = triples(rules) - per_ns
        cluster = {t for t in ts if t[1].split("/")[0] not in ns_res}
        local = ts - cluster
        labels = {"app.kubernetes.io/name": svc}
        subject = [{"kind": "ServiceAccount", "name": svc, "namespace": "kinference-system"}]
        name = f"kinference-{svc}"
        if cluster:
            docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                         "metadata": {"name": name, "labels": labels}, "rules": _rules(cluster)})
            docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                         "metadata": {"name": name, "labels": labels},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                         "subjects": subject})
        if local:
            docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                         "metadata": {"name": name, "labels": labels}, "rules": _rules(local)})
            docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                         "metadata": {"name": name, "labels": labels},
                         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                         "subjects": subject})
        if per_ns:
            role = per_namespace_role(svc)
            docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                         "metadata": {"name": role, "labels": labels}, "rules": _rules(per_ns)})
            docs.append(role_binding(svc, None))
    return docs


def render() -> str:
    head = ("# GENERATED by `.venv/bin/python deploy/k8s/rbac_gen.py` from SERVICE_RULES in\n"
            "# libs/kinference_common/kube/rbac.py: exactly the API calls each service makes.\n"
            "# Do not edit; change the rules in code and regenerate.\n")
    return head + yaml.safe_dump_all(documents(), sort_keys=False, width=120)


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="rbac_gen.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when the file differs; write nothing")
    args = p.parse_args(argv)  # --help prints the page and writes nothing
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run .venv/bin/python deploy/k8s/rbac_gen.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
