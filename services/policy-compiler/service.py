"""The reconcile loop: level-triggered, like a Kubernetes controller.

Every ``interval`` the source is polled; on a change, and at least every
``resync`` seconds anyway, everything is recompiled from the documents in
force and the differences are published and written. Nothing assumes an
event arrived: a missed change is picked up by the next pass.

Publishing failures (NATS down) are temporary: the loop logs once, keeps the
statuses current, and publishes on the next pass once NATS is back (the
client reconnects by itself). On reconnect and on every resync the publisher
reads the config bucket again and writes what differs (recreating the
bucket when the server lost its storage), so the bus converges to the
desired state whatever happened to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import nats
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from kinference_common import bus
from kinference_common.compiler import CompileResult, compile_documents
from kinference_common.manifests import ManifestError
from kinference_common.tasks import cancel_and_wait
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_policy_compiler.source import DirectorySource, ManifestSource
from kinference_policy_compiler.statuses import StatusDirectory

log = structlog.get_logger("policy-compiler")


@dataclass
class Settings:
    manifests: Path
    nats_url: str = "nats://127.0.0.1:4222"
    status_dir: Path | None = None
    interval: float = 0.5
    resync: float = 30.0
    http_host: str = "127.0.0.1"
    #: health and metrics; 0 = any free port, None = no HTTP server
    http_port: int | None = None
    watched_namespaces: Collection[str] | None = None
    #: credentials and TLS (:func:`kinference_common.natsauth.connect_options`)
    nats_options: dict[str, Any] = field(default_factory=dict)
    #: classifiers routers run in their own process (``--in-process-classifier``)
    in_process_classifiers: Collection[str] = ()
    #: replicas of the config bucket (``--kv-replicas``: 3 on a cluster of three NATS servers)
    kv_replicas: int = 1


class StatusSink(Protocol):
    """Where statuses go besides the status directory (Kubernetes mode:
    kube_status.KubernetesStatusSink). True when the pass completed."""

    async def write(self, res: CompileResult, errors: list[ManifestError]) -> bool: ...


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.warnings = Gauge("kinference_policy_warnings", "Warnings in a policy's status",
                              ["namespace", "policy"], registry=self.registry)
        self.reconcile = Histogram("kinference_reconcile_seconds", "Time to compile and publish",
                                   ["kind"], registry=self.registry)
        self.errors = Gauge("kinference_manifest_errors", "Manifest errors in the current input",
                            registry=self.registry)
        self.pools = Gauge("kinference_compiled_pools", "Compiled pools in force", registry=self.registry)


class PolicyCompilerService:
    def __init__(self, settings: Settings, source: ManifestSource | None = None,
                 status_sink: StatusSink | None = None, is_leader: Callable[[], bool] | None = None) -> None:
        self.settings = settings
        self.source = source or DirectorySource(settings.manifests)
        #: Kubernetes mode: statuses to the cluster; only the leader writes and publishes
        self.status_sink = status_sink
        self.is_leader = is_leader or (lambda: True)
        self._sink_pending = False
        self.last_errors: list[ManifestError] = []
        self.metrics = Metrics()
        self.statuses = StatusDirectory(settings.status_dir) if settings.status_dir else None
        self.last_result: CompileResult | None = None
        self.reconciles = 0
        self._nc: nats.NATS | None = None
        self._publisher: ConfigPublisher | None = None
        self._task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._wake = asyncio.Event()
        self._stopping = False
        self._unpublished = True
        self._publish_failing = False
        self.http_port: int | None = None

    async def start(self) -> None:
        self._nc = await bus.connect(self.settings.nats_url, name="kinference-policy-compiler",
                                     on_reconnect=self._on_reconnect, **self.settings.nats_options)
        self._publisher = ConfigPublisher(self._nc, replicas=self.settings.kv_replicas)
        await self._restore_last_good()
        if self._runner is None:
            await self._start_http()
        self.source.poll()
        self.reconcile()  # compile once before publishing, so start() returns with state
        await self._write_statuses()
        await self._publish()
        self._task = asyncio.create_task(self._loop(), name="policy-compiler-loop")
        # the directory only when it is the source (Kubernetes mode logged "manifests: .")
        where = ({"manifests": str(self.settings.manifests)} if isinstance(self.source, DirectorySource)
                 else {"source": type(self.source).__name__})
        log.info("started", nats=self.settings.nats_url, **where)

    async def _restore_last_good(self) -> None:
        """Read the config bucket (waiting for JetStream, saying so once) and
        give the source its stored last good versions, so a file broken now
        keeps what it published before the restart."""
        assert self._publisher is not None
        waiting = False
        while True:
            try:
                texts = await self._publisher.start()
                break
            except Exception as exc:  # JetStream not ready yet (a NATS just started)
                if not waiting:
                    waiting = True
                    log.warning("config bucket unavailable, retrying", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(0.5)
        restore = getattr(self.source, "restore_last_good", None)
        if restore is not None and texts:
            restore(texts)

    async def start_http(self) -> None:
        """Serve /healthz (and a 503 /readyz) before start(), e.g. while the
        Kubernetes caches fill."""
        if self._runner is None:
            await self._start_http()

    async def _start_http(self) -> None:
        if self.settings.http_port is None:
            return
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.http_host, self.settings.http_port)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        # Python 3.11's wait_for can swallow a cancel when the wake event is
        # set at the same moment (a cache change, a leadership change): the
        # flag ends the loop anyway.
        self._stopping = True
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._nc is not None:
            await bus.close(self._nc)  # bounded: NATS may be gone too
        log.info("stopped")

    def wake(self) -> None:
        """Reconcile now (tests, SIGHUP)."""
        self._wake.set()

    # ------------------------------------------------------------------ loop

    async def _loop(self) -> None:
        last_full = time.monotonic()
        while not self._stopping:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.interval)
            except TimeoutError:
                pass
            self._wake.clear()
            changed = self.source.poll()
            if changed or time.monotonic() - last_full >= self.settings.resync:
                if not changed and self._publisher is not None:
                    self._publisher.resync()  # level-triggered: compare with what the bus holds now
                last_full = time.monotonic()
                self.reconcile()
                self._unpublished = True
            await self._write_statuses()
            if self._unpublished:
                await self._publish()

    def reconcile(self) -> CompileResult:
        """Compile the documents in force and write statuses (no NATS)."""
        started = time.perf_counter()
        documents = self.source.documents()  # once: the order of definitions in force is settled here
        res = compile_documents(documents, watched_namespaces=self.settings.watched_namespaces,
                               in_process_classifiers=self.settings.in_process_classifiers,
                               services_visible=getattr(self.source, "services_visible", False))
        errors = [*self.source.errors(), *res.errors]
        self.last_errors = errors
        self._sink_pending = self.status_sink is not None
        if self.statuses is not None:
            self.statuses.write(res, errors, documents)
        self.metrics.warnings.clear()
        for (ns, name), st in res.policy_status.items():
            self.metrics.warnings.labels(ns, name).set(len(st.warnings))
        self.metrics.errors.set(len(errors))
        self.metrics.pools.set(len(res.pools))
        self.metrics.reconcile.labels("all").observe(time.perf_counter() - started)
        for e in errors:
            log.warning("manifest error", document=str(e.document), path=e.path, error=e.message)
        kept = getattr(self.source, "kept_at_last_good", lambda: [])()
        if kept:
            log.warning("keeping last good version", files=kept)
        self.last_result = res
        self.reconciles += 1
        log.info("reconciled", pools=len(res.pools), policies=len(res.policy_status), errors=len(errors),
                 warnings=res.warning_count)
        return res

    def leadership_changed(self) -> None:
        """Called by the leader elector: a new leader writes and publishes at once."""
        self._sink_pending = self.status_sink is not None
        if self._publisher is not None:
            self._publisher.resync()  # another leader may have written since: read the bucket again
        self._unpublished = True
        self.wake()

    async def _write_statuses(self) -> None:
        if self.status_sink is None or not self._sink_pending or self.last_result is None:
            return
        if not self.is_leader():
            return
        if await self.status_sink.write(self.last_result, self.last_errors):
            self._sink_pending = False

    async def _publish(self) -> None:
        if self._publisher is None or self.last_result is None:
            return
        if not self.is_leader():
            return
        if self._nc is None or not self._nc.is_connected:
            return
        last_good = getattr(self.source, "last_good_texts", None)
        try:
            published, deleted = await self._publisher.publish(
                self.last_result.pools, last_good() if last_good is not None else None)
        except Exception as exc:  # temporary: NATS went away mid-publish, JetStream not ready
            if not self._publish_failing:  # once per outage, not every interval
                self._publish_failing = True
                log.warning("publish failed, will retry", error=str(exc) or type(exc).__name__)
            return
        if self._publish_failing:
            self._publish_failing = False
            log.info("publishing again")
        self._unpublished = False
        if published or deleted:
            log.info("published", pools=published, deleted=deleted)

    async def _on_reconnect(self) -> None:
        if self._publisher is not None:
            self._publisher.resync()  # the server may have lost everything: read it again
        self._unpublished = True
        self.wake()

    # ------------------------------------------------------------------ http

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.last_result is not None and self._nc is not None and self._nc.is_connected \
            and self._task is not None
        return web.Response(status=200 if ok else 503, text="ready\n" if ok else "not ready\n")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})
