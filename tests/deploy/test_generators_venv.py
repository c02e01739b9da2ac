"""deploy/k8s's generators read the users and rules from kinference_common,
which lives in the project's venv: the docs and the scripts' own headers say
``.venv/bin/python deploy/k8s/...`` (the trial ran ``python
deploy/k8s/nats_conf_gen.py`` as written and got a ModuleNotFoundError
traceback), and another Python is told so in one line. nats_conf_gen.py
names the Secret the StatefulSet really reads the route password from."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from .k8s import K8S, REPO

GENERATORS = ("nats_conf_gen.py", "rbac_gen.py")
#: ``python deploy/k8s/...`` not preceded by the venv's path
BARE = re.compile(r"(?<!\.venv/bin/)\bpython3? deploy/k8s/\w+\.py")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_doc_{name[:-3]}", K8S / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", GENERATORS)
def test_without_the_venv_a_generator_says_so_in_one_line(name: str) -> None:
    # -S: no site-packages, so neither kinference_common nor its dependencies import
    out = subprocess.run([sys.executable, "-S", str(K8S / name), "--check"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 1, out
    assert len(lines) == 1 and lines[0].startswith(f"{name}: "), lines
    assert f"run it with the project's venv (make install): .venv/bin/python deploy/k8s/{name}" in lines[0]


@pytest.mark.parametrize("name", GENERATORS)
def test_headers_say_the_venvs_python(name: str) -> None:
    doc = load(name).__doc__ or ""
    assert f".venv/bin/python deploy/k8s/{name}" in doc
    assert not BARE.findall(doc), BARE.findall(doc)


def test_operations_says_the_venvs_python() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    assert ".venv/bin/python deploy/k8s/nats_conf_gen.py" in text
    assert ".venv/bin/python deploy/k8s/rbac_gen.py" in text
    assert not BARE.findall(text), BARE.findall(text)


def test_the_route_password_is_named_where_the_statefulset_reads_it() -> None:
    docs = [d for d in yaml.safe_load_all((K8S / "base" / "nats.yaml").read_text()) if d]
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (c,) = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nats"]
    ref = next(e for e in c["env"] if e["name"] == "ROUTE_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("kinference-nats-auth", "route")
    doc = " ".join((load("nats_conf_gen.py").__doc__ or "").split())
    assert "from key ``route`` of the Secret ``kinference-nats-auth``" in doc, doc
    assert "``kinference-nats-routes``" not in doc  # no such Secret (kinference-nats-routes-tls holds TLS)


@pytest.mark.parametrize("name", GENERATORS)
def test_help_prints_the_page_and_writes_nothing(name: str) -> None:
    """HA trial: `nats_conf_gen.py --help` rewrote base/nats.conf (any
    argument but --check did) instead of printing help."""
    target = load(name).OUT
    before = target.stat().st_mtime_ns
    out = subprocess.run([sys.executable, str(K8S / name), "--help"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.startswith(f"usage: {name}") and "--check" in out.stdout
    assert "wrote" not in out.stdout
    assert target.stat().st_mtime_ns == before  # not rewritten (the same text would hide it)
    bad = subprocess.run([sys.executable, str(K8S / name), "--chek"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments: --chek" in bad.stderr
