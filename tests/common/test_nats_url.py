"""``--nats-url`` is checked once, in one place (``bus.servers``), and every
service says what is wrong with it in one line at start-up, naming the
entry, and exits 1. The HA trial found the router printing a 29-46 line
traceback for each URL below, and the collector retrying one forever while
serving /healthz."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from kinference_common import bus

#: what the trial gave, and the entry each message must name
TRIAL = [
    ("", "''"),
    (",", "','"),
    ("nats://127.0.0.1:notaport", "'nats://127.0.0.1:notaport'"),
    ("nats://127.0.0.1:5922;nats://127.0.0.1:5932", "'nats://127.0.0.1:5922;nats://127.0.0.1:5932'"),
    ("nats://127.0.0.1:99999,nats://127.0.0.1:5932", "'nats://127.0.0.1:99999'"),
]


@pytest.mark.parametrize("url, expected", [
    ("nats://127.0.0.1:4222", ["nats://127.0.0.1:4222"]),
    (" nats://a:1 , tls://b:2,", ["nats://a:1", "tls://b:2"]),
    ("NATS://a:1", ["nats://a:1"]),  # the client knows lower-case schemes only
    ("a:4222,b", ["nats://a:4222", "nats://b"]),  # as the client reads them: nats://, port 4222
    ("nats://[::1]:4222", ["nats://[::1]:4222"]),
    ("nats://observer:pw@127.0.0.1:4222/", ["nats://observer:pw@127.0.0.1:4222/"]),
    ("wss://nats.example:443/ws,ws://other/ws", ["wss://nats.example:443/ws", "ws://other/ws"]),
    (["nats://a:1", "nats://b:2,nats://c:3"], ["nats://a:1", "nats://b:2", "nats://c:3"]),
])
def test_good_urls_are_the_servers(url: str | list[str], expected: list[str]) -> None:
    assert bus.servers(url) == expected
    assert bus.check_url(url) == ",".join(expected)


@pytest.mark.parametrize("url, message", [
    ("", "--nats-url '': no NATS server given"),
    (" , ", "--nats-url ' , ': no NATS server given"),
    ("nats://127.0.0.1:notaport", "--nats-url 'nats://127.0.0.1:notaport': port 'notaport' is not a number in 1-65535"),
    ("nats://127.0.0.1:5922;nats://127.0.0.1:5932",
     "--nats-url 'nats://127.0.0.1:5922;nats://127.0.0.1:5932': separate servers with commas, not ';'"),
    ("nats://a:1 nats://b:2", "--nats-url 'nats://a:1 nats://b:2': separate servers with commas, not spaces"),
    ("nats://127.0.0.1:99999,nats://127.0.0.1:5932", "--nats-url 'nats://127.0.0.1:99999': port 99999 is outside 1-65535"),
    ("nats://a:1,nats://b:0", "--nats-url 'nats://b:0': port 0 is outside 1-65535"),
    ("foo://127.0.0.1:5922", "--nats-url 'foo://127.0.0.1:5922': scheme 'foo://' is not one of nats://, tls://"),
    ("http://127.0.0.1:4222", "--nats-url 'http://127.0.0.1:4222': scheme 'http://'"),
    ("nats://:4222", "--nats-url 'nats://:4222': no host"),
    ("nats://a:4222/x", "--nats-url 'nats://a:4222/x': unexpected '/x' after the port"),
    ("nats://[::1", "--nats-url 'nats://[::1': not a URL"),
    ("ws://a:1,nats://b:2", "WebSocket servers (ws://, wss://) cannot be mixed"),
])
def test_a_bad_url_names_the_entry_and_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(bus.NatsUrlError) as caught:
        bus.servers(url)
    assert message in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # what servers() raised before


def test_a_password_in_a_bad_url_is_not_repeated() -> None:
    with pytest.raises(bus.NatsUrlError) as caught:
        bus.servers("nats://observer:s3cret-pw@127.0.0.1:99999")
    assert "s3cret-pw" not in str(caught.value)
    assert "nats://***@127.0.0.1:99999" in str(caught.value)
    # a password holding '/' (base64) or ',' (which cuts the URL in two) is not shown either
    for url, piece in (("nats://router:Zm9v/YmFy@nats-0:99999", "Zm9v"), ("nats://router:s3cr,et@nats-0:4222", "s3cr")):
        with pytest.raises(bus.NatsUrlError) as caught:
            bus.servers(url)
        assert piece not in str(caught.value), str(caught.value)
    assert bus.servers("nats://router:Zm9v/YmFy@nats-0:4222") == ["nats://router:Zm9v/YmFy@nats-0:4222"]


async def test_connect_refuses_a_bad_url_at_once() -> None:
    with pytest.raises(bus.NatsUrlError, match="port 99999"):
        await asyncio.wait_for(bus.connect("nats://127.0.0.1:99999", name="test"), 5)


SERVICES = {
    "kinference-router": ["-m", "kinference_router"],
    "kinference-policy-compiler": ["-m", "kinference_policy_compiler", "--manifests", "."],
    "kinference-classifier": ["-m", "kinference_classifier", "--health-port", "0"],
    "kinference-telemetry-collector": ["-m", "kinference_collector", "--http-port", "0"],
}


@pytest.mark.parametrize("prog", list(SERVICES))
async def test_every_service_says_it_in_one_line_and_exits_1(prog: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    for url, entry in TRIAL:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *SERVICES[prog], "--nats-url", url, cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 15)
        except TimeoutError:  # the collector retried it forever
            proc.kill()
            await proc.wait()
            pytest.fail(f"{prog} --nats-url {url!r} still running after 15 s")
        lines = err.decode().splitlines()
        assert proc.returncode == 1, (url, proc.returncode, lines)
        assert len(lines) == 1 and lines[0].startswith(f"{prog}: --nats-url {entry}: "), (url, lines)
        assert not out


async def test_nats_url_from_the_environment_is_checked_too(tmp_path: Path) -> None:
    env = {**os.environ, "NATS_URL": "nats://127.0.0.1:5922;nats://127.0.0.1:5932"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kinference_router", cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode == 1
    assert err.decode().splitlines() == [
        "kinference-router: --nats-url 'nats://127.0.0.1:5922;nats://127.0.0.1:5932': "
        "separate servers with commas, not ';'"]
