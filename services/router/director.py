"""The decision path and the accounting of a send, apart from any transport.

The router's two front doors, the HTTP data port (:mod:`kinference_router.app`)
and the Endpoint Picker (:mod:`kinference_router.epp`), turn what arrives into
the same calls here:

- :meth:`Director.admit`: authenticate -> tenant, read and check the body,
  the engine's view of the request (rewrite, objective, tokens, block
  hashes), classification started (lazily);
- :meth:`Director.routing` then :meth:`Routing.next`: decide on the
  snapshot, with flow control and the candidates to avoid, interpret it
  (engine.interpret), publish the decision event; a rejection is an
  :class:`ApiError`;
- :meth:`Director.begin`: the accounting of one send (provider limiter,
  in-flight ledger, prefix index, in-flight metric, the Observation), which
  :class:`Send` carries to its end (first token, usage, finished).

Nothing here knows HTTP or gRPC; both doors answer an :class:`ApiError` in
the same OpenAI error envelope (``app.error_response``).
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import structlog

from kinference_common import subjects
from kinference_common.compiled import CompiledFlowControl
from kinference_common.engine import (Calibration, Decision, InFlightLedger, PrefixIndex, Request, Snapshot, decide,
                                      interpret, rejection_status)
from kinference_common.engine.candidates import Candidate
from kinference_common.engine.request import OBJECTIVE_HEADERS, engine_request
from kinference_common.engine.trace import ClassifierTrace, build_trace, encode_trace
from kinference_common.messages import Observation, encode
from kinference_common.request_body import BadRequest, ParsedBody, check_body, parse
from kinference_router import validate
from kinference_router.classification import Classification, RequestTags
from kinference_router.events import EventPublisher
from kinference_router.flow import FlowQueue, QueueTimeout, Shed
from kinference_router.metrics import RouterMetrics
from kinference_router.recording import Recorder
from kinference_router.state import SnapshotKeeper
from kinference_router.tenants import Authenticator
from kinference_router.upstream import ProviderLimiter

log = structlog.get_logger("router")

#: names a flow for flow control's fairness (RESOURCES.md); absent = the tenant
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"


class ApiError(Exception):
    """An answer in OpenAI's error envelope; ``rule`` labels it in ``kinference_requests_total``."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None,
                 rule: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after
        self.rule = rule
        #: the decision its event should show (set by flow control's 429 and 503)
        self.decision: Decision | None = None
        #: why ``decision``'s outcome is not the engine's (its record says so): flow_control |
        #: upstream_error | not_sent (kinference_common.recording.DecisionRecord.amended)
        self.amended = ""
        #: more headers for the answer (a routed request's rule and backend)
        self.headers: list[tuple[str, str]] = []


def flow_control_rejection(d: Decision, err: ApiError) -> Decision:
    """The decision event of a request flow control gave up on (shed, or
    ``maxQueueWait``): its last decision with the outcome it really had. That
    decision may have routed (a newcomer queued behind earlier waiters, the
    capacity went to them); the event then still shows which rules and tiers
    applied, but names no backend the request never reached."""
    out = copy.copy(d)
    out.routed, out.candidate, out.code, out.reason = False, None, err.code, err.message
    return out


def new_decision_id() -> str:
    """128 random bits, as 32 hex digits."""
    return os.urandom(16).hex()


class Director:
    """The decision path of one pool and the accounting of its sends (see
    the module docstring). Built by the Router from its own parts."""

    def __init__(self, *, settings: Any,
                 auth: Callable[[], Authenticator], keeper: SnapshotKeeper, ledger: InFlightLedger, prefix: PrefixIndex,
                 metrics: RouterMetrics, flow: FlowQueue, classification: Classification,
                 events: EventPublisher, limiter: ProviderLimiter, calibration: Calibration,
                 rng: random.Random, recorder: Recorder | None = None) -> None:
        #: the router's RouterSettings (namespace, pool, max_body_bytes, prefix_key)
        self.settings = settings
        namespace, pool = self.namespace, self.pool = settings.namespace, settings.pool
        #: the authenticator in use (the router's; tests and reloads may replace it)
        self._auth = auth
        self.keeper, self.ledger, self.prefix = keeper, ledger, prefix
        self.metrics, self.flow, self.classification, self.events = metrics, flow, classification, events
        self.limiter, self.calibration, self.rng = limiter, calibration, rng
        #: the decision records for replay (recording.py); None: not recording
        self.recorder = recorder
        self.pool_label = f"{namespace}/{pool}"
        self._decisions_subject = subjects.decisions_subject(namespace, pool)
        self._observations_subject = subjects.observations_subject(namespace, pool)

    # ------------------------------------------------------------ admission

    def admit(self, headers: Mapping[str, str], body: bytes, too_large: bool, chat: bool,
              decision_id: str) -> RequestTags:
        """Authenticate, read the body, the engine's request, classification
        started: the request's tags (``tags.body``, ``tags.req``). ``headers``
        have lower-cased names. ApiError 401, 413, 400, 503."""
        tenant = self.authenticate(headers)
        parsed = self.read(body, too_large, chat)
        if self.keeper.snapshot is None:
            raise ApiError(503, "no_capacity", "the router has no configuration yet (it has not read its pool "
                           "from NATS: see its config_store log lines and kinference_bus_available)", retry_after=1)
        req = self.engine_request(headers, parsed, tenant)
        # classified lazily: only when a classifier's answer can change the decision
        return self.classification.start(req, parsed, decision_id)

    def authenticate(self, headers: Mapping[str, str]) -> str:
        """The tenant of the request's API key; ApiError 401 without a valid
        one (every answer of the API checks this first, /v1/models too)."""
        tenant = self._auth().tenant(headers)
        if tenant is None:
            raise ApiError(401, "unauthorized", "missing or unknown API key")
        return tenant

    def read(self, body: bytes, too_large: bool, chat: bool) -> ParsedBody:
        if too_large:
            raise ApiError(413, "payload_too_large", f"body over {self.settings.max_body_bytes} bytes")
        try:
            parsed = parse(body, chat=chat)
            check_body(parsed)
            return parsed
        except BadRequest as exc:
            raise ApiError(400, "bad_request", str(exc)) from None

    def engine_request(self, headers: Mapping[str, str], body: ParsedBody, tenant: str) -> Request:
        snap = self.keeper.snapshot
        assert snap is not None
        req = engine_request(snap, headers, body, tenant, self.rng, self.settings.prefix_key)
        if req.objective is not None and req.objective not in snap.pool.objectives:
            self.metrics.unknown_objectives.inc()
        return req

    # ------------------------------------------------------------- deciding

    def decide(self, req: Request, snap: Snapshot, avoid: set[str] | frozenset[str]) -> Decision:
        """The engine's decision, timed (no classifier, no event)."""
        started = time.perf_counter()
        d = decide(snap, req, ledger=self.ledger, prefix=self.prefix, rng=self.rng, avoid=avoid)
        self.metrics.decision.observe(time.perf_counter() - started)
        if self.recorder is not None:
            self.recorder.capture(d)
        return d

    def routing(self, tags: RequestTags, decision_id: str, *, avoid: frozenset[str] = frozenset(),
                decide_fn: Callable[[Request, Snapshot, Any], Decision] | None = None) -> Routing:
        """The decisions of one request: :meth:`Routing.next` for the first
        and after each candidate that refused the connection. ``avoid``:
        candidates (ledger keys) never to pick (a gateway's subset hint)."""
        return Routing(self, tags, decision_id, avoid, decide_fn or self.decide)

    async def wait_for_capacity(self, req: Request, settings: CompiledFlowControl, avoid: set[str] | frozenset[str],
                                deadline: float, first: Decision, tags: RequestTags | None = None,
                                decide_fn: Callable[[Request, Snapshot, Any], Decision] | None = None) -> Decision:
        """Flow control (:mod:`kinference_router.flow`): wait in the pool's
        queue until a decision on a newer state routes (or rejects for
        another reason); 429 when shed, 503 at ``maxQueueWait``. ``first`` is
        the decision that sent the request here (a routed one: it queues
        behind earlier waiters). A 429 or 503 of its own carries, in
        ``decision``, what the decision event should say."""
        last = first
        decide_fn = decide_fn or self.decide

        def attempt() -> Decision:
            nonlocal last
            snap = self.keeper.snapshot
            if snap is None:
                raise ApiError(503, "no_capacity", "the router lost its configuration", retry_after=1)
            # a newer policy may require a classifier not asked: its failure tag
            last = decide_fn(tags.fail_closed(snap) if tags is not None else req, snap, avoid)
            return last

        flow = req.headers.get(FAIRNESS_HEADER) or req.tenant
        try:
            return await self.flow.wait(req.priority, flow, settings, attempt, deadline,
                                        capacity_seen=first.routed, model=first.canonical_model)
        except (Shed, QueueTimeout) as exc:
            if isinstance(exc, Shed):
                err = ApiError(429, "rate_limited", "shed by flow control: the pool's queue is full", retry_after=1)
            else:
                err = ApiError(503, "no_capacity", f"no capacity came back within the pool's maxQueueWait "
                               f"({settings.max_queue_wait_seconds:g}s)", retry_after=1)
            if not last.routed and last.code == err.code:
                err.decision = last
            else:  # the engine's decision, with flow control's outcome
                err.decision, err.amended = flow_control_rejection(last, err), "flow_control"
            raise err from None

    def publish_decision(self, d: Decision, decision_id: str, traces: list[ClassifierTrace],
                         amended: str = "") -> None:
        """The decision event (and record); ``amended``: the outcome is not
        the engine's (``flow_control``: shed or ``maxQueueWait``;
        ``upstream_error``: a send that failed after it left, and
        ``not_sent``: a pick that could not be carried out, each published
        again with what the client saw)."""
        try:
            trace = build_trace(d, decision_id=decision_id, classifiers=traces, scores=False)
            data = encode_trace(trace)
        except Exception as exc:  # a trace must never fail a request
            log.warning("decision event not built", error=str(exc))
            return
        self.events.publish(self._decisions_subject, data)
        if self.recorder is not None:
            try:
                self.recorder.decision(d, decision_id, traces, trace.outcome, amended)
            except Exception as exc:  # nor a record
                log.warning("decision record not built", error=str(exc))

    def count(self, rule: str, code: str, backend_type: str) -> None:
        """One answer in ``kinference_requests_total``."""
        self.metrics.child(self.metrics.requests, self.pool_label, rule, code, backend_type).inc()

    # -------------------------------------------------------------- sending

    def begin(self, d: Decision, snap: Snapshot, decision_id: str, *, provider: Any = None) -> Send:
        """The accounting of sending ``d``'s pick: the provider's limiter
        (ApiError 429 at its limit; ``provider``: the pick's Provider spec),
        the in-flight ledger, the prefix index, the in-flight metric and the
        Observation. :meth:`Send.finish` ends it, once."""
        cand = d.candidate
        assert cand is not None
        if not cand.is_local and not self.limiter.acquire(cand.ledger_key, provider):
            raise ApiError(429, "rate_limited", f"provider {cand.dest_name} is at its configured limit",
                           retry_after=1)
        return Send(self, d, snap, decision_id)

    def publish_observation(self, obs: Observation) -> None:
        self.events.publish(self._observations_subject, encode(obs))
        if self.recorder is not None:
            self.recorder.observation(obs)

    @staticmethod
    def usage(payload: bytes, obs: Observation) -> None:
        try:
            usage = _usage_decoder.decode(payload).usage
        except msgspec.DecodeError:  # not JSON, or not shaped like a completion
            return
        if usage is not None:
            obs.prompt_tokens = usage.prompt_tokens
            obs.completion_tokens = usage.completion_tokens

    @classmethod
    def usage_from_stream(cls, tail: bytes, obs: Observation) -> None:
        idx = tail.rfind(b'"usage"')
        if idx < 0:
            return
        start = tail.rfind(b"data: ", 0, idx)
        end = tail.find(b"\n", idx)
        if start >= 0:
            cls.usage(tail[start + 6:end if end > 0 else None], obs)


class Routing:
    """One request's decisions (see :meth:`Director.routing`)."""

    def __init__(self, director: Director, tags: RequestTags, decision_id: str, avoid: frozenset[str],
                 decide_fn: Callable[[Request, Snapshot, Any], Decision]) -> None:
        self.director, self.tags, self.decision_id = director, tags, decision_id
        self.avoid = avoid
        self._decide = decide_fn
        #: candidates that refused the connection (the caller adds them)
        self.tried: set[str] = set()
        #: when flow control gives up on this request (set when it first queues)
        self._queue_deadline: float | None = None

    async def next(self) -> Decision | None:
        """The next routed decision (its event published in a later turn of
        the event loop), None without a snapshot; ApiError when rejected
        (404, 503, 400, 403; 429 or 503 from flow control)."""
        dr = self.director
        tags = self.tags
        snap = dr.keeper.snapshot
        if snap is None:
            return None
        avoid = self.tried | self.avoid if self.avoid else self.tried
        # after a refused connection, decide again without what failed
        d = await tags.decide(snap, avoid, self._decide, ledger=dr.ledger, prefix=dr.prefix, rng=dr.rng,
                              observe=dr.metrics.decision.observe, latest=lambda: dr.keeper.snapshot)
        if dr.recorder is not None and d.inputs is None:  # decided lazily, not by dr.decide
            dr.recorder.capture(d)
        # a prompt no candidate's window holds is the client's error (a 400), never a
        # wait for capacity: read so before flow control would queue it as no_capacity
        d = interpret(d)
        req, traces, snap = tags.req, tags.traces, d.snapshot
        flow_control = snap.pool.flow_control
        if flow_control is not None and (
                (not d.routed and d.code == "no_capacity")
                # no cutting in line: earlier waiters get the capacity first (flow.py)
                or (d.routed and not self.tried and dr.flow.waiting_at_or_above(req.priority, d.canonical_model))):
            if self._queue_deadline is None:
                self._queue_deadline = asyncio.get_running_loop().time() + flow_control.max_queue_wait_seconds
            # it is decided again while waiting, without awaiting: every tag first
            req, traces = await tags.complete(snap), tags.traces
            if d.request is not req:  # decided without some tags: again with them, for the event
                again = self._decide(req, snap, avoid)
                d = again if (again.routed, again.code) == (d.routed, d.code) else d
            try:
                # decided again while it waited: read the same way
                d = interpret(await dr.wait_for_capacity(req, flow_control, avoid, self._queue_deadline, d, tags,
                                                         decide_fn=self._decide))
            except ApiError as err:
                d = err.decision or d
                dr.publish_decision(d, self.decision_id, traces, err.amended)
                err.rule = d.rule or ""
                raise
        # built and published in a later turn of the event loop: while the
        # upstream works on the request, not before it is sent
        asyncio.get_running_loop().call_soon(dr.publish_decision, d, self.decision_id, traces)
        if not d.routed:
            code = d.code or "policy_rejected"
            raise ApiError(rejection_status(code), code, d.reason or code,
                           retry_after=1 if code == "no_capacity" else None, rule=d.rule or "")
        if d.context.spread is not None:
            dr.metrics.spread_moves.inc()
        relief = d.context.relief
        if relief is not None and d.candidate is not None and \
                d.context.matched_blocks(d.candidate) < d.context.matched_blocks(relief[0]):
            dr.metrics.relief_copies.inc()
        if d.context.continued and d.candidate is not None and \
                d.context.matched_blocks(d.candidate) < max(d.context.matches().values(), default=0):
            dr.metrics.conversation_moves.inc()  # the routed tier's ranking found a continuation
        return d


class Send:
    """The accounting of one send, from :meth:`Director.begin` to
    :meth:`finish`."""

    __slots__ = ("director", "decision", "candidate", "decision_id", "handle", "obs", "started", "predicted",
                 "events", "_done")

    def __init__(self, director: Director, d: Decision, snap: Snapshot, decision_id: str) -> None:
        self.director, self.decision, self.decision_id = director, d, decision_id
        cand = d.candidate
        assert cand is not None
        self.candidate: Candidate = cand
        self._done = False
        #: the SSE events of a streamed answer (``data:`` lines, :meth:`streamed`)
        self.events = 0
        self.obs = Observation(decision_id=decision_id, namespace=director.namespace, pool=director.pool,
                               backend_type=cand.type, backend_name=cand.dest_name, endpoint=cand.endpoint,
                               model=cand.served_name, at=time.time())
        self._join(cand, snap)
        self.started = time.perf_counter()

    def _join(self, cand: Candidate, snap: Snapshot) -> None:
        dr, d = self.director, self.decision
        # PredictedTTFT of the pick without calibration, before this send joins the
        # ledger: what the observed TTFT is compared with to learn the calibration
        self.predicted = None
        if cand.is_local:
            p = d.context.predicted_ttft(cand)
            self.predicted = p / snap.ttft_model.calibration if p else None
        # the prefill work this adds: the prompt minus what the endpoint likely has cached
        self.handle = dr.ledger.sent(cand.ledger_key, d.prefill_tokens_at(cand), time.time())
        req = d.request
        if req.block_hashes and cand.is_local:
            dr.prefix.record(cand.ledger_key, req.block_hashes, cand.cache_blocks, cand.kv)
        inflight = dr.metrics.inflight
        inflight[cand.backend] = inflight.get(cand.backend, 0) + 1

    def move_to(self, cand: Candidate, snap: Snapshot) -> None:
        """The send went to ``cand`` instead (a gateway's retry walked the
        fallback list): its in-flight work and learned TTFT count there."""
        if self._done or cand is self.candidate:
            return
        dr, old = self.director, self.candidate
        dr.ledger.finished(self.handle, time.time())
        dr.metrics.inflight[old.backend] -= 1
        self.candidate = cand
        self.obs.backend_type, self.obs.backend_name, self.obs.endpoint = cand.type, cand.dest_name, cand.endpoint
        self.obs.model = cand.served_name
        self._join(cand, snap)

    def streamed(self, chunk: bytes) -> None:
        """A chunk of a streamed answer: its SSE events counted (the
        answer's length when it carries no usage, :meth:`finish`)."""
        self.events += chunk.count(b"data:")

    def first_token(self, streamed: bool) -> None:
        """The first byte of the answer: its TTFT. Only a streamed answer's
        is a time to first token to learn from (a whole answer's first byte
        comes after its last token)."""
        dr, cand = self.director, self.candidate
        ttft = time.perf_counter() - self.started
        dr.ledger.first_token(self.handle, time.time())
        self.obs.ttft_seconds = ttft
        self.obs.streamed = streamed
        dr.metrics.child(dr.metrics.ttft, cand.backend).observe(ttft)
        if streamed:
            if self.predicted is not None:
                dr.calibration.observe(ttft, self.predicted)
            dr.metrics.first_token(dr.pool_label, cand.dest_name, cand.endpoint, ttft)

    def finish(self, outcome: str) -> None:
        """The send ended (``ok``, ``error``, ``timeout``, ``rate_limited``,
        ``cancelled``; ``not_sent``: nothing reached the upstream, nothing
        observed). Once; later calls do nothing."""
        if self._done:
            return
        self._done = True
        dr, cand, obs = self.director, self.candidate, self.obs
        dr.ledger.finished(self.handle, time.time())
        dr.flow.slot_freed()
        dr.metrics.inflight[cand.backend] -= 1
        if not cand.is_local:
            dr.limiter.release(cand.ledger_key)
        if outcome != "not_sent":  # nothing reached the upstream: nothing to observe
            obs.outcome = outcome  # type: ignore[assignment]
            generated = obs.completion_tokens
            if generated is None and self.events:
                # a stream without usage (its client did not ask): vLLM streams a token an
                # event by default, less the closing [DONE]; fewer counted makes a fuller index
                generated = self.events - 1
            if outcome == "ok" and cand.is_local and generated is not None:
                # how much of what the endpoint computed was prompt: the prefix index's fill there
                dr.prefix.observe_output(cand.ledger_key, self.handle.tokens, generated,
                                         self.decision.request.prompt_tokens, obs.prompt_tokens)
            dr.metrics.sent(dr.pool_label, cand.backend, cand.dest_name, cand.endpoint, cand.is_local,
                            outcome, obs.prompt_tokens, obs.completion_tokens)
            # encoded and published after the response is on its way
            asyncio.get_running_loop().call_soon(dr.publish_observation, obs)

    @property
    def done(self) -> bool:
        return self._done


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    """What the router reads of a completion: its ``usage`` (the rest is skipped)."""

    usage: _Usage | None = None


_usage_decoder = msgspec.json.Decoder(_WithUsage)
