"""The collector's own Prometheus metrics and its small HTTP server.

A registry per collector (no process globals), served on ``/metrics``;
``/healthz`` answers 200 while the collector runs and 503 once it stops.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

SCRAPE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
ENDPOINT_STATES = ("ready", "stale", "not_ready")


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.scrape_seconds = Histogram(
            "kinference_scrape_seconds", "Scrape, parse and derive time per target.",
            ["target_kind"], buckets=SCRAPE_BUCKETS, registry=self.registry,
        )
        self.scrape_errors = Counter(
            "kinference_scrape_errors_total", "Failed scrapes (timeouts, HTTP errors, oversize or unreadable pages).",
            ["target_kind"], registry=self.registry,
        )
        self.endpoints = Gauge(
            "kinference_endpoints", "Endpoints by state: ready, stale (ready, last scrapes failed), not_ready.",
            ["state"], registry=self.registry,
        )
        self.published = Counter(
            "kinference_collector_published_total", "States published to NATS, by kind (endpoint, provider).",
            ["kind"], registry=self.registry,
        )
        self.kv_writes = Counter(
            "kinference_collector_kv_writes_total",
            "States written to the telemetry KV bucket: at most once a second per key, and at once when an "
            "endpoint's readiness changes (every change goes on its subject).", registry=self.registry,
        )
        self.dcgm_unchanged = Counter(
            "kinference_collector_dcgm_unchanged_total",
            "DCGM exporter pages the same as the last one parsed (the exporter had not collected since): "
            "not parsed again.", registry=self.registry,
        )
        self.members = Gauge(
            "kinference_collector_members",
            "Collector replicas sharing the fleet, as this replica counts them (itself included).",
            registry=self.registry,
        )
        self.members_dropped = Counter(
            "kinference_collector_members_dropped_total",
            "Replicas this replica's probe took for dead, by cause: disconnected (NATS had no connection of "
            "it) or unanswered (--probe-misses probes in a row timed out while it was connected).",
            ["cause"], registry=self.registry,
        )
        self.observations = Counter(
            "kinference_collector_observations_total", "Observations received, by whether they decoded.",
            ["result"], registry=self.registry,
        )
        # children resolved once: labels() is a dict lookup plus a lock
        self.scrape_seconds_vllm = self.scrape_seconds.labels("vllm")
        self.scrape_seconds_dcgm = self.scrape_seconds.labels("dcgm")
        self.scrape_errors_vllm = self.scrape_errors.labels("vllm")
        self.scrape_errors_dcgm = self.scrape_errors.labels("dcgm")
        for s in ENDPOINT_STATES:
            self.endpoints.labels(s).set(0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def http_app(metrics: CollectorMetrics, healthy: Callable[[], bool],
             before_render: Callable[[], None] | None = None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        return web.json_response({"ok": ok}, status=200 if ok else 503)

    async def metrics_page(_: web.Request) -> web.Response:
        if before_render is not None:
            before_render()
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_page)
    return app
