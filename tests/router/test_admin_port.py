"""Metrics are on the admin port only (unless asked for on the data port); the data
port serves the API and health."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from kinference_router.app import Router, RouterSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles


async def test_metrics_only_on_the_admin_port(tmp_path: Path) -> None:
    router = Router(RouterSettings(), Authenticator("none"), SecretFiles(tmp_path / "s"))
    data, admin = router.data_server(), router.admin_server()
    await data.start("127.0.0.1", 0)
    await admin.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{data.port}/metrics") as r:
                assert r.status == 404
            async with http.get(f"http://127.0.0.1:{data.port}/healthz") as r:
                assert r.status == 200
            async with http.get(f"http://127.0.0.1:{admin.port}/metrics") as r:
                assert r.status == 200
                assert "kinference_" in await r.text()
    finally:
        await data.close(grace=0.5)
        await admin.close(grace=0.5)


async def test_metrics_on_the_data_port_when_asked(tmp_path: Path) -> None:
    """``--metrics-on-data-port``: a cluster whose network policy closes the admin port."""
    router = Router(RouterSettings(metrics_on_data_port=True), Authenticator("none"), SecretFiles(tmp_path / "s"))
    data = router.data_server()
    await data.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{data.port}/metrics") as r:
                assert r.status == 200
    finally:
        await data.close(grace=0.5)
