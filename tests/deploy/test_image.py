"""docker/Dockerfile and compose.yaml, statically (no container engine in the
suite; docs/getting-started.md records a real Podman run): one multi-stage
image, non-root, built by one compose service and run by every other,
published ports on loopback and moved by the port offset."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def compose() -> dict:
    return yaml.safe_load((REPO / "compose.yaml").read_text())


def stages() -> list[str]:
    return re.split(r"(?m)^FROM ", DOCKERFILE)[1:]


def test_the_image_is_multi_stage_and_the_runtime_has_no_build_tools() -> None:
    build, runtime = stages()
    assert " AS build" in build.splitlines()[0]
    assert "COPY --from=build /opt/kinference /opt/kinference" in runtime
    assert "pip install" not in runtime and "python3-venv" not in runtime
    # dependencies are installed before the code is copied: a code change keeps their layer
    assert build.index("-r /tmp/requirements.txt") < build.index("COPY libs libs")


def test_the_image_runs_as_a_non_root_user() -> None:
    runtime = stages()[-1]
    users = re.findall(r"(?m)^USER (\S+)", runtime)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert int(users[-1].split(":")[0]) >= 10000
    # the same uid the Kubernetes manifests run as
    assert "runAsUser: 10001" in (REPO / "deploy" / "k8s" / "base" / "router.yaml").read_text()


def test_compose_builds_the_image_once_and_every_service_runs_it() -> None:
    services = compose()["services"]
    builders = [name for name, s in services.items() if "build" in s]
    assert builders == ["nats"]
    images = {s["image"] for s in services.values()}
    assert images == {"localhost/kinference:dev"}
    for name, s in services.items():
        if name not in builders:
            assert s.get("pull_policy") == "never", name


def test_compose_publishes_on_loopback_and_follows_the_port_offset() -> None:
    published = [p for s in compose()["services"].values() for p in s.get("ports", [])]
    assert len(published) == 3
    for p in published:
        assert re.fullmatch(r"127\.0\.0\.1:\$\{KINFERENCE_[A-Z]+_PORT:-\d+\}:\d+", p), p
    script = (REPO / "docker" / "compose.sh").read_text()
    for var, base in (("ROUTER", 8080), ("ADMIN", 8081), ("NATS", 4222)):
        assert f"KINFERENCE_{var}_PORT=$(({base} + off))" in script
        assert f"${{KINFERENCE_{var}_PORT:-{base}}}" in (REPO / "compose.yaml").read_text()


def test_compose_sh_computes_the_ports_from_the_offset(tmp_path: Path) -> None:
    fake = tmp_path / "compose"
    fake.write_text('#!/bin/sh\necho "$KINFERENCE_ROUTER_PORT $KINFERENCE_ADMIN_PORT $KINFERENCE_NATS_PORT $*"\n')
    fake.chmod(0o755)
    out = subprocess.run([str(REPO / "docker" / "compose.sh"), "config"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "KINFERENCE_PORT_OFFSET": "5500", "COMPOSE": str(fake)},
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "13580 13581 9722 config"


def test_the_build_context_leaves_out_what_the_image_does_not_need() -> None:
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for heavy in (".git", ".venv", "tests", "bench", "docs"):
        assert heavy in ignored
    for needed in re.findall(r"(?m)^COPY (?!--from)(\S+)", DOCKERFILE):
        assert needed not in ignored
