"""Helpers for the tests of deploy/k8s: the kustomize output, as documents."""

from __future__ import annotations

import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
EXAMPLE = K8S / "overlays" / "example"
#: the Kubernetes versions the manifests are validated against (docs/operations.md says the same)
KUBE_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
SERVICES = ("router", "policy-compiler", "telemetry-collector", "classifier")


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, "kubectl is needed to build the kustomizations (kubectl kustomize works offline)"
    return found


@cache
def build(path: Path) -> tuple[dict[str, Any], ...]:
    out = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c
