"""The router's Prometheus metrics, in one place: every service module that
counts something takes a :class:`RouterMetrics` and uses :meth:`RouterMetrics.child`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


#: per-pod series kept by one router (a pod past this evicts the least recently used)
MAX_PODS = 512
#: TTFT buckets, seconds: from a warm prefix-cache hit to a long queue
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
#: the router's observation outcomes, as metric label values
OUTCOMES = {"cancelled": "abandoned"}


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
        self.egress_refused = Counter("kinference_egress_refused_total",
                                      "Requests the provider egress refused (403 egress_forbidden), by reason",
                                      ["reason"], registry=r)
        self.unknown_objectives = Counter("kinference_unknown_objectives_total",
                                          "Requests naming an InferenceObjective the pool does not have",
                                          registry=r)
        self.spread_moves = Counter("kinference_spread_moves_total",
                                    "Decisions that moved a request off a busy prefix holder to a pod that holds little "
                                    "(one that joined or restarted with an empty cache): each pays a cold prefill",
                                    registry=r)
        self.relief_copies = Counter("kinference_stickiness_relief_copies_total",
                                     "Decisions that sent a request to a pod without its prefix while the best "
                                     "holder's stickiness charge was relieved (it carried more than its share of "
                                     "the load and of the prefixes in use): each pays a cold prefill",
                                     registry=r)
        self.conversation_moves = Counter("kinference_conversation_moves_total",
                                          "Decisions that sent a conversation's next turn to a pod without its "
                                          "earlier turns (charged less for leaving its pod: the holder's copy is "
                                          "the conversation's past): each pays the turn's whole prefill",
                                          registry=r)
        # --- what an operator asks of the data plane (docs/reference/metrics.md)
        self.backend_requests = Counter(
            "kinference_backend_requests_total",
            "Requests sent to a backend, by how they ended: ok, error, timeout, rate_limited, "
            "abandoned (the client went away first)",
            ["pool", "backend", "outcome"], registry=r)
        self.endpoint_requests = Counter(
            "kinference_endpoint_requests_total",
            f"Requests sent to one vLLM pod, by outcome (at most {MAX_PODS} pods per router, least recently used evicted)",
            ["pool", "worker_set", "pod", "outcome"], registry=r)
        self.endpoint_ttft = Histogram(
            "kinference_endpoint_ttft_seconds",
            f"Time to first token of streamed requests, per vLLM pod (at most {MAX_PODS} pods per router)",
            ["pool", "worker_set", "pod"], buckets=TTFT_BUCKETS, registry=r)
        self.provider_tokens = Counter(
            "kinference_provider_tokens_total",
            "Tokens a provider billed, from its answers' usage: kind=prompt|completion",
            ["pool", "provider", "kind"], registry=r)
        self.classifier_tags = Counter(
            "kinference_classifier_tags_total",
            "Tags the classifiers gave requests (a failed or late classifier counts as its failure tag)",
            ["classifier", "tag"], registry=r)
        # --- replica sync (replica_sync.py): router replicas sharing what they know
        self.sync_peers = Gauge("kinference_replica_sync_peers",
                                "Other router replicas whose state this one merges now", registry=r)
        self.sync_messages = Counter(
            "kinference_replica_sync_messages_total",
            "Replica-sync messages: direction=out (outcome sent|failed), direction=in (outcome merged|"
            "own|old|stale|garbled|key_mismatch)",
            ["direction", "outcome"], registry=r)
        self.sync_expired = Counter("kinference_replica_sync_peers_expired_total",
                                    "Router replicas forgotten after going quiet for the TTL", registry=r)
        #: (pool, worker_set, pod) -> None, in least-recently-used order
        self._pods: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._children: dict[tuple[Any, ...], Any] = {}
        #: the HTTP servers whose limits are exported, by name (data, admin)
        self._http: dict[str, Any] = {}
        r.register(_HttpCollector(self._http))
        #: part of NATS the router uses -> checks, each True while it works (routers of several pools
        #: share this: the part works when every pool's check says so)
        self._bus: dict[str, list[Callable[[], bool]]] = {}
        r.register(_BusCollector(self._bus))

    def watch_bus(self, part: str, works: Callable[[], bool]) -> None:
        """Export ``kinference_bus_available{part}``: 1 while ``works()``."""
        self._bus.setdefault(part, []).append(works)

    def watch_http(self, name: str, server: Any) -> None:
        """Export ``server``'s connections, pending body bytes and refusals
        (an :class:`~kinference_router.http_server.HttpServer`) as ``server=name``."""
        self._http[name] = server

    def sent(self, pool: str, backend: str, dest_name: str, pod: str | None, is_local: bool, outcome: str,
             prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """One request sent to a backend has ended (``outcome`` as the router's
        observation has it; ``cancelled`` is counted as ``abandoned``).
        ``dest_name`` is the worker set of a local pick, the provider's name otherwise."""
        outcome = OUTCOMES.get(outcome, outcome)
        self.child(self.backend_requests, pool, backend, outcome).inc()
        if is_local and pod:
            self._pod_seen(pool, dest_name, pod)
            self.child(self.endpoint_requests, pool, dest_name, pod, outcome).inc()
        elif not is_local:
            if prompt_tokens:
                self.child(self.provider_tokens, pool, dest_name, "prompt").inc(prompt_tokens)
            if completion_tokens:
                self.child(self.provider_tokens, pool, dest_name, "completion").inc(completion_tokens)

    def first_token(self, pool: str, worker_set: str, pod: str | None, seconds: float) -> None:
        """A streamed local request's first token arrived after ``seconds``."""
        if pod:
            self._pod_seen(pool, worker_set, pod)
            self.child(self.endpoint_ttft, pool, worker_set, pod).observe(seconds)

    def tags(self, classifier: str, tags: Any) -> None:
        for tag in tags:
            self.child(self.classifier_tags, classifier, tag).inc()

    def _pod_seen(self, pool: str, worker_set: str, pod: str) -> None:
        """Bound the per-pod series: pods come and go with rollouts, so past
        ``MAX_PODS`` the least recently used pod's series are removed."""
        key = (pool, worker_set, pod)
        if key in self._pods:
            self._pods.move_to_end(key)
            return
        self._pods[key] = None
        while len(self._pods) > MAX_PODS:
            old, _ = self._pods.popitem(last=False)
            self.forget_pod(*old)

    def forget_pod(self, pool: str, worker_set: str, pod: str) -> None:
        """Remove every series of one pod."""
        self._pods.pop((pool, worker_set, pod), None)
        for key in [k for k in self._children if k[0] in (self.endpoint_requests, self.endpoint_ttft)
                    and k[1:4] == (pool, worker_set, pod)]:
            del self._children[key]
            try:
                key[0].remove(*key[1:])
            except KeyError:
                pass

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


class _BusCollector(Collector):
    """``kinference_bus_available{part}``, read at scrape time: 1 while the
    part of NATS the router uses works, 0 while it does not (``connection``:
    connected to a server; ``config_store``: the configuration bucket answers,
    which needs a JetStream quorum; ``records_stream``: the decision records'
    stream stores them). A NATS cluster that lost its quorum showed only in
    the logs (HA trial)."""

    def __init__(self, parts: dict[str, list[Callable[[], bool]]]) -> None:
        self._parts = parts

    def collect(self) -> Any:
        g = GaugeMetricFamily("kinference_bus_available", "1 while this part of NATS works for the router",
                              labels=["part"])
        for part, checks in list(self._parts.items()):
            g.add_metric([part], 1.0 if all(check() for check in checks) else 0.0)
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
