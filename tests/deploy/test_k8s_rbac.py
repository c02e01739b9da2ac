"""The Roles and ClusterRoles in deploy/k8s grant each service exactly the API
calls its code declares in SERVICE_RULES (libs/kinference_common/kube/rbac.py):
no more (least privilege), no less (the service would fail with 403)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from kinference_common.kube import rbac

from .k8s import K8S, SERVICES, build, of_kind

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
    assert rbac_gen.main(["--check"]) == 0, "regenerate: python deploy/k8s/rbac_gen.py"


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
