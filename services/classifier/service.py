"""The classifier service: NATS request/reply in front of :class:`Classifiers`.

One subscription per built-in classifier on ``kinference.classify.<name>``,
all in the queue group ``kinference-classifier``, so replicas share the load
and NATS delivers each request to exactly one of them.

Lifecycle (explicit, no globals): :meth:`ClassifierService.start` compiles
the detectors and warms them, starts the health/metrics HTTP server, connects
to NATS and subscribes; :meth:`ClassifierService.stop` drains the
subscriptions (requests already delivered are answered), closes NATS and
then the HTTP server. ``__main__`` calls ``stop`` on SIGTERM/SIGINT.

The handler decodes, calls the pure detector, encodes and responds. It fails
closed: a request it cannot decode is answered with the failure tag
(``outcome="error"``); the detector's own failures are handled in
:mod:`kinference_classifier.core`.

A request is answered without running a detector (``outcome="deadline"``,
detail ``expired before it was read``) when it waited in this replica's
backlog longer than its deadline plus :data:`CLOCK_SKEW_ALLOWANCE`, measured
from the caller's ``sentAt``: its caller has given up already, and working on
it would only make the requests behind it late too (under a burst the backlog
would otherwise never recover). The allowance keeps a clock that is off by
less than it from failing fresh requests.

Logs never carry prompt text or exception messages (a validator's message may
quote its input): only sizes, tags, outcomes, timings and request ids.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import structlog
from aiohttp import web
from kinference_common.detectors.core import Classifiers
from kinference_common.classifiers import DEFAULT_MAX_CHARS
from kinference_common import bus
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.messages import (
    ClassifyBatch,
    ClassifyBatchReply,
    ClassifyReply,
    ClassifyRequest,
    decoder,
    encode,
)
from kinference_common.subjects import CLASSIFIER_QUEUE_GROUP, classify_batch_subject, classify_subject
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

#: how far the caller's clock may be ahead of or behind ours before a fresh
#: request could be taken for an expired one (NTP keeps a cluster well within it)
CLOCK_SKEW_ALLOWANCE = 1.0

_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 20e-3, 50e-3)


class Metrics:
    """The service's Prometheus metrics, on a registry of its own (tests run several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "kinference_classify_requests",
            "Classify requests answered, by tag and outcome.",
            ["classifier", "tag", "outcome"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "kinference_classify_seconds",
            "Time to classify one request inside the service (decode to encode).",
            ["classifier", "outcome"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.input_chars = Histogram(
            "kinference_classify_input_chars",
            "Characters per classify request.",
            ["classifier"],
            buckets=(256, 1024, 4096, 16384, 65536, 262144, 1048576),
            registry=self.registry,
        )
        self.expired = Counter(
            "kinference_classify_expired",
            "Requests answered unread (failure tag, outcome deadline): older than "
            "their deadline plus the clock allowance. Under load: a backlog being "
            "shed; at rest: the callers' clocks are off.",
            ["classifier"],
            registry=self.registry,
        )
        self.connected = Gauge(
            "kinference_classify_nats_connected",
            "1 while connected to NATS.",
            registry=self.registry,
        )


class ClassifierService:
    """Answer ``kinference.classify.<name>`` for the given classifiers."""

    def __init__(
        self,
        *,
        nats_url: str,
        health_host: str = "0.0.0.0",
        health_port: int = 8080,
        classifiers: Classifiers | None = None,
        names: list[str] | None = None,
        engine: str | None = None,
        max_chars: int = DEFAULT_MAX_CHARS,
        metrics: Metrics | None = None,
        logger: Any = None,
        nats_options: dict[str, Any] | None = None,
    ) -> None:
        self.nats_url = nats_url
        #: credentials and TLS (:func:`kinference_common.natsauth.connect_options`)
        self.nats_options = nats_options or {}
        self.health_host = health_host
        self.health_port = health_port
        self._classifiers = classifiers
        self._engine = engine
        self._max_chars = max_chars
        self.names = names or list(BUILTIN_CLASSIFIERS)
        unknown = [n for n in self.names if n not in BUILTIN_CLASSIFIERS]
        if unknown:
            raise ValueError(f"unknown classifiers: {', '.join(unknown)}")
        self.metrics = metrics or Metrics()
        self.log = logger or structlog.get_logger("kinference.classifier")
        self.nc: NATS | None = None
        self._subs: list[Subscription] = []
        self._runner: web.AppRunner | None = None
        self._decoder = decoder(ClassifyRequest)
        #: upper bound of a request's JSON size for ``max_chars`` characters
        #: (a character is at most 6 bytes escaped): larger payloads are not decoded
        self._max_bytes = 6 * max_chars + 65536

    # ---------------------------------------------------------------- lifecycle

    @property
    def classifiers(self) -> Classifiers:
        if self._classifiers is None:
            raise RuntimeError("not started")
        return self._classifiers

    @property
    def http_port(self) -> int | None:
        """The bound health port (useful with ``health_port=0``)."""
        if self._runner is None:
            return None
        for site in self._runner.sites:
            server = getattr(site, "_server", None)
            if server is not None and server.sockets:
                return int(server.sockets[0].getsockname()[1])
        return None

    def ready(self) -> bool:
        return self.nc is not None and self.nc.is_connected and len(self._subs) == 2 * len(self.names)

    async def start(self) -> None:
        if self._classifiers is None:
            self._classifiers = Classifiers(engine=self._engine, max_chars=self._max_chars)
        self.classifiers.warm_up()
        await self._start_http()
        self.nc = await bus.connect(
            self.nats_url,
            name="kinference-classifier",
            on_disconnect=self._on_disconnected,
            on_reconnect=self._on_reconnected,
            **self.nats_options,
        )
        self.metrics.connected.set(1)
        for name in self.names:
            sub = await self.nc.subscribe(
                classify_subject(name), queue=CLASSIFIER_QUEUE_GROUP, cb=self._handler(name)
            )
            self._subs.append(sub)
            sub = await self.nc.subscribe(
                classify_batch_subject(name), queue=CLASSIFIER_QUEUE_GROUP, cb=self._batch_handler(name)
            )
            self._subs.append(sub)
        # The server has our subscriptions once it answers: ready means reachable.
        await bus.sync(self.nc)
        engines = {n: getattr(d, "engine", "?") for n, d in self.classifiers.detectors.items()}
        self.log.info(
            "classifier started",
            classifiers=self.names,
            engines=engines,
            health_port=self.http_port,
            max_chars=self.classifiers.max_chars,
        )

    async def stop(self) -> None:
        """Drain (answer what was delivered), then close NATS and the HTTP server."""
        if self.nc is not None:
            # drains every subscription (answers what was delivered), bounded:
            # a bare drain never returns when NATS goes away meanwhile
            self._subs.clear()
            await bus.close(self.nc)
            self.nc = None
            self.metrics.connected.set(0)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self.log.info("classifier stopped")

    async def __aenter__(self) -> ClassifierService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ NATS

    def _handler(self, name: str) -> Any:
        info = BUILTIN_CLASSIFIERS[name]
        metrics = self.metrics
        log = self.log

        async def handle(msg: Msg) -> None:
            t0 = time.perf_counter()
            reply: ClassifyReply
            chars = 0
            stale = False
            if len(msg.data) > self._max_bytes:
                reply = ClassifyReply(
                    classifier=name,
                    tags=[info.failure_tag],
                    outcome="oversize",
                    detail=f"{len(msg.data)} bytes not decoded",
                )
            else:
                try:
                    req = self._decoder.decode(msg.data)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    reply = ClassifyReply(
                        classifier=name,
                        tags=[info.failure_tag],
                        outcome="error",
                        detail="undecodable request",
                    )
                else:
                    if (
                        req.sent_at is not None
                        and req.deadline_ms is not None
                        and (waited := time.time() - req.sent_at)
                        > req.deadline_ms / 1000.0 + CLOCK_SKEW_ALLOWANCE
                    ):
                        # its caller gave up long ago: no detector runs, and no
                        # warning per request (a backlog would flood the log):
                        # kinference_classify_expired_total counts them
                        stale = True
                        metrics.expired.labels(name).inc()
                        reply = ClassifyReply(
                            classifier=name,
                            tags=[info.failure_tag],
                            outcome="deadline",
                            request_id=req.request_id,
                            detail=f"expired before it was read ({waited:.1f}s after it was sent)",
                        )
                    else:
                        chars = sum(len(t) for t in req.texts)
                        reply = self.classifiers.classify(
                            name,
                            req.texts,
                            roles=req.roles,
                            unreadable=req.unreadable,
                            deadline_ms=req.deadline_ms,
                            request_id=req.request_id,
                        )
            elapsed = time.perf_counter() - t0
            tag = reply.tags[0] if reply.tags else ""
            metrics.requests.labels(name, tag, reply.outcome).inc()
            metrics.seconds.labels(name, reply.outcome).observe(elapsed)
            metrics.input_chars.labels(name).observe(chars)
            if reply.outcome == "ok":
                log.debug(
                    "classified",
                    classifier=name,
                    tag=tag,
                    findings=reply.findings,
                    request_id=reply.request_id,
                    chars=chars,
                    micros=reply.micros,
                )
            elif not stale:
                log.warning(
                    "classify failed closed",
                    classifier=name,
                    tag=tag,
                    outcome=reply.outcome,
                    detail=reply.detail,
                    request_id=reply.request_id,
                    chars=chars,
                )
            if msg.reply:
                try:
                    await msg.respond(encode(reply))
                except Exception as exc:
                    log.warning("reply failed", classifier=name, error=type(exc).__name__)

        return handle

    def _batch_handler(self, name: str) -> Any:
        """``kinference.classify.<name>.batch``: the items in order, within the
        batch's deadline from when it is read (an item left without time gets
        the failure tag, outcome deadline); the whole batch is answered unread
        when it waited longer than its deadline plus the clock allowance."""
        info = BUILTIN_CLASSIFIERS[name]
        metrics = self.metrics
        batch_decoder = decoder(ClassifyBatch)

        async def handle(msg: Msg) -> None:
            t0 = time.perf_counter()
            if len(msg.data) > self._max_bytes:
                replies = None
            else:
                try:
                    batch = batch_decoder.decode(msg.data)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    batch = None
                replies = [] if batch is not None else None
            if replies is None:
                # cannot tell how many items: the caller fails them all closed
                out = ClassifyBatchReply(replies=[])
            else:
                assert batch is not None
                stale = (batch.sent_at is not None and batch.deadline_ms is not None
                         and time.time() - batch.sent_at > batch.deadline_ms / 1000.0 + CLOCK_SKEW_ALLOWANCE)
                until = None if batch.deadline_ms is None else t0 + batch.deadline_ms / 1000.0
                for req in batch.items:
                    started = time.perf_counter()
                    left = None if until is None else (until - started) * 1000.0
                    if stale:
                        metrics.expired.labels(name).inc()
                        reply = ClassifyReply(classifier=name, tags=[info.failure_tag], outcome="deadline",
                                              request_id=req.request_id, detail="expired before it was read")
                    else:
                        reply = self.classifiers.classify(name, req.texts, roles=req.roles,
                                                          unreadable=req.unreadable, deadline_ms=left,
                                                          request_id=req.request_id)
                    replies.append(reply)
                    metrics.requests.labels(name, reply.tags[0] if reply.tags else "", reply.outcome).inc()
                    metrics.seconds.labels(name, reply.outcome).observe(time.perf_counter() - started)
                    metrics.input_chars.labels(name).observe(sum(len(t) for t in req.texts))
                out = ClassifyBatchReply(replies=replies)
                if any(r.outcome != "ok" for r in replies) and not stale:
                    self.log.warning("classify batch failed closed in part", classifier=name,
                                     items=len(replies), failed=sum(r.outcome != "ok" for r in replies),
                                     micros=round((time.perf_counter() - t0) * 1e6, 1))
            if msg.reply:
                try:
                    await msg.respond(encode(out))
                except Exception as exc:
                    self.log.warning("reply failed", classifier=name, error=type(exc).__name__)

        return handle

    async def _on_disconnected(self) -> None:
        self.metrics.connected.set(0)

    async def _on_reconnected(self) -> None:
        self.metrics.connected.set(1)

    # ------------------------------------------------------------------ HTTP

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.health_host, self.health_port)
        await site.start()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.ready():
            return web.json_response({"status": "ready", "classifiers": self.names})
        return web.json_response({"status": "not ready"}, status=503)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
