"""``kinference-router --help`` says how provider keys are laid out in
--secrets-dir (the trial found it named a layout the router does not read)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from kinference_router.__main__ import main
from kinference_router.upstream import SecretFiles
from kinference_common.compiled import SecretRef


def test_help_states_the_layout_the_router_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["--help"])
    text = " ".join(out.getvalue().split())
    assert "<dir>/<namespace>/<secret>/<key>" in text
    assert "<dir>/<secret>/<key>" in text
    # and the router reads exactly those two
    (tmp_path / "default" / "databricks-token").mkdir(parents=True)
    (tmp_path / "default" / "databricks-token" / "token").write_text("sk-ns\n")
    (tmp_path / "other-token").mkdir()
    (tmp_path / "other-token" / "key").write_text("sk-flat\n")
    files = SecretFiles(tmp_path)
    assert files.read("default", SecretRef(name="databricks-token", key="token")) == "sk-ns"
    assert files.read("team-a", SecretRef(name="other-token", key="key")) == "sk-flat"
