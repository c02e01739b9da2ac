"""``make run``'s supervisor as a user's trial met it, run for real (the
script, as a process, on a port offset of its own):

- closing the terminal (SIGHUP) stops the stack as Ctrl-C does; it used to
  kill the supervisor alone and leave every service running, holding its port;
- no service outlives a supervisor killed with SIGKILL (the OOM killer);
- a second start against a running stack is refused without touching the
  running stack's run directory (it used to wipe its NATS passwords, logs
  and JetStream storage before noticing the ports were taken);
- the refusal says what to type: ``make`` takes no ``--port-offset``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import chaos
from kinference_simulators.stack import PORTS, Stack, _port_open

START_TIMEOUT = 60.0  # a busy two-core machine: the stack starts in about 5 s when idle


def free_offset() -> int:
    """A multiple of 100 whose ports are all free (the chaos suite's own pick)."""
    return chaos.free_offset()


def env(**extra: str) -> dict[str, str]:
    """The environment of a supervisor started by hand (not by make), plus ``extra``."""
    drop = {"MAKELEVEL", "MAKEFLAGS", "MFLAGS", "KINFERENCE_PORT_OFFSET"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def stack_argv(offset: int, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "kinference_simulators.stack", "--port-offset", str(offset),
            "--run-dir", str(run_dir), "--speed-profile", "h100"]


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def child_pids(output: str) -> dict[str, int]:
    """The supervisor's own list: ``started <name> pid <n>``."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^\s+started (\S+)\s+pid (\d+)$", output, re.M)}


def wait_for(what, timeout: float, step: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(step)
    return what()


class Supervisor:
    """The stack's script as a process of its own session, its output in a file."""

    def __init__(self, tmp_path: Path, offset: int | None = None, name: str = "a", nohup: bool = False) -> None:
        self.offset = free_offset() if offset is None else offset
        self.run_dir = tmp_path / f"run-{name}"
        self.out = tmp_path / f"{name}.out"
        self.children: dict[str, int] = {}
        # nohup: started with SIGHUP ignored, as `nohup make run &` starts it; else with SIGHUP's
        # default, whatever this test process was started with (a suite run under nohup ignores it)
        hup = signal.SIG_IGN if nohup else signal.SIG_DFL
        ignore = lambda: signal.signal(signal.SIGHUP, hup)  # noqa: E731
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(stack_argv(self.offset, self.run_dir), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=env(), start_new_session=True,
                                         preexec_fn=ignore)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_running(self) -> None:
        ok = wait_for(lambda: "Kinference is running" in self.text() or self.proc.poll() is not None, START_TIMEOUT)
        self.children = child_pids(self.text())
        assert ok and self.proc.poll() is None, f"the stack did not start:\n{self.text()}"
        assert len(self.children) == 10, self.children  # nats-server, 2 services, 3 pods, 3 sims, router

    def cleanup(self) -> None:
        """Stop what is left: the supervisor, then any child it left behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in self.children.values():
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    s = Supervisor(tmp_path)
    try:
        yield s
    finally:
        s.cleanup()


@pytest.mark.slow
def test_sighup_stops_the_stack_like_ctrl_c(supervisor: Supervisor) -> None:
    supervisor.wait_running()
    supervisor.proc.send_signal(signal.SIGHUP)
    try:
        rc = supervisor.proc.wait(30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SIGHUP did not stop the supervisor:\n{supervisor.text()}")
    assert rc == 0, (rc, supervisor.text())  # not killed by the signal: it stopped the stack
    out = supervisor.text()
    assert "Stopping..." in out and out.rstrip().endswith("Stopped."), out
    left = {name: pid for name, pid in supervisor.children.items() if alive(pid)}
    assert not left, f"still running after Stopped.: {left}"


@pytest.mark.slow
def test_a_stack_started_with_nohup_outlives_its_terminal(tmp_path: Path) -> None:
    """The review: the SIGHUP handler replaced the SIG_IGN that `nohup` set,
    so `nohup make run &` and a logout stopped the stack, which it had
    outlived before."""
    s = Supervisor(tmp_path, nohup=True)
    try:
        s.wait_running()
        s.proc.send_signal(signal.SIGHUP)
        time.sleep(2.0)
        assert s.proc.poll() is None and "Stopping" not in s.text(), s.text()
        assert all(alive(pid) for pid in s.children.values())
        s.proc.send_signal(signal.SIGINT)  # Ctrl-C still stops it
        assert s.proc.wait(30) == 0 and s.text().rstrip().endswith("Stopped.")
    finally:
        s.cleanup()


@pytest.mark.slow
def test_closing_the_terminal_stops_the_stack(tmp_path: Path) -> None:
    """The terminal itself goes away: the supervisor, whose controlling
    terminal it is, gets SIGHUP and every write to the terminal fails (EIO);
    it still stops every service and exits cleanly."""
    offset = free_offset()
    master, slave = os.openpty()
    # a session whose controlling terminal is the pty (opened by the session leader)
    launcher = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                "fd = os.open(os.ttyname(0), os.O_RDWR); os.execv(sys.executable, sys.argv[1:])")
    proc = subprocess.Popen([sys.executable, "-c", launcher, *stack_argv(offset, tmp_path / "run")],
                            stdin=slave, stdout=slave, stderr=slave, env=env(), start_new_session=True)
    os.close(slave)
    seen, children = b"", {}
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while b"Kinference is running" not in seen and time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 65_536)
                except OSError:
                    break
        children = child_pids(seen.decode(errors="replace").replace("\r\n", "\n"))
        assert b"Kinference is running" in seen, seen.decode(errors="replace")
        assert os.getsid(proc.pid) == proc.pid  # the supervisor leads the terminal's session
        os.close(master)  # the terminal window closes
        master = -1
        try:
            rc = proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("closing the terminal did not stop the supervisor")
        assert rc == 0, rc  # not killed by SIGHUP, not failed writing "Stopping..." to a dead terminal
        assert len(children) == 10, children
        left = {name: pid for name, pid in children.items() if alive(pid)}
        assert not left, f"still running after the terminal closed: {left}"
    finally:
        if master >= 0:
            os.close(master)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for pid in children.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_no_service_outlives_a_supervisor_killed_with_sigkill(supervisor: Supervisor) -> None:
    supervisor.wait_running()
    supervisor.proc.kill()  # kill -9: nothing of the supervisor runs, the kernel ends its children
    supervisor.proc.wait(10)
    left = wait_for(lambda: not any(alive(pid) for pid in supervisor.children.values()), 15)
    assert left, {name: pid for name, pid in supervisor.children.items() if alive(pid)}
    # and nothing listens on the ports any more: a new stack can start there
    stack = Stack(supervisor.run_dir, supervisor.offset)
    assert wait_for(lambda: not any(_port_open(p) for p in stack._ports()), 10)


def _snapshot(run_dir: Path) -> dict[str, tuple[int, bytes | None]]:
    """Each entry's inode (a wiped and re-made directory has new ones) and, for
    the files the stack writes once at its start, their content."""
    static = ("nats-auth/", "manifests/", "secrets/", "endpoints.yaml", "supervisor.json")
    snap = {}
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir).as_posix()
        if rel.startswith("nats/") or rel.startswith("status/"):
            continue  # JetStream storage and statuses come and go while the stack runs
        content = path.read_bytes() if path.is_file() and rel.startswith(static) else None
        snap[rel] = (path.stat().st_ino, content)
    for keep in ("nats", "status", "logs"):
        if (run_dir / keep).exists():
            snap[keep] = ((run_dir / keep).stat().st_ino, None)
    return snap


@pytest.mark.slow
def test_a_refused_start_changes_nothing(tmp_path: Path, supervisor: Supervisor) -> None:
    supervisor.wait_running()
    run_dir = supervisor.run_dir
    before = _snapshot(run_dir)
    assert any(k.startswith("nats-auth/") for k in before) and "logs/router.log" in before, sorted(before)
    second = tmp_path / "second.out"

    def start(offset: int, **extra: str) -> tuple[int, str]:
        with open(second, "wb") as out:
            rc = subprocess.run(stack_argv(offset, run_dir), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env(**extra), timeout=30).returncode
        return rc, second.read_text()

    # the same offset, as make runs it (make sets MAKELEVEL for its recipes)
    rc, out = start(supervisor.offset, MAKELEVEL="1")
    assert rc == 1, out
    assert out.startswith("make run: ports already in use: "), out
    assert f"a stack is running from {run_dir} (pid {supervisor.proc.pid})" in out, out
    assert re.search(r"try KINFERENCE_PORT_OFFSET=\d+00 make run$", out.strip()), out
    assert "--port-offset" not in out and "Stopping" not in out, out
    # another offset, the same run directory: refused too (its ports are free)
    other = free_offset()
    rc, out = start(other)
    assert rc == 1, out
    assert f"a stack is already running from {run_dir} (pid {supervisor.proc.pid})" in out, out

    assert _snapshot(run_dir) == before  # nothing removed, re-made or rewritten
    assert supervisor.proc.poll() is None
    router = Stack(run_dir, supervisor.offset).port(PORTS["router"])
    with urllib.request.urlopen(f"http://127.0.0.1:{router}/readyz", timeout=5) as r:  # noqa: S310 - loopback
        assert r.status == 200  # the running stack is untouched


@pytest.mark.parametrize(("flags", "by_make", "said", "retry"), [
    ([], False, "python -m kinference_simulators.stack", r"--port-offset \d+00"),
    ([], True, "make run", r"KINFERENCE_PORT_OFFSET=\d+00 make run"),
    (["--nats-cluster"], True, "make run-ha", r"KINFERENCE_PORT_OFFSET=\d+00 make run-ha"),
])
def test_taken_ports_refuse_the_start_in_the_words_of_how_it_was_started(
        tmp_path: Path, flags: list[str], by_make: bool, said: str, retry: str) -> None:
    """Something else holds a port (no stack: nothing to name but the port).
    The refusal says what to type to start on another offset, and the run
    directory, here a previous run's, is left as it was."""
    offset = free_offset()
    run_dir = tmp_path / "run"
    (run_dir / "nats-auth").mkdir(parents=True)
    (run_dir / "nats-auth" / "observer").write_text("kept\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", PORTS["router"] + offset))
        holder.listen()
        extra = {"MAKELEVEL": "1"} if by_make else {}
        done = subprocess.run([*stack_argv(offset, run_dir), *flags], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, env=env(**extra), timeout=30)
    assert done.returncode == 1, done
    assert done.stdout == "", done  # not even "Starting...": nothing was started, nothing is stopped
    out = done.stderr.strip()
    assert re.fullmatch(rf"{re.escape(said)}: ports already in use: {PORTS['router'] + offset} "
                        rf"\(another stack running\? try {retry}\)", out), out
    assert sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")) == ["nats-auth", "nats-auth/observer"]
    assert (run_dir / "nats-auth" / "observer").read_text() == "kept\n"
