"""``kinference_bus_available{part}``: what part of NATS works for a router,
for a dashboard and an alert (HA trial: a NATS cluster that lost its quorum
showed only in the logs), and the router's words for a config bucket that
is away when it has no configuration at all."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from structlog.testing import capture_logs

from kinference_common import bus
from kinference_router.app import Router, RouterSettings
from kinference_router.metrics import RouterMetrics
from kinference_router.recording import RecordSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles


def gauge(metrics: RouterMetrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^kinference_bus_available\{part="([a-z_]+)"\} ([0-9.]+)$', text, re.M)}


def test_each_part_is_1_while_every_check_says_it_works() -> None:
    m = RouterMetrics()
    state = {"a": True, "b": True}
    m.watch_bus("config_store", lambda: state["a"])
    m.watch_bus("config_store", lambda: state["b"])  # a second pool's router in the same process
    assert gauge(m) == {"config_store": 1.0}
    state["b"] = False
    assert gauge(m) == {"config_store": 0.0}


def test_a_router_exports_its_connection_store_and_records(tmp_path: Path) -> None:
    router = Router(RouterSettings(record=RecordSettings()), Authenticator("none"), SecretFiles(tmp_path / "s"))
    assert gauge(router.metrics) == {"connection": 0.0, "config_store": 1.0, "records_stream": 1.0}
    router.keeper.store.failed(TimeoutError())
    router.events._stream_away = True
    assert gauge(router.metrics) == {"connection": 0.0, "config_store": 0.0, "records_stream": 0.0}
    plain = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path / "t"))
    assert "records_stream" not in gauge(plain.metrics)


def test_a_config_store_outage_says_what_it_means_for_a_router_without_configuration(tmp_path: Path) -> None:
    """HA trial: a router restarted while NATS had no quorum answered 503 for
    38 s and logged "routing on the last snapshot", which it did not have."""
    router = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path / "s"))
    assert router.keeper.pool is None
    with capture_logs() as logs:
        router.keeper.store.failed(TimeoutError())
    [line] = [e for e in logs if e["event"] == "config_store_unavailable"]
    assert line["consequence"].startswith("no configuration yet: requests are answered 503")
    assert "last snapshot" not in line["consequence"]
    again = bus.Availability("x", "fixed words")
    with capture_logs() as logs:
        again.failed()
    assert logs[0]["consequence"] == "fixed words"
