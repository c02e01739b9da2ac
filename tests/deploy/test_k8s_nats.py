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
from nats.errors import NoRespondersError

from kinference_common import bus, natsserver, subjects
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
    route_tls = {k: base64.b64decode(v).decode() for k, v in docs["kinference-nats-routes-tls"]["data"].items()}
    return {"auth": docs["kinference-nats-auth"]["stringData"], "tls": tls, "routes": route_tls}


def start_servers(tmp: Path, made: dict[str, dict[str, str]], size: int = 3,
                  route_password: str | None = None, peers: list[int] | None = None) -> list[dict[str, Any]]:
    """The StatefulSet's three servers as processes on loopback: the
    ConfigMap's nats.conf with its ports, paths and route URLs (the
    headless Service's names become localhost) replaced."""
    binary = natsserver.find_binary()
    assert binary, "nats-server is needed (make install)"
    (conf,) = [d["data"]["nats.conf"] for n, d in of_kind(build(K8S), "ConfigMap").items()
               if n.startswith("nats-config")]
    ports = [(natsserver.free_port(), natsserver.free_port(), natsserver.free_port()) for _ in range(size)]
    servers = []
    for i, (port, route, monitor) in enumerate(ports):
        text = (conf.replace("/etc/nats-tls/", f"{tmp}/").replace("/etc/nats-routes-tls/", f"{tmp}/routes-")
                .replace("/data/", f"{tmp}/data-{i}/")
                .replace("\nport: 4222", f"\nport: {port}\nhost: 127.0.0.1").replace("http_port: 8222", f"http_port: {monitor}")
                .replace("  port: 6222", f"  listen: 127.0.0.1:{route}"))
        path = tmp / f"nats-{i}.conf"
        path.write_text(text)
        env = {**os.environ, "POD_NAME": f"nats-{i}", "ROUTE_PASSWORD": route_password or made["auth"]["route"]}
        for j, r in enumerate(peers or [r for _p, r, _m in ports]):  # peers: another cluster's routes
            env[f"NATS_ROUTE_{j}"] = f"nats-route://route:{env['ROUTE_PASSWORD']}@localhost:{r}"
        for user, pw in made["auth"].items():
            env[user.upper().replace("-", "_") + "_PASSWORD"] = pw
        check = subprocess.run([binary, "-t", "-c", str(path)], env=env, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr + check.stdout
        proc = subprocess.Popen([binary, "-c", str(path)], env=env, stdout=subprocess.DEVNULL,
                                stderr=open(tmp / f"nats-{i}.log", "w"))
        servers.append({"proc": proc, "port": port, "monitor": monitor, "route": route, "conf": path, "env": env})
    for s in servers:
        natsserver._wait_port("127.0.0.1", s["port"], 10, s["proc"])
    if size > 1:  # JetStream is usable once a meta leader is elected: /healthz says so
        member = [natsserver.NatsServer("127.0.0.1", s["port"], "", proc=s["proc"], monitor_port=s["monitor"])
                  for s in servers]
        natsserver.NatsCluster(member).wait_healthy(30)
    return servers


def routes(monitor: int) -> int:
    """The servers this one has routes to (2.10 and later pool several routes per server)."""
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/routez", timeout=2) as r:  # noqa: S310
        return len({route["remote_id"] for route in json.load(r)["routes"] or []})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("nats")
    made = secrets()
    for name, text in made["tls"].items():
        (tmp / name).write_text(text)
    for name, text in made["routes"].items():
        (tmp / f"routes-{name}").write_text(text)
    servers = start_servers(tmp, made)
    try:
        yield {"url": ",".join(f"tls://localhost:{s['port']}" for s in servers), "ca": str(tmp / "ca.crt"),
               "auth": made["auth"], "log": tmp / "nats-0.log", "servers": servers, "tmp": tmp, "made": made}
    finally:
        for s in servers:
            s["proc"].terminate()
            s["proc"].wait(10)


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
        self.nc = await nats.connect(bus.servers(server["url"]), user=user, password=password or server["auth"][user], tls=ctx,
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
        # at three replicas, as deployed (--kv-replicas 3): no service may update a stream, so a
        # bucket made smaller here could never be healed by the later test
        publisher = ConfigPublisher(compiler.nc, replicas=3)
        await publisher.start()
        assert (await publisher.publish(pools))[0] == len(pools)
        # the collector creates its bucket and publishes an endpoint's state
        bus = NatsBus(collector.nc, replicas=3)
        await bus.start()
        await bus.put(subjects.endpoint_subject("default", "ws", "pod-0"),
                      subjects.endpoint_key("default", "ws", "pod-0"), b"{}")
        await bus.store(subjects.endpoint_key("default", "ws", "pod-0"), b"{}")
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
        # collector replicas probe each other: one answers on its alive subject, and
        # NATS answers "no responders" for a replica that is not connected
        peer = Client()
        await peer.connect(server, "telemetry-collector")

        async def alive(msg: Any) -> None:
            await msg.respond(b"")

        await collector.nc.subscribe(f"{subjects.COLLECTOR_ALIVE_PREFIX}.collector-0", cb=alive)
        await settle(collector, peer)
        assert (await peer.nc.request(f"{subjects.COLLECTOR_ALIVE_PREFIX}.collector-0", b"", timeout=2)).data == b""
        with pytest.raises(NoRespondersError):
            await peer.nc.request(f"{subjects.COLLECTOR_ALIVE_PREFIX}.collector-9", b"", timeout=2)
        assert peer.violations() == []
        await peer.nc.close()
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
    assert gen.main(["--check"]) == 0, "regenerate: .venv/bin/python deploy/k8s/nats_conf_gen.py"
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
        await asyncio.wait_for(nats.connect(server["url"].split(",")[0].replace("tls://", "nats://"), user="router",
                                            password=server["auth"]["router"], allow_reconnect=False,
                                            connect_timeout=2, error_cb=on_error), 4)


async def test_the_three_servers_route_to_each_other_and_lose_one_without_losing_a_write(
        server: dict[str, Any]) -> None:
    """The cluster block as deployed: routes over TLS with their own password
    form between the three; the compiler (its own user) makes its bucket at
    three replicas; one server killed, the bucket stays writable; it rejoins."""
    from kinference_policy_compiler.publisher import ConfigPublisher

    servers = server["servers"]
    for _ in range(100):
        if all(routes(s["monitor"]) == 2 for s in servers):
            break
        await asyncio.sleep(0.1)
    assert [routes(s["monitor"]) for s in servers] == [2, 2, 2]
    compiler = Client()
    await compiler.connect(server, "policy-compiler")
    try:
        publisher = ConfigPublisher(compiler.nc, replicas=3)
        await publisher.start()
        js = compiler.nc.jetstream()
        info = await js.stream_info(f"KV_{subjects.CONFIG_BUCKET}")
        assert info.config.num_replicas == 3
        victim = next(s for s in servers if f"nats-{servers.index(s)}" == info.cluster.leader)
        victim["proc"].kill()
        victim["proc"].wait()
        kv = None
        for _ in range(60):  # the two left elect a leader within seconds
            try:
                kv = await js.key_value(subjects.CONFIG_BUCKET)
                await kv.put("_probe", b"x")
                break
            except Exception:
                kv = None
                await asyncio.sleep(0.25)
        assert kv is not None and (await kv.get("_probe")).value == b"x"
        victim["proc"] = subprocess.Popen([natsserver.find_binary(), "-c", str(victim["conf"])], env=victim["env"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        natsserver._wait_port("127.0.0.1", victim["port"], 10, victim["proc"])
        assert await bus.wait_current(js, f"KV_{subjects.CONFIG_BUCKET}", 30)
        assert compiler.violations() == []
    finally:
        await compiler.nc.close()


async def test_a_server_without_the_route_password_cannot_join(server: dict[str, Any],
                                                              tmp_path: Path) -> None:
    for name, text in server["made"]["tls"].items():
        (tmp_path / name).write_text(text)
    for name, text in server["made"]["routes"].items():
        (tmp_path / f"routes-{name}").write_text(text)
    # it knows the routes' names and holds a route certificate, not the password
    (rogue,) = start_servers(tmp_path, server["made"], size=1, route_password="k" + "0" * 48,
                             peers=[s["route"] for s in server["servers"]])
    try:
        await asyncio.sleep(2)
        assert routes(rogue["monitor"]) == 0
        assert [routes(s["monitor"]) for s in server["servers"]] == [2, 2, 2]
    finally:
        rogue["proc"].kill()
        rogue["proc"].wait()
