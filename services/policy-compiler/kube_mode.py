"""Kubernetes mode, assembled: an API client, the informers' source, the
status sink and (optionally) a leader elector, around the same
:class:`~kinference_policy_compiler.service.PolicyCompilerService`.

Start-up order matters: the informers must have listed every kind once
before the first compile, or an empty cache would be compiled and published
(the routers would lose their pools). :meth:`KubernetesMode.start` waits for
that, however long the API server takes to answer.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from dataclasses import dataclass

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.kube.lease import LeaderElector
from kinference_policy_compiler.kube_source import KubernetesSource
from kinference_policy_compiler.kube_status import KubernetesStatusSink
from kinference_policy_compiler.service import PolicyCompilerService, Settings

log = structlog.get_logger("policy-compiler.kube")

USER_AGENT = "kinference-policy-compiler"
DEFAULT_LEASE_NAME = "kinference-policy-compiler"


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_lease_namespace() -> str:
    return os.environ.get("POD_NAMESPACE") or "kinference-system"


@dataclass
class KubeSettings:
    kubeconfig: str | None = None
    namespaces: Collection[str] | None = None
    leader_elect: bool = True
    lease_name: str = DEFAULT_LEASE_NAME
    lease_namespace: str | None = None
    identity: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    watch_timeout: int = 300
    backoff_cap: float = 30.0
    event_interval: float = 60.0


class _KubeCollector:
    """Kubernetes-mode metrics, read from the parts at scrape time."""

    def __init__(self, mode: KubernetesMode) -> None:
        self.mode = mode

    def collect(self):  # type: ignore[no-untyped-def]
        m = self.mode
        leader = GaugeMetricFamily("kinference_leader", "1 when this replica holds the Lease (writes and "
                                   "publishes); always 1 without leader election")
        leader.add_metric([], 1.0 if (m.elector is None or m.elector.is_leader) else 0.0)
        yield leader
        if m.source is not None:
            lists = CounterMetricFamily("kinference_kube_lists", "Lists per kind (the first, then every relist)",
                                        labels=["resource"])
            errors = CounterMetricFamily("kinference_kube_watch_errors", "API errors and cut watches per kind",
                                         labels=["resource", "kind"])
            for k, inf in m.source.informers.items():
                lists.add_metric([str(k)], inf.lists)
                errors.add_metric([str(k), "gone"], inf.gone)
                errors.add_metric([str(k), "error"], inf.errors)
            yield lists
            yield errors
        if m.sink is not None:
            writes = CounterMetricFamily("kinference_kube_status_writes", "Status patches sent",
                                         labels=["outcome"])
            writes.add_metric(["written"], m.sink.writer.writes)
            writes.add_metric(["conflict"], m.sink.writer.conflicts)
            yield writes
            events = CounterMetricFamily("kinference_kube_events", "Events recorded", labels=["op"])
            events.add_metric(["created"], m.sink.recorder.created)
            events.add_metric(["updated"], m.sink.recorder.updated)
            yield events


class KubernetesMode:
    def __init__(self, settings: Settings, kube: KubeSettings) -> None:
        self.settings = settings
        self.kube = kube
        self.identity = kube.identity or default_identity()
        self.rc: ResourceClient | None = None
        self.source: KubernetesSource | None = None
        self.elector: LeaderElector | None = None
        self.service: PolicyCompilerService | None = None
        self.sink: KubernetesStatusSink | None = None

    async def start(self) -> PolicyCompilerService:
        api = await api_client(self.kube.kubeconfig, USER_AGENT)
        self.rc = ResourceClient(api)
        namespaces = self.kube.namespaces
        self.settings.watched_namespaces = namespaces
        self.source = KubernetesSource(self.rc, namespaces, watch_timeout=self.kube.watch_timeout,
                                       backoff_cap=self.kube.backoff_cap)
        if self.kube.leader_elect:
            self.elector = LeaderElector(
                self.rc, self.kube.lease_namespace or default_lease_namespace(), self.kube.lease_name,
                self.identity, lease_duration=self.kube.lease_duration, renew_deadline=self.kube.renew_deadline,
                retry_period=self.kube.retry_period)
        elector = self.elector
        is_leader = (lambda: elector.is_leader) if elector is not None else (lambda: True)
        sink = KubernetesStatusSink(self.rc, self.source, self.identity, event_interval=self.kube.event_interval,
                                    is_leader=is_leader)
        self.sink = sink
        self.service = PolicyCompilerService(self.settings, source=self.source, status_sink=sink,
                                             is_leader=is_leader)
        self.service.metrics.registry.register(_KubeCollector(self))
        self.source.on_change = self.service.wake
        if self.elector is not None:
            self.elector.on_started = self.service.leadership_changed
            self.elector.on_stopped = self.service.leadership_changed
        await self.service.start_http()  # live (not ready) while the caches fill
        self.source.start()
        log.info("waiting for the caches to fill", namespaces=sorted(namespaces) if namespaces else "all")
        await self.source.wait_synced()
        if self.elector is not None:
            self.elector.start()
        await self.service.start()
        log.info("kubernetes mode started", identity=self.identity,
                 leader_election=self.kube.leader_elect)
        return self.service

    async def stop(self, release: bool = True) -> None:
        """Stop; ``release=False`` leaves the Lease held (as a crash would)."""
        if self.elector is not None:
            await self.elector.stop(release=release)
        if self.service is not None:
            await self.service.stop()
        if self.source is not None:
            await self.source.stop()
        if self.rc is not None:
            await self.rc.api.close()
