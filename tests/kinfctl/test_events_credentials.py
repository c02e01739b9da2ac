"""``kinfctl events`` on the ``make run`` stack needs no credential flag: it
reads the observer's password from ``.run[-offset]/nats-auth/`` (here or
above); without one it says which credential is missing, not that NATS is
unreachable."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kinference_common import natsauth
from kinference_common.natsserver import _wait_port, find_binary, free_port


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A nats-server laid out as ``KINFERENCE_PORT_OFFSET=N make run`` lays it out in ``tmp_path``."""
    port = free_port()
    offset = port - 4222
    run = tmp_path / f".run-{offset}"
    conf = natsauth.LocalAuth(run / "nats-auth").server_config(f"127.0.0.1:{port}", str(run / "nats"))
    binary = find_binary()
    assert binary, "nats-server is needed (make install)"
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port("127.0.0.1", port, 10, proc)
        yield tmp_path, offset
    finally:
        proc.terminate()
        proc.wait(5)


async def events(cwd: Path, offset: int) -> tuple[int | None, str]:
    env = {**os.environ, "KINFERENCE_PORT_OFFSET": str(offset)}
    env.pop(natsauth.PASSWORD_ENV, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinfctl", "events", "--count", "1", "--timeout", "2", env=env, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        return proc.returncode, line
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_the_local_stacks_observer_password_is_found(stack: tuple[Path, int]) -> None:
    root, offset = stack
    (root / "sub").mkdir()
    _, line = await events(root / "sub", offset)  # from a directory below the stack's
    assert "following" in line, line


async def test_a_missing_password_is_named(stack: tuple[Path, int]) -> None:
    root, offset = stack
    (root / f".run-{offset}" / "nats-auth" / "observer").unlink()
    _, line = await events(root, offset)
    assert "is up but refused user 'observer'" in line and f".run-{offset}/nats-auth/observer" in line, line
    assert "cannot reach" not in line
