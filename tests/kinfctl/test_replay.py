"""Decision records and ``kinfctl replay`` / ``kinfctl audit --since``: a
router recording to a real nats-server (real classifier service, stand-in
pods and provider, both front doors), the records read back by kinfctl as an
operator runs it. The traffic is sent once for the module (:func:`recorded`);
each test reads it from NATS or from its export."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest
from aiohttp.test_utils import TestServer

from kinference_classifier.service import ClassifierService
from kinference_common import natsserver, recording
from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.compiler import compile_documents
from kinference_common.natsserver import NatsServer
from kinference_policy_compiler.publisher import ConfigPublisher
from kinference_router.app import Router, RouterSettings
from kinference_router.epp import EppServer, EppSettings
from kinference_router.recording import RecordSettings
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretFiles
from kinfctl import records as rec_io
from kinfctl.main import main
from tests.epp.client import EppClient
from tests.epp.test_epp import CHAT, chat_body
from tests.router.conftest import Served
from tests.router.manifests import EXAMPLES, example_documents
from tests.router.test_router import Env, Upstream

#: a prompt no record may contain, in any byte
SECRET_PROMPT = "Zyzzogeton quarterly figures for the Wombat-7 merger"
PII_PROMPT = "Please email the contract to jane.doe@example.com and call me back."
POLICY = (EXAMPLES / "10-burst-policy.yaml").read_text()
POOL = "default/inference-all"


@dataclass
class Recorded:
    nats: NatsServer
    #: the records of the pool, written by ``kinfctl replay --export``
    export: Path
    tmp: Path
    #: the decision the Endpoint Picker took
    epp_decision: str


async def _traffic(server: NatsServer, tmp: Path) -> str:
    """Idle pods (local; one request through the Endpoint Picker), one pod
    under the threshold (local), all saturated (clean bursts, PII refused)."""
    pods = {p: Upstream(p) for p in ("qwen-0", "qwen-1", "qwen-spot-0")}
    provider = Upstream("databricks", api_key="sk-test")
    for up in (*pods.values(), provider):
        up.server = TestServer(up.app())
        await up.server.start_server()
    nc = await nats.connect(server.url)
    classifier = ClassifierService(nats_url=server.url, health_host="127.0.0.1", health_port=0)
    await classifier.start()
    res = compile_documents(example_documents(provider.address))
    assert not res.errors
    publisher = ConfigPublisher(nc)
    await publisher.start()
    await publisher.publish(res.pools)
    secret = tmp / "secrets" / "default" / "databricks-token"
    secret.mkdir(parents=True)
    (secret / "token").write_text("sk-test\n")
    settings = RouterSettings(record=RecordSettings(max_bytes=8 << 20, max_age_seconds=3600, keyframe_seconds=0.3))
    router = Router(settings, Authenticator("none"), SecretFiles(tmp / "secrets"), nc=nc)
    await router.start()
    client = await Served(router.data_server()).start()
    epp = EppServer(router, EppSettings())
    await epp.start("127.0.0.1", 0)
    env = Env(server, nc, pods, provider, router, client, tmp)
    try:
        for pod in pods:
            await env.telemetry(pod)
        await env.settle()
        for i in range(3):
            r = await env.chat(f"{SECRET_PROMPT} #{i}")
            assert r.status == 200 and r.headers["x-kinference-backend"].startswith("Local/")
        epp_client = EppClient(epp.port)
        try:
            rq = await epp_client.exchange(CHAT, {}, chat_body(f"{SECRET_PROMPT} via the gateway"))
            epp_decision = rq.set_headers["x-kinference-decision-id"]
        finally:
            await epp_client.close()
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
    finally:
        await epp.close()
        await client.close()
        await router.stop()
        await classifier.stop()
        for up in (*pods.values(), provider):
            await up.server.close()  # type: ignore[union-attr]
        await nc.close()
    return epp_decision


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    """The module's traffic, recorded on a nats-server that stays up for the module."""
    tmp = tmp_path_factory.mktemp("replay")
    with natsserver.start() as server, pytest.MonkeyPatch.context() as mp:
        # a late classifier answer on a busy machine would turn a clean prompt into pii-unknown
        for name, info in list(BUILTIN_CLASSIFIERS.items()):
            mp.setitem(BUILTIN_CLASSIFIERS, name, msgspec.structs.replace(info, deadline_seconds=2.0))
        epp_decision = asyncio.run(_traffic(server, tmp))
        export = tmp / "records.jsonl"
        code, _, err = asyncio.run(kinfctl("replay", "--export", str(export), "--pool", POOL,
                                           "--nats-url", server.url, "--since", "10m"))
        assert code == 0 and f"records of {POOL} written" in err, err
        yield Recorded(server, export, tmp, epp_decision)


async def kinfctl(*argv: str) -> tuple[int, str, str]:
    """``kinfctl ARGV`` as an operator runs it: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    code = await asyncio.to_thread(call)
    return code, out.getvalue(), err.getvalue()


def policy_file(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


async def test_records_hold_no_prompt_and_the_stream_has_the_limits(recorded: Recorded) -> None:
    nc = await nats.connect(recorded.nats.url)
    try:
        js = nc.jetstream()
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
    finally:
        await nc.close()
    assert kinds["decision"] == 10 and kinds["observation"] == 9 and kinds["snapshot"] >= 3
    text = recorded.export.read_text()
    assert "Zyzzogeton" not in text and "jane.doe" not in text
    assert recorded.epp_decision in text  # the Endpoint Picker's decision, recorded as the router's are


async def test_replay_of_the_live_policy_reproduces_every_decision(recorded: Recorded) -> None:
    same = policy_file(recorded.tmp, "same.yaml", POLICY)
    code, out, err = await kinfctl("replay", str(same), "--pool", POOL, "--nats-url", recorded.nats.url, "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["reproduced"] == {"count": 10, "of": 10, "not_reproduced": []}
    assert rep["changed"] == 0 and rep["pii_leaving"]["count"] == 0
    assert rep["to_provider"] == {"before": 3, "after": 3} and rep["refused"] == {"before": 1, "after": 1}
    code, out, _ = await kinfctl("replay", str(same), "--pool", POOL, "--file", str(recorded.export))
    assert code == 0 and "10 of 10 decisions reproduced" in out, out


@pytest.mark.parametrize("amended", sorted(recording.SECOND_RECORDS))
async def test_a_decisions_second_record_is_not_replayed_as_a_decision(recorded: Recorded, amended: str) -> None:
    """A send that failed after it left (``upstream_error``) or a pick not
    carried out (``not_sent``) records the decision again with what the client
    saw: replay reads the decision once, and audit keeps the last record."""
    records = rec_io.read_file(recorded.export)
    first = next(r for r in records if isinstance(r, recording.DecisionRecord) and r.outcome.backend)
    second = msgspec.structs.replace(first, amended=amended, outcome=msgspec.structs.replace(
        first.outcome, code="no_capacity", reason="the pick could not be carried out"))
    doubled = recorded.tmp / f"doubled-{amended}.jsonl"
    doubled.write_bytes(recorded.export.read_bytes() + msgspec.json.encode(second) + b"\n")
    same = str(policy_file(recorded.tmp, "same.yaml", POLICY))
    code, out, err = await kinfctl("replay", same, "--pool", POOL, "--file", str(doubled), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["reproduced"] == {"count": 10, "of": 10, "not_reproduced": []}


async def test_the_observed_ttft_is_of_streamed_answers_only(recorded: Recorded) -> None:
    """The trial: every answer here is whole, and its first byte (after the
    last token) was shown as the observed TTFT, next to predictions 60x smaller."""
    same = str(policy_file(recorded.tmp, "same.yaml", POLICY))
    code, out, err = await kinfctl("replay", same, "--pool", POOL, "--file", str(recorded.export), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["predicted_ttft_ms"]["observed"] is None
    # one of them streamed, with its first token after 250 ms: the observed mean is that one
    records = rec_io.read_file(recorded.export)
    obs = [r for r in records if isinstance(r, recording.ObservationRecord) and r.ttft_seconds is not None]
    assert len(obs) >= 2 and not any(o.streamed for o in obs)
    i = records.index(obs[0])
    records[i] = msgspec.structs.replace(obs[0], streamed=True, ttft_seconds=0.25)
    edited = recorded.tmp / "one-streamed.jsonl"
    rec_io.write_file(edited, records)
    code, out, err = await kinfctl("replay", same, "--pool", POOL, "--file", str(edited), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["predicted_ttft_ms"]["observed"] == 250.0
    code, out, _ = await kinfctl("replay", same, "--pool", POOL, "--file", str(edited))
    assert "observed (streamed answers) 250ms" in out, out


async def test_a_changed_burst_threshold_predicts_the_changed_decisions(recorded: Recorded) -> None:
    higher = policy_file(recorded.tmp, "higher.yaml", POLICY.replace("greaterThan: 4", "greaterThan: 20"))
    code, out, err = await kinfctl("replay", str(higher), "--pool", POOL, "--file", str(recorded.export), "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    # the saturated phase stays local: 3 bursts come back, the refused PII request is served locally
    assert rep["changes"]["moves"] == {"Provider->Local": 3, "Refused->Local": 1}
    assert rep["burst_share"] == {"before": round(3 / 9, 4), "after": 0.0}
    assert rep["refused"] == {"before": 1, "after": 0} and rep["pii_leaving"]["count"] == 0
    assert rep["provider_tokens"]["before"] > 0 and rep["provider_tokens"]["after"] == 0
    lower = policy_file(recorded.tmp, "lower.yaml", POLICY.replace("greaterThan: 4", "greaterThan: 2"))
    code, out, err = await kinfctl("replay", str(lower), "--pool", POOL, "--file", str(recorded.export), "-o", "json")
    rep = json.loads(out)
    # the two requests that found qwen-0 at 3 queued would burst; pii was not asked for them live
    assert rep["changes"]["moves"] == {"Local->Provider": 2}
    assert rep["tags_unknown"] == {"pii": 2} and rep["pii_unknown_to_provider"] == 2


RULE = "local-first-then-provider-unless-pii"


def rule_table(out: str) -> dict[str, dict[str, str]]:
    """The text output's per-rule table: rule -> column -> cell."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("RULE "))
    columns = lines[head].split()
    rows = {}
    for line in lines[head + 1:]:
        if not line or line.startswith(" ") or line.startswith("changed decisions"):
            break
        cells = line.split()
        rows[cells[0]] = dict(zip(columns, cells, strict=True))
    return rows


def change_lines(out: str) -> list[str]:
    """The text output's changed decisions, from the backend on."""
    lines = out.split("changed decisions", 1)[1].splitlines()[1:]
    return [line.split(" tags=", 1)[1].split(" ", 1)[1] for line in lines if line.startswith("  ")]


def assert_each_line_shows_what_changed(lines: list[str]) -> None:
    for line in lines:
        place, rule = line.rsplit(" (rule ", 1)
        for side in (place, rule.rstrip(")").replace("rule ", "")):
            if " -> " in side:
                before, after = side.split(" -> ")
                assert before != after, line
        assert " -> " in place or " -> " in rule, f"neither the place nor the rule changed: {line}"


async def test_a_rule_the_candidate_drops_counts_its_decisions_as_changed(recorded: Recorded) -> None:
    """The trial: a rule gone from the candidate showed CHANGED 0 although its
    decisions moved (all counted under the candidate's rule), and a change of
    rule was listed as ``A -> A (rule NEW)``, the old rule not printed."""
    renamed = POLICY.replace(RULE, "local-first-v2").replace("greaterThan: 4", "greaterThan: 20")
    path = str(policy_file(recorded.tmp, "renamed.yaml", renamed))
    code, out, err = await kinfctl("replay", path, "--pool", POOL, "--file", str(recorded.export), "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    # every decision changes rule; the saturated phase also comes back local (3 bursts, the refused PII request)
    assert rep["changed"] == 10 and rep["changes"]["rule"] == 6 and rep["changes"]["backend_type"] == 4
    rules = {x["rule"]: x for x in rep["rules"]}
    assert rules.keys() == {RULE, "local-first-v2"}
    old, new = rules[RULE], rules["local-first-v2"]
    assert (old["before"], old["after"], old["changed"]) == (10, 0, {"before": 10, "after": 0})
    assert old["to_provider"] == {"before": 3, "after": 0} and old["refused"] == {"before": 1, "after": 0}
    assert (new["before"], new["after"], new["changed"]) == (0, 10, {"before": 0, "after": 10})
    # each side of the table adds up to the summary
    for side in ("before", "after"):
        assert sum(x["changed"][side] for x in rep["rules"]) == rep["changed"]
        assert sum(x["to_provider"][side] for x in rep["rules"]) == rep["to_provider"][side]
        assert sum(x["refused"][side] for x in rep["rules"]) == rep["refused"][side]
    assert len(rep["changed_decisions"]) == 10
    for c in rep["changed_decisions"]:
        assert (c["rule_before"], c["rule_after"]) == (RULE, "local-first-v2")
        assert (c["before"] == c["after"]) == (c["change"] == "rule"), c

    code, out, err = await kinfctl("replay", path, "--pool", POOL, "--file", str(recorded.export))
    assert code == 0, err
    assert "CHANGED: those the candidate decides otherwise (a decision that changes rule counts in both" in out
    table = rule_table(out)
    assert table[RULE]["BEFORE"] == "10" and table[RULE]["AFTER"] == "0" and table[RULE]["CHANGED"] == "10->0"
    assert table[RULE]["TO-PROVIDER"] == "3->0" and table[RULE]["REFUSED"] == "1->0"
    assert table["local-first-v2"]["CHANGED"] == "0->10"
    lines = change_lines(out)
    assert len(lines) == 10
    assert_each_line_shows_what_changed(lines)
    moved = f"(rule {RULE} -> rule local-first-v2)"
    assert all(line.endswith(moved) for line in lines), lines
    assert sum(line.startswith("Provider/databricks -> Local/qwen-2-5-32b ") for line in lines) == 3, lines
    assert sum(line.startswith("refused no_capacity -> Local/qwen-2-5-32b ") for line in lines) == 1, lines
    same_place = [line for line in lines if line.startswith("Local/") and " -> Local/" not in line]
    assert len(same_place) == 6, lines  # printed once: "Local/qwen-2-5-32b qwen-N (rule A -> rule B)"


async def test_a_change_under_the_same_rule_shows_both_places_and_the_rule_once(recorded: Recorded) -> None:
    lower = str(policy_file(recorded.tmp, "lower.yaml", POLICY.replace("greaterThan: 4", "greaterThan: 2")))
    code, out, err = await kinfctl("replay", lower, "--pool", POOL, "--file", str(recorded.export), "-o", "json")
    assert code == 0, err
    rep = json.loads(out)
    assert [x["changed"] for x in rep["rules"]] == [{"before": 2, "after": 2}]
    code, out, err = await kinfctl("replay", lower, "--pool", POOL, "--file", str(recorded.export))
    assert code == 0, err
    assert rule_table(out)[RULE]["CHANGED"] == "2->2"
    lines = change_lines(out)
    assert_each_line_shows_what_changed(lines)
    assert len(lines) == 2 and all(line.startswith("Local/qwen-2-5-32b qwen-0 -> Provider/databricks (rule "
                                                   f"{RULE})") for line in lines), lines


async def test_pii_that_would_leave_is_shouted_with_exit_1(recorded: Recorded) -> None:
    leaky = POLICY.split("          - name: ensure-pii-never-leaves-cluster")[0] + \
        "        select:" + POLICY.split("        select:")[1]
    path = policy_file(recorded.tmp, "leaky.yaml", leaky)
    code, out, err = await kinfctl("replay", str(path), "--pool", POOL, "--file", str(recorded.export))
    assert code == 1
    assert "PII-tagged requests that would leave the cluster: 1" in out
    assert "PII WOULD LEAVE THE CLUSTER: 1" in err


async def test_audit_since_reads_the_recorded_decisions(recorded: Recorded) -> None:
    for pool in ([], ["--pool", POOL]):
        code, out, err = await kinfctl("audit", "--since", "1h", *pool, "--nats-url", recorded.nats.url, "-o", "json")
        assert code == 0, err
        total = json.loads(out)["total"]
        assert total["requests"] == 10 and total["pii"] == 1 and total["refused"] == 1 and total["provider"] == 0
    code, out, _ = await kinfctl("audit", str(recorded.export), "-o", "json")
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
        # NAME alone is default/NAME, as in kinfctl explain
        (["replay", str(good), "--pool", "inference-all", "--file", str(empty)],
         "no recorded decisions of pool default/inference-all"),
        (["replay", str(good), "--pool", "a/b/c", "--file", str(empty)], "--pool must be NAMESPACE/NAME"),
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


async def test_an_unknown_pool_names_the_recorded_ones(recorded: Recorded) -> None:
    code, _, err = await kinfctl("replay", str(policy_file(recorded.tmp, "p.yaml", POLICY)), "--pool",
                                 "default/other", "--file", str(recorded.export))
    assert code == 1 and f"recorded pools: {POOL}" in err, err


async def test_an_unknown_pool_read_from_nats_names_the_recorded_ones(recorded: Recorded) -> None:
    """The trial: read from NATS, a mistyped pool said "none at all: is the
    router recording?", since only that pool's subject was read."""
    policy = str(policy_file(recorded.tmp, "p.yaml", POLICY))
    code, _, err = await kinfctl("replay", policy, "--pool", "default/other", "--nats-url", recorded.nats.url)
    assert code == 1 and f"recorded pools: {POOL}" in err and "Traceback" not in err, err
    await asyncio.sleep(1.2)  # the module's traffic is now over a second old
    code, _, err = await kinfctl("replay", policy, "--pool", POOL, "--nats-url", recorded.nats.url, "--since", "1s")
    assert code == 1 and "widen --since" in err, err


def test_credentials_and_http_headers_are_not_recorded() -> None:
    headers = {"authorization": "Bearer sk", "x-api-key": "k", "cookie": "c", "x-session-id": "s",
               "user-agent": "OpenAI/Python", "x-stainless-lang": "python", "x-team": "a",
               "x-user-email": "jane@example.com", "x-forwarded-for": "10.0.0.1",
               "x-gateway-inference-objective": "batch"}
    assert recording.recordable_headers(headers) == {"x-team": "a", "x-gateway-inference-objective": "batch"}


async def test_records_that_cannot_be_read_exit_3_not_1_which_means_pii_left(nats_server: NatsServer,
                                                                          monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """HA trial: `kinfctl audit` right after a NATS server died printed a
    traceback (js.subscribe timed out) and exited 1, which for audit means
    "PII left the cluster". Reading failures are one line and exit 3."""
    from kinference_common import natsserver
    from kinfctl import events, records

    closed = f"nats://127.0.0.1:{natsserver.free_port()}"
    code, _, err = await kinfctl("audit", "--since", "1m", "--nats-url", closed)
    assert code == records.EXIT_UNREADABLE == 3, err
    assert "Traceback" not in err and err.count("\n") == 1

    class Stream:  # the stream is there, the consumer cannot be made: nats' TimeoutError
        async def stream_info(self, name):  # type: ignore[no-untyped-def]
            return type("I", (), {"state": type("S", (), {"messages": 5})()})()

        async def subscribe(self, *a, **kw):  # type: ignore[no-untyped-def]
            raise nats.errors.TimeoutError

    class Conn:
        def jetstream(self):  # type: ignore[no-untyped-def]
            return Stream()

        async def close(self) -> None:
            pass

    async def connect(args):  # type: ignore[no-untyped-def]
        return Conn()

    monkeypatch.setattr(events, "connect", connect)
    code, _, err = await kinfctl("audit", "--since", "1m", "--nats-url", nats_server.url)
    assert code == 3, err
    assert "cannot read the decision records" in err and "Traceback" not in err and err.count("\n") == 1
