"""Each Deployment's command line parses with that service's own argument
parser, so a renamed or missing flag fails here rather than in a crash-looping
pod. Flags the cross-service contract adds in other modules
(kinference_common.natsauth: the NATS credentials; kinference_common.kube:
Kubernetes mode) are only set aside while their module is absent from the
tree: once it is merged, every flag is checked."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io

import pytest

from .k8s import K8S, SERVICES, build, container, of_kind

#: flag -> (the module that brings it, whether it takes a value)
CONTRACT_FLAGS = {
    "--nats-user": ("kinference_common.natsauth", True),
    "--nats-password-file": ("kinference_common.natsauth", True),
    "--nats-tls-ca": ("kinference_common.natsauth", True),
    "--source": ("kinference_common.kube.config", True),
    "--leader-elect": ("kinference_common.kube.config", False),
    "--lease-name": ("kinference_common.kube.config", True),
    "--dcgm-selector": ("kinference_common.kube.config", True),
    "--dcgm-port": ("kinference_common.kube.config", True),
}
MODULES = {"router": "kinference_router.__main__", "policy-compiler": "kinference_policy_compiler.__main__",
           "telemetry-collector": "kinference_collector.__main__", "classifier": "kinference_classifier.__main__"}


def present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def without_pending(args: list[str]) -> tuple[list[str], set[str]]:
    out, pending, i = [], set(), 0
    while i < len(args):
        flag = args[i]
        module, takes_value = CONTRACT_FLAGS.get(flag, (None, False))
        if module is not None and not present(module):
            pending.add(flag)
            i += 2 if takes_value else 1
            continue
        out.append(flag)
        i += 1
    return out, pending


def parse(service: str, args: list[str]) -> tuple[bool, str]:
    mod = importlib.import_module(MODULES[service])
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if hasattr(mod, "parse_args"):
                mod.parse_args(args)
            elif hasattr(mod, "build_parser"):
                mod.build_parser().parse_args(args)
            else:
                mod.parser().parse_args(args)
    except SystemExit:
        return False, err.getvalue()
    return True, ""


@pytest.mark.parametrize("service", SERVICES)
def test_the_manifest_command_line_parses(service: str) -> None:
    args = container(of_kind(build(K8S), "Deployment")[service])["args"]
    checked, pending = without_pending(args)
    if service == "policy-compiler" and "--source" in pending:
        checked += ["--manifests", "/manifests"]  # directory mode stands in until Kubernetes mode is here
    ok, err = parse(service, checked)
    assert ok, f"{service}: {err.strip().splitlines()[-1] if err.strip() else err}"


def test_a_wrong_flag_is_caught() -> None:
    ok, err = parse("classifier", ["--health-prot", "8083"])
    assert not ok and "unrecognized arguments: --health-prot" in err
