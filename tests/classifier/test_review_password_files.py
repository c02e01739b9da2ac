"""Password files and the nats-server configuration (which holds every
password) are created readable by their owner only: never world-readable,
not even between creating and chmod-ing them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kinference_common import natsauth


@pytest.fixture
def no_chmod(monkeypatch: pytest.MonkeyPatch) -> None:
    """chmod after the fact does nothing: the mode a file is created with is what counts."""
    monkeypatch.setattr(Path, "chmod", lambda self, mode: None)
    old = os.umask(0o022)
    yield
    os.umask(old)


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_password_files_are_created_private(tmp_path: Path, no_chmod: None) -> None:
    natsauth.write_password_files(tmp_path / "pw", {"router": "secret-1"})
    assert (tmp_path / "pw" / "router").read_text().strip() == "secret-1"
    assert private(tmp_path / "pw" / "router")


def test_make_runs_server_configuration_is_created_private(tmp_path: Path, no_chmod: None) -> None:
    conf = natsauth.LocalAuth(tmp_path / "auth").server_config("127.0.0.1:4222", str(tmp_path / "js"))
    assert private(conf)
    assert all(private(tmp_path / "auth" / user) for user in natsauth.USERS)


def test_the_cli_writes_its_configuration_private(tmp_path: Path, no_chmod: None) -> None:
    out = tmp_path / "nats.conf"
    assert natsauth.main(["--out", str(out), "--password-dir", str(tmp_path / "pw")]) == 0
    assert private(out) and private(tmp_path / "pw" / "router")
