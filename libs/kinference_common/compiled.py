"""The executable form of a pool and its policy.

The policy compiler produces one :class:`CompiledPool` per InferencePool; it
is published on NATS (``kinference.config.<ns>.<pool>``, KV ``kinference-config``)
and is everything the decision engine needs: no YAML, no Kubernetes objects.

What compilation has already done, so the engine never does it per request:

- model names are canonical (aliases resolved with the pool's aliases);
- tags are resolved to classifiers; unknown tags removed (an emptied tag list
  can never hold, see :class:`RequestTest`);
- durations are seconds (``"800ms"`` -> ``0.8``);
- terms that compile to nothing are gone: duplicate rules, class-scoped
  exclusions, out-of-range comparisons (each with a warning in the status);
- tiers are checked; ``minimize`` signals that do not fit the tier's type are
  defaulted to that type's TTFT signal.

Semantics of ``None`` versus empty lists, everywhere here: ``None`` means "no
constraint"; an empty list means "nothing can satisfy it".
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

SCHEMA_VERSION = 1

BackendType = Literal["Local", "Provider"]

#: Every candidate signal a policy can compare on (POLICY.md section 4, ``drop``).
Signal = Literal[
    "queuedPrompts",
    "runningPrompts",
    "kvCacheUsage",
    "gpuUtilization",
    "gpuMemoryUsage",
    "predictedTTFT",
    "estimatedTTFT",
    "errorRate",
    "inFlight",
]

#: Signals meaningful for one kind of candidate only ("class-scoped").
SIGNAL_SCOPE: dict[str, BackendType | None] = {
    "queuedPrompts": "Local",
    "runningPrompts": "Local",
    "kvCacheUsage": "Local",
    "gpuUtilization": "Local",
    "gpuMemoryUsage": "Local",
    "predictedTTFT": "Local",
    "estimatedTTFT": "Provider",
    "errorRate": "Provider",
    "inFlight": None,
}

#: Signals whose value is a fraction in 0..1.
FRACTION_SIGNALS = frozenset({"kvCacheUsage", "gpuUtilization", "gpuMemoryUsage", "errorRate"})
#: Signals written as durations in manifests (seconds here).
DURATION_SIGNALS = frozenset({"predictedTTFT", "estimatedTTFT"})
#: Signals that change with load: an exclusion on one makes a rejection
#: ``no_capacity`` (more capacity could change the outcome), not ``policy_rejected``.
LIVE_SIGNALS = frozenset(SIGNAL_SCOPE)

Minimize = Literal["PredictedTTFT", "EstimatedTTFT", "QueuedPrompts", "KVCacheUsage", "InFlight"]
MINIMIZE_SCOPE: dict[str, BackendType | None] = {
    "PredictedTTFT": "Local",
    "EstimatedTTFT": "Provider",
    "QueuedPrompts": "Local",
    "KVCacheUsage": "Local",
    "InFlight": None,
}
TieBreak = Literal["LeastInFlight", "PrefixAffinity", "Random"]


class _C(Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """Base of compiled types: immutable, keyword-only, camelCase JSON."""


class Range(_C, kw_only=True):
    """``greaterThan`` / ``lessThan`` (both exclusive). A comparison with an
    unknown value is false."""

    greater_than: float | None = None
    less_than: float | None = None

    def holds(self, value: float | None) -> bool:
        if value is None:
            return False
        if self.greater_than is not None and not value > self.greater_than:
            return False
        if self.less_than is not None and not value < self.less_than:
            return False
        return True


class SignalTest(_C, kw_only=True):
    signal: Signal
    range: Range


class CandidateTest(_C, kw_only=True):
    """A candidate predicate (an exclusion's ``drop``, a tier's ``backends``):
    every present field must hold."""

    backend_type: BackendType | None = None
    #: destination names; None = any, [] = none (all names were unknown)
    backend_names: list[str] | None = None
    signals: list[SignalTest] = []


class Header(_C, kw_only=True):
    name: str  # lower-cased
    value: str


class RequestTest(_C, kw_only=True):
    """One ``matches`` entry, or an exclusion's ``if``: every present field must
    hold. For list fields, None = no constraint, [] = never holds."""

    models: list[str] | None = None  # canonical names
    tenants: list[str] | None = None
    tags: list[str] | None = None  # holds when the request carries any of them
    objectives: list[str] | None = None
    priority: Range | None = None
    prompt_tokens: Range | None = None
    headers: list[Header] = []

    @property
    def non_tag_only(self) -> bool:
        return self.tags is None


class Consider(_C, kw_only=True):
    """One ``consider`` entry: candidates serving one of ``models`` (None = the
    requested model), narrowed by backend type and names."""

    models: list[str] | None = None
    backend_type: BackendType | None = None
    backend_names: list[str] | None = None


class CompiledExclusion(_C, kw_only=True):
    name: str
    term: str  # e.g. "rules[0].route.exclude[1]"
    when: RequestTest | None = None  # the ``if``; None = always
    drop: CandidateTest
    #: True when ``drop`` compares a live signal (see LIVE_SIGNALS).
    live: bool = False


class CompiledTier(_C, kw_only=True):
    index: int
    term: str
    type: BackendType
    backends: CandidateTest | None = None
    minimize: Minimize | None = None
    #: destination names in preference order; the tier sees only those
    order: list[str] | None = None
    #: an earlier tier with no subset covers the same type: this tier never picks
    unreachable: bool = False


class CompiledRule(_C, kw_only=True):
    name: str
    index: int  # position in spec.rules
    term: str  # "rules[<index>]"
    matches: list[RequestTest] | None = None  # None = catch-all
    consider: list[Consider] | None = None  # None = the requested model everywhere
    exclude: list[CompiledExclusion] = []
    select: list[CompiledTier] = []
    tie_break: list[TieBreak] = []
    on_empty: Literal["Reject", "FallThrough"] = "Reject"
    requires_classifiers: list[str] = []
    #: follows a catch-all whose onEmpty is Reject: never fires
    shadowed: bool = False


class CompiledPolicy(_C, kw_only=True):
    namespace: str
    #: "" for the default policy (no policyRef, or the policy is missing)
    name: str
    unmatched: Literal["ServeLocal", "Reject"] = "ServeLocal"
    rules: list[CompiledRule] = []
    generation: int | None = None
    #: classifiers the router runs in its own process instead of asking the
    #: classifier service over NATS (the compiler's ``--in-process-classifier``)
    in_process_classifiers: list[str] = []

    @property
    def is_default(self) -> bool:
        return not self.name


DEFAULT_POLICY_RULE_NAME = "unmatched"


class SecretRef(_C, kw_only=True):
    name: str
    key: str


class ServedModel(_C, kw_only=True):
    #: canonical, client-facing name
    name: str
    #: the name the destination itself expects in the body
    #: (worker set ``servedName``, provider ``upstreamName``)
    served_name: str
    context_window: int | None = None
    #: other names clients may use for this model (worker sets only)
    aliases: list[str] = []


class ProviderSettings(_C, kw_only=True):
    url: str
    secret_ref: SecretRef
    max_concurrency: int | None = None
    requests_per_minute: int | None = None
    connect_timeout_seconds: float | None = None
    first_token_timeout_seconds: float | None = None


class Destination(_C, kw_only=True):
    """A resolved pool destination: a worker set (Local) or a provider."""

    type: BackendType
    name: str
    namespace: str
    #: one entry for a worker set; one per model for a provider
    models: list[ServedModel]
    # Local
    selector: dict[str, str] | None = None
    port: int | None = None
    engine: str | None = None
    # Provider
    provider: ProviderSettings | None = None

    @property
    def backend(self) -> str:
        return f"{self.type}/{self.name}"


class PoolModel(_C, kw_only=True):
    """``status.models[]`` of the pool."""

    name: str
    aliases: list[str] = []
    served_by: list[str] = []
    context_window: dict[str, int] | None = None  # {"min": .., "max": ..}


class RewriteTarget(_C, kw_only=True):
    model: str
    weight: int


class CompiledRewrite(_C, kw_only=True):
    """One InferenceModelRewrite rule, in precedence order within the pool."""

    source: str  # "<group> <namespace>/<name> rules[<i>]"
    #: the model it matches exactly; None = a generic rule (matches any model)
    match_model: str | None = None
    targets: list[RewriteTarget] = []


class CompiledFlowControl(_C, kw_only=True):
    max_queue_wait_seconds: float
    max_queued: int


class RouteValueMatch(_C, kw_only=True):
    """A header (name lower-cased) or query parameter match of an HTTPRoute."""

    name: str
    value: str
    type: Literal["Exact", "RegularExpression"] = "Exact"


class RoutePath(_C, kw_only=True):
    """One HTTPRoute match (Gateway API semantics): the path, and the method,
    headers and query parameters that must match too (all of them)."""

    type: Literal["Exact", "PathPrefix", "RegularExpression"] = "PathPrefix"
    value: str = "/"
    method: str | None = None
    headers: list[RouteValueMatch] = []
    query_params: list[RouteValueMatch] = []


class CompiledRoute(_C, kw_only=True):
    """An HTTPRoute whose rules name this pool as a backendRef: the hostnames
    and paths for which a router serving several pools picks this pool."""

    #: ``namespace/name`` of the HTTPRoute
    route: str
    #: empty = any host; ``*.example.com`` = any subdomain
    hostnames: list[str] = []
    #: the path matches of the rules that name the pool (a rule without matches: PathPrefix "/")
    paths: list[RoutePath] = []


class CompiledPool(_C, kw_only=True):
    schema_version: int = SCHEMA_VERSION
    namespace: str
    name: str
    #: content hash; changes whenever anything below changes
    revision: str = ""
    destinations: list[Destination] = []
    models: list[PoolModel] = []
    #: every accepted model name (canonical and alias) -> canonical name
    aliases: dict[str, str] = {}
    policy: CompiledPolicy
    rewrites: list[CompiledRewrite] = []
    #: InferenceObjective name -> priority
    objectives: dict[str, int] = {}
    flow_control: CompiledFlowControl | None = None
    #: HTTPRoutes naming this pool as a backendRef (routers serving several pools match on them)
    routes: list[CompiledRoute] = []


_encoder = msgspec.json.Encoder()
_pool_decoder = msgspec.json.Decoder(CompiledPool)


def encode_pool(pool: CompiledPool) -> bytes:
    return _encoder.encode(pool)


def decode_pool(data: bytes) -> CompiledPool:
    return _pool_decoder.decode(data)
