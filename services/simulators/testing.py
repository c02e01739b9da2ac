"""Helpers for tests that need simulators: in-process servers and real subprocesses.

- :func:`serve`: run an aiohttp app (``vllm.make_app(...)`` etc.) on a free
  localhost port and get an :class:`aiohttp.test_utils.TestClient` for it.
- :func:`run_simulator`: start ``python -m kinference_simulators.<module>``
  with ``--port 0`` as a real process; the bound port is read from its
  ``listening`` log line.
- :func:`sse_events`: the ``data:`` payloads of an SSE body.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[TestClient]:
    """Run ``app`` on a free localhost port; yield a client bound to it."""
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def sse_events(body: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body (JSON decoded, ``[DONE]`` kept as a string)."""
    out: list[Any] = []
    for line in body.splitlines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    port: int
    lines: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def run_simulator(module: str, *args: str, ready_timeout: float = 30.0) -> Iterator[Proc]:
    """Start ``python -m kinference_simulators.<module> --port 0 ...``; wait for ``listening``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", f"kinference_simulators.{module}", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    port: list[int] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if not port:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "listening":
                    port.append(int(rec["port"]))
                    ready.set()
        ready.set()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        ready.wait(ready_timeout)
        if not port:
            raise RuntimeError(f"{module} did not start:\n{''.join(lines)}")
        yield Proc(proc, port[0], lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        t.join(5)
