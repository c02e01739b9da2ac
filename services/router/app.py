"""The router's HTTP side: the OpenAI-compatible data port and the admin port.

One request, in order (ARCHITECTURE.md, "The hot path"):

1. authenticate -> tenant (401 before any other work); read and parse the
   body once;
2. InferenceModelRewrite, objective -> priority, prompt-token estimate and
   prompt block hashes;
3. ask the classifiers the applicable rules need, in parallel, each with its
   deadline (no answer = its failure tag);
4. decide on the snapshot (the pure engine call);
5. proxy to the pick, streaming as chunks arrive; a request provably not
   received (connect failed, or the connection closed before it was fully
   written) tries the next best candidate (bounded, retry.py); one that may
   have been received is never sent again (502);
6. publish the decision event and the observation without waiting.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kinference_common import subjects
from kinference_common.compiled import CompiledFlowControl
from kinference_common.engine import Calibration, Decision, InFlightLedger, PrefixIndex, Request, Snapshot, decide
from kinference_common.engine.request import apply_rewrite
from kinference_common.engine.tokens import block_hashes, estimate_prompt_tokens
from kinference_common.engine.trace import ClassifierTrace, build_trace, encode_trace
from kinference_common.messages import Observation, encode
from kinference_router import models_api, provider_request, replica_sync, retry, stream_usage, validate
from kinference_router.body import BadRequest, ParsedBody, parse
from kinference_router.classification import Classification, RequestTags
from kinference_router.events import EventPublisher
from kinference_router.flow import FlowQueue, QueueTimeout, Shed
from kinference_router.metrics import RouterMetrics
from kinference_router.http_server import HttpLimits, HttpServer, Request as HttpRequest, Response
from kinference_router.state import SnapshotKeeper
from kinference_router.tenants import Authenticator
from kinference_router.upstream import ProviderLimiter, SecretError, SecretFiles, UpstreamHealth
from kinference_router.upstream_http import (ConnectFailed, SentNotAnswered, UpstreamClient, UpstreamError,
                                             UpstreamTimeout)

log = structlog.get_logger("router")

OBJECTIVE_HEADERS = ("x-gateway-inference-objective", "x-llm-d-inference-objective")
#: names a flow for flow control's fairness (RESOURCES.md); absent = the tenant
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
#: hop-by-hop and client-specific headers never forwarded upstream
_DROP_HEADERS = frozenset({
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
    "proxy-authorization", "authorization", "x-kinference-tenant", "accept-encoding",
    # set by the router: the body it forwards is always JSON
    "content-type",
})


@dataclass
class RouterSettings:
    namespace: str = "default"
    pool: str = "inference-all"
    max_body_bytes: int = 4 * 1024 * 1024
    #: bounded retries on connection failure before any byte was sent
    max_attempts: int = 3
    connect_timeout: float = 2.0
    first_byte_timeout: float = 120.0
    #: the collector's freshness bound: older telemetry is stale
    stale_after: float = 2.0
    #: client headers (lower-cased) a provider may receive (provider_request.check_allowlist)
    provider_headers: frozenset[str] = frozenset()
    #: what clients may make the HTTP servers hold (deadlines, connections, memory)
    http: HttpLimits = field(default_factory=HttpLimits)
    #: /metrics on the data port too (a cluster that closes the admin port to the network)
    metrics_on_data_port: bool = False
    #: share in-flight sends and prefix picks with the other replicas (replica_sync.py)
    replica_sync: bool = True
    #: the block-hash key (replica_sync.hash_key); None: unkeyed, per-process hashes
    prefix_key: bytes | None = None

    def __post_init__(self) -> None:
        if self.replica_sync and self.prefix_key is None:  # replicas' hashes must agree
            self.prefix_key = replica_sync.hash_key(None)


def engine_request(snap: Snapshot, headers: Mapping[str, str], body: ParsedBody, tenant: str,
                   rng: random.Random, prefix_key: bytes | None = None) -> Request:
    """The engine's view of one request (pure): the model after any
    InferenceModelRewrite, the objective's priority (0 when the pool has no
    such objective), the prompt-token estimate, the prompt's block hashes and
    the headers, whose names are lower-cased already (as the router's HTTP
    server gives them, and explain passes them)."""
    rewritten = apply_rewrite(snap.pool, body.model, rng) or body.model
    objective = next((headers[h] for h in OBJECTIVE_HEADERS if h in headers), None)
    priority = snap.pool.objectives.get(objective, 0) if objective is not None else 0
    return Request(
        model=rewritten,
        requested_model=body.model,
        tenant=tenant,
        objective=objective,
        priority=priority,
        prompt_tokens=estimate_prompt_tokens(body.texts),
        max_tokens=body.max_tokens,
        headers=dict(headers),
        block_hashes=block_hashes("\n".join(body.texts), key=prefix_key),
    )


class ApiError(Exception):
    """An answer in OpenAI's error envelope; ``rule`` labels it in ``kinference_requests_total``."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None,
                 rule: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after
        self.rule = rule
        #: the decision its event should show (set by flow control's 429 and 503)
        self.decision: Decision | None = None


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


def error_response(err: ApiError, decision_id: str) -> Response:
    """OpenAI's error envelope (INTERFACES.md), with the decision id."""
    kind = _ERROR_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "server_error")
    body = {"error": {"message": err.message, "type": kind,
                      "code": err.code, "decision_id": decision_id}}
    headers = [("x-kinference-decision-id", decision_id)]
    if err.retry_after is not None:
        headers.append(("Retry-After", str(max(1, int(err.retry_after + 0.999)))))
    return Response(err.status, msgspec.json.encode(body), headers)


def server_error(status: int, code: str, message: str) -> Response:
    """The answer to what the HTTP server refuses before any handler (an
    unknown path, a wrong method, a request that is not HTTP) or to a
    handler that failed: the same envelope, with a fresh decision id."""
    return error_response(ApiError(status, code, message), new_decision_id())


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
                429: "rate_limit_error", 502: "upstream_error", 503: "overloaded_error", 504: "timeout_error"}


@dataclass
class Router:
    settings: RouterSettings
    auth: Authenticator
    secrets: SecretFiles
    nc: nats.NATS | None = None
    rng: random.Random = field(default_factory=random.Random)
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    ledger: InFlightLedger = field(default_factory=InFlightLedger)
    prefix: PrefixIndex = field(default_factory=PrefixIndex)
    health: UpstreamHealth = field(default_factory=UpstreamHealth)
    limiter: ProviderLimiter = field(default_factory=ProviderLimiter)
    calibration: Calibration = field(default_factory=Calibration)
    #: None: the router follows its pool itself; else fed by a router of several pools (pools.py)
    keeper: SnapshotKeeper | None = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        # a router fed by a router of several pools shares that one's ledger and sync
        self.sync = replica_sync.for_router(self.settings, self.ledger, self.prefix, self.metrics) \
            if self.keeper is None else None
        if self.keeper is None:
            self.keeper = SnapshotKeeper(self.settings.namespace, self.settings.pool, self.ledger,
                                         stale_after=self.settings.stale_after, ejected=self.health.excluded,
                                         healthy=self.health.seen_healthy)
        self.events = EventPublisher(self.nc, self.metrics.dropped_events)
        #: the pool's metrics label, formatted once
        self.pool_label = f"{self.settings.namespace}/{self.settings.pool}"
        self._decisions_subject = subjects.decisions_subject(self.settings.namespace, self.settings.pool)
        self._observations_subject = subjects.observations_subject(self.settings.namespace, self.settings.pool)
        self.upstream: UpstreamClient | None = None
        self.flow = FlowQueue(on_depth=self._queue_depth)
        self.keeper.on_rebuild = self.flow.capacity_changed
        self.keeper.calibration = self._calibration
        # one per process (routers of several pools share metrics, hence this)
        self.classification = Classification.shared(self.metrics, self.nc)
        self.classification.watch(self.keeper)  # loads in-process classifiers when a policy asks for them

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.upstream = UpstreamClient()
        self.events.start()
        self.flow.start()
        if self.nc is not None:
            await self.keeper.start(self.nc)
            if self.sync is not None:
                await self.sync.start(self.nc)

    async def stop(self) -> None:
        if self.sync is not None:
            await self.sync.stop()
        await self.flow.stop()
        await self.keeper.stop()
        await self.events.stop()
        if self.upstream is not None:
            await self.upstream.close()

    # -------------------------------------------------------------- routes

    def data_server(self) -> HttpServer:
        """The data port's server (not started): the OpenAI API and health (metrics
        are on the admin port only)."""
        return self._server({
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
            "/v1/models": {"GET": self.models},
            "/v1/models/*": {"GET": self.model},
        })

    def admin_server(self) -> HttpServer:
        """The admin port's server (not started): explain, health and metrics."""
        return self._server({"/debug/explain": {"POST": self.explain}})

    def _server(self, routes: dict[str, Any]) -> HttpServer:
        common = {"/healthz": {"GET": self.healthz}, "/readyz": {"GET": self.readyz}}
        if "/debug/explain" in routes or self.settings.metrics_on_data_port:
            common["/metrics"] = {"GET": self.metrics_page}
        server = HttpServer({**routes, **common}, max_body_bytes=self.settings.max_body_bytes,
                            limits=self.settings.http, on_error=server_error)
        self.metrics.watch_http("admin" if "/debug/explain" in routes else "data", server)
        return server

    async def healthz(self, _: HttpRequest) -> Response:
        return Response(200, b"ok\n", content_type="text/plain; charset=utf-8")

    async def readyz(self, _: HttpRequest) -> Response:
        # and, when the policy runs a classifier in process, once it is loaded
        ready = self.keeper.snapshot is not None and self.classification.ready(self.keeper.snapshot)
        return Response(200 if ready else 503, b"ready\n" if ready else b"no configuration yet\n",
                        content_type="text/plain; charset=utf-8")

    async def metrics_page(self, _: HttpRequest) -> Response:
        return Response(200, generate_latest(self.metrics.registry), content_type=CONTENT_TYPE_LATEST)

    def _unauthorized(self, request: HttpRequest) -> Response | None:
        """401 for a request without a valid key (every data-port answer checks this first)."""
        if self.auth.tenant(request.headers) is not None:
            return None
        self.metrics.child(self.metrics.requests, self.pool_label, "", "unauthorized", "").inc()
        return error_response(ApiError(401, "unauthorized", "missing or unknown API key"), new_decision_id())

    async def models(self, request: HttpRequest) -> Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        snap = self.keeper.snapshot
        return Response(200, msgspec.json.encode(models_api.model_list(snap.pool.models if snap else [])))

    async def model(self, request: HttpRequest) -> Response:
        if (denied := self._unauthorized(request)) is not None:
            return denied
        snap = self.keeper.snapshot
        found = models_api.find(snap.pool.models if snap else [], request.path)
        if found is None:
            return error_response(ApiError(404, "model_not_found", "no destination of the pool serves "
                                           f"{request.path[len(models_api.PREFIX):]!r}"), new_decision_id())
        return Response(200, msgspec.json.encode(models_api.model_object(found)))

    async def chat(self, request: HttpRequest) -> Response | None:
        return await self._handle(request, chat=True)

    async def completions(self, request: HttpRequest) -> Response | None:
        return await self._handle(request, chat=False)

    # ------------------------------------------------------------ the path

    def _read(self, request: HttpRequest, chat: bool) -> ParsedBody:
        if request.body_too_large:
            raise ApiError(413, "payload_too_large", f"body over {self.settings.max_body_bytes} bytes")
        try:
            parsed = parse(request.body, chat=chat)
            validate.check_body(parsed)
            return parsed
        except BadRequest as exc:
            raise ApiError(400, "bad_request", str(exc)) from None

    def _engine_request(self, headers: Mapping[str, str], body: ParsedBody, tenant: str) -> Request:
        snap = self.keeper.snapshot
        assert snap is not None
        req = engine_request(snap, headers, body, tenant, self.rng, self.settings.prefix_key)
        if req.objective is not None and req.objective not in snap.pool.objectives:
            self.metrics.unknown_objectives.inc()
        return req

    async def _handle(self, request: HttpRequest, chat: bool) -> Response | None:
        decision_id = new_decision_id()
        bound = structlog.contextvars.bind_contextvars(decision_id=decision_id)
        try:
            tenant = self.auth.tenant(request.headers)
            if tenant is None:
                raise ApiError(401, "unauthorized", "missing or unknown API key")
            body = self._read(request, chat)
            if self.keeper.snapshot is None:
                raise ApiError(503, "no_capacity", "the router has no configuration yet", retry_after=1)
            req = self._engine_request(request.headers, body, tenant)
            # classified lazily: only when a classifier's answer can change the decision
            tags = self.classification.start(req, body, decision_id)
            return await self._route(request, chat, body, tags, decision_id)
        except ApiError as err:  # counted once, here
            self.metrics.child(self.metrics.requests, self.pool_label, err.rule, err.code, "").inc()
            return error_response(err, decision_id)
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away before its answer ended
            self.metrics.child(self.metrics.requests, self.pool_label, "", "abandoned", "").inc()
            raise
        finally:
            structlog.contextvars.reset_contextvars(**bound)

    def _decide(self, req: Request, snap: Snapshot, avoid: set[str]) -> Decision:
        started = time.perf_counter()
        d = decide(snap, req, ledger=self.ledger, prefix=self.prefix, rng=self.rng, avoid=avoid)
        self.metrics.decision.observe(time.perf_counter() - started)
        return d

    def _calibration(self) -> float:
        c = self.calibration.value
        self.metrics.child(self.metrics.calibration, self.pool_label).set(c)
        return c

    def _queue_depth(self, priority: int, n: int) -> None:
        self.metrics.child(self.metrics.queue_depth, self.pool_label, str(priority)).set(n)

    async def _wait_for_capacity(self, req: Request, settings: CompiledFlowControl, avoid: set[str],
                                 deadline: float, first: Decision, tags: RequestTags | None = None) -> Decision:
        """Flow control (:mod:`kinference_router.flow`): wait in the pool's
        queue until a decision on a newer state routes (or rejects for
        another reason); 429 when shed, 503 at ``maxQueueWait``. ``first`` is
        the decision that sent the request here (a routed one: it queues
        behind earlier waiters). A 429 or 503 of its own carries, in
        ``decision``, what the decision event should say."""
        last = first

        def attempt() -> Decision:
            nonlocal last
            snap = self.keeper.snapshot
            if snap is None:
                raise ApiError(503, "no_capacity", "the router lost its configuration", retry_after=1)
            # a newer policy may require a classifier not asked: its failure tag
            last = self._decide(tags.fail_closed(snap) if tags is not None else req, snap, avoid)
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
            err.decision = last if not last.routed and last.code == err.code else flow_control_rejection(last, err)
            raise err from None

    def _publish_decision(self, d: Decision, decision_id: str, traces: list[ClassifierTrace]) -> None:
        try:
            data = encode_trace(build_trace(d, decision_id=decision_id, classifiers=traces, scores=False))
        except Exception as exc:  # a trace must never fail a request
            log.warning("decision event not built", error=str(exc))
            return
        self.events.publish(self._decisions_subject, data)

    async def _route(self, request: HttpRequest, chat: bool, body: ParsedBody, tags: RequestTags,
                     decision_id: str) -> Response | None:
        tried: set[str] = set()
        #: when flow control gives up on this request (set when it first queues)
        queue_deadline: float | None = None
        for attempt in range(self.settings.max_attempts):
            snap = self.keeper.snapshot
            if snap is None:
                break
            # after a refused connection, decide again without what failed
            d = await tags.decide(snap, tried, self._decide, ledger=self.ledger, prefix=self.prefix, rng=self.rng,
                                  observe=self.metrics.decision.observe, latest=lambda: self.keeper.snapshot)
            req, traces, snap = tags.req, tags.traces, d.snapshot
            flow_control = snap.pool.flow_control
            if flow_control is not None and (
                    (not d.routed and d.code == "no_capacity")
                    # no cutting in line: earlier waiters get the capacity first (flow.py)
                    or (d.routed and not tried and self.flow.waiting_at_or_above(req.priority, d.canonical_model))):
                if queue_deadline is None:
                    queue_deadline = asyncio.get_running_loop().time() + flow_control.max_queue_wait_seconds
                # it is decided again while waiting, without awaiting: every tag first
                req, traces = await tags.complete(snap), tags.traces
                if d.request is not req:  # decided without some tags: again with them, for the event
                    again = self._decide(req, snap, tried)
                    d = again if (again.routed, again.code) == (d.routed, d.code) else d
                try:
                    d = await self._wait_for_capacity(req, flow_control, tried, queue_deadline, d, tags)
                except ApiError as err:
                    d = err.decision or d
                    self._publish_decision(d, decision_id, traces)
                    err.rule = d.rule or ""
                    raise
                snap = d.snapshot  # the state it was decided on
            d = validate.interpret(d)  # every candidate's context window too small: a 400
            # built and published in a later turn of the event loop: while the
            # upstream works on the request, not before it is sent
            asyncio.get_running_loop().call_soon(self._publish_decision, d, decision_id, traces)
            rule = d.rule or ""
            if not d.routed:
                code = d.code or "policy_rejected"
                status = {"model_not_found": 404, "no_capacity": 503, "context_length_exceeded": 400}.get(code, 403)
                raise ApiError(status, code, d.reason or code, retry_after=1 if code == "no_capacity" else None,
                               rule=rule)
            cand = d.candidate
            tried.add(cand.ledger_key)
            try:
                result = await self._send(request, chat, body, req, d, snap, decision_id)
            except ApiError as err:
                if err.decision is not None:
                    self._publish_decision(err.decision, decision_id, traces)
                raise
            if result is not _NOT_SENT:
                return result  # type: ignore[return-value]
        raise ApiError(502, "upstream_error", "every candidate tried refused the connection")

    async def _send(self, request: HttpRequest, chat: bool, body: ParsedBody, req: Request, d: Decision,
                    snap: Snapshot, decision_id: str) -> Response | None | object:
        """Proxy to the pick: a Response, or None once a stream was passed
        through. ``_NOT_SENT`` means "connection refused before any byte was
        sent": the caller may try the next best candidate."""
        assert self.upstream is not None
        cand = d.candidate
        dest = next(x for x in snap.pool.destinations if x.name == cand.dest_name and x.type == cand.type)
        headers = [(k, v) for k, v in request.raw_headers if k.lower() not in _DROP_HEADERS]
        headers.append(("Content-Type", "application/json"))
        path = "/chat/completions" if chat else "/completions"
        connect_timeout, first_byte = self.settings.connect_timeout, self.settings.first_byte_timeout
        if cand.is_local:
            state = cand.state
            url = f"http://{state.address}/v1{path}"  # type: ignore[union-attr]
        else:
            provider = dest.provider
            assert provider is not None
            headers = provider_request.headers(request.headers, stream=body.stream, request_id=decision_id,
                                               allow=self.settings.provider_headers)
            if not self.limiter.acquire(cand.ledger_key, provider):
                raise ApiError(429, "rate_limited", f"provider {dest.name} is at its configured limit",
                               retry_after=1)
            try:
                headers.append(("Authorization",
                                f"Bearer {self.secrets.read(dest.namespace, provider.secret_ref)}"))
            except Exception as exc:  # SecretError says what is missing; others never show the file's contents
                self.limiter.release(cand.ledger_key)
                why = str(exc) if isinstance(exc, SecretError) else \
                    f"its API key could not be read ({type(exc).__name__})"
                raise ApiError(502, "upstream_error", f"provider {dest.name}: {why}") from None
            url = provider.url.rstrip("/") + path
            connect_timeout = provider.connect_timeout_seconds or connect_timeout
            first_byte = provider.first_token_timeout_seconds or first_byte
        data = body.encode(cand.served_name) if cand.is_local else provider_request.body(body.raw, cand.served_name)
        route_headers = [("x-kinference-decision-id", decision_id), ("x-kinference-rule", d.rule or "unmatched"),
                         ("x-kinference-backend", cand.backend)]
        # PredictedTTFT of the pick without calibration, before this send joins the
        # ledger: what the observed TTFT is compared with to learn the calibration
        predicted = None
        if cand.is_local:
            p = d.context.predicted_ttft(cand)
            predicted = p / snap.ttft_model.calibration if p else None
        # the prefill work this adds: the prompt minus what the endpoint likely has cached
        send = self.ledger.sent(cand.ledger_key, d.prefill_tokens, time.time())
        if req.block_hashes and cand.is_local:
            self.prefix.record(cand.ledger_key, req.block_hashes, cand.cache_blocks)
        backend_type = cand.type
        inflight = self.metrics.inflight
        inflight[cand.backend] = inflight.get(cand.backend, 0) + 1
        obs = Observation(decision_id=decision_id, namespace=self.settings.namespace, pool=self.settings.pool,
                          backend_type=backend_type, backend_name=cand.dest_name, endpoint=cand.endpoint,
                          model=cand.served_name, at=time.time())
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                upstream = await self.upstream.post(url, data, headers, connect_timeout=connect_timeout,
                                                    read_timeout=first_byte)
            except ConnectFailed as exc:
                # nothing was sent: count it against the endpoint, let the caller try the next
                if self.health.connect_failed(cand.ledger_key):
                    log.warning("endpoint ejected", backend=cand.backend, endpoint=cand.endpoint)
                log.info("upstream connection failed", backend=cand.backend, error=str(exc))
                return _NOT_SENT
            except UpstreamTimeout:
                outcome = "timeout"
                obs.timeout_seconds = first_byte
                raise ApiError(504, "upstream_timeout", f"{cand.backend} did not answer in time") from None
            except UpstreamError as exc:
                err = ApiError(502, "upstream_error", f"{cand.backend}: {exc}")
                if isinstance(exc, SentNotAnswered):  # never re-sent: the event says why (retry.py)
                    err.decision = retry.not_resent(d, cand.backend)
                raise err from None
            except ValueError as exc:  # a bad provider URL or header; never echo header values
                outcome = "not_sent"
                why = "a header could not be encoded" if isinstance(exc, UnicodeError) else str(exc).split(";")[0]
                raise ApiError(502, "upstream_error", f"{cand.backend}: request not sent: {why}") from None
            async with upstream:
                self.health.succeeded(cand.ledger_key)
                obs.status = upstream.status
                if upstream.status == 429 and not cand.is_local:
                    seconds = self.health.cool_down(cand.ledger_key, upstream.header("Retry-After"))
                    self.keeper.mark_dirty()
                    outcome = "rate_limited"
                    raise ApiError(429, "rate_limited", f"provider {dest.name} is rate limiting", retry_after=seconds)
                if upstream.status >= 500:
                    raise ApiError(502, "upstream_error", f"{cand.backend} answered {upstream.status}")
                if upstream.status >= 400:  # in the envelope, with the decision id and the upstream's message
                    try:
                        payload = await upstream.read()
                    except UpstreamError:
                        payload = b""
                    raise ApiError(*validate.upstream_refusal(upstream.status, payload, cand.backend,
                                                              upstream.header("Retry-After")))
                ctype = upstream.header("Content-Type", "application/json")
                if body.stream and upstream.status == 200:
                    request.start_stream(200, [("Content-Type", ctype), ("Cache-Control", "no-cache"),
                                               *route_headers])
                    first = True
                    tail = b""
                    strip = stream_usage.stripper(body.raw, cand.is_local)  # usage the client did not ask for
                    try:
                        async for chunk in upstream.chunks():
                            if first:
                                first = False
                                self._first_token(send, obs, started, cand.backend, predicted)
                                self.metrics.first_token(self.pool_label, cand.dest_name, cand.endpoint, obs.ttft_seconds)
                            tail = (tail + chunk)[-4096:]
                            if strip is not None:
                                chunk = strip.feed(chunk)
                            await request.write(chunk)
                        if strip is not None:
                            await request.write(strip.flush())
                    except UpstreamError as exc:
                        # headers are sent: the only way left to tell the client
                        # is to end its stream abruptly (no terminating chunk),
                        # so that a cut completion does not look finished
                        outcome = "timeout" if isinstance(exc, UpstreamTimeout) else "error"
                        obs.timeout_seconds = first_byte if outcome == "timeout" else None
                        self.metrics.child(self.metrics.requests, self.pool_label, d.rule or "unmatched",
                                                  "upstream_error", backend_type).inc()
                        log.info("upstream stream cut", backend=cand.backend, error=str(exc))
                        request.abort()
                        return None
                    request.end_stream()
                    self._usage_from_stream(tail, obs)
                    resp = None
                else:
                    try:
                        payload = await upstream.read()
                    except UpstreamTimeout:
                        outcome = "timeout"
                        obs.timeout_seconds = first_byte
                        raise ApiError(504, "upstream_timeout", f"{cand.backend} stopped answering") from None
                    except UpstreamError as exc:
                        raise ApiError(502, "upstream_error", f"{cand.backend}: {exc}") from None
                    # a whole answer's first byte comes after its last token: not a TTFT to learn from
                    self._first_token(send, obs, started, cand.backend, None)
                    self._usage(payload, obs)
                    resp = Response(upstream.status, payload, route_headers, content_type=ctype)
                outcome = "ok" if upstream.status < 400 else "error"
                self.metrics.child(self.metrics.requests, self.pool_label, d.rule or "unmatched", "routed", backend_type).inc()
                return resp
        except asyncio.CancelledError:
            outcome = "cancelled"  # the client went away: leaving `async with` closes the upstream
            raise
        except ConnectionResetError:
            outcome = "cancelled"
            raise
        finally:
            self.ledger.finished(send, time.time())
            self.flow.slot_freed()
            inflight[cand.backend] -= 1
            if not cand.is_local:
                self.limiter.release(cand.ledger_key)
            if outcome != "not_sent":  # nothing reached the upstream: nothing to observe
                obs.outcome = outcome  # type: ignore[assignment]
                self.metrics.sent(self.pool_label, cand.backend, cand.dest_name, cand.endpoint, cand.is_local,
                                  outcome, obs.prompt_tokens, obs.completion_tokens)
                # encoded and published after the response is on its way
                asyncio.get_running_loop().call_soon(self._publish_observation, obs)

    def _publish_observation(self, obs: Observation) -> None:
        self.events.publish(self._observations_subject, encode(obs))

    def _first_token(self, send: Any, obs: Observation, started: float, backend: str,
                     predicted: float | None) -> None:
        ttft = time.perf_counter() - started
        self.ledger.first_token(send, time.time())
        obs.ttft_seconds = ttft
        self.metrics.child(self.metrics.ttft, backend).observe(ttft)
        if predicted is not None:
            self.calibration.observe(ttft, predicted)

    @staticmethod
    def _usage(payload: bytes, obs: Observation) -> None:
        try:
            usage = _usage_decoder.decode(payload).usage
        except msgspec.DecodeError:  # not JSON, or not shaped like a completion
            return
        if usage is not None:
            obs.prompt_tokens = usage.prompt_tokens
            obs.completion_tokens = usage.completion_tokens

    @classmethod
    def _usage_from_stream(cls, tail: bytes, obs: Observation) -> None:
        idx = tail.rfind(b'"usage"')
        if idx < 0:
            return
        start = tail.rfind(b"data: ", 0, idx)
        end = tail.find(b"\n", idx)
        if start >= 0:
            cls._usage(tail[start + 6:end if end > 0 else None], obs)

    # ---------------------------------------------------------------- admin

    async def explain(self, request: HttpRequest) -> Response:
        """``POST /debug/explain``: a request body plus optional ``tenant``,
        ``tags``, ``headers``; the trace on the live snapshot, nothing sent."""
        if request.body_too_large:
            return _explain_error(413, f"body over {self.settings.max_body_bytes} bytes")
        try:
            explained = validate.explain_input(request.body)
        except BadRequest as exc:
            return _explain_error(400, str(exc))
        snap = self.keeper.snapshot
        if snap is None:
            return _explain_error(503, "no configuration yet")
        try:
            body = parse(msgspec.json.encode(explained.body), chat=explained.chat)
        except BadRequest as exc:
            return _explain_error(400, str(exc))
        req = self._engine_request(explained.headers, body, explained.tenant)
        # without caller tags, the classifiers run as on the request path (lazily, on their path)
        tags = (RequestTags.supplied(self.classification, req, body, explained.tags)
                if explained.tags is not None else self.classification.start(req, body, "explain"))
        explain_rng = random.Random(0)
        d = await tags.decide(snap, set(), lambda r, sn, av: decide(sn, r, ledger=self.ledger, prefix=self.prefix,
                                                                     rng=explain_rng),
                              ledger=self.ledger, prefix=self.prefix, rng=explain_rng)
        return Response(200, encode_trace(build_trace(d, decision_id="explain", classifiers=tags.traces)))


def _explain_error(status: int, message: str) -> Response:
    """The error envelope, as on the data port."""
    return server_error(status, {413: "payload_too_large", 503: "no_capacity"}.get(status, "bad_request"), message)


#: what _send returns when nothing reached the upstream (the caller tries the next candidate)
_NOT_SENT = object()


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _WithUsage(msgspec.Struct):
    """What the router reads of a completion: its ``usage`` (the rest is skipped)."""

    usage: _Usage | None = None


_usage_decoder = msgspec.json.Decoder(_WithUsage)
