"""compose.yaml's NATS runs with authentication, as `make run` and the
Kubernetes manifests do: a one-shot `nats-auth` service generates the
passwords and the configuration into a volume (nothing secret in the
repository), nats-server starts from that configuration, and every service
connects as its own user. The generator is then run for real with compose's
arguments and a real nats-server refuses anonymous clients."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from kinference_common import natsauth, natsserver

REPO = Path(__file__).resolve().parents[2]
#: compose service -> the NATS user it connects as
USERS = {"policy-compiler": natsauth.COMPILER, "classifier": natsauth.CLASSIFIER,
         "telemetry-collector": natsauth.COLLECTOR, "router": natsauth.ROUTER}


def services() -> dict[str, Any]:
    return yaml.safe_load((REPO / "compose.yaml").read_text())["services"]


def argv(service: dict[str, Any]) -> list[str]:
    """The service's command as words (a `sh -c` script split like the shell would)."""
    cmd = service.get("command", [])
    if service.get("entrypoint") == ["sh", "-c"]:
        return shlex.split(cmd[0].replace("$$", "$"))
    return list(cmd)


def flag(words: list[str], name: str) -> str:
    assert words.count(name) == 1, f"{name} given {words.count(name)} times in {words}"
    return words[words.index(name) + 1]


def auth_mount(service: dict[str, Any], read_only: bool) -> str:
    """Where the service mounts the `nats-auth` volume."""
    mounts = [v.split(":") for v in service.get("volumes", []) if v.startswith("nats-auth:")]
    assert len(mounts) == 1, service.get("volumes")
    assert (mounts[0][2:] == ["ro"]) is read_only, mounts[0]
    return mounts[0][1]


def waits_for_the_generator(service: dict[str, Any]) -> bool:
    deps = service.get("depends_on", {})
    return isinstance(deps, dict) and deps.get("nats-auth", {}).get("condition") == "service_completed_successfully"


def test_the_generator_writes_the_configuration_and_the_passwords_into_the_volume() -> None:
    gen = services()["nats-auth"]
    words = argv(gen)
    assert words[:3] == ["python", "-m", "kinference_common.natsauth"]
    directory = auth_mount(gen, read_only=False)
    assert flag(words, "--password-dir") == directory
    assert Path(flag(words, "--out")).parent == Path(directory)
    assert "nats-auth" in yaml.safe_load((REPO / "compose.yaml").read_text())["volumes"]


def test_nats_starts_from_the_generated_configuration_only() -> None:
    svc, gen = services()["nats"], services()["nats-auth"]
    words = argv(svc)
    assert words[0] == "nats-server"
    # the configuration alone: a flag such as -js without -c would start a server open to anyone
    assert words[1:] == ["-c", flag(argv(gen), "--out")]
    assert auth_mount(svc, read_only=True) == auth_mount(gen, read_only=False)
    assert waits_for_the_generator(svc)


def test_every_nats_client_connects_as_its_own_user_with_its_password_file() -> None:
    all_services = services()
    directory = auth_mount(all_services["nats-auth"], read_only=False)
    clients = {name for name, s in all_services.items() if "--nats-url" in argv(s)}
    assert clients == set(USERS)
    for name, user in USERS.items():
        svc = all_services[name]
        words = argv(svc)
        assert flag(words, "--nats-user") == user, name
        assert flag(words, "--nats-password-file") == f"{auth_mount(svc, read_only=True)}/{user}", name
        assert auth_mount(svc, read_only=True) == directory, name
        assert waits_for_the_generator(svc), name


def test_no_password_is_written_in_compose_yaml() -> None:
    text = (REPO / "compose.yaml").read_text()
    for name, svc in services().items():
        env = svc.get("environment", {})
        keys = env if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
        assert natsauth.PASSWORD_ENV not in keys, name
    # outside comments, "password" only ever names a file or directory to read
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "password" not in code.replace("--nats-password-file", "").replace("--password-dir", "").lower()


@pytest.mark.nats
async def test_the_generated_configuration_refuses_anonymous_clients_and_admits_each_service(
        tmp_path: Path) -> None:
    binary = natsserver.find_binary()
    assert binary, "nats-server is needed (make install)"
    gen = services()["nats-auth"]
    directory = auth_mount(gen, read_only=False)
    # compose's own arguments, with the volume and the JetStream store moved under tmp_path
    words = [w.replace(directory, str(tmp_path / "auth")) for w in argv(gen)[3:]]
    words[words.index("--store-dir") + 1] = str(tmp_path / "js")
    port = natsserver.free_port()
    assert natsauth.main([*words, "--listen", f"127.0.0.1:{port}"]) == 0
    conf = Path(flag(words, "--out"))
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        natsserver._wait_port("127.0.0.1", port, 10, proc)
        url = f"nats://127.0.0.1:{port}"
        with pytest.raises(Exception, match="(?i)authorization"):
            await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
        for name, user in USERS.items():
            password_file = Path(flag(argv(services()[name]), "--nats-password-file").replace(
                directory, str(tmp_path / "auth")))
            assert password_file.stat().st_mode & 0o077 == 0, password_file
            nc = await nats.connect(url, user=user, password=password_file.read_text().strip(),
                                    inbox_prefix=natsauth.inbox_prefix(user), allow_reconnect=False,
                                    connect_timeout=2)
            await nc.close()
    finally:
        proc.terminate()
        proc.wait(10)
