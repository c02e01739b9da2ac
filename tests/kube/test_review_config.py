"""A kubeconfig that is not valid YAML, or not a mapping, stops every
service with one line naming the file, never a traceback (review of the
Kubernetes mode)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kinference_common.kube.config import KubeConfigError, load_configuration

BROKEN = {
    "not-yaml": "foo: [\n",
    "a-list": "- a\n- b\n",
    "a-string": "just words\n",
}


@pytest.mark.parametrize("content", BROKEN.values(), ids=BROKEN.keys())
async def test_broken_kubeconfig_is_a_one_line_config_error(tmp_path, content):
    path = tmp_path / "kc"
    path.write_text(content)
    with pytest.raises(KubeConfigError) as info:
        await load_configuration(path)
    msg = str(info.value)
    assert msg.startswith(f"--kubeconfig {path}: ")
    assert "\n" not in msg


SERVICES = {
    "router": ("kinference_router", ["--port", "0", "--admin-port", "0"]),
    "telemetry-collector": ("kinference_collector", ["--http-port", "0"]),
    "policy-compiler": ("kinference_policy_compiler", ["--http-port", "0", "--no-leader-elect"]),
}


@pytest.mark.parametrize("service", SERVICES)
def test_services_refuse_a_broken_kubeconfig_without_a_traceback(tmp_path, service):
    path = tmp_path / "kc"
    path.write_text(BROKEN["not-yaml"])
    module, extra = SERVICES[service]
    out = subprocess.run(
        [sys.executable, "-m", module, "--source", "kubernetes", "--kubeconfig", str(path),
         "--nats-url", "nats://127.0.0.1:1", *extra],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert f"--kubeconfig {path}" in lines[0]
