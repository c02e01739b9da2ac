"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kinference_common import natsserver

REPO = Path(__file__).resolve().parent.parent
SEEDS = REPO.parent / "shared" / "seeds"


@pytest.fixture(scope="session")
def nats_server_session() -> Iterator[natsserver.NatsServer]:
    """One real nats-server (JetStream) for tests that only publish/subscribe."""
    with natsserver.start() as server:
        yield server


@pytest.fixture
def nats_server() -> Iterator[natsserver.NatsServer]:
    """A real nats-server of the test's own (it may kill or restart it)."""
    with natsserver.start() as server:
        yield server


@pytest.fixture
def repo_root() -> Path:
    return REPO
