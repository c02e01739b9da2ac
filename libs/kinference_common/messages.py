"""Every message on NATS, as msgspec Structs encoded as JSON (camelCase).

Rules for changing them (msgspec's schema-evolution guidance): add fields with
defaults, never change a field's type, never reuse a name. Each message has
``schemaVersion``; a reader accepts any version it knows and ignores unknown
fields, so an old router keeps working next to a new collector.

The compiled pool (``kinference.config.*``) lives in
:mod:`kinference_common.compiled`.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

SCHEMA_VERSION = 1


class _Msg(Struct, kw_only=True, omit_defaults=False, rename="camel"):
    schema_version: int = SCHEMA_VERSION


# ------------------------------------------------------------------ telemetry


class EndpointState(_Msg, kw_only=True):
    """One engine endpoint (a vLLM pod), as the collector last saw it.

    ``kinference.telemetry.endpoint.<ns>.<workerset>.<pod>`` and KV
    ``kinference-telemetry`` key ``endpoint.<ns>.<workerset>.<pod>``.
    Any engine signal may be None (unknown): a comparison on it is false.
    """

    namespace: str
    worker_set: str
    pod: str
    #: "host:port" of the OpenAI API (and /metrics)
    address: str
    #: canonical model of the worker set
    model: str = ""
    #: Kubernetes readiness and a successful recent scrape
    ready: bool = False
    #: Unix time (seconds) of the last successful scrape; consumers derive age
    scraped_at: float = 0.0
    #: requests waiting in the engine queue (vllm:num_requests_waiting)
    queued: int | None = None
    #: requests in the running batch (vllm:num_requests_running)
    running: int | None = None
    #: KV-cache use, 0..1
    kv_cache_usage: float | None = None
    #: tokens the KV cache holds (num_gpu_blocks * block_size)
    kv_capacity_tokens: int | None = None
    block_size: int | None = None
    #: prefix-cache hits / queries over the recent window, 0..1
    prefix_cache_hit_rate: float | None = None
    #: prefill throughput learned online, tokens per second
    prefill_tokens_per_second: float | None = None
    #: fixed per-request overhead (TTFT not explained by prefill), seconds
    fixed_overhead_seconds: float | None = None
    #: mean observed TTFT over the recent window, seconds
    mean_ttft_seconds: float | None = None
    #: preemptions counted over the recent window
    preemptions: int | None = None
    #: the engine's max_model_len when known
    context_window: int | None = None
    #: DCGM, max over the pod's GPUs, 0..1
    gpu_utilization: float | None = None
    gpu_memory_usage: float | None = None
    #: last XID error code seen on any of the pod's GPUs (0 = none)
    xid_error: int | None = None
    #: consecutive failed scrapes, and the last failure (never secret)
    scrape_errors: int = 0
    last_error: str | None = None


class ProviderState(_Msg, kw_only=True):
    """``kinference.telemetry.provider.<ns>.<provider>``; KV key ``provider.<ns>.<provider>``."""

    namespace: str
    name: str
    #: recency-weighted TTFT estimate, seconds; None = never observed
    estimated_ttft_seconds: float | None = None
    #: share of failed requests over the last minute, 0..1; None = no requests
    error_rate: float | None = None
    #: requests observed over the errorRate window (the last minute)
    observations: int = 0
    updated_at: float = 0.0


class Observation(_Msg, kw_only=True):
    """What a router saw of one request: ``kinference.observations.<ns>.<pool>``."""

    decision_id: str
    namespace: str
    pool: str
    backend_type: Literal["Local", "Provider"]
    backend_name: str
    endpoint: str | None = None  # pod name for Local
    model: str = ""  # the model sent upstream
    status: int = 0  # HTTP status from upstream (0 = no answer)
    outcome: Literal["ok", "error", "timeout", "rate_limited", "cancelled"] = "ok"
    #: send to the answer's first byte (a time to first token only when ``streamed``:
    #: a whole answer's first byte comes after its last token)
    ttft_seconds: float | None = None
    streamed: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    at: float = 0.0
    #: for outcome "timeout": the timeout that fired, seconds (the collector
    #: counts a timeout as a TTFT sample at this value when ttft_seconds is None)
    timeout_seconds: float | None = None


class ProviderKey(Struct, kw_only=True, rename="camel"):
    """Whether a router can read one provider's API key now: names only, never a value."""

    namespace: str
    name: str
    #: ``namespace/name`` of the Secret (``spec.auth.secretRef``; the provider's namespace)
    secret: str
    #: None: readable. ``SecretNotWatched``: the Secret's namespace is not among the
    #: router's ``--secret-namespaces``; ``SecretUnavailable``: missing, no such key, not base64
    problem: str | None = None
    message: str = ""


class ProviderKeyReport(_Msg, kw_only=True):
    """``kinference.observations._keys.<router>``: one router replica's view of
    the API keys of every provider of the pools it serves, sent every few
    seconds (level-triggered: a report replaces the replica's previous one, and
    a replica silent for three periods no longer counts). The collector turns
    a problem into the provider's ``Ready`` condition."""

    router: str
    sent_at: float
    #: seconds between reports (the receiver forgets a replica after three)
    interval: float
    providers: list[ProviderKey] = []


# ----------------------------------------------------------------- classifiers


class ClassifyRequest(_Msg, kw_only=True):
    """``kinference.classify.<classifier>`` request (request/reply)."""

    #: the texts to classify: every message's text parts, or the prompt(s)
    texts: list[str]
    #: how long the caller will wait; the classifier answers its failure tag
    #: rather than overrun it
    deadline_ms: float | None = None
    request_id: str = ""
    #: role of each text ("user", "system", "tool"...; "" for a legacy prompt),
    #: parallel to ``texts``; the injection classifier skips system/developer
    roles: list[str] = msgspec.field(default_factory=list)
    #: parts the caller could not turn into text (images, audio, token ids):
    #: a classifier that finds nothing answers "unknown" rather than "none"
    unreadable: int = 0
    #: the caller's wall clock (Unix seconds) when it sent the request: a
    #: classifier behind on its backlog answers requests whose caller gave
    #: up long ago with the failure tag, without running its detectors
    sent_at: float | None = None


class ClassifyReply(_Msg, kw_only=True):
    classifier: str
    #: exactly one tag of the classifier's (see kinference_common.classifiers)
    tags: list[str]
    #: "ok" or why the failure tag was used: "oversize", "error", "deadline";
    #: "shed" only in the router (not sent: the classifier's backlog was over its limit)
    outcome: Literal["ok", "oversize", "error", "deadline", "shed"] = "ok"
    micros: float = 0.0
    request_id: str = ""
    #: entity kinds behind the tag (e.g. ["email"]); never text of the prompt
    findings: list[str] = msgspec.field(default_factory=list)
    #: why a failure tag was used, for logs and traces (e.g. "no responders")
    detail: str = ""


class ClassifyBatch(_Msg, kw_only=True):
    """``kinference.classify.<classifier>.batch`` request: several requests in
    one message (the router sends one per event-loop turn). The classifier
    works through ``items`` in order within ``deadline_ms`` of reading the
    batch; an item it has no time left for gets the failure tag."""

    items: list[ClassifyRequest]
    deadline_ms: float | None = None
    sent_at: float | None = None


class ClassifyBatchReply(_Msg, kw_only=True):
    """One reply per item of a :class:`ClassifyBatch`, in the same order."""

    replies: list[ClassifyReply]


# -------------------------------------------------------------- replica sync


class ReplicaEndpoint(Struct, kw_only=True, rename="camel"):
    """One endpoint in a router replica's :class:`ReplicaSync` (the fields of
    :class:`kinference_common.engine.ledger.PeerEndpoint`)."""

    #: ``<namespace>/<workerset>/<pod>``
    key: str
    in_flight: int = 0
    #: ``[sentAt, promptTokens]`` of each send without a first token yet
    pending: list[tuple[float, int]] = []
    #: ``[sentAt, firstTokenAt]`` of sends prefilled in the last 2 s
    prefilled: list[tuple[float, float]] = []
    #: older pending sends beyond the per-endpoint cap, summed
    more_count: int = 0
    more_tokens: int = 0


class PrefixRecord(Struct, kw_only=True, rename="camel"):
    """One pick for the prefix index: the endpoint and the prompt's keyed block hashes."""

    key: str
    block_hashes: list[int]
    #: the endpoint's KV cache in prompt blocks (the index's cap for it)
    max_blocks: int | None = None
    #: the endpoint's KV usage (0..1) the sender saw at its pick (the index's fill there)
    kv_usage: float | None = None


class ReplicaSync(_Msg, kw_only=True):
    """``kinference.router.<ns>.<pool>.sync``: what one router replica tells the
    others (services/router/replica_sync.py). Counts, token counts, times and
    keyed block hashes only: never a prompt, a header or a tenant."""

    #: the sender (pod name and a random suffix); a replica ignores its own
    replica: str
    #: increases with every message of one replica (a lower one is older)
    seq: int
    sent_at: float
    #: this replica's sends per endpoint (the full state: replaces the previous message's)
    endpoints: list[ReplicaEndpoint] = []
    #: the prefix-index picks since the previous message
    prefix: list[PrefixRecord] = []
    #: names the block-hash key (a digest of it, not the key): records hashed
    #: under another key are ignored
    hash_key_id: str = ""


class ReplicaSyncHead(_Msg, kw_only=True):
    """The sender of a :class:`ReplicaSync` message, decoded without the rest
    (a replica reads its own messages back on the subject and drops them)."""

    replica: str


# ------------------------------------------------------------------- encoding

_encoder = msgspec.json.Encoder()


def encode(msg: Struct) -> bytes:
    return _encoder.encode(msg)


def decoder(t: type) -> msgspec.json.Decoder:  # type: ignore[type-arg]
    """A reusable decoder for one message type."""
    return msgspec.json.Decoder(t)
