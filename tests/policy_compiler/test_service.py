"""The policy-compiler service in local mode, against a real nats-server:
compiled pools land in the KV bucket and on their subject; changes, removals
and broken files behave as an operator expects; statuses are written."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest
import yaml

from kinference_common import subjects
from kinference_common.compiled import decode_pool
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.service import PolicyCompilerService, Settings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    d = tmp_path / "manifests"
    shutil.copytree(EXAMPLES, d)
    return d


async def kv_pool(nc: nats.NATS, key: str = "default.inference-all"):  # type: ignore[no-untyped-def]
    kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
    entry = await kv.get(key)
    return decode_pool(entry.value)


async def eventually(check, timeout: float = 10.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            result = await check()
            if result:
                return result
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_publishes_compiled_pools_and_follows_changes(nats_server: NatsServer, manifests: Path,
                                                            tmp_path: Path) -> None:
    status_dir = tmp_path / "status"
    svc = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, status_dir=status_dir,
                                         interval=0.05, http_port=0))
    nc = await nats.connect(nats_server.url)
    updates: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg):  # type: ignore[no-untyped-def]
        await updates.put(msg.data)

    await nc.subscribe(subjects.config_subject("default", "inference-all"), cb=on_msg)
    await svc.start()
    try:
        pool = await kv_pool(nc)
        assert pool.policy.name == "burst-unless-pii"
        first = await asyncio.wait_for(updates.get(), 10)
        assert decode_pool(first) == pool  # the first publish (announced, and again once written)
        assert [d.name for d in pool.destinations] == ["databricks", "qwen-2-5-32b", "qwen-2-5-32b-spot"]
        # statuses readable by the operator
        st = yaml.safe_load((status_dir / "InferencePolicy" / "default" / "burst-unless-pii.yaml").read_text())
        assert st["status"]["state"] == "Accepted" and st["status"]["ruleCount"] == 1
        pst = yaml.safe_load((status_dir / "InferencePool" / "default" / "inference-all.yaml").read_text())
        assert pst["status"]["state"] == "Accepted" and pst["status"]["destinationCount"] == 3

        # a change: the exclusion threshold moves; routers hear it on the subject
        policy = manifests / "10-burst-policy.yaml"
        policy.write_text(policy.read_text().replace("greaterThan: 4", "greaterThan: 8"))
        data = await _next_change(updates, first)
        changed = decode_pool(data)
        assert changed.policy.rules[0].exclude[0].drop.signals[0].range.greater_than == 8
        assert (await kv_pool(nc)).revision == changed.revision

        await asyncio.sleep(0.3)
        while not updates.empty():  # the same pool once written: nothing else
            assert updates.get_nowait() == data
        # a broken file: reported, skipped, last good version stays in force
        policy.write_text("apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\n"
                          "metadata: {name: burst-unless-pii}\nspec:\n  rules: [{name: x, route: {}}]\n")
        await eventually(lambda: _errors_mention(status_dir, "select"))
        assert (await kv_pool(nc)).revision == changed.revision
        assert (await kv_pool(nc)).policy.name == "burst-unless-pii"
        assert updates.empty()

        # the pool is removed: deleted from KV, announced with an empty body
        (manifests / "20-pool.yaml").unlink()
        assert await _next_change(updates, data) == b""
        kv = await nc.jetstream().key_value(subjects.CONFIG_BUCKET)
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("default.inference-all")
        await eventually(lambda: _gone(status_dir / "InferencePool" / "default" / "inference-all.yaml"))
        policy_status = yaml.safe_load((status_dir / "InferencePolicy" / "default" / "burst-unless-pii.yaml").read_text())
        assert policy_status["status"]["state"] == "NotReferenced"
    finally:
        await svc.stop()
        await nc.close()


async def _errors_mention(status_dir: Path, word: str) -> bool:
    path = status_dir / "errors.yaml"
    return path.exists() and any(word in e["message"] for e in yaml.safe_load(path.read_text())["errors"])


async def _gone(path: Path) -> bool:
    return not path.exists()


async def test_restart_publishes_nothing_new_and_metrics_show_warnings(nats_server: NatsServer, manifests: Path) -> None:
    first = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05))
    await first.start()
    await first.stop()
    nc = await nats.connect(nats_server.url)
    seen: list[bytes] = []

    async def on_msg(msg):  # type: ignore[no-untyped-def]
        seen.append(msg.data)

    await nc.subscribe("kinference.config.>", cb=on_msg)
    second = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05,
                                            http_port=0))
    await second.start()
    try:
        await asyncio.sleep(0.3)
        assert seen == []  # same revision: nothing republished
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{second.http_port}/metrics") as r:
                text = await r.text()
            async with http.get(f"http://127.0.0.1:{second.http_port}/readyz") as r:
                assert r.status == 200
        assert 'kinference_policy_warnings{namespace="default",policy="burst-unless-pii"} 0.0' in text
        assert "kinference_reconcile_seconds_count" in text
    finally:
        await second.stop()
        await nc.close()


async def test_keeps_compiling_while_nats_is_down_and_publishes_after(nats_server: NatsServer,
                                                                       manifests: Path, tmp_path: Path) -> None:
    svc = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05,
                                         status_dir=tmp_path / "st"))
    await svc.start()
    try:
        nats_server.kill()
        policy = manifests / "10-burst-policy.yaml"
        policy.write_text(policy.read_text().replace("greaterThan: 4", "greaterThan: 6"))
        await eventually(lambda: _has(tmp_path / "st", svc, 6))
        nats_server.restart()
        nc = await nats.connect(nats_server.url)
        try:
            async def published() -> bool:
                pool = await kv_pool(nc)
                return pool.policy.rules[0].exclude[0].drop.signals[0].range.greater_than == 6

            await eventually(published, timeout=15)
        finally:
            await nc.close()
    finally:
        await svc.stop()


async def _has(_: Path, svc: PolicyCompilerService, threshold: int) -> bool:
    res = svc.last_result
    return bool(res) and res.pools[("default", "inference-all")].policy.rules[0].exclude[0].drop.signals[0].range.greater_than == threshold  # type: ignore[union-attr]


def test_help_and_waiting_for_nats(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "kinference_policy_compiler", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--manifests" in p.stdout
    proc = subprocess.Popen([sys.executable, "-m", "kinference_policy_compiler", "--manifests", str(tmp_path),
                             "--nats-url", "nats://127.0.0.1:1", "--http-port", "0", "--log-format", "json"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # it waits for NATS, saying so once
    assert "nats unavailable, retrying" in line
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "Traceback" not in line + rest


async def test_every_resync_announces_the_pools_again(nats_server: NatsServer, manifests: Path) -> None:
    """A router started while the config bucket has no quorum reads nothing
    from it (it answered 503 for 38 s in an HA trial): each resync announces
    every pool on its subject again, so such a router gets its pool within
    one; unchanged, routers that have it ignore the repeat."""
    svc = PolicyCompilerService(Settings(manifests=manifests, nats_url=nats_server.url, interval=0.05, resync=0.5))
    await svc.start()
    nc = await nats.connect(nats_server.url)
    seen: list[str] = []

    async def on_msg(msg):  # type: ignore[no-untyped-def]
        seen.append(decode_pool(msg.data).revision)

    try:
        await nc.subscribe("kinference.config.>", cb=on_msg)
        await nc.flush()
        await asyncio.sleep(1.6)
        assert len(seen) >= 2 and len(set(seen)) == 1, seen  # the same revision, again
    finally:
        await svc.stop()
        await nc.close()


async def _next_change(updates: asyncio.Queue[bytes], last: bytes) -> bytes:
    """The next message on the pool's subject that is not ``last`` again (a
    pool goes out when announced and again once written to the bucket)."""
    while True:
        data = await asyncio.wait_for(updates.get(), 10)
        if data != last:
            return data
