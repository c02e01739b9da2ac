"""The NATS configuration in deploy/k8s, run for real: nats-server started
with the ConfigMap's nats.conf, the TLS certificate and the passwords that
deploy/k8s/make-secrets.sh makes; each service's user does what that service
does (with the services' own publishing code where it is separable), and is
refused what it must not do."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from kinference_common import natsserver, subjects
from kinference_common.classify_client import classify_body
from kinference_common.messages import ClassifyReply, encode

from .k8s import K8S, build, of_kind

pytestmark = pytest.mark.nats


def secrets() -> dict[str, dict[str, str]]:
    assert shutil.which("openssl"), "openssl is needed (make install installs it)"
    out = subprocess.run(["sh", str(K8S / "make-secrets.sh"), "--print"], capture_output=True, text=True,
                         timeout=60, check=True)
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d}
    tls = {k: base64.b64decode(v).decode() for k, v in docs["kinference-nats-tls"]["data"].items()}
    return {"auth": docs["kinference-nats-auth"]["stringData"], "tls": tls}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary = natsserver.find_binary()
    assert binary, "nats-server is needed (make install)"
    tmp = tmp_path_factory.mktemp("nats")
    made = secrets()
    for name, text in made["tls"].items():
        (tmp / name).write_text(text)
    port, monitor = natsserver.free_port(), natsserver.free_port()
    (conf,) = [d["data"]["nats.conf"] for n, d in of_kind(build(K8S), "ConfigMap").items()
               if n.startswith("nats-config")]
    conf = (conf.replace("/etc/nats-tls/", f"{tmp}/").replace("/data/", f"{tmp}/data/")
            .replace("port: 4222", f"port: {port}\nhost: 127.0.0.1").replace("http_port: 8222", f"http_port: {monitor}"))
    (tmp / "nats.conf").write_text(conf)
    env = {**os.environ, "POD_NAME": "nats-0"}
    for user, pw in made["auth"].items():
        env[user.upper().replace("-", "_") + "_PASSWORD"] = pw
    check = subprocess.run([binary, "-t", "-c", str(tmp / "nats.conf")], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    proc = subprocess.Popen([binary, "-c", str(tmp / "nats.conf")], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp / "nats.log", "w"))
    try:
        natsserver._wait_port("127.0.0.1", port, 10, proc)
        yield {"url": f"tls://localhost:{port}", "ca": str(tmp / "ca.crt"), "auth": made["auth"], "log": tmp / "nats.log"}
    finally:
        proc.terminate()
        proc.wait(10)


class Client:
    """A connection as one user, collecting the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Any = None

    async def connect(self, server: dict[str, Any], user: str, password: str | None = None) -> Any:
        ctx = ssl.create_default_context(cafile=server["ca"])

        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        # each service's replies come to an inbox of its own (natsauth.inbox_prefix)
        self.nc = await nats.connect(server["url"], user=user, password=password or server["auth"][user], tls=ctx,
                                     error_cb=on_error, max_reconnect_attempts=0, connect_timeout=5,
                                     inbox_prefix=f"_INBOX_{user}")
        return self.nc

    def violations(self) -> list[str]:
        return [e for e in self.errors if "ermission" in e]


async def settle(*clients: Client) -> None:
    for c in clients:
        await c.nc.flush(timeout=5)
    await asyncio.sleep(0.2)  # a permission error arrives asynchronously


async def test_each_service_does_its_work_as_its_user(server: dict[str, Any]) -> None:
    from kinference_collector.publish import NatsBus
    from kinference_policy_compiler.publisher import ConfigPublisher
    from kinference_common.compiler import compile_documents
    from kinference_policy_compiler.source import DirectorySource

    compiler, collector, router, classifier = Client(), Client(), Client(), Client()
    await compiler.connect(server, "policy-compiler")
    await collector.connect(server, "telemetry-collector")
    await router.connect(server, "router")
    await classifier.connect(server, "classifier")
    try:
        # the classifier answers in its queue group
        async def answer(msg: Any) -> None:
            await msg.respond(encode(ClassifyReply(classifier="pii", tags=["pii-none"])))

        await classifier.nc.subscribe(subjects.classify_subject("pii"), queue=subjects.CLASSIFIER_QUEUE_GROUP,
                                      cb=answer)
        # the router follows config and telemetry
        seen: list[str] = []

        async def on(msg: Any) -> None:
            seen.append(msg.subject)

        await router.nc.subscribe(f"{subjects.CONFIG_PREFIX}.>", cb=on)
        await router.nc.subscribe(f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", cb=on)
        await collector.nc.subscribe(f"{subjects.OBSERVATIONS_PREFIX}.>", cb=on)
        await settle(classifier, router, collector)

        # the compiler creates its bucket and publishes the example's pools
        source = DirectorySource(Path(__file__).resolve().parents[2] / "deploy" / "examples")
        source.poll()
        pools = compile_documents(source.documents()).pools
        assert pools
        publisher = ConfigPublisher(compiler.nc)
        await publisher.start()
        assert (await publisher.publish(pools))[0] == len(pools)
        # the collector creates its bucket and publishes an endpoint's state
        bus = NatsBus(collector.nc)
        await bus.start()
        await bus.put(subjects.endpoint_subject("default", "ws", "pod-0"),
                      subjects.endpoint_key("default", "ws", "pod-0"), b"{}")
        # the router reads both buckets (as its resync does), asks the classifier, publishes events
        js = router.nc.jetstream()
        config = await js.key_value(subjects.CONFIG_BUCKET)
        (ns, name), _ = next(iter(pools.items()))
        assert (await config.get(subjects.config_key(ns, name))).value
        telemetry = await js.key_value(subjects.TELEMETRY_BUCKET)
        keys = await telemetry.keys()
        assert keys == [subjects.endpoint_key("default", "ws", "pod-0")]
        assert (await telemetry.get(keys[0])).value == b"{}"
        reply = await classify_body(router.nc, "pii", {"messages": [{"role": "user", "content": "hi"}]}, 2.0)
        assert reply.outcome == "ok" and reply.tags == ["pii-none"]
        await router.nc.publish(subjects.decisions_subject(ns, name), b"{}")
        await router.nc.publish(subjects.observations_subject(ns, name), b"{}")
        await router.nc.subscribe(subjects.replica_sync_subject(ns, name))  # replica sync: publish and listen
        await router.nc.publish(subjects.replica_sync_subject(ns, name), b"{}")
        await settle(compiler, collector, router, classifier)
        assert subjects.config_subject(ns, name) in seen
        assert subjects.observations_subject(ns, name) in seen
        assert any(s.startswith(subjects.TELEMETRY_ENDPOINT_PREFIX) for s in seen)
        for c in (compiler, collector, router, classifier):
            assert c.violations() == [], c.violations()
    finally:
        for c in (compiler, collector, router, classifier):
            await c.nc.close()


@pytest.mark.parametrize(("user", "subject"), [
    ("router", "kinference.config.default.inference-all"),          # only the compiler publishes config
    ("router", "$KV.kinference-telemetry.endpoint.x"),              # nor writes telemetry
    ("classifier", "kinference.decisions.default.inference-all"),   # the classifier only answers
    ("classifier", "kinference.classify.pii"),
    ("telemetry-collector", "$KV.kinference-config.default.x"),     # the collector cannot change config
    ("policy-compiler", "kinference.telemetry.endpoint.x"),
    ("telemetry-collector", "kinference.router.default.inference-all.sync"),  # only routers forge replica sync
    ("observer", "kinference.router.default.inference-all.sync"),
])
async def test_a_user_is_refused_what_its_service_never_does(server: dict[str, Any], user: str, subject: str) -> None:
    c = Client()
    await c.connect(server, user)
    try:
        await c.nc.publish(subject, b"x")
        await settle(c)
        assert c.violations(), f"{user} could publish to {subject}"
    finally:
        await c.nc.close()


@pytest.mark.parametrize(("user", "subject"), [
    ("router", "kinference.classify.pii"),            # prompts: only classifiers read them
    ("telemetry-collector", "kinference.classify.>"),
    ("observer", "kinference.classify.pii"),
    ("router", "_INBOX_classifier.>"),                # nobody reads another service's replies
    ("policy-compiler", "$KV.kinference-telemetry.>"),
    ("observer", "kinference.router.>"),              # replica sync (keyed prompt hashes): routers only
    ("classifier", "kinference.router.default.inference-all.sync"),
])
async def test_a_user_cannot_listen_where_its_service_never_does(server: dict[str, Any], user: str,
                                                                 subject: str) -> None:
    c = Client()
    await c.connect(server, user)
    try:
        await c.nc.subscribe(subject)
        await settle(c)
        assert c.violations(), f"{user} could subscribe to {subject}"
    finally:
        await c.nc.close()


async def test_the_observer_follows_decisions_and_can_publish_nothing(server: dict[str, Any]) -> None:
    router, observer = Client(), Client()
    await router.connect(server, "router")
    await observer.connect(server, "observer")
    try:
        got: list[bytes] = []

        async def on(msg: Any) -> None:
            got.append(msg.data)

        await observer.nc.subscribe(f"{subjects.DECISIONS_PREFIX}.>", cb=on)
        await settle(observer)
        await router.nc.publish(subjects.decisions_subject("default", "p"), b"{}")
        await settle(router, observer)
        assert got == [b"{}"] and observer.violations() == []
        await observer.nc.publish(subjects.decisions_subject("default", "p"), b"forged")
        await settle(observer)
        assert observer.violations()
    finally:
        await router.nc.close()
        await observer.nc.close()


def test_the_committed_config_is_generated_from_the_permissions() -> None:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("nats_conf_gen", K8S / "nats_conf_gen.py")
    gen = importlib.util.module_from_spec(spec)
    sys.modules["nats_conf_gen"] = gen
    spec.loader.exec_module(gen)
    assert gen.main(["--check"]) == 0, "regenerate: python deploy/k8s/nats_conf_gen.py"
    users, permissions = gen.users_and_permissions()
    assert set(users) >= {"router", "policy-compiler", "telemetry-collector", "classifier"}
    # the classifier may publish nothing but replies
    assert permissions("classifier")["publish"] == {"deny": [">"]}


async def test_a_wrong_password_and_plain_text_are_refused(server: dict[str, Any]) -> None:
    with pytest.raises(Exception):
        await asyncio.wait_for(Client().connect(server, "router", password="not-the-password"), 4)
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    with pytest.raises(Exception):  # no TLS: the server requires it
        await asyncio.wait_for(nats.connect(server["url"].replace("tls://", "nats://"), user="router",
                                            password=server["auth"]["router"], allow_reconnect=False,
                                            connect_timeout=2, error_cb=on_error), 4)
