"""docs/reference/metrics.md against what the services serve: each service is
built and its ``/metrics`` handler asked (not the generator's own view of the
registries, which is what missed the metrics the router's classification
registers), and every metric family it answers with must be on the page,
under that service. The page's port sentence matches the router's servers."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]

spec = importlib.util.spec_from_file_location("docgen", REPO / "tools" / "docgen.py")
docgen = importlib.util.module_from_spec(spec)
sys.modules["docgen"] = docgen
spec.loader.exec_module(docgen)


def documented() -> dict[str, set[str]]:
    """service -> the metric names the generated page lists under it."""
    out: dict[str, set[str]] = {}
    service = ""
    for line in docgen.metrics_page().splitlines():
        if line.startswith("## "):
            service = line[3:].strip()
        elif m := re.match(r"\| `(kinference_\w+)` \|", line):
            out.setdefault(service, set()).add(m.group(1))
    return out


def families(text: str) -> set[str]:
    """The metric names a scrape shows, as the page names them (counters with
    _total). prometheus_client writes a counter's or histogram's creation time
    as a gauge family ``<name>_created`` of its own: part of that metric, not
    one to document."""
    fams = list(text_string_to_metric_families(text))
    timed = {f.name for f in fams if f.type in ("counter", "histogram", "summary")}
    return {f.name + ("_total" if f.type == "counter" else "") for f in fams
            if not (f.name.endswith("_created") and f.name.removesuffix("_created") in timed)}


def router_parts(tmp_path: Path):  # type: ignore[no-untyped-def]
    from kinference_router.app import Router, RouterSettings
    from kinference_router.pools import MultiPoolRouter
    from kinference_router.tenants import Authenticator
    from kinference_router.upstream import SecretFiles

    single = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path))
    multi = MultiPoolRouter(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path))
    multi.router_for(("default", "a"))  # a pool's router, as the first request to it makes
    return single, multi


async def served_by_router(tmp_path: Path) -> set[str]:
    out: set[str] = set()
    for r in router_parts(tmp_path):
        answer = await r.admin_server().routes["/metrics"]["GET"](None)
        assert answer.status == 200
        out |= families(answer.body.decode())
    return out


async def served_by_compiler(tmp_path: Path) -> set[str]:
    """The Kubernetes mode's compiler (its own metrics and the mode's)."""
    from kinference_policy_compiler.kube_mode import (KubernetesMode, KubernetesSource, KubernetesStatusSink,
                                                      KubeSettings, _KubeCollector)
    from kinference_policy_compiler.service import PolicyCompilerService, Settings

    mode = KubernetesMode(Settings(manifests=tmp_path), KubeSettings(identity="test"))
    mode.source = KubernetesSource(None)  # type: ignore[arg-type]
    mode.sink = KubernetesStatusSink(None, mode.source, "test")  # type: ignore[arg-type]
    service = PolicyCompilerService(mode.settings, source=mode.source, status_sink=mode.sink)
    service.metrics.registry.register(_KubeCollector(mode))
    answer = await service._metrics(None)  # noqa: SLF001
    return families(answer.body.decode())


async def served_by_classifier() -> set[str]:
    from kinference_classifier.service import ClassifierService

    answer = await ClassifierService(nats_url="nats://127.0.0.1:4222")._metrics(None)  # noqa: SLF001
    return families(answer.body.decode())


async def served_by_collector() -> set[str]:
    from kinference_collector.metrics import CollectorMetrics, http_app

    async with TestClient(TestServer(http_app(CollectorMetrics(), lambda: True))) as client:
        resp = await client.get("/metrics")
        assert resp.status == 200
        return families(await resp.text())


async def test_every_metric_a_service_serves_is_on_the_page(tmp_path: Path) -> None:
    page = documented()
    served = {"router": await served_by_router(tmp_path),
              "policy-compiler": await served_by_compiler(tmp_path),
              "telemetry-collector": await served_by_collector(),
              "classifier": await served_by_classifier()}
    for service, names in served.items():
        assert names, service
        missing = names - page.get(service, set())
        assert missing == set(), f"{service} serves metrics docs/reference/metrics.md leaves out: {sorted(missing)}"
    # the ones the trial found missing, by name
    assert {"kinference_classifier_deadline_misses_total", "kinference_classifier_shed_total",
            "kinference_classifier_overloaded", "kinference_classifier_in_flight_limit",
            "kinference_classifier_skipped_total"} <= page["router"]


def test_the_page_names_no_metric_no_service_serves(tmp_path: Path) -> None:
    import asyncio

    page = documented()
    served = asyncio.run(served_by_router(tmp_path))
    assert page["router"] - served == set()


def test_the_page_says_only_the_admin_port_serves_metrics(tmp_path: Path) -> None:
    from dataclasses import replace

    single, _ = router_parts(tmp_path)
    assert "/metrics" in single.admin_server().routes
    assert "/metrics" not in single.data_server().routes  # 404 there
    single.settings = replace(single.settings, metrics_on_data_port=True)
    assert "/metrics" in single.data_server().routes
    text = docgen.metrics_page()
    assert "data port 8080 and admin port 8081" not in text
    assert "admin port only" in text and "--metrics-on-data-port" in text
