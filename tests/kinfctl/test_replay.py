"""Decision records and ``kinfctl replay`` / ``kinfctl audit --since``: a
router recording to a real nats-server (real classifier service, stand-in
pods and provider), the records read back by kinfctl as an operator runs it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from aiohttp.test_utils import TestServer

from kinference_common import recording
from kinference_common.compiler import compile_documents
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import Router, RouterSettings
from kinference_router.recording import RecordSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles
from kinfctl.main import main
from tests.router.conftest import Served
from tests.router.manifests import EXAMPLES, example_documents
from tests.router.test_router import Env, Upstream, classifier  # noqa: F401 - fixture

#: a prompt no record may contain, in any byte
SECRET_PROMPT = "Zyzzogeton quarterly figures for the Wombat-7 merger"
PII_PROMPT = "Please email the contract to jane.doe@example.com and call me back."
POLICY = (EXAMPLES / "10-burst-policy.yaml").read_text()


@pytest.fixture
async def env(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Env]:
    pods = {p: Upstream(p) for p in ("qwen-0", "qwen-1", "qwen-spot-0")}
    provider = Upstream("databricks", api_key="sk-test")
    for up in (*pods.values(), provider):
        up.server = TestServer(up.app())
        await up.server.start_server()
    res = compile_documents(example_documents(provider.address))
    assert not res.errors
    nc = await nats.connect(nats_server.url)
    publisher = ConfigPublisher(nc)
    await publisher.start()
    await publisher.publish(res.pools)
    secret = tmp_path / "secrets" / "default" / "databricks-token"
    secret.mkdir(parents=True)
    (secret / "token").write_text("sk-test\n")
    settings = RouterSettings(record=RecordSettings(max_bytes=8 << 20, max_age_seconds=3600, keyframe_seconds=0.3))
    router = Router(settings, Authenticator("none"), SecretFiles(tmp_path / "secrets"), nc=nc)
    await router.start()
    client = await Served(router.data_server()).start()
    e = Env(nats_server, nc, pods, provider, router, client, tmp_path)
    for pod in pods:
        await e.telemetry(pod)
    await e.settle()
    try:
        yield e
    finally:
        await client.close()
        await router.stop()
        for up in (*pods.values(), provider):
            await up.server.close()  # type: ignore[union-attr]
        await nc.close()


async def kinfctl(*argv: str) -> tuple[int, str, str]:
    """``kinfctl ARGV`` as an operator runs it: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    code = await asyncio.to_thread(call)
    return code, out.getvalue(), err.getvalue()


async def traffic(env: Env) -> dict[str, int]:
    """Idle pods (local), one pod under the threshold (local), all saturated
    (clean bursts, PII refused): what each phase sent."""
    for i in range(3):
        r = await env.chat(f"{SECRET_PROMPT} #{i}")
        assert r.status == 200 and r.headers["x-kinference-backend"].startswith("Local/")
    await env.telemetry("qwen-0", queued=3)
    await env.telemetry("qwen-1", queued=6)
    await env.telemetry("qwen-spot-0", queued=10)
    await env.settle()
    for i in range(2):
        r = await env.chat(f"{SECRET_PROMPT} warm #{i}")
        assert r.status == 200 and r.headers["x-kinference-backend"] == "Local/qwen-2-5-32b", await r.text()
    await env.saturate()
    for i in range(3):
        r = await env.chat(f"{SECRET_PROMPT} busy #{i}")
        assert r.status == 200 and r.headers["x-kinference-backend"] == "Provider/databricks", await r.text()
    r = await env.chat(PII_PROMPT)
    assert r.status == 503
    await asyncio.sleep(0.3)  # the records published (a later turn of the loop, 2 ms linger)
    return {"local": 5, "provider": 3, "refused": 1}


def policy_file(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


async def test_records_hold_no_prompt_and_the_stream_has_the_limits(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    js = env.nc.jetstream()
    info = await js.stream_info(recording.STREAM)
    assert info.config.max_bytes == 8 << 20 and info.config.max_age == 3600
    assert info.config.subjects == ["kinference.record.>"]
    kinds: dict[str, int] = {}
    sub = await js.subscribe("kinference.record.>", stream=recording.STREAM, ordered_consumer=True)
    for _ in range(info.state.messages):
        msg = await sub.next_msg(timeout=2)
        assert SECRET_PROMPT.encode() not in msg.data and b"jane.doe" not in msg.data
        assert b"Zyzzogeton" not in msg.data and b"Wombat" not in msg.data
        kind = json.loads(msg.data)["kind"]
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds["decision"] == 9 and kinds["observation"] == 8 and kinds["snapshot"] >= 3


async def test_replay_of_the_live_policy_reproduces_every_decision(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    code, out, err = await kinfctl("replay", str(policy_file(env.tmp, "same.yaml", POLICY)), "--pool",
                                   "default/inference-all", "--nats-url", env.nats.url, "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["reproduced"] == {"count": 9, "of": 9, "not_reproduced": []}
    assert rep["changed"] == 0 and rep["pii_leaving"]["count"] == 0
    assert rep["to_provider"] == {"before": 3, "after": 3} and rep["refused"] == {"before": 1, "after": 1}
    code, out, _ = await kinfctl("replay", str(env.tmp / "same.yaml"), "--pool", "default/inference-all",
                                 "--nats-url", env.nats.url)
    assert code == 0 and "9 of 9 decisions reproduced" in out


async def test_a_changed_burst_threshold_predicts_the_changed_decisions(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    higher = policy_file(env.tmp, "higher.yaml", POLICY.replace("greaterThan: 4", "greaterThan: 20"))
    code, out, err = await kinfctl("replay", str(higher), "--pool", "default/inference-all",
                                   "--nats-url", env.nats.url, "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    # the saturated phase stays local: 3 bursts come back, the refused PII request is served locally
    assert rep["changes"]["moves"] == {"Provider->Local": 3, "Refused->Local": 1}
    assert rep["burst_share"] == {"before": round(3 / 8, 4), "after": 0.0}
    assert rep["refused"] == {"before": 1, "after": 0} and rep["pii_leaving"]["count"] == 0
    assert rep["provider_tokens"]["before"] > 0 and rep["provider_tokens"]["after"] == 0
    lower = policy_file(env.tmp, "lower.yaml", POLICY.replace("greaterThan: 4", "greaterThan: 2"))
    code, out, err = await kinfctl("replay", str(lower), "--pool", "default/inference-all",
                                   "--nats-url", env.nats.url, "-o", "json")
    rep = json.loads(out)
    # the two requests that found qwen-0 at 3 queued would burst; pii was not asked for them live
    assert rep["changes"]["moves"] == {"Local->Provider": 2}
    assert rep["tags_unknown"] == {"pii": 2} and rep["pii_unknown_to_provider"] == 2


async def test_pii_that_would_leave_is_shouted_with_exit_1(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    leaky = POLICY.split("          - name: ensure-pii-never-leaves-cluster")[0] + \
        "        select:" + POLICY.split("        select:")[1]
    path = policy_file(env.tmp, "leaky.yaml", leaky)
    code, out, err = await kinfctl("replay", str(path), "--pool", "default/inference-all", "--nats-url", env.nats.url)
    assert code == 1
    assert "PII-tagged requests that would leave the cluster: 1" in out
    assert "PII WOULD LEAVE THE CLUSTER: 1" in err


async def test_offline_from_an_export_and_audit_since(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    export = env.tmp / "records.jsonl"
    code, _, err = await kinfctl("replay", "--export", str(export), "--pool", "default/inference-all",
                                 "--nats-url", env.nats.url, "--since", "10m")
    assert code == 0 and "records of default/inference-all written" in err
    assert SECRET_PROMPT not in export.read_text()
    code, out, err = await kinfctl("replay", str(policy_file(env.tmp, "same.yaml", POLICY)), "--pool",
                                   "default/inference-all", "--file", str(export), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["reproduced"]["count"] == 9
    for pool in ([], ["--pool", "default/inference-all"]):
        code, out, err = await kinfctl("audit", "--since", "1h", *pool, "--nats-url", env.nats.url, "-o", "json")
        assert code == 0, err
        total = json.loads(out)["total"]
        assert total["requests"] == 9 and total["pii"] == 1 and total["refused"] == 1 and total["provider"] == 0
    code, out, _ = await kinfctl("audit", str(export), "-o", "json")
    assert code == 0 and json.loads(out)["total"]["pii"] == 1


async def test_bad_input_is_one_clear_line(tmp_path: Path, nats_server: NatsServer) -> None:
    good = policy_file(tmp_path, "p.yaml", POLICY)
    broken = policy_file(tmp_path, "broken.yaml", "kind: InferencePolicy\napiVersion: kinference.buoyant.io/v1alpha1\n"
                                                  "metadata: {name: x, namespace: default}\nspec: {rules: 3}\n")
    empty = policy_file(tmp_path, "empty.jsonl", "")
    cases = [
        (["replay", str(broken), "--pool", "default/inference-all", "--file", str(empty)], "broken.yaml"),
        (["replay", str(tmp_path / "nope.yaml"), "--pool", "default/inference-all", "--file", str(empty)],
         "no such file"),
        (["replay", str(good), "--pool", "default/inference-all", "--file", str(empty)],
         "no recorded decisions of pool default/inference-all"),
        (["replay", str(good), "--pool", "inference-all", "--file", str(empty)], "--pool must be NAMESPACE/NAME"),
        (["replay", str(good), "--pool", "default/inference-all", "--nats-url", nats_server.url],
         "no decision records"),
        (["replay", str(good), "--pool", "default/x", "--file", str(good)], "not a decision record"),
        (["audit", "--since", "soon", "--nats-url", nats_server.url], "--since"),
        (["replay", str(EXAMPLES / "20-pool.yaml"), "--pool", "default/inference-all", "--file", str(empty)],
         "holds pool default/inference-all but not all it names"),
    ]
    for argv, words in cases:
        code, out, err = await kinfctl(*argv)
        assert code == 1, (argv, out, err)
        assert words in err and "Traceback" not in err and err.count("\n") == 1, (argv, err)


async def test_an_unknown_pool_names_the_recorded_ones(env: Env, classifier: Any) -> None:  # noqa: F811
    await traffic(env)
    export = env.tmp / "records.jsonl"
    await kinfctl("replay", "--export", str(export), "--pool", "default/inference-all", "--nats-url", env.nats.url)
    code, _, err = await kinfctl("replay", str(policy_file(env.tmp, "p.yaml", POLICY)), "--pool", "default/other",
                                 "--file", str(export))
    assert code == 1 and "recorded pools: default/inference-all" in err, err


def test_records_stay_small() -> None:
    """A record holds no more than what the decision needs (a few hundred bytes here)."""
    rec = recording.DecisionRecord(
        decision_id="0" * 32, at=time.time(), router="r", snapshot=1, namespace="default", pool="p",
        request=recording.RecordedRequest(model="m", prompt_tokens=100, headers={"authorization": "Bearer sk",
                                                                                "x-api-key": "k", "x-team": "a"}),
        outcome=recording.OutcomeTrace(type="Routed", backend="Local/w"))
    assert recording.recordable_headers(rec.request.headers) == {"x-team": "a"}


async def test_the_endpoint_pickers_decisions_are_recorded_too(env: Env, classifier: Any) -> None:  # noqa: F811
    from kinference_router.epp import EppServer, EppSettings
    from tests.epp.client import EppClient
    from tests.epp.test_epp import CHAT, chat_body

    server = EppServer(env.router, EppSettings())
    await server.start("127.0.0.1", 0)
    client = EppClient(server.port)
    try:
        rq = await client.exchange(CHAT, {}, chat_body(SECRET_PROMPT))
        decision_id = rq.set_headers["x-kinference-decision-id"]
    finally:
        await client.close()
        await server.close()
    await asyncio.sleep(0.2)
    export = env.tmp / "records.jsonl"
    await kinfctl("replay", "--export", str(export), "--pool", "default/inference-all", "--nats-url", env.nats.url)
    text = export.read_text()
    assert decision_id in text and SECRET_PROMPT not in text
    code, out, _ = await kinfctl("replay", str(policy_file(env.tmp, "p.yaml", POLICY)), "--pool",
                                 "default/inference-all", "--file", str(export))
    assert code == 0 and "1 of 1 decisions reproduced" in out, out
