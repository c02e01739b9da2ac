"""The router's Prometheus metrics, in one place: every service module that
counts something takes a :class:`RouterMetrics` and uses :meth:`RouterMetrics.child`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class RouterMetrics:
    """The router's Prometheus metrics. :meth:`child` returns a metric's
    child for a label set, kept after the first use: ``labels()`` costs a lock
    and a tuple lookup on every call, which adds up on the hot path (label
    sets are bounded by the pool's rules, outcomes and backends)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("kinference_requests_total", "Requests by outcome",
                                ["pool", "rule", "outcome", "backend_type"], registry=r)
        self.decision = Histogram("kinference_decision_seconds", "Decision time (engine call only)",
                                  buckets=(5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2),
                                  registry=r)
        self.classifier = Histogram("kinference_classifier_seconds", "Classifier round trip",
                                    ["classifier", "outcome"], registry=r)
        self.ttft = Histogram("kinference_upstream_ttft_seconds", "Time to first byte from upstream",
                              ["backend"], registry=r)
        #: requests open upstream, per backend; read by the registry at scrape
        #: time (a Gauge would take a lock twice per request)
        self.inflight: dict[str, int] = {}
        r.register(_InflightCollector(self.inflight))
        self.queue_depth = Gauge("kinference_queue_depth", "Requests waiting in flow control",
                                 ["pool", "priority"], registry=r)
        self.calibration = Gauge("kinference_ttft_calibration",
                                 "PredictedTTFT's calibration factor c (observed / predicted TTFT), as learned",
                                 ["pool"], registry=r)
        self.dropped_events = Counter("kinference_events_dropped_total",
                                      "Decision events and observations not published", registry=r)
        self.unknown_objectives = Counter("kinference_unknown_objectives_total",
                                          "Requests naming an InferenceObjective the pool does not have",
                                          registry=r)
        self._children: dict[tuple[Any, ...], Any] = {}
        #: the HTTP servers whose limits are exported, by name (data, admin)
        self._http: dict[str, Any] = {}
        r.register(_HttpCollector(self._http))

    def watch_http(self, name: str, server: Any) -> None:
        """Export ``server``'s connections, pending body bytes and refusals
        (an :class:`~kinference_router.http_server.HttpServer`) as ``server=name``."""
        self._http[name] = server

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept after the first use."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


class _InflightCollector(Collector):
    """``kinference_inflight{backend}`` from the router's own counts."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Any:
        g = GaugeMetricFamily("kinference_inflight", "Requests open upstream", labels=["backend"])
        for backend, n in list(self._counts.items()):
            g.add_metric([backend], n)
        yield g


class _HttpCollector(Collector):
    """What clients make the HTTP servers hold, read at scrape time:
    ``kinference_http_connections{server}``,
    ``kinference_http_pending_body_bytes{server}`` and
    ``kinference_http_rejected_total{server, reason}`` (connection_limit,
    header_timeout, body_timeout, body_memory, header_limit)."""

    def __init__(self, servers: dict[str, Any]) -> None:
        self._servers = servers

    def collect(self) -> Any:
        conns = GaugeMetricFamily("kinference_http_connections", "Open client connections", labels=["server"])
        pending = GaugeMetricFamily("kinference_http_pending_body_bytes",
                                    "Bytes of request bodies received but not yet handed to a handler",
                                    labels=["server"])
        rejected = CounterMetricFamily("kinference_http_rejected",
                                       "Connections and requests refused by an HTTP limit", labels=["server", "reason"])
        for name, server in list(self._servers.items()):
            conns.add_metric([name], len(server.connections))
            pending.add_metric([name], server.pending_body_bytes)
            for reason, n in server.rejected.items():
                rejected.add_metric([name, reason], n)
        yield conns
        yield pending
        yield rejected
