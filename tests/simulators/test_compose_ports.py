"""compose.yaml publishes every port on the host's loopback only."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_compose_publishes_ports_on_loopback_only() -> None:
    doc = yaml.safe_load((REPO / "compose.yaml").read_text())
    published = [(name, port) for name, svc in doc["services"].items() for port in svc.get("ports", [])]
    assert any(name == "router" and str(port).endswith(":8081") for name, port in published)  # the admin port
    for name, port in published:
        assert str(port).startswith("127.0.0.1:"), (name, port)
