"""``kinfctl events`` finds a local stack's NATS by the port offset, like
``make run --port-offset N`` lays it out (KINFERENCE_PORT_OFFSET or
--port-offset), without --nats-url."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from kinference_common import natsserver


async def following_line(env: dict[str, str], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinfctl", "events", "--count", "1", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        return (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("via", ["env", "flag"])
async def test_the_default_nats_address_follows_the_port_offset(via: str) -> None:
    port = natsserver.free_port()
    offset = port - 4222
    env = {k: v for k, v in os.environ.items() if k != "KINFERENCE_PORT_OFFSET"}
    args: tuple[str, ...] = ()
    if via == "env":
        env["KINFERENCE_PORT_OFFSET"] = str(offset)
    else:
        env["KINFERENCE_PORT_OFFSET"] = "7"  # the flag wins over the environment
        args = ("--port-offset", str(offset))
    with natsserver.start(port=port):
        line = await following_line(env, *args)
    assert f"on nats://127.0.0.1:{port}" in line, line


async def test_a_bad_offset_is_a_clear_error() -> None:
    env = {**os.environ, "KINFERENCE_PORT_OFFSET": "lots"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "kinfctl", "events", env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 1
    assert "KINFERENCE_PORT_OFFSET must be a whole number, not 'lots'" in err.decode()
    assert "Traceback" not in err.decode()


def test_unreachable_nats_names_the_stacks_started_with_another_offset(tmp_path, monkeypatch) -> None:
    import argparse

    from kinfctl import localstack

    (tmp_path / ".run-3000" / "nats-auth").mkdir(parents=True)
    (tmp_path / ".run-17").mkdir()  # no nats-auth/: not a stack
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # found from below, as the stack's directory is
    port = natsserver.free_port()  # nothing listens there
    args = argparse.Namespace(nats_url=f"nats://127.0.0.1:{port}", nats_user="kinfctl", nats_password_file=None)
    message = localstack.why_unreachable(args, 0, OSError("no servers available for connection"), None)
    assert message == (f"cannot reach NATS at nats://127.0.0.1:{port}: no servers available for connection; "
                       "a stack was started with another port offset: .run-3000/ (--port-offset 3000)")
    # the stack of the offset asked for is not named as another
    assert localstack.other_stacks(3000) == ""
    (tmp_path / ".run" / "nats-auth").mkdir(parents=True)
    assert localstack.other_stacks(3000) == "; a stack was started with another port offset: .run/ (--port-offset 0)"


def test_the_hint_skips_directories_of_no_offset_and_ones_it_cannot_read(tmp_path, monkeypatch) -> None:
    from kinfctl import localstack

    (tmp_path / ".run-03" / "nats-auth").mkdir(parents=True)  # make run names offset 3 .run-3
    (tmp_path / ".run-5" / "nats-auth").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    real = localstack.Path.is_dir

    def is_dir(self: localstack.Path) -> bool:
        if self.parent.name == ".run-5":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(localstack.Path, "is_dir", is_dir)
    assert localstack.other_stacks(0) == ""
