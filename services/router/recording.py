"""Recording decisions for replay (``kinfctl replay``): the router's side of
:mod:`kinference_common.recording`.

On by default (``--no-record`` turns it off); the stream
``KINFERENCE_RECORDS`` is created (or its limits updated) when the router
starts, with ``--record-max-bytes`` and ``--record-max-age``; the oldest
records go first when either limit is reached.

Off the request path, like decision events: a decision only has its inputs
*captured* when it is taken (:meth:`Recorder.capture`: the pool's non-idle
in-flight loads, the prefix matches, a few dictionaries; the ledger and the
prefix index change as soon as the request is sent, so this cannot wait);
the records are built, encoded and queued on the router's
:class:`~kinference_router.events.EventPublisher` in a later turn of the
event loop, with the decision event. A snapshot is recorded only when a
decision used it, as a delta from the previous one recorded.
"""

from __future__ import annotations

import asyncio
import operator
import os
import time
from dataclasses import dataclass
from typing import Any

import structlog

from kinference_common import bus, recording
from kinference_common.engine import Decision, PrefixIndex, Snapshot
from kinference_common.engine.trace import ClassifierTrace, OutcomeTrace
from kinference_common.messages import Observation
from kinference_common.recording import (
    SCHEMA_VERSION,
    DecisionRecord,
    ObservationRecord,
    RecordedRequest,
    SnapshotRecord,
)

log = structlog.get_logger("router.recording")


@dataclass(frozen=True)
class RecordSettings:
    """The router's ``--record-*`` flags."""

    max_bytes: int = recording.DEFAULT_MAX_BYTES
    max_age_seconds: float = recording.DEFAULT_MAX_AGE_SECONDS
    #: a complete snapshot at least this often (a delta otherwise)
    keyframe_seconds: float = recording.DEFAULT_KEYFRAME_SECONDS
    #: the stream's replicas (``--kv-replicas``: 3 on a cluster of three NATS
    #: servers, so that a server's death loses no record)
    replicas: int = 1


class Inputs:
    """What :meth:`Recorder.capture` kept of a decision's moment."""

    __slots__ = ("loads", "matches", "held", "pressure", "hot", "continued", "predicted")

    def __init__(self, loads: dict[str, tuple[int, ...]], matches: dict[str, int], held: dict[str, int],
                 pressure: dict[str, float], hot: dict[str, float], continued: dict[str, bool],
                 predicted: float | None) -> None:
        self.loads, self.matches, self.held, self.pressure, self.hot = loads, matches, held, pressure, hot
        self.continued, self.predicted = continued, predicted


#: an EndpointLoad's fields as a tuple, in the records' order
_load_fields = operator.attrgetter(*recording.LOAD_FIELDS)


class Recorder:
    """One pool's records, published on ``events`` (the router's publisher)."""

    def __init__(self, events: Any, namespace: str, pool: str, settings: RecordSettings,
                 clock: Any = time.time) -> None:
        self.events = events
        self.namespace, self.pool = namespace, pool
        self.settings = settings
        self.clock = clock
        #: names this process's snapshots in the records (versions count per keeper)
        self.router_id = os.urandom(6).hex()
        self._snapshot_subject = recording.subject(namespace, pool, "snapshot")
        self._decision_subject = recording.subject(namespace, pool, "decision")
        self._observation_subject = recording.subject(namespace, pool, "observation")
        self._last: Snapshot | None = None
        self._keyframe_at = float("-inf")
        #: records published (tests and the benchmark read them)
        self.published = 0

    # --------------------------------------------------- on the request path

    @staticmethod
    def capture(d: Decision) -> None:
        """Keep what the decision read of this router's changing state, now."""
        ctx = d.context
        by_key = d.snapshot.by_key
        loads = {k: _load_fields(v) for k, v in ctx.loads.items() if k in by_key} if ctx.loads else {}
        matches: dict[str, int] = {}
        held: dict[str, int] = {}
        if ctx.block_hashes and ctx.prefix is not None:
            matches = {k: n for k, n in ctx.matches().items() if k in by_key}
            if not matches or ctx.held_read:  # what PrefixAffinity and the spread read
                held = _held(ctx.prefix, by_key)
        pressed = ctx.pressure_read()
        pressure = {k: f for k, f in pressed.items() if k in by_key} if pressed else {}
        pick = d.candidate
        predicted = None
        if pick is not None:
            predicted = ctx.predicted_ttft(pick) if pick.is_local else pick.est_ttft
        hot = {k: f for k, f in ctx.hot_read.items() if k in by_key} if ctx.hot_read else {}
        continued = {k: v for k, v in ctx.continued_read.items() if k in by_key} if ctx.continued_read else {}
        d.inputs = Inputs(loads, matches, held, pressure, hot, continued, predicted)

    # ------------------------------------------------------- off the path

    def decision(self, d: Decision, decision_id: str, traces: list[ClassifierTrace], outcome: OutcomeTrace,
                 amended: str = "") -> None:
        """Record ``d`` (and its snapshot, when not recorded yet); ``amended``:
        see :meth:`kinference_router.director.Director.publish_decision`."""
        snap = d.snapshot
        if snap.inputs is None:  # built before recording started: nothing to refer to
            return
        if self._last is not snap:
            self._snapshot(snap)
        req = d.request
        inputs = d.inputs if isinstance(d.inputs, Inputs) else None
        avoid: list[str] = []
        for step in d.steps:
            avoided = getattr(step, "avoided", None)
            if avoided:
                avoid.extend(c.ledger_key for c in avoided if c.ledger_key not in avoid)
        rec = DecisionRecord(
            v=SCHEMA_VERSION,
            decision_id=decision_id, at=self.clock(), router=self.router_id, snapshot=snap.version,
            namespace=self.namespace, pool=self.pool,
            request=RecordedRequest(
                model=req.model, requested_model=req.requested_model, tenant=req.tenant, objective=req.objective,
                priority=req.priority, prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens,
                context_tokens=req.context_tokens,
                headers=recording.recordable_headers(req.headers), tags=sorted(req.tags),
                block_hashes=list(req.block_hashes)),
            classifiers=traces, avoid=avoid,
            loads=inputs.loads if inputs else {}, matches=inputs.matches if inputs else {},
            held=inputs.held if inputs else {}, pressure=inputs.pressure if inputs else {},
            hot=inputs.hot if inputs else {}, continued=inputs.continued if inputs else {},
            draws=list(d.context.draws or ()), outcome=outcome, amended=amended,
            predicted_ttft=inputs.predicted if inputs else None,
        )
        self._publish(self._decision_subject, recording.encode(rec))

    def observation(self, obs: Observation) -> None:
        rec = ObservationRecord(v=SCHEMA_VERSION, decision_id=obs.decision_id, backend_type=obs.backend_type,
                                backend_name=obs.backend_name, outcome=obs.outcome, ttft_seconds=obs.ttft_seconds,
                                streamed=obs.streamed,
                                prompt_tokens=obs.prompt_tokens, completion_tokens=obs.completion_tokens, at=obs.at)
        self._publish(self._observation_subject, recording.encode(rec))

    def _snapshot(self, snap: Snapshot) -> None:
        assert snap.inputs is not None
        endpoints, providers = snap.inputs
        last = self._last
        now = self.clock()
        keyframe = (last is None or last.inputs is None or now - self._keyframe_at >= self.settings.keyframe_seconds)
        if keyframe:
            self._keyframe_at = now
            rec = SnapshotRecord(
                v=SCHEMA_VERSION,
                router=self.router_id, version=snap.version, namespace=self.namespace, pool=self.pool,
                now=snap.now, stale_after=snap.stale_after, provider_stale_after=snap.provider_stale_after,
                ejected=sorted(snap.ejected), ttft_model=snap.ttft_model, pool_revision=snap.revision,
                compiled=snap.pool, endpoints=list(endpoints.values()), providers=list(providers.values()))
        else:
            assert last is not None and last.inputs is not None
            old_e, old_p = last.inputs
            rec = SnapshotRecord(
                v=SCHEMA_VERSION,
                router=self.router_id, version=snap.version, base=last.version, namespace=self.namespace,
                pool=self.pool, now=snap.now, stale_after=snap.stale_after,
                provider_stale_after=snap.provider_stale_after, ejected=sorted(snap.ejected),
                ttft_model=snap.ttft_model if snap.ttft_model != last.ttft_model else None,
                pool_revision=snap.revision, compiled=snap.pool if snap.revision != last.revision else None,
                endpoints=[s for k, s in endpoints.items() if old_e.get(k) is not s],
                providers=[s for k, s in providers.items() if old_p.get(k) is not s],
                endpoints_gone=[k for k in old_e if k not in endpoints],
                providers_gone=[k for k in old_p if k not in providers])
        self._last = snap
        self._publish(self._snapshot_subject, recording.encode(rec))

    def _publish(self, subject: str, data: bytes) -> None:
        self.published += 1
        self.events.publish(subject, data)


def _held(prefix: PrefixIndex, by_key: dict[str, Any]) -> dict[str, int]:
    return {k: n for k, n in prefix.held().items() if k in by_key}


async def ensure_stream(nc: Any, settings: RecordSettings, *, attempts: int = 30, wait: float = 1.0) -> bool:
    """Create the records' stream with the operator's limits and replicas, or
    bring an existing one to them (:func:`kinference_common.bus.ensure_stream`:
    one copy on a single server, a stream found with fewer replicas healed);
    retried while JetStream is not ready. False (and a warning) when it
    cannot be done: the router routes on, unrecorded."""
    from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

    config = StreamConfig(
        name=recording.STREAM, subjects=[f"{recording.PREFIX}.>"], retention=RetentionPolicy.LIMITS,
        max_bytes=settings.max_bytes, max_age=settings.max_age_seconds, storage=StorageType.FILE,
        discard=DiscardPolicy.OLD, num_replicas=settings.replicas,
        description="Kinference decision records for kinfctl replay")
    last: Exception | None = None
    for _ in range(attempts):
        try:
            await bus.ensure_stream(nc.jetstream(), config)
            return True
        except Exception as exc:  # JetStream not up yet, NATS away: try again
            last = exc
            await asyncio.sleep(wait)
    log.warning("decision records stream not created: decisions are not recorded", stream=recording.STREAM,
                error=str(last))
    return False
