"""The Roles and ClusterRoles in deploy/k8s grant each service exactly the API
calls its code declares in SERVICE_RULES (libs/kinference_common/kube/rbac.py):
no more (least privilege), no less (the service would fail with 403)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from kinference_common.kube import rbac

from .k8s import K8S, SERVICES, build, container, of_kind

spec = importlib.util.spec_from_file_location("rbac_gen", K8S / "rbac_gen.py")
rbac_gen = importlib.util.module_from_spec(spec)
sys.modules["rbac_gen"] = rbac_gen
spec.loader.exec_module(rbac_gen)

API_USERS = ("policy-compiler", "telemetry-collector", "router")


def granted(service: str) -> set[tuple[str, str, str]]:
    """What the built manifests grant the service's ServiceAccount, via any binding."""
    docs = build(K8S)
    roles = {("ClusterRole", n): d for n, d in of_kind(docs, "ClusterRole").items()}
    roles |= {("Role", n): d for n, d in of_kind(docs, "Role").items()}
    out: set[tuple[str, str, str]] = set()
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for b in of_kind(docs, kind).values():
            if any(s["kind"] == "ServiceAccount" and s["name"] == service and s["namespace"] == "kinference-system"
                   for s in b["subjects"]):
                role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
                out |= rbac_gen.triples(role["rules"])
    return out


def test_the_committed_rbac_is_generated_from_the_rules() -> None:
    assert rbac_gen.main(["--check"]) == 0, "regenerate: .venv/bin/python deploy/k8s/rbac_gen.py"


@pytest.mark.parametrize("service", API_USERS)
def test_each_service_gets_exactly_its_declared_rules(service: str) -> None:
    declared = rbac_gen.triples(rbac.SERVICE_RULES[service])
    assert declared, f"SERVICE_RULES has no rules for {service}"
    assert granted(service) == declared


def test_every_service_with_rules_has_manifests_and_no_wildcards() -> None:
    assert set(rbac.SERVICE_RULES) <= set(API_USERS)
    for service in API_USERS:
        for g, res, verb in granted(service):
            assert "*" not in (g, res, verb), (service, g, res, verb)


def test_leases_only_in_the_namespace() -> None:
    docs = build(K8S)
    for role in of_kind(docs, "ClusterRole").values():
        assert all("leases" not in r["resources"] for r in role["rules"])
    for role in of_kind(docs, "Role").values():
        assert role["metadata"]["namespace"] == "kinference-system"


def test_the_classifier_has_no_api_access() -> None:
    assert granted("classifier") == set()
    docs = build(K8S)
    pod = of_kind(docs, "Deployment")["classifier"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    for s in SERVICES:
        assert of_kind(docs, "ServiceAccount")[s]["automountServiceAccountToken"] is False


def test_a_rule_shape_change_is_still_understood() -> None:
    """The generator reads rules as named tuples, dataclasses or Role dicts."""
    as_dict = [{"apiGroups": ["a"], "resources": ["x", "y"], "verbs": ["get"]}]
    assert rbac_gen.triples(as_dict) == {("a", "x", "get"), ("a", "y", "get")}
    assert rbac_gen.triples([(("a",), ("x",), ("get", "list"))]) == {("a", "x", "get"), ("a", "x", "list")}


OVERLAYS = {"base": K8S, "example": K8S / "overlays" / "example", "gateway": K8S / "overlays" / "gateway"}


def watched_namespaces(deployment: dict, monkeypatch: pytest.MonkeyPatch) -> set[str] | None:
    """The namespaces whose Secrets a router Deployment watches, read as the router
    reads its flags (None: not a router in Kubernetes mode)."""
    from kinference_router.__main__ import parse_args
    from kinference_router.kube_secrets import secret_namespaces

    c = container(deployment)
    if c.get("command") != ["kinference-router"]:
        return None
    args = parse_args(c.get("args", []))
    if args.source != "kubernetes":
        return None
    monkeypatch.setenv("POD_NAMESPACE", deployment["metadata"]["namespace"])  # the downward API's value
    names = secret_namespaces(args.secret_namespaces)
    assert names is not None, "a router watches every namespace's Secrets ('*'): that needs a ClusterRoleBinding"
    return set(names)


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_secrets_are_readable_exactly_where_each_router_watches_them(overlay: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No ClusterRoleBinding grants Secrets; every router (and Endpoint Picker)
    Deployment has a RoleBinding of kinference-router-secrets in each namespace
    of its --secret-namespaces, and in no other."""
    docs = build(OVERLAYS[overlay])
    cluster_roles = of_kind(docs, "ClusterRole")
    for b in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        rules = cluster_roles[b["roleRef"]["name"]]["rules"]
        assert not any({"secrets", "*"} & set(r["resources"]) for r in rules), b["metadata"]["name"]
    role = rbac_gen.per_namespace_role("router")
    assert rbac_gen.triples(cluster_roles[role]["rules"]) == rbac_gen.triples(rbac.SERVICE_RULES["router"])
    routers = 0
    for d in (d for d in docs if d["kind"] == "Deployment"):
        watched = watched_namespaces(d, monkeypatch)
        if watched is None:
            continue
        routers += 1
        sa = (d["spec"]["template"]["spec"]["serviceAccountName"], d["metadata"]["namespace"])
        bound = {b["metadata"]["namespace"] for b in docs if b["kind"] == "RoleBinding"
                 and b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
                 and any((s["name"], s["namespace"]) == sa for s in b["subjects"] if s["kind"] == "ServiceAccount")}
        assert bound == watched, (d["metadata"]["name"], "RoleBindings in", bound, "--secret-namespaces", watched)
    assert routers == {"base": 1, "example": 1, "gateway": 2}[overlay]
