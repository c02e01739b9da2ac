"""The compiler's "started" line names its source: the manifests directory
in directory mode only (the trial saw ``"manifests": "."`` from a compiler
watching a cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.service import PolicyCompilerService, Settings

pytestmark = pytest.mark.nats


class NoManifests:
    """A ManifestSource with nothing in it (stands for the cluster)."""

    def poll(self) -> bool:
        return False

    def documents(self) -> list:  # type: ignore[type-arg]
        return []

    def errors(self) -> list:  # type: ignore[type-arg]
        return []


async def started(settings: Settings, source: object | None = None) -> dict:  # type: ignore[type-arg]
    svc = PolicyCompilerService(settings, source=source)  # type: ignore[arg-type]
    with capture_logs() as logs:
        await svc.start()
    await svc.stop()
    return next(e for e in logs if e["event"] == "started")


async def test_another_source_is_named_not_a_directory(nats_server: NatsServer) -> None:
    line = await started(Settings(manifests=Path("."), nats_url=nats_server.url, http_port=0), NoManifests())
    assert "manifests" not in line and line["source"] == "NoManifests"


async def test_the_directory_is_named_in_directory_mode(nats_server: NatsServer, tmp_path: Path) -> None:
    line = await started(Settings(manifests=tmp_path, nats_url=nats_server.url, http_port=0))
    assert line["manifests"] == str(tmp_path)
