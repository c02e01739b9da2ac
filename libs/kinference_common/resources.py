"""Typed models of every resource Kinference reads, as msgspec Structs.

Field names follow the seeds (``../shared/seeds``) and ``spec/RESOURCES.md``
exactly; Python attribute names are snake_case and the wire names camelCase.
Decoding is strict about types, enums and required fields (as the API server's
schema is). Unknown fields are *not* errors here: msgspec ignores them, and
:func:`kinference_common.manifests.unknown_fields` reports them so that the
policy compiler can warn (``UnknownField``) about them in pools, worker sets
and providers; in a policy, where an ignored field would change where
requests go, :mod:`kinference_common.manifests` makes them errors.

Where the seeds say a missing field is a *resolution* outcome rather than a
schema error, the field is optional here:

- ``InferencePool.spec.destinations[].kind``: a missing kind makes that
  destination ``Incomplete`` (seed 002), not the manifest invalid.
- ``InferenceProvider.spec.url`` / ``auth`` / ``models``: a provider missing
  one is ``Incomplete`` in the pools that list it (RESOURCES.md).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct, field

from kinference_common import API_GROUP, API_VERSION

GIE_GROUPS = ("inference.networking.x-k8s.io", "llm-d.ai")
GATEWAY_GROUP = "gateway.networking.k8s.io"
#: the Inference Extension's own InferencePool (v1)
GIE_POOL_GROUP = "inference.networking.k8s.io"
GIE_POOL_VERSION = "v1"
#: annotations that make a GIE InferencePool Kinference's (docs/kubernetes.md)
POLICY_ANNOTATION = f"{API_GROUP}/policy"
DESTINATIONS_ANNOTATION = f"{API_GROUP}/destinations"

Name = Annotated[str, Meta(min_length=1, max_length=253)]
LabelMap = Annotated[dict[str, str], Meta(max_length=64)]
BackendType = Literal["Local", "Provider"]


class _Model(Struct, kw_only=True, omit_defaults=True, rename="camel"):
    """Base: keyword-only, camelCase on the wire, defaults omitted on encode."""


# --------------------------------------------------------------------- metadata


class ObjectMeta(_Model, kw_only=True):
    name: Name
    namespace: str = "default"
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    creation_timestamp: str | None = None
    generation: int | None = None
    uid: str | None = None
    resource_version: str | None = None


class LabelSelector(_Model, kw_only=True):
    match_labels: LabelMap = {}


def selector_matches(selector: LabelSelector, labels: dict[str, str]) -> bool:
    """Kubernetes ``matchLabels`` semantics: every listed label present and equal."""
    return all(labels.get(k) == v for k, v in selector.match_labels.items())


# ------------------------------------------------------------- InferencePolicy


class IntComparison(_Model, kw_only=True):
    greater_than: int | None = None
    less_than: int | None = None


class NumberComparison(_Model, kw_only=True):
    greater_than: float | None = None
    less_than: float | None = None


class DurationComparison(_Model, kw_only=True):
    """Compared against a duration signal; values like ``"800ms"``."""

    greater_than: str | None = None
    less_than: str | None = None


class HeaderMatch(_Model, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    value: str


StrOrList = Union[str, list[str]]


class RequestMatch(_Model, kw_only=True):
    """One ``matches`` entry (or an exclusion's ``if``): every field must hold."""

    model: StrOrList | None = None
    tenant: StrOrList | None = None
    tag: StrOrList | None = None
    objective: StrOrList | None = None
    priority: IntComparison | None = None
    prompt_tokens: IntComparison | None = None
    headers: list[HeaderMatch] | None = None


class BackendFilter(_Model, kw_only=True):
    type: BackendType | None = None
    names: list[str] | None = None


class CandidatePredicate(_Model, kw_only=True):
    """An exclusion's ``drop`` or a tier's ``backends``: every field must hold."""

    backend: BackendFilter | None = None
    queued_prompts: NumberComparison | None = None
    running_prompts: NumberComparison | None = None
    kv_cache_usage: NumberComparison | None = None
    gpu_utilization: NumberComparison | None = None
    gpu_memory_usage: NumberComparison | None = None
    predicted_ttft: DurationComparison | None = field(default=None, name="predictedTTFT")
    estimated_ttft: DurationComparison | None = field(default=None, name="estimatedTTFT")
    error_rate: NumberComparison | None = None
    in_flight: NumberComparison | None = None


class ModelNames(_Model, kw_only=True):
    names: list[str]


class ConsiderEntry(_Model, kw_only=True):
    models: ModelNames | None = None
    backend: BackendFilter | None = None


class Exclusion(_Model, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    if_: RequestMatch | None = field(default=None, name="if")
    drop: CandidatePredicate


MinimizeSignal = Literal["PredictedTTFT", "EstimatedTTFT", "QueuedPrompts", "KVCacheUsage", "InFlight"]
TieBreak = Literal["LeastInFlight", "PrefixAffinity", "Random"]


class SelectTier(_Model, kw_only=True):
    type: BackendType
    backends: CandidatePredicate | None = None
    minimize: MinimizeSignal | None = None
    order: list[str] | None = None


class Route(_Model, kw_only=True):
    #: absent: the requested model's destinations; when given, at least one entry
    #: (an empty list would admit no candidate: every request would meet onEmpty)
    consider: Annotated[list[ConsiderEntry], Meta(min_length=1)] | None = None
    exclude: list[Exclusion] | None = None
    #: at least one tier: a rule with none can never pick (every request it matches met its onEmpty)
    select: Annotated[list[SelectTier], Meta(min_length=1)]
    tie_break: list[TieBreak] | None = None
    on_empty: Literal["Reject", "FallThrough"] = "Reject"


class PolicyRule(_Model, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    matches: list[RequestMatch] | None = None
    route: Route


class InferencePolicySpec(_Model, kw_only=True):
    unmatched: Literal["ServeLocal", "Reject"] = "ServeLocal"
    rules: list[PolicyRule] = []


class InferencePolicy(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferencePolicy"]
    metadata: ObjectMeta
    spec: InferencePolicySpec = msgspec.field(default_factory=InferencePolicySpec)


# --------------------------------------------------------------- InferencePool


class PoolDestination(_Model, kw_only=True):
    group: str = API_GROUP
    kind: Literal["InferenceWorkerSet", "InferenceProvider"] | None = None
    name: str | None = None
    namespace: str | None = None
    selector: LabelSelector | None = None


class PolicyRef(_Model, kw_only=True):
    group: str = API_GROUP
    kind: str = "InferencePolicy"
    name: Name


class FlowControl(_Model, kw_only=True):
    """Opt-in per-pool queueing (RESOURCES.md, Flow control)."""

    max_queue_wait: str = "10s"
    max_queued: Annotated[int, Meta(ge=1)] = 1000


class InferencePoolSpec(_Model, kw_only=True):
    destinations: list[PoolDestination] | None = None
    # The pool reference says object; the guide writes a one-element list.
    # Both decode; the list form is checked (and warned about) by the compiler.
    policy_ref: PolicyRef | list[PolicyRef] | None = None
    flow_control: FlowControl | None = None


class InferencePool(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferencePool"]
    metadata: ObjectMeta
    spec: InferencePoolSpec = msgspec.field(default_factory=InferencePoolSpec)


# --------------------------------------------------------- InferenceWorkerSet


class WorkerSetModel(_Model, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    aliases: list[str] = []
    served_name: str | None = None
    context_window: Annotated[int, Meta(gt=0)] | None = None


class InferenceWorkerSetSpec(_Model, kw_only=True):
    model: WorkerSetModel
    engine: Literal["vLLM"] = "vLLM"
    selector: LabelSelector
    port: Annotated[int, Meta(ge=1, le=65535)] = 8000


class InferenceWorkerSet(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferenceWorkerSet"]
    metadata: ObjectMeta
    spec: InferenceWorkerSetSpec


# ---------------------------------------------------------- InferenceProvider


class SecretKeyRef(_Model, kw_only=True):
    name: Name
    key: Annotated[str, Meta(min_length=1)]


class ProviderAuth(_Model, kw_only=True):
    secret_ref: SecretKeyRef | None = None


class ProviderModel(_Model, kw_only=True):
    name: Annotated[str, Meta(min_length=1)]
    upstream_name: str | None = None
    context_window: Annotated[int, Meta(gt=0)] | None = None


class ProviderLimits(_Model, kw_only=True):
    max_concurrency: Annotated[int, Meta(ge=1)] | None = None
    requests_per_minute: Annotated[int, Meta(ge=1)] | None = None


class ProviderTimeouts(_Model, kw_only=True):
    connect: str | None = None
    first_token: str | None = None


class InferenceProviderSpec(_Model, kw_only=True):
    url: str | None = None
    auth: ProviderAuth | None = None
    models: list[ProviderModel] | None = None
    limits: ProviderLimits | None = None
    timeouts: ProviderTimeouts | None = None


class InferenceProvider(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferenceProvider"]
    metadata: ObjectMeta
    spec: InferenceProviderSpec = msgspec.field(default_factory=InferenceProviderSpec)


# ------------------------------------------------- Gateway API: ReferenceGrant


class ReferenceGrantFrom(_Model, kw_only=True):
    group: str
    kind: str
    namespace: str


class ReferenceGrantTo(_Model, kw_only=True):
    group: str
    kind: str
    name: str | None = None


class ReferenceGrantSpec(_Model, kw_only=True):
    from_: list[ReferenceGrantFrom] = field(name="from")
    to: list[ReferenceGrantTo]


class ReferenceGrant(_Model, kw_only=True):
    api_version: str
    kind: Literal["ReferenceGrant"]
    metadata: ObjectMeta
    spec: ReferenceGrantSpec


# ------------------------------------------------------ Gateway API: HTTPRoute


class ParentReference(_Model, kw_only=True):
    group: str = GATEWAY_GROUP
    kind: str = "Gateway"
    namespace: str | None = None
    name: Name
    section_name: str | None = None
    port: int | None = None


class BackendRef(_Model, kw_only=True):
    group: str = ""
    kind: str = "Service"
    name: Name
    namespace: str | None = None
    port: int | None = None
    weight: int | None = None


class HTTPPathMatch(_Model, kw_only=True):
    type: str = "PathPrefix"  # Exact | PathPrefix | RegularExpression
    value: str = "/"


class HTTPNameValueMatch(_Model, kw_only=True):
    """A header or query parameter match (Gateway API: ``Exact`` or ``RegularExpression``)."""

    name: str
    value: str
    type: str = "Exact"


class HTTPRouteMatch(_Model, kw_only=True):
    #: None = PathPrefix "/" (Gateway API's default)
    path: HTTPPathMatch | None = None
    headers: list[HTTPNameValueMatch] = []
    query_params: list[HTTPNameValueMatch] = []
    method: str | None = None


class HTTPRouteRule(_Model, kw_only=True):
    #: no entry = every path (one PathPrefix "/" match)
    matches: list[HTTPRouteMatch] = []
    backend_refs: list[BackendRef] = []


class HTTPRouteSpec(_Model, kw_only=True):
    parent_refs: list[ParentReference] = []
    hostnames: list[str] = []
    rules: list[HTTPRouteRule] = []


class HTTPRoute(_Model, kw_only=True):
    api_version: str
    kind: Literal["HTTPRoute"]
    metadata: ObjectMeta
    spec: HTTPRouteSpec = msgspec.field(default_factory=HTTPRouteSpec)


# ------------------------------- Gateway API Inference Extension (seed 003)


class PoolObjectReference(_Model, kw_only=True):
    group: str = "inference.networking.k8s.io"
    kind: str = "InferencePool"
    name: Name


class InferenceObjectiveSpec(_Model, kw_only=True):
    priority: int | None = None
    pool_ref: PoolObjectReference


class InferenceObjective(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferenceObjective"]
    metadata: ObjectMeta
    spec: InferenceObjectiveSpec


class ModelMatch(_Model, kw_only=True):
    type: Literal["Exact"] = "Exact"
    value: Annotated[str, Meta(min_length=1)]


class RewriteMatch(_Model, kw_only=True):
    model: ModelMatch | None = None


class TargetModel(_Model, kw_only=True):
    weight: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    model_rewrite: str


class InferenceModelRewriteRule(_Model, kw_only=True):
    matches: list[RewriteMatch] = []
    targets: Annotated[list[TargetModel], Meta(min_length=1)]


class InferenceModelRewriteSpec(_Model, kw_only=True):
    pool_ref: PoolObjectReference
    rules: list[InferenceModelRewriteRule] = []


class InferenceModelRewrite(_Model, kw_only=True):
    api_version: str
    kind: Literal["InferenceModelRewrite"]
    metadata: ObjectMeta
    spec: InferenceModelRewriteSpec


# ------------------------- Inference Extension InferencePool (inference.networking.k8s.io/v1)
# The fields of GIE api/v1/inferencepool_types.go and shared_types.go, with
# their validation; the CRD in deploy/k8s/crds is generated from these.

#: Kubernetes' DNS-1123 label (a namespace) and subdomain (an object's name, an API group)
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = DNS1123_LABEL + r"(\." + DNS1123_LABEL + r")*"

PortNumber = Annotated[int, Meta(ge=1, le=65535)]
GieGroup = Annotated[str, Meta(max_length=253, pattern=rf"^$|^{DNS1123_SUBDOMAIN}$")]
GieKind = Annotated[str, Meta(min_length=1, max_length=63, pattern=r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$")]
GieNamespace = Annotated[str, Meta(min_length=1, max_length=63, pattern=rf"^{DNS1123_LABEL}$")]
GieControllerName = Annotated[str, Meta(min_length=1, max_length=253, pattern=(
    rf"^{DNS1123_SUBDOMAIN}\/[A-Za-z0-9\/\-._~%!$&'()*+,;=:]+$"))]


class GiePort(_Model, kw_only=True):
    number: PortNumber


class GieLabelSelector(_Model, kw_only=True):
    match_labels: Annotated[dict[str, str], Meta(min_length=1, max_length=64)]


class EndpointPickerRef(_Model, kw_only=True):
    group: GieGroup = ""
    kind: GieKind = "Service"
    name: Name
    port: GiePort | None = None
    failure_mode: Literal["FailOpen", "FailClose"] = "FailClose"


class GieInferencePoolSpec(_Model, kw_only=True):
    selector: GieLabelSelector
    target_ports: Annotated[list[GiePort], Meta(min_length=1, max_length=8)]
    app_protocol: Literal["http", "kubernetes.io/h2c"] = "http"
    endpoint_picker_ref: EndpointPickerRef | None = None


class GieInferencePool(_Model, kw_only=True):
    """The Inference Extension's InferencePool. Kinference serves it when it
    carries the ``kinference.buoyant.io/policy`` annotation (docs/kubernetes.md)."""

    api_version: str
    kind: Literal["InferencePool"]
    metadata: ObjectMeta
    spec: GieInferencePoolSpec


def is_kinference_gie_pool(pool: GieInferencePool) -> bool:
    """A GIE pool is Kinference's when it names a Kinference policy; any other
    is another picker's and left alone."""
    return POLICY_ANNOTATION in pool.metadata.annotations


# ------------------------------------------- Gateway API: Gateway, GatewayClass


class GatewaySpec(_Model, kw_only=True):
    gateway_class_name: Name


class Gateway(_Model, kw_only=True):
    api_version: str
    kind: Literal["Gateway"]
    metadata: ObjectMeta
    spec: GatewaySpec


class GatewayClassSpec(_Model, kw_only=True):
    controller_name: str


class GatewayClass(_Model, kw_only=True):
    """Cluster-scoped; its ``metadata.namespace`` is ignored."""

    api_version: str
    kind: Literal["GatewayClass"]
    metadata: ObjectMeta
    spec: GatewayClassSpec


# -------------------------------------------- core: Service (an EPP reference)


class ServicePort(_Model, kw_only=True):
    name: str | None = None
    port: int


class ServiceSpec(_Model, kw_only=True):
    type: str = "ClusterIP"
    ports: list[ServicePort] = []


class Service(_Model, kw_only=True):
    """Only what resolving an ``endpointPickerRef`` needs."""

    api_version: str
    kind: Literal["Service"]
    metadata: ObjectMeta
    spec: ServiceSpec = msgspec.field(default_factory=ServiceSpec)


Resource = Union[
    InferencePolicy,
    InferencePool,
    InferenceWorkerSet,
    InferenceProvider,
    ReferenceGrant,
    HTTPRoute,
    InferenceObjective,
    InferenceModelRewrite,
    GieInferencePool,
    Gateway,
    GatewayClass,
    Service,
]

#: (apiVersion group, kind) -> Struct. The Inference Extension kinds are read
#: in both groups they have lived in (RESOURCES.md).
KINDS: dict[tuple[str, str], type[Resource]] = {
    (API_GROUP, "InferencePolicy"): InferencePolicy,
    (API_GROUP, "InferencePool"): InferencePool,
    (API_GROUP, "InferenceWorkerSet"): InferenceWorkerSet,
    (API_GROUP, "InferenceProvider"): InferenceProvider,
    (GATEWAY_GROUP, "ReferenceGrant"): ReferenceGrant,
    (GATEWAY_GROUP, "HTTPRoute"): HTTPRoute,
    **{(g, "InferenceObjective"): InferenceObjective for g in GIE_GROUPS},
    **{(g, "InferenceModelRewrite"): InferenceModelRewrite for g in GIE_GROUPS},
    (GIE_POOL_GROUP, "InferencePool"): GieInferencePool,
    (GATEWAY_GROUP, "Gateway"): Gateway,
    (GATEWAY_GROUP, "GatewayClass"): GatewayClass,
    ("", "Service"): Service,
}

#: Groups whose every kind Kinference defines: any other kind there is an error.
OWN_GROUPS = frozenset({API_GROUP})

#: (group, kind) -> the versions an apiVersion may name (the API server
#: converts between them; the first is the one Kinference watches). Other
#: projects' kinds list every version their CRDs have served, so that a
#: manifest a cluster accepts is never refused here.
SERVED_VERSIONS: dict[tuple[str, str], tuple[str, ...]] = {
    **{(API_GROUP, k): (API_VERSION,) for (g, k) in KINDS if g == API_GROUP},
    (GATEWAY_GROUP, "HTTPRoute"): ("v1", "v1beta1", "v1alpha2"),
    (GATEWAY_GROUP, "Gateway"): ("v1", "v1beta1", "v1alpha2"),
    (GATEWAY_GROUP, "GatewayClass"): ("v1", "v1beta1", "v1alpha2"),
    (GATEWAY_GROUP, "ReferenceGrant"): ("v1beta1", "v1alpha2"),
    **{(g, "InferenceObjective"): ("v1alpha2",) for g in GIE_GROUPS},
    **{(g, "InferenceModelRewrite"): ("v1alpha2",) for g in GIE_GROUPS},
    (GIE_POOL_GROUP, "InferencePool"): (GIE_POOL_VERSION,),
    ("", "Service"): ("v1",),
}

#: Printer-column short names (seeds; RESOURCES.md).
SHORT_NAMES = {
    "InferencePolicy": "infpol",
    "InferencePool": "infpool",
    "InferenceWorkerSet": "infws",
    "InferenceProvider": "infprov",
}
