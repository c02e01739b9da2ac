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

from kinference_common.engine import (Calibration, Decision, InFlightLedger, PrefixIndex, Request, Snapshot, decide,
                                      interpret)
from kinference_common import recording
from kinference_common.engine.trace import build_trace, encode_trace
from kinference_common.request_body import BadRequest, ParsedBody, check_body, parse
from kinference_common.tasks import cancel_and_wait
from kinference_router import models_api, provider_request, replica_sync, retry, stream_usage, validate
from kinference_router.classification import Classification, RequestTags
from kinference_router.director import (FAIRNESS_HEADER, OBJECTIVE_HEADERS, ApiError, Director, Routing,
                                        engine_request, flow_control_rejection, new_decision_id)
from kinference_router.events import EventPublisher
from kinference_router.recording import Recorder, RecordSettings, ensure_stream
from kinference_router.flow import FlowQueue
from kinference_router.metrics import RouterMetrics
from kinference_router.model_name import Restorer
from kinference_router.http_server import HttpLimits, HttpServer, Request as HttpRequest, Response
from kinference_router.state import SnapshotKeeper
from kinference_router.tenants import Authenticator
from kinference_router.upstream import ProviderLimiter, SecretError, SecretFiles, UpstreamHealth
from kinference_common.upstream_http import (ConnectFailed, SentNotAnswered, UpstreamClient, UpstreamError,
                                             UpstreamTimeout)

log = structlog.get_logger("router")

__all__ = ["DROP_HEADERS", "FAIRNESS_HEADER", "OBJECTIVE_HEADERS", "ApiError", "Router", "RouterSettings",
           "engine_request", "error_response", "flow_control_rejection", "new_decision_id", "server_error"]
#: hop-by-hop and client-specific headers never forwarded upstream
DROP_HEADERS = frozenset({
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
    #: record decisions for replay (recording.py; the CLI's default is on); None: not recorded
    record: RecordSettings | None = None

    def __post_init__(self) -> None:
        if self.replica_sync and self.prefix_key is None:  # replicas' hashes must agree
            self.prefix_key = replica_sync.hash_key(None)


def error_response(err: ApiError, decision_id: str) -> Response:
    """OpenAI's error envelope (INTERFACES.md), with the decision id."""
    kind = _ERROR_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "server_error")
    body = {"error": {"message": err.message, "type": kind,
                      "code": err.code, "decision_id": decision_id}}
    headers = [("x-kinference-decision-id", decision_id), *err.headers]
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
        self.events = EventPublisher(self.nc, self.metrics.dropped_events,
                                     stored=(f"{recording.PREFIX}.", recording.STREAM)
                                     if self.settings.record is not None else None)
        self.metrics.watch_bus("connection", lambda: self.nc is not None and self.nc.is_connected)
        store = getattr(self.keeper, "store", None)
        if store is not None:
            self.metrics.watch_bus("config_store", lambda: store.available)
        self.recorder: Recorder | None = None
        if self.settings.record is not None:
            self.metrics.watch_bus("records_stream", self.events.storing)
            self.recorder = Recorder(self.events, self.settings.namespace, self.settings.pool, self.settings.record)
            self.keeper.record_inputs = True
        self._record_stream: asyncio.Task[bool] | None = None
        #: the pool's metrics label, formatted once
        self.pool_label = f"{self.settings.namespace}/{self.settings.pool}"
        self.upstream: UpstreamClient | None = None
        self.flow = FlowQueue(on_depth=self._queue_depth)
        self.keeper.on_rebuild = self.flow.capacity_changed
        self.keeper.calibration = self._calibration
        # one per process (routers of several pools share metrics, hence this)
        self.classification = Classification.shared(self.metrics, self.nc)
        self.classification.watch(self.keeper)  # loads in-process classifiers when a policy asks for them
        #: the decision path and the accounting of sends, shared with the Endpoint Picker (epp.py)
        self.director = Director(
            settings=self.settings, auth=lambda: self.auth, keeper=self.keeper, ledger=self.ledger,
            prefix=self.prefix, metrics=self.metrics, flow=self.flow, classification=self.classification,
            events=self.events, limiter=self.limiter, calibration=self.calibration, rng=self.rng,
            recorder=self.recorder)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.upstream = UpstreamClient()
        self.events.start()
        self.flow.start()
        if self.nc is not None and self.settings.record is not None:  # off the start-up path
            self._record_stream = asyncio.create_task(ensure_stream(self.nc, self.settings.record),
                                                      name="record-stream")
        if self.nc is not None:
            await self.keeper.start(self.nc)
            if self.sync is not None:
                await self.sync.start(self.nc)

    async def stop(self) -> None:
        if self.sync is not None:
            await self.sync.stop()
        await self.flow.stop()
        await self.keeper.stop()
        if self._record_stream is not None and not self._record_stream.done():
            await cancel_and_wait(self._record_stream)
        await self.events.stop()
        if self.upstream is not None:
            await self.upstream.close()

    # -------------------------------------------------------------- routes

    def api_routes(self) -> dict[str, dict[str, Any]]:
        """The OpenAI API's paths and methods, with their handlers: the data
        port's, and what the Endpoint Picker serves (a path or method not here
        is refused alike at both: ``http_server.refusal``)."""
        return {
            "/v1/chat/completions": {"POST": self.chat},
            "/v1/completions": {"POST": self.completions},
            "/v1/models": {"GET": self.models},
            "/v1/models/*": {"GET": self.model},
        }

    def data_server(self) -> HttpServer:
        """The data port's server (not started): the OpenAI API and health (metrics
        are on the admin port only)."""
        return self._server(self.api_routes())

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
        ready = self.ready()
        return Response(200 if ready else 503, b"ready\n" if ready else b"no configuration yet\n",
                        content_type="text/plain; charset=utf-8")

    async def metrics_page(self, _: HttpRequest) -> Response:
        return Response(200, generate_latest(self.metrics.registry), content_type=CONTENT_TYPE_LATEST)

    def _unauthorized(self, request: HttpRequest) -> Response | None:
        """401 for a request without a valid key (every data-port answer checks this first)."""
        try:  # the one check both front doors make (Director.authenticate)
            self.director.authenticate(request.headers)
        except ApiError as err:
            self.director.count("", err.code, "")
            return error_response(err, new_decision_id())
        return None

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

    def _engine_request(self, headers: Mapping[str, str], body: ParsedBody, tenant: str) -> Request:
        return self.director.engine_request(headers, body, tenant)

    def ready(self) -> bool:
        """A snapshot, and, when the policy runs a classifier in process, once it is loaded."""
        return self.keeper.snapshot is not None and self.classification.ready(self.keeper.snapshot)

    async def _handle(self, request: HttpRequest, chat: bool) -> Response | None:
        decision_id = new_decision_id()
        bound = structlog.contextvars.bind_contextvars(decision_id=decision_id)
        try:
            tags = self.director.admit(request.headers, request.body, request.body_too_large, chat, decision_id)
            return await self._route(request, chat, tags.body, tags, decision_id)
        except ApiError as err:  # counted once, here
            self.director.count(err.rule, err.code, "")
            return error_response(err, decision_id)
        except (asyncio.CancelledError, ConnectionResetError):  # the client went away before its answer ended
            self.director.count("", "abandoned", "")
            raise
        finally:
            structlog.contextvars.reset_contextvars(**bound)

    def _decide(self, req: Request, snap: Snapshot, avoid: set[str]) -> Decision:
        return self.director.decide(req, snap, avoid)

    def _calibration(self) -> float:
        c = self.calibration.value
        self.metrics.child(self.metrics.calibration, self.pool_label).set(c)
        return c

    def _queue_depth(self, priority: int, n: int) -> None:
        self.metrics.child(self.metrics.queue_depth, self.pool_label, str(priority)).set(n)

    async def _route(self, request: HttpRequest, chat: bool, body: ParsedBody, tags: RequestTags,
                     decision_id: str) -> Response | None:
        routing = self.director.routing(tags, decision_id, decide_fn=self._decide)
        for attempt in range(self.settings.max_attempts):
            d = await routing.next()
            if d is None:
                break
            cand = d.candidate
            routing.tried.add(cand.ledger_key)
            try:
                result = await self._send(request, chat, body, tags.req, d, d.snapshot, decision_id)
            except ApiError as err:
                if err.decision is not None:
                    self.director.publish_decision(err.decision, decision_id, tags.traces, err.amended)
                # routed, then refused on the way (the upstream's 4xx, a 5xx, a timeout, a
                # provider's limit): the answer names the rule and the backend, as a routed one
                err.headers = [("x-kinference-rule", d.rule or "unmatched"), ("x-kinference-backend", cand.backend)]
                raise
            if result is not _NOT_SENT:
                return result  # type: ignore[return-value]
        raise ApiError(502, "upstream_error", "every candidate tried refused the connection")

    def provider_target(self, dest: Any, headers: Mapping[str, str], stream: bool, decision_id: str,
                        chat: bool) -> tuple[str, list[tuple[str, str]]]:
        """A Provider pick's URL and headers, its API key included (ApiError
        502 naming what is missing when the key cannot be read)."""
        provider = dest.provider
        assert provider is not None
        out = provider_request.headers(headers, stream=stream, request_id=decision_id,
                                       allow=self.settings.provider_headers)
        try:
            out.append(("Authorization", f"Bearer {self.secrets.read(dest.namespace, provider.secret_ref)}"))
        except Exception as exc:  # SecretError says what is missing; others never show the file's contents
            why = str(exc) if isinstance(exc, SecretError) else f"its API key could not be read ({type(exc).__name__})"
            raise ApiError(502, "upstream_error", f"provider {dest.name}: {why}") from None
        return provider.url.rstrip("/") + ("/chat/completions" if chat else "/completions"), out

    async def _send(self, request: HttpRequest, chat: bool, body: ParsedBody, req: Request, d: Decision,
                    snap: Snapshot, decision_id: str) -> Response | None | object:
        """Proxy to the pick: a Response, or None once a stream was passed
        through. ``_NOT_SENT`` means "connection refused before any byte was
        sent": the caller may try the next best candidate."""
        assert self.upstream is not None
        cand = d.candidate
        dest = next(x for x in snap.pool.destinations if x.name == cand.dest_name and x.type == cand.type)
        connect_timeout, first_byte = self.settings.connect_timeout, self.settings.first_byte_timeout
        send = self.director.begin(d, snap, decision_id, provider=dest.provider)  # 429 at a provider's limit
        if cand.is_local:
            headers = [(k, v) for k, v in request.raw_headers if k.lower() not in DROP_HEADERS]
            headers.append(("Content-Type", "application/json"))
            url = f"http://{cand.state.address}/v1{'/chat/completions' if chat else '/completions'}"  # type: ignore[union-attr]
            data = body.encode(cand.served_name)
        else:
            try:
                url, headers = self.provider_target(dest, request.headers, body.stream, decision_id, chat)
            except ApiError:
                send.finish("not_sent")
                raise
            connect_timeout = dest.provider.connect_timeout_seconds or connect_timeout
            first_byte = dest.provider.first_token_timeout_seconds or first_byte
            data = provider_request.body(body.raw, cand.served_name)
        route_headers = [("x-kinference-decision-id", decision_id), ("x-kinference-rule", d.rule or "unmatched"),
                         ("x-kinference-backend", cand.backend)]
        backend_type = cand.type
        obs = send.obs
        send.started = time.perf_counter()
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
                    err.decision, err.amended = retry.not_resent(d, cand.backend), "upstream_error"
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
                if upstream.status >= 400:  # in the envelope, with the decision id and a 4xx's message
                    payload = b""
                    if upstream.status < 500:
                        try:
                            payload = await upstream.read()
                        except UpstreamError:
                            pass
                    raise ApiError(*validate.upstream_refusal(upstream.status, payload, cand.backend,
                                                              upstream.header("Retry-After")))
                ctype = upstream.header("Content-Type", "application/json")
                # the client's model name back, as the Endpoint Picker puts it back (None: the same name)
                restore = Restorer.of(cand.served_name, body.model)
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
                                send.first_token(streamed=True)
                            tail = (tail + chunk)[-4096:]
                            send.streamed(chunk)
                            if strip is not None:
                                chunk = strip.feed(chunk)
                            if restore is not None:
                                chunk = restore.feed(chunk)
                            await request.write(chunk)
                        rest = strip.flush() if strip is not None else b""
                        if restore is not None:
                            rest = restore.feed(rest) + restore.flush()
                        if rest:
                            await request.write(rest)
                    except UpstreamError as exc:
                        # headers are sent: the only way left to tell the client
                        # is to end its stream abruptly (no terminating chunk),
                        # so that a cut completion does not look finished
                        outcome = "timeout" if isinstance(exc, UpstreamTimeout) else "error"
                        obs.timeout_seconds = first_byte if outcome == "timeout" else None
                        self.director.count(d.rule or "unmatched", "upstream_error", backend_type)
                        log.info("upstream stream cut", backend=cand.backend, error=str(exc))
                        request.abort()
                        return None
                    request.end_stream()
                    Director.usage_from_stream(tail, obs)
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
                    send.first_token(streamed=False)
                    Director.usage(payload, obs)
                    if restore is not None:
                        payload = restore.whole(payload)
                    resp = Response(upstream.status, payload, route_headers, content_type=ctype)
                outcome = "ok" if upstream.status < 400 else "error"
                self.director.count(d.rule or "unmatched", "routed", backend_type)
                return resp
        except asyncio.CancelledError:
            outcome = "cancelled"  # the client went away: leaving `async with` closes the upstream
            raise
        except ConnectionResetError:
            outcome = "cancelled"
            raise
        finally:
            send.finish(outcome)

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
        try:  # refused with the data port's words
            body = parse(msgspec.json.encode(explained.body), chat=explained.chat)
            check_body(body)
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
        d = interpret(d)  # a prompt no window holds: context_length_exceeded, as the data port answers
        return Response(200, encode_trace(build_trace(d, decision_id="explain", classifiers=tags.traces)))


def _explain_error(status: int, message: str) -> Response:
    """The error envelope, as on the data port."""
    return server_error(status, {413: "payload_too_large", 503: "no_capacity"}.get(status, "bad_request"), message)


#: what _send returns when nothing reached the upstream (the caller tries the next candidate)
_NOT_SENT = object()
