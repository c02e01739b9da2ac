"""The resources Kinference reads and writes."""

from __future__ import annotations

from dataclasses import dataclass

from kinference_common import API_GROUP, API_VERSION
from kinference_common.resources import GATEWAY_GROUP, GIE_GROUPS, GIE_POOL_GROUP, GIE_POOL_VERSION


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


INFERENCE_POLICY = Kind(API_GROUP, API_VERSION, "inferencepolicies", "InferencePolicy")
INFERENCE_POOL = Kind(API_GROUP, API_VERSION, "inferencepools", "InferencePool")
INFERENCE_WORKER_SET = Kind(API_GROUP, API_VERSION, "inferenceworkersets", "InferenceWorkerSet")
INFERENCE_PROVIDER = Kind(API_GROUP, API_VERSION, "inferenceproviders", "InferenceProvider")
GIE_INFERENCE_POOL = Kind(GIE_POOL_GROUP, GIE_POOL_VERSION, "inferencepools", "InferencePool")
GATEWAY = Kind(GATEWAY_GROUP, "v1", "gateways", "Gateway")
GATEWAY_CLASS = Kind(GATEWAY_GROUP, "v1", "gatewayclasses", "GatewayClass", namespaced=False)
SERVICE = Kind("", "v1", "services", "Service")
HTTP_ROUTE = Kind(GATEWAY_GROUP, "v1", "httproutes", "HTTPRoute")
REFERENCE_GRANT = Kind(GATEWAY_GROUP, "v1beta1", "referencegrants", "ReferenceGrant")
INFERENCE_OBJECTIVES = tuple(Kind(g, "v1alpha2", "inferenceobjectives", "InferenceObjective") for g in GIE_GROUPS)
INFERENCE_MODEL_REWRITES = tuple(
    Kind(g, "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite") for g in GIE_GROUPS)
POD = Kind("", "v1", "pods", "Pod")
SECRET = Kind("", "v1", "secrets", "Secret")
EVENT = Kind("events.k8s.io", "v1", "events", "Event")
LEASE = Kind("coordination.k8s.io", "v1", "leases", "Lease")

#: what the policy compiler compiles, in the order it reads them
COMPILER_INPUTS: tuple[Kind, ...] = (
    INFERENCE_POLICY, INFERENCE_POOL, INFERENCE_WORKER_SET, INFERENCE_PROVIDER, HTTP_ROUTE, REFERENCE_GRANT,
    *INFERENCE_OBJECTIVES, *INFERENCE_MODEL_REWRITES,
    GIE_INFERENCE_POOL, GATEWAY, GATEWAY_CLASS, SERVICE,
)


def kind_of(group: str, kind: str) -> Kind | None:
    for k in (*COMPILER_INPUTS, POD, SECRET, EVENT, LEASE):
        if k.group == group and k.kind == kind:
            return k
    return None
