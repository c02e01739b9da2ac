"""rbac.SERVICE_RULES names real resources and verbs, and covers what the
compiler's informers need (the tests of each service check the calls it
really made against the fake API server)."""

from __future__ import annotations

from kinference_common.kube import kinds
from kinference_common.kube.rbac import SERVICE_RULES, allowed, not_allowed, role_rules
from kinference_simulators.kubeapi import FakeKubeAPI

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


def test_rules_name_served_resources_and_real_verbs(repo_root):
    api = FakeKubeAPI([repo_root / "deploy" / "k8s" / "crds"])
    served = {(t.group, t.plural) for t in api.types} | {(t.group, f"{t.plural}/status") for t in api.types
                                                         if t.status_subresource}
    for service, rules in SERVICE_RULES.items():
        for rule in rules:
            assert set(rule.verbs) <= VERBS, (service, rule)
            for g in rule.api_groups:
                for res in rule.resources:
                    assert (g, res) in served, (service, g, res)


def test_compiler_rules_cover_its_informers_and_writes():
    for k in kinds.COMPILER_INPUTS:
        for verb in ("list", "watch"):
            assert allowed("policy-compiler", verb, k.group, k.plural), k
    assert allowed("policy-compiler", "patch", "kinference.buoyant.io", "inferencepools/status")
    assert not allowed("policy-compiler", "patch", "kinference.buoyant.io", "inferenceproviders/status")
    assert not allowed("policy-compiler", "list", "", "secrets")
    assert not_allowed("policy-compiler", {("delete", "kinference.buoyant.io", "inferencepolicies")}) == [
        ("delete", "kinference.buoyant.io", "inferencepolicies")]


def test_role_rules_are_role_shaped():
    rules = role_rules("policy-compiler")
    assert all(set(r) == {"apiGroups", "resources", "verbs"} for r in rules)
    assert {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "verbs": ["create", "get", "update"]} in rules
