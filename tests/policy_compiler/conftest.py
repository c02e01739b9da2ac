"""Fixtures for the policy compiler in Kubernetes mode: ``kube_compiler``
starts a compiler (KubernetesMode, in-process) against the fake API server
and a real nats-server; every instance has its own bearer token, so the
fake's request log tells the instances apart (``kube_api.used(identity)``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kinference_policy_compiler.kube_mode import KubernetesMode, KubeSettings
from kinference_policy_compiler.service import Settings


async def eventually(pred: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (a deadline, not a speed assertion)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        try:
            value = pred()
        except (KeyError, TypeError, IndexError):
            value = None
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"{what} not reached before the deadline")
        await asyncio.sleep(0.05)


def load_docs(*paths: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for p in paths:
        files = sorted(p.glob("*.yaml")) if p.is_dir() else [p]
        for f in files:
            docs.extend(d for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict) and d.get("kind"))
    return docs


@pytest.fixture
async def kube_compiler(kube_api, nats_server, tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """``await kube_compiler(identity="a", **KubeSettings overrides)`` -> a started KubernetesMode."""
    started: list[KubernetesMode] = []

    async def make(identity: str = "compiler-a", **kw: Any) -> KubernetesMode:
        kubeconfig = kube_api.write_kubeconfig(tmp_path / f"kubeconfig-{identity}", user=identity,
                                               token=f"token-{identity}")
        opts: dict[str, Any] = dict(kubeconfig=str(kubeconfig), identity=identity, lease_namespace="kinference-system",
                                    lease_duration=4.0, renew_deadline=3.0, retry_period=0.2, backoff_cap=0.5,
                                    event_interval=0.0)
        opts.update(kw)
        mode = KubernetesMode(Settings(manifests=Path("."), nats_url=nats_server.url, interval=0.05, resync=5.0,
                                       http_port=None), KubeSettings(**opts))
        started.append(mode)
        await mode.start()
        return mode

    yield make
    for m in started:
        await m.stop()
