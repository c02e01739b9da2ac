"""kinfctl on the ``make run-ha`` stack (NATS as a cluster of three, laid out
by the stack's own code in ``.run-<offset>``): without ``--nats-url`` it
connects to every server, so ``kinfctl events`` and ``kinfctl audit`` work
with nats-0 down (the HA trial found them trying nats-0 alone: "cannot
reach NATS"); given the three URLs itself, it still finds the observer's
password. A malformed ``--nats-url`` is said to be malformed, not
unreachable."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinference_common import natsauth
from bench.chaos import free_offset
from kinference_common.natsserver import _wait_port, find_binary
from kinference_simulators.stack import NATS_CLUSTER, Stack

pytestmark = pytest.mark.nats


@pytest.fixture
def ha_stack(tmp_path: Path) -> Iterator[tuple[Path, int, list[str]]]:
    """``.run-<offset>`` as ``KINFERENCE_PORT_OFFSET=N make run-ha`` writes it,
    with nats-1 and nats-2 running and nats-0 down. Yields the directory the
    stack was started from, the offset and every server's URL."""
    binary = find_binary()
    assert binary, "nats-server is needed (make install)"
    offset = free_offset()
    stack = Stack(tmp_path / f".run-{offset}", offset, nats_cluster=True)
    procs = stack._nats_procs(binary, natsauth.LocalAuth(stack.run_dir / "nats-auth"))
    assert [p.name for p in procs] == ["nats-0", "nats-1", "nats-2"]
    for p in procs:
        (stack.nats_dir / p.name).mkdir(parents=True, exist_ok=True)
    running = [subprocess.Popen(p.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in procs[1:]]
    try:
        for proc, (client, _route, _monitor) in zip(running, NATS_CLUSTER[1:], strict=True):
            _wait_port("127.0.0.1", stack.port(client), 10, proc)
        # two of three elect JetStream's meta leader in a few seconds: until then every
        # stream request times out (kinfctl audit then rightly says it cannot read)
        for _client, _route, monitor in NATS_CLUSTER[1:]:
            _wait_healthy(stack.port(monitor), 30)
        yield tmp_path, offset, stack.nats_url.split(",")
    finally:
        for proc in running:
            proc.terminate()
        for proc in running:
            proc.wait(5)


def _wait_healthy(monitor_port: int, timeout: float) -> None:
    """Until the server's /healthz says its JetStream is current."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"nats-server on monitor port {monitor_port} not healthy within {timeout} s")
        time.sleep(0.2)


async def kinfctl(cwd: Path, offset: int | None, *argv: str, first_line: bool = False) -> tuple[int | None, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KINFERENCE_PORT_OFFSET", natsauth.PASSWORD_ENV)}
    if offset is not None:
        env["KINFERENCE_PORT_OFFSET"] = str(offset)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinfctl", *argv, env=env, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        if first_line:  # kinfctl events follows until killed
            return proc.returncode, (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        return proc.returncode, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_events_uses_every_server_of_the_ha_stack(ha_stack: tuple[Path, int, list[str]]) -> None:
    root, offset, urls = ha_stack
    assert len(urls) == 3
    (root / "sub").mkdir()
    _, line = await kinfctl(root / "sub", offset, "events", "--count", "1", "--timeout", "2", first_line=True)
    assert line.startswith(f"following kinference.decisions.> on {','.join(urls)}"), line


async def test_audit_reaches_the_ha_stack_with_nats_0_down(ha_stack: tuple[Path, int, list[str]]) -> None:
    root, offset, urls = ha_stack
    code, err = await kinfctl(root, offset, "audit", "--since", "1h", "--timeout", "2")
    # connected and authorised: the routers have recorded nothing on this stack
    assert "cannot reach" not in err and "refused" not in err, err
    assert code == 0 or f"no decision records on {','.join(urls)}:" in err, (code, err)


@pytest.mark.parametrize("order", ["as printed", "reversed", "one server"])
async def test_the_stacks_own_urls_still_find_the_observer_password(
        ha_stack: tuple[Path, int, list[str]], order: str) -> None:
    root, _offset, urls = ha_stack
    given = {"as printed": urls, "reversed": urls[::-1], "one server": urls[1:2]}[order]
    # no port offset in the environment: the URLs alone say which stack it is
    _, line = await kinfctl(root, None, "events", "--nats-url", ",".join(given), "--count", "1",
                            "--timeout", "2", first_line=True)
    assert line.startswith("following"), line


@pytest.mark.parametrize("command", ["events", "audit"])
async def test_a_bad_scheme_is_said_to_be_one(tmp_path: Path, command: str) -> None:
    code, err = await kinfctl(tmp_path, None, command, "--nats-url", "foo://127.0.0.1:5922")
    assert code == 1
    assert err.splitlines() == ["kinfctl: --nats-url 'foo://127.0.0.1:5922': scheme 'foo://' is not one of "
                                "nats://, tls://, ws://, wss://"], err
