"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from kinference_common import natsserver

# Property tests draw the same examples on every run, so that CI cannot fail
# on an input it happened to draw that day (found bugs become @example cases).
# HYPOTHESIS_PROFILE=explore draws fresh examples, to look for new bugs.
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=1000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

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


# ------------------------------------------------------- Kubernetes (fake API)


@pytest.fixture
async def kube_api():
    """An in-process fake Kubernetes API server (kinference_simulators.kubeapi)
    serving the repository's CRDs plus the built-in kinds; started on
    127.0.0.1, port 0. Test hooks: drop_watches(), compact(), go_down(s),
    requests / used(who); direct access: apply(), get(), list(), set_status()."""
    from kinference_simulators.kubeapi import FakeKubeAPI

    api = FakeKubeAPI([REPO / "deploy" / "k8s" / "crds"])
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
def kubeconfig(kube_api, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at ``kube_api`` (user "test", no token)."""
    return kube_api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def nats_cluster() -> Iterator[natsserver.NatsCluster]:
    """Three real nats-servers clustered over routes on loopback (JetStream,
    replicated buckets possible); the test may kill and restart any of them."""
    with natsserver.start_cluster(3) as cluster:
        yield cluster
