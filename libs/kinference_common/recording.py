"""Decision records: what a routing decision needs to be taken again, without
the prompt (the router writes them, ``kinfctl replay`` and ``kinfctl audit
--since`` read them).

Three kinds of message, each a tagged msgspec Struct (``"kind"``), on the
JetStream stream :data:`STREAM` (``kinference.record.>``; size and age limits
set by the router's ``--record-max-bytes`` and ``--record-max-age``):

- :class:`SnapshotRecord` on ``kinference.record.<ns>.<pool>.snapshot``: the
  state a decision ran on, once per snapshot some decision used, as a delta
  from the router's previous record (``base``), or whole (a keyframe: the
  first record of a router, then every ``--record-keyframe-interval``): the
  endpoints' and providers' states that changed (and the keys gone), the
  ejected endpoints, the clock the ages were measured against, staleness
  bounds, the PredictedTTFT model (its calibration) and the compiled pool
  when its revision changed. ``router`` + ``version`` name it.
- :class:`DecisionRecord` on ``...<pool>.decision``: the request's features
  (model, tenant, objective, priority, token counts, prefix block hashes as
  the router keys them, headers without credentials, classifier tags and
  timings), what the router's own state added (in-flight loads of the
  pool's endpoints, prefix matches and held blocks, ``tieBreak: Random``'s
  draws, the candidates to avoid), the outcome, and the snapshot it was
  taken on, by reference.
- :class:`ObservationRecord` on ``...<pool>.observation``: what happened to
  the send (TTFT, tokens), joined to its decision by ``decision_id``.

Never a prompt: the records hold numbers, names and keyed hashes.
"""

from __future__ import annotations

from typing import Union

import msgspec
from msgspec import Struct

from kinference_common import subjects
from kinference_common.compiled import CompiledPool
from kinference_common.engine.trace import ClassifierTrace, OutcomeTrace
from kinference_common.engine.ttft import TTFTModel
from kinference_common.messages import EndpointState, ProviderState

#: 2: a decision keeps ``held`` whenever it read it (the spread of
#: :class:`~kinference_common.engine.ttft.TTFTModel` does); ``kinfctl replay``
#: takes a version-1 record's decisions without the spread, as its router did.
#: 3: routers give an endpoint its same-GPU peers' largest Theta
#: (``TTFTModel.peer_prefill_rate``); replay takes older records' without it.
#: 4: routers charge a prefix's copy ``TTFTModel.prefix_stickiness_unqueued``
#: on any endpoint where nothing waits (``unqueued_running``); replay takes
#: older records' with that charge (1x then) on idle endpoints only.
#: 5: routers relieve a busy prefix holder's stickiness charge
#: (``TTFTModel.stickiness_relief``) and record the hot fractions that read
#: (``DecisionRecord.hot``); replay takes older records' with the full charge.
#: 6: routers charge a conversation's next turn less for leaving its pod
#: (``TTFTModel.continuation_stickiness``, ``continuation_unqueued``) and
#: record whether the prompt continued one sent to a best holder
#: (``DecisionRecord.continued``); replay takes older records' without it.
#: Writers set ``v`` explicitly: the field's default is what a record that
#: does not say means (version 1 wrote none, its default being omitted).
SCHEMA_VERSION = 6
#: the first version whose routers had the spread
SPREAD_SINCE = 2
#: the first version whose routers gave an endpoint its peers' largest Theta
PEER_THETA_SINCE = 3
#: the first version whose routers charged a copy less wherever nothing waits
UNQUEUED_SINCE = 4
#: the charge on an idle endpoint's copy before UNQUEUED_SINCE
IDLE_CHARGE_BEFORE = 1.0
#: the first version whose routers relieved a busy holder's stickiness
RELIEF_SINCE = 5
#: the first version whose routers charged a conversation's next turn less for moving
CONTINUATION_SINCE = 6
#: the JetStream stream of every pool's records
STREAM = "KINFERENCE_RECORDS"
PREFIX = "kinference.record"
#: defaults of the router's --record-* flags
DEFAULT_MAX_BYTES = 1 << 30
#: ``DecisionRecord.amended`` of a decision's second record (what the client saw
#: after the first, the decision, was recorded): replay reads the first only
SECOND_RECORDS = frozenset({"upstream_error", "not_sent"})
DEFAULT_MAX_AGE_SECONDS = 24 * 3600.0
DEFAULT_KEYFRAME_SECONDS = 60.0

#: request headers never recorded: credentials (and any whose name contains one of
#: :data:`SECRET_WORDS`), and HTTP's own, which say nothing about the request
SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
SECRET_WORDS = ("key", "token", "secret", "password", "auth", "cookie", "session")
HTTP_HEADERS = frozenset({"host", "user-agent", "accept", "accept-encoding", "accept-language", "content-type",
                          "content-length", "connection", "keep-alive", "te", "transfer-encoding", "expect",
                          "upgrade", "via", "forwarded", "x-forwarded-for", "x-forwarded-proto", "x-request-id",
                          "traceparent", "tracestate"})
#: field order of a recorded in-flight load (:class:`kinference_common.engine.ledger.EndpointLoad`)
LOAD_FIELDS = ("in_flight", "pending_count", "pending_tokens", "unseen_count", "unseen_tokens",
               "drained_count", "peer_in_flight", "peer_pending_count", "peer_pending_tokens",
               "peer_unseen_count", "peer_seen_count", "peer_drained_count")


def subject(namespace: str, pool: str, kind: str) -> str:
    """``kinference.record.<ns>.<pool>.<kind>`` (kind: snapshot | decision | observation)."""
    return f"{PREFIX}.{subjects.token(namespace)}.{subjects.token(pool)}.{kind}"


def pool_filter(namespace: str, pool: str) -> str:
    return f"{PREFIX}.{subjects.token(namespace)}.{subjects.token(pool)}.>"


#: client-library chatter, and identities a proxy adds (who the user is is not the record's business)
_DROPPED_PREFIXES = ("x-stainless-", "x-forwarded-", "x-user-", "x-real-ip")

#: header names seen, and those of them not recorded (names repeat: one set lookup each)
_seen: set[str] = set()
_dropped: set[str] = set()


def recordable(name: str) -> bool:
    """Whether a (lower-case) header name is recorded."""
    return not (name in SECRET_HEADERS or name in HTTP_HEADERS or name.startswith(_DROPPED_PREFIXES)
                or any(w in name for w in SECRET_WORDS))


def recordable_headers(headers: dict[str, str]) -> dict[str, str]:
    """The headers a policy may match on: without credentials, nor HTTP's own."""
    new = headers.keys() - _seen
    if new:
        for name in new:
            if not recordable(name):
                _dropped.add(name)
        if len(_seen) < 4096:  # a client sending random names: those are checked each time
            _seen.update(new)
        else:
            return {k: v for k, v in headers.items() if recordable(k)}
    return {k: v for k, v in headers.items() if k not in _dropped}


class _R(Struct, kw_only=True, tag_field="kind", omit_defaults=True):
    """Records: additive changes only (new fields get defaults)."""


class SnapshotRecord(_R, kw_only=True, tag="snapshot"):
    v: int = 1
    router: str
    version: int
    #: the version this one is a delta from; None: complete (a keyframe)
    base: int | None = None
    namespace: str
    pool: str
    #: the wall clock telemetry ages were measured against
    now: float
    stale_after: float
    provider_stale_after: float
    ejected: list[str] = []
    #: the PredictedTTFT model; in a delta only when it changed (its calibration is learned)
    ttft_model: TTFTModel | None = None
    pool_revision: str
    #: the compiled pool, when its revision differs from the base's (always in a keyframe)
    compiled: CompiledPool | None = None
    endpoints: list[EndpointState] = []
    providers: list[ProviderState] = []
    #: keys (``ns/workerset/pod``, ``ns/provider``) the base had and this one has not
    endpoints_gone: list[str] = []
    providers_gone: list[str] = []


class RecordedRequest(Struct, kw_only=True, omit_defaults=True):
    """:class:`kinference_common.engine.request.Request`, less the headers' credentials."""

    model: str
    requested_model: str | None = None
    tenant: str = "anonymous"
    objective: str | None = None
    priority: int = 0
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    context_tokens: int | None = None
    headers: dict[str, str] = {}
    tags: list[str] = []
    block_hashes: list[int] = []


class DecisionRecord(_R, kw_only=True, tag="decision"):
    v: int = 1
    decision_id: str
    #: wall-clock time of the record
    at: float
    router: str
    #: the snapshot's ``version`` (a :class:`SnapshotRecord` of the same router)
    snapshot: int
    namespace: str
    pool: str
    request: RecordedRequest
    #: classifiers asked (their tags are in ``request.tags``), with timings; skipped ones too
    classifiers: list[ClassifierTrace] = []
    #: ledger keys the decision was told to avoid (refused connections, a gateway's subset)
    avoid: list[str] = []
    #: in-flight load per ledger key (:data:`LOAD_FIELDS` order), the pool's non-idle ones
    loads: dict[str, tuple[int, ...]] = {}
    #: prefix index: leading prompt blocks each endpoint holds
    matches: dict[str, int] = {}
    #: prefix index: blocks each endpoint holds, when the decision read them
    #: (PrefixAffinity when no endpoint matched; the spread)
    held: dict[str, int] = {}
    #: prefix index: the hot fraction of each endpoint over half full of
    #: prefixes in use, when the decision read it (PrefixIndex.pressure)
    pressure: dict[str, float] = {}
    #: prefix index: the hot fraction of each candidate, when the decision
    #: read them (the relief, when the best holder's load was high)
    hot: dict[str, float] = {}
    #: prefix index: the best holders the decision asked whether the prompt
    #: continued one sent there (PrefixIndex.continued_on), and the answer
    continued: dict[str, bool] = {}
    #: ``tieBreak: Random`` draws, ``[n, drawn]`` each, in order
    draws: list[tuple[int, int]] = []
    outcome: OutcomeTrace
    #: the outcome is not the engine's: ``flow_control`` (shed, or ``maxQueueWait`` after
    #: the engine routed); or a second record of the same decision, with what the client
    #: saw (:data:`SECOND_RECORDS`): ``upstream_error`` (the send failed after it left),
    #: ``not_sent`` (the pick could not be carried out: a Provider pick at an Endpoint
    #: Picker without an egress)
    amended: str = ""
    #: the pick's PredictedTTFT (Local) or EstimatedTTFT (Provider), seconds
    predicted_ttft: float | None = None


class ObservationRecord(_R, kw_only=True, tag="observation"):
    v: int = 1
    decision_id: str
    backend_type: str
    backend_name: str
    outcome: str = "ok"
    ttft_seconds: float | None = None
    #: a streamed answer: ``ttft_seconds`` is a time to first token (else the whole answer's)
    streamed: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    at: float = 0.0


Record = Union[SnapshotRecord, DecisionRecord, ObservationRecord]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


def encode(record: Record) -> bytes:
    return _encoder.encode(record)


def decode(data: bytes | str) -> Record:
    """A record; msgspec.DecodeError / ValidationError when it is none."""
    return _decoder.decode(data)
