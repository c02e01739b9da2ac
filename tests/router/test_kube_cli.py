"""Kubernetes mode's command lines: a bad kubeconfig or --pool is a one-line
error and exit code 1 (no traceback), for the router and the collector."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("module", ["kinference_router", "kinference_collector"])
def test_missing_kubeconfig_is_a_clear_error(module: str, tmp_path: Path) -> None:
    extra = ["--http-port", "0"] if module == "kinference_collector" else []
    r = run(module, "--source", "kubernetes", "--kubeconfig", str(tmp_path / "nope"), "--nats-url",
            "nats://127.0.0.1:1", *extra)
    assert r.returncode == 1
    assert f"--kubeconfig {tmp_path / 'nope'}: no such file" in r.stderr
    assert "Traceback" not in r.stderr


def test_broken_kubeconfig_and_bad_pool(tmp_path: Path) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    r = run("kinference_router", "--source", "kubernetes", "--kubeconfig", str(kc))
    assert r.returncode == 1 and str(kc) in r.stderr and "Traceback" not in r.stderr
    r = run("kinference_router", "--source", "kubernetes", "--pool", "just-a-name")
    assert r.returncode == 1 and "--pool must be NAMESPACE/NAME" in r.stderr


def test_bad_dcgm_selector() -> None:
    r = run("kinference_collector", "--source", "kubernetes", "--dcgm-selector", "app", "--http-port", "0")
    assert r.returncode == 2 and "--dcgm-selector" in r.stderr and "not key=value" in r.stderr
