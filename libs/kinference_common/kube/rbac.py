"""The Kubernetes API calls each service makes, as RBAC rules.

This is the single source of truth: the deployment's Roles and ClusterRoles
are written from it (and a test checks they match), and the tests record
every request a service makes against the fake API server and assert it is
covered by the service's rules here. A subresource is its own resource
(``inferencepolicies/status``), as in RBAC.

A rule marked ``per_namespace`` is granted namespace by namespace, never
cluster-wide: the deployment writes it as a ClusterRole that no
ClusterRoleBinding binds, and a RoleBinding of it in each namespace the
service is told to read (the router's Secrets, ``--secret-namespaces``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from kinference_common import API_GROUP
from kinference_common.resources import GATEWAY_GROUP, GIE_GROUPS, GIE_POOL_GROUP

READ = ("get", "list", "watch")


@dataclass(frozen=True)
class Rule:
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    #: granted only in chosen namespaces (a RoleBinding in each), never at the cluster scope
    per_namespace: bool = False

    def allows(self, verb: str, group: str, resource: str) -> bool:
        return (group in self.api_groups or "*" in self.api_groups) and \
            (resource in self.resources or "*" in self.resources) and \
            (verb in self.verbs or "*" in self.verbs)

    def to_dict(self) -> dict[str, list[str]]:
        """As a Role's ``rules[]`` entry."""
        return {"apiGroups": list(self.api_groups), "resources": list(self.resources), "verbs": list(self.verbs)}


SERVICE_RULES: dict[str, list[Rule]] = {
    "policy-compiler": [
        Rule((API_GROUP,), ("inferencepolicies", "inferencepools", "inferenceworkersets", "inferenceproviders"),
             READ),
        Rule((API_GROUP,), ("inferencepolicies/status", "inferencepools/status"), ("patch",)),
        Rule((GATEWAY_GROUP,), ("httproutes", "referencegrants", "gateways", "gatewayclasses"), READ),
        Rule(GIE_GROUPS, ("inferenceobjectives", "inferencemodelrewrites"), READ),
        # the Inference Extension's InferencePool (v1) and the Services its endpointPickerRef names
        Rule((GIE_POOL_GROUP,), ("inferencepools",), READ),
        Rule((GIE_POOL_GROUP,), ("inferencepools/status",), ("patch",)),
        Rule(("",), ("services",), READ),
        Rule(GIE_GROUPS, ("inferenceobjectives/status", "inferencemodelrewrites/status"), ("patch",)),
        Rule(("events.k8s.io",), ("events",), ("create", "get", "patch")),
        Rule(("coordination.k8s.io",), ("leases",), ("create", "get", "update")),
    ],
    # kube_discovery.py / kube_status.py: informers (list, watch) on worker sets,
    # providers and pods; status patches; a get of the object after a 409
    "telemetry-collector": [
        Rule((API_GROUP,), ("inferenceworkersets", "inferenceproviders"), READ),
        Rule((API_GROUP,), ("inferenceworkersets/status", "inferenceproviders/status"), ("patch",)),
        Rule(("",), ("pods",), ("list", "watch")),
    ],
    # kube_secrets.py: one informer on Secrets (provider keys, tenant keys) per namespace of
    # --secret-namespaces; bound in those namespaces only (docs/kubernetes-dataplane.md, "Which Secrets")
    "router": [
        Rule(("",), ("secrets",), ("list", "watch"), per_namespace=True),
    ],
}


def role_rules(service: str) -> list[dict[str, list[str]]]:
    """The service's rules as a Role's / ClusterRole's ``rules``."""
    return [r.to_dict() for r in SERVICE_RULES[service]]


def allowed(service: str, verb: str, group: str, resource: str) -> bool:
    return any(r.allows(verb, group, resource) for r in SERVICE_RULES[service])


def allowed_at(rules: Iterable[Rule], verb: str, group: str, resource: str, namespace: str | None,
               bound: Collection[str]) -> bool:
    """Whether ``rules`` allow the call in ``namespace`` (None: the cluster scope,
    all namespaces) when the per-namespace rules are bound in ``bound`` only."""
    return any(r.allows(verb, group, resource) and (not r.per_namespace or namespace in bound) for r in rules)


def not_allowed(service: str, used: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The (verb, group, resource) of ``used`` that the service's rules do not cover."""
    return sorted(u for u in used if not allowed(service, *u))
