"""Each simulator as a real process: ``--help``, ``--port 0``, a request, a clean SIGTERM."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from kinference_simulators.testing import run_simulator

pytestmark = pytest.mark.slow


def get(url: str, headers: dict[str, str] | None = None, data: object = None) -> tuple[int, bytes]:
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.parametrize("module", ["vllm", "dcgm", "provider"])
def test_help(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", f"kinference_simulators.{module}", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--port" in out


def test_bad_arguments_exit_with_an_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kinference_simulators.vllm", "--speed-profile", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "unknown speed profile" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "kinference_simulators.dcgm", "--gpu", "no-pod-here"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0 and "NAMESPACE/POD=ENGINE_URL" in proc.stderr


def test_engine_and_dcgm_processes() -> None:
    with run_simulator(
        "vllm",
        "--speed-profile",
        "fast",
        "--model",
        "m",
        "--pod-name",
        "p-0",
        "--max-model-len",
        "2048",
    ) as engine:
        status, body = get(engine.url + "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["max_model_len"] == 2048
        status, body = get(
            engine.url + "/v1/chat/completions",
            data={
                "model": "m",
                "max_tokens": 4,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "my SSN is PII-MARKER-4242"}],
            },
        )
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
        status, body = get(engine.url + "/metrics")
        assert b'vllm:generation_tokens_total{engine="0",model_name="m"} 4.0' in body
        with run_simulator("dcgm", "--gpu", f"prod/p-0={engine.url}", "--interval", "0.1") as d:
            status, body = get(d.url + "/metrics")
            assert status == 200 and b'pod="p-0"' in body and b'namespace="prod"' in body
            status, _ = get(d.url + "/sim/xid", data={"gpu": 0, "code": 48})
            assert status == 200
            assert b'err_code="48"' in get(d.url + "/metrics")[1]
        assert d.proc.returncode == 0
    assert engine.proc.returncode == 0
    # prompts never reach the logs
    assert engine.lines and not any("PII-MARKER" in line for line in engine.lines)


def test_provider_process(tmp_path: object) -> None:
    log = f"{tmp_path}/received.jsonl"
    with run_simulator(
        "provider",
        "--api-key",
        "k1",
        "--model",
        "gpt-x",
        "--ttft-ms",
        "1",
        "--ttft-jitter-ms",
        "0",
        "--tokens-per-second",
        "1000",
        "--log-file",
        log,
    ) as p:
        status, _ = get(
            p.url + "/v1/chat/completions",
            data={"model": "gpt-x", "messages": [{"role": "user", "content": "hello"}]},
        )
        assert status == 401
        status, body = get(
            p.url + "/v1/chat/completions",
            headers={"Authorization": "Bearer k1"},
            data={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert status == 200 and json.loads(body)["model"] == "gpt-x"
        records = json.loads(get(p.url + "/sim/requests")[1])
        assert [(r["prompt_text"], r["authorized"]) for r in records] == [
            ("hello", False),
            ("hi", True),
        ]
    assert p.proc.returncode == 0
    with open(log) as f:
        assert len(f.readlines()) == 2
