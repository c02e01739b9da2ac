"""NATS authentication in the ``make run`` configuration (natsauth.LocalAuth,
the generator stack.py uses): without credentials nothing connects; only
classifiers may subscribe to the classify subjects (not a router, not the
observer); only routers may publish them; TLS with an openssl-made certificate."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
from kinference_common import natsauth
from kinference_common.natsserver import _wait_port, find_binary, free_port

pytestmark = pytest.mark.nats


def _spawn(conf: Path, port: int) -> subprocess.Popen[bytes]:
    binary = find_binary()
    assert binary, "nats-server is needed (make install)"
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_port("127.0.0.1", port, 10, proc)
    return proc


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, natsauth.LocalAuth]]:
    port = free_port()
    auth = natsauth.LocalAuth(tmp_path / "nats-auth")
    conf = auth.server_config(f"127.0.0.1:{port}", str(tmp_path / "js"))
    proc = _spawn(conf, port)
    try:
        yield f"nats://127.0.0.1:{port}", auth
    finally:
        proc.terminate()
        proc.wait(5)


async def login(url: str, auth: natsauth.LocalAuth, user: str, errors: list[str] | None = None) -> nats.NATS:
    p = argparse.ArgumentParser()
    natsauth.add_arguments(p)
    opts = natsauth.connect_options(p.parse_args(auth.flags(user)))

    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(url, error_cb=on_error, max_reconnect_attempts=0, **opts)


async def test_without_credentials_nothing_connects(server) -> None:
    url, _ = server
    with pytest.raises(Exception) as exc:
        await nats.connect(url, max_reconnect_attempts=0, allow_reconnect=False, connect_timeout=2)
    assert "authorization" in str(exc.value).lower() or isinstance(exc.value, nats.errors.NoServersError)


async def test_a_wrong_password_is_refused(server, tmp_path: Path) -> None:
    url, _ = server
    with pytest.raises(Exception):
        await nats.connect(url, user="router", password="guess", max_reconnect_attempts=0,
                           allow_reconnect=False, connect_timeout=2)


async def _can_read_classify(url: str, auth: natsauth.LocalAuth, user: str) -> tuple[bool, list[str]]:
    """Does ``user`` receive what a router publishes on kinference.classify.pii?"""
    errors: list[str] = []
    spy = await login(url, auth, user, errors)
    got: list[bytes] = []

    async def on(msg) -> None:  # noqa: ANN001
        got.append(msg.data)

    await spy.subscribe("kinference.classify.pii", cb=on)
    await spy.subscribe("kinference.>", cb=on)
    await spy.subscribe(">", cb=on)
    await spy.flush()
    router = await login(url, auth, "router")
    await router.publish("kinference.classify.pii", b'{"texts": ["card 4111 1111 1111 1111"]}')
    await router.flush()
    await asyncio.sleep(0.3)
    await spy.close()
    await router.close()
    return bool(got), errors


@pytest.mark.parametrize("user", ["router", "observer", "telemetry-collector", "policy-compiler"])
async def test_only_classifiers_may_read_classify_subjects(server, user: str) -> None:
    url, auth = server
    received, errors = await _can_read_classify(url, auth, user)
    assert not received, f"{user} read a classify request"
    assert any("permissions violation" in e.lower() for e in errors), errors


async def test_a_classifier_reads_them(server) -> None:
    url, auth = server
    received, _ = await _can_read_classify(url, auth, "classifier")
    assert received


@pytest.mark.parametrize("user", ["classifier", "observer", "telemetry-collector", "policy-compiler"])
async def test_only_routers_may_publish_classify_requests(server, user: str) -> None:
    url, auth = server
    classifier = await login(url, auth, "classifier")
    got: list[bytes] = []

    async def on(msg) -> None:  # noqa: ANN001
        got.append(msg.data)

    await classifier.subscribe("kinference.classify.pii", cb=on)
    await classifier.flush()
    errors: list[str] = []
    other = await login(url, auth, user, errors)
    await other.publish("kinference.classify.pii", b"{}")
    await other.flush()
    await asyncio.sleep(0.3)
    await other.close()
    await classifier.close()
    assert not got
    assert any("permissions violation" in e.lower() for e in errors), errors


async def test_request_reply_works_for_the_services(server) -> None:
    """The classifier answers a router's request (allow_responses), and the
    reply reaches the router's own inbox only."""
    url, auth = server
    classifier = await login(url, auth, "classifier")

    async def answer(msg) -> None:  # noqa: ANN001
        await msg.respond(b"ok")

    await classifier.subscribe("kinference.classify.pii", queue="kinference-classifier", cb=answer)
    await classifier.flush()
    router = await login(url, auth, "router")
    reply = await router.request("kinference.classify.pii", b"{}", timeout=2)
    assert reply.data == b"ok"
    assert reply.subject.startswith("_INBOX_router.")
    await router.close()
    await classifier.close()


def test_generator_cli_writes_a_config_nats_server_accepts(tmp_path: Path) -> None:
    out = tmp_path / "nats.conf"
    assert natsauth.main(["--out", str(out), "--password-dir", str(tmp_path / "pw"), "--listen", "127.0.0.1:4999",
                          "--store-dir", str(tmp_path / "js")]) == 0
    assert sorted(p.name for p in (tmp_path / "pw").iterdir()) == sorted(natsauth.USERS)
    assert oct((tmp_path / "pw" / "router").stat().st_mode)[-3:] == "600"
    binary = find_binary()
    assert binary
    check = subprocess.run([binary, "-c", str(out), "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    # passwords kept on a second run
    before = (tmp_path / "pw" / "router").read_text()
    natsauth.main(["--out", str(out), "--password-dir", str(tmp_path / "pw")])
    assert (tmp_path / "pw" / "router").read_text() == before


def test_credential_flags_fail_clearly(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    natsauth.add_arguments(p)
    with pytest.raises(natsauth.CredentialsError, match="nats-password-file .*missing"):
        natsauth.connect_options(p.parse_args(["--nats-user", "router", "--nats-password-file",
                                               str(tmp_path / "missing")]))
    with pytest.raises(natsauth.CredentialsError, match="go together"):
        natsauth.connect_options(p.parse_args(["--nats-tls-cert", str(tmp_path / "c")]))


async def test_tls_with_an_openssl_certificate(tmp_path: Path) -> None:
    key, cert = tmp_path / "server.key", tmp_path / "server.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    port = free_port()
    passwords = natsauth.generate_passwords()
    natsauth.write_password_files(tmp_path / "pw", passwords)
    conf = tmp_path / "nats.conf"
    conf.write_text(natsauth.server_config(passwords, listen=f"127.0.0.1:{port}",
                                           tls=natsauth.Tls(cert=str(cert), key=str(key))))
    proc = _spawn(conf, port)
    try:
        p = argparse.ArgumentParser()
        natsauth.add_arguments(p)
        args = p.parse_args(["--nats-user", "router", "--nats-password-file", str(tmp_path / "pw" / "router"),
                             "--nats-tls-ca", str(cert)])
        nc = await nats.connect(f"tls://127.0.0.1:{port}", max_reconnect_attempts=0, **natsauth.connect_options(args))
        await nc.publish("kinference.decisions.default.pool", b"{}")
        await nc.flush()
        assert nc.is_connected
        await nc.close()
        # without the CA the server's certificate is not trusted
        with pytest.raises(Exception):
            await nats.connect(f"tls://127.0.0.1:{port}", max_reconnect_attempts=0, allow_reconnect=False,
                               connect_timeout=2, user="router", password=passwords["router"])
    finally:
        proc.terminate()
        proc.wait(5)
