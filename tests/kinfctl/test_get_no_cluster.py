"""``kinfctl get`` without a cluster says so in one line of its own (the
trial got the library's "Config not found: /root/.kube/config" first, then
"Service host/port is not set"; and for a --kubeconfig that does not exist,
"Expected key current-context")."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinfctl.main import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_no_kubeconfig_and_not_in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, err = run(["get", "pools"], capsys)
    assert code == 1
    assert err.strip().splitlines() == [
        "kinfctl: no cluster to read: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod; "
        "pass --kubeconfig FILE, or -f MANIFESTS to read manifests offline"]


def test_a_kubeconfig_that_does_not_exist_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    code, err = run(["get", "pools", "--kubeconfig", str(missing)], capsys)
    assert code == 1
    assert err.strip() == f"kinfctl: --kubeconfig {missing}: no such file (or -f MANIFESTS to read manifests offline)"


def test_kubeconfig_from_the_environment_is_still_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """$KUBECONFIG names an (invalid) file: the library reads it and its error is shown."""
    bad = tmp_path / "kc"
    bad.write_text("apiVersion: v1\nkind: Config\n")
    monkeypatch.setenv("KUBECONFIG", str(bad))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, err = run(["get", "pools"], capsys)
    assert code == 1 and "no cluster to read (" in err
