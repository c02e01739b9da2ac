"""``kinfctl explain``: flags, telemetry file, trace JSON, text, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kinfctl.main import main

from .seed_manifests import ALICE, BURST, WORKLOADS

STATE = """
endpoints:
  - {namespace: default, workerSet: qwen-2-5-32b, pod: qwen-0, ready: true,
     queuedPrompts: 3, runningPrompts: 40, kvCacheUsage: 0.6,
     prefillTokensPerSecond: 12000, ageSeconds: 0.1}
  - {namespace: default, workerSet: qwen-2-5-32b, pod: qwen-1, ready: true,
     queuedPrompts: 9, runningPrompts: 40, kvCacheUsage: 0.6}
  - {namespace: default, workerSet: gemma-4-12b, pod: gemma-0, ready: true, queuedPrompts: 0}
providers:
  - {namespace: default, name: databricks, estimatedTTFT: 900ms, errorRate: 0}
"""

BODY = {"model": "qwen-2.5", "messages": [{"role": "user", "content": "Summarise the attached report."}],
        "max_tokens": 200}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "burst": tmp_path / "burst.yaml",
        "alice": tmp_path / "alice.yaml",
        "state": tmp_path / "state.yaml",
        "body": tmp_path / "body.json",
    }
    out["burst"].write_text(WORKLOADS + "\n---\n" + BURST)
    out["alice"].write_text(WORKLOADS + "\n---\n" + ALICE)
    out["state"].write_text(STATE)
    out["body"].write_text(json.dumps(BODY))
    return out


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["explain", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def base(files, manifests: str = "burst", pool: str = "default/inference-all") -> list[str]:
    return ["-f", str(files[manifests]), "--pool", pool, "--telemetry", str(files["state"]),
            "--request", str(files["body"])]


def test_json_trace_and_failed_classifier_sets_its_failure_tag(files, capsys) -> None:
    code, out, _ = run(capsys, *base(files), "-o", "json")
    assert code == 0
    t = json.loads(out)
    assert [{k: c[k] for k in ("name", "ms", "outcome", "tags")} for c in t["classifiers"]] == [
        {"name": "pii", "ms": 0.0, "outcome": "absent", "tags": ["pii-unknown"]}]  # the tag it stood for
    assert t["tags"] == ["pii-unknown"]
    rule = t["rules"][0]
    assert rule["excluded"][0]["dropped"] == ["Local/qwen-2-5-32b/qwen-1"]
    assert rule["excluded"][2]["dropped"] == ["Provider/databricks"]
    assert t["outcome"]["backend"] == "Local/qwen-2-5-32b" and t["outcome"]["endpoint"] == "qwen-0"
    assert t["outcome"]["model"] == "Qwen/Qwen2.5-32B-Instruct"


def test_tag_flag_stands_for_the_classifier(files, capsys, tmp_path) -> None:
    state = tmp_path / "busy.yaml"
    state.write_text(STATE.replace("queuedPrompts: 3", "queuedPrompts: 30"))
    argv = base(files)
    argv[argv.index(str(files["state"]))] = str(state)
    code, out, _ = run(capsys, *argv, "--tag", "pii-none", "-o", "json")
    t = json.loads(out)
    assert code == 0 and t["tags"] == ["pii-none"]
    assert t["classifiers"][0]["outcome"] == "offline"
    assert t["outcome"]["backend"] == "Provider/databricks" and t["outcome"]["model"] == "databricks-qwen25-32b"
    code, out, _ = run(capsys, *argv, "--tag", "pii-confirmed", "-o", "json")
    t = json.loads(out)
    assert code == 0 and t["outcome"]["type"] == "Rejected" and t["outcome"]["code"] == "no_capacity"


def test_text_puts_the_answer_first(files, capsys) -> None:
    code, out, _ = run(capsys, *base(files, "alice", "default/inference-local"), "--tenant", "alice")
    assert code == 0
    first = out.splitlines()[0]
    assert first.startswith("Routed to Local/gemma-4-12b (pod gemma-0), model 'google/gemma-4-12b-it'")
    assert "rule alice-qwen-to-gemma: Routed" in out
    assert "PREDICTED" in out


def test_headers_and_tenant(files, capsys, tmp_path) -> None:
    code, out, _ = run(capsys, *base(files, "alice", "default/inference-local"), "--tenant", "bob",
                       "--header", "X-Team=a", "-o", "json")
    t = json.loads(out)
    assert code == 0 and t["tenant"] == "bob" and t["outcome"]["rule"] == "unmatched"
    assert t["outcome"]["backend"] == "Local/qwen-2-5-32b"


def test_rejections_exit_zero(files, capsys, tmp_path) -> None:
    body = tmp_path / "llama.json"
    body.write_text(json.dumps({"model": "llama-3", "prompt": "hi"}))
    argv = base(files)
    argv[argv.index(str(files["body"]))] = str(body)
    code, out, _ = run(capsys, *argv)
    assert code == 0 and out.startswith("Rejected: model_not_found (HTTP 404)")
    # a prompt no window holds: the client's 400, as the router answers it (the trial: "HTTP )")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"model": "qwen-2.5", "max_tokens": 1000,
                               "messages": [{"role": "user", "content": "word " * 45000}]}))
    argv[argv.index(str(body))] = str(big)
    code, out, _ = run(capsys, *argv)
    assert code == 0 and out.startswith("Rejected: context_length_exceeded (HTTP 400)"), out


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f, d: ["--pool", "default/nope"], "pool default/nope is not in the manifests"),
        (lambda f, d: ["--telemetry", str(d / "missing.yaml")], "cannot read"),
        (lambda f, d: ["--telemetry", str(_write(d / "bad.yaml", "endpoints: [{pod: x}]"))], "workerSet"),
        (lambda f, d: ["--telemetry", str(_write(d / "bad2.yaml", "endpoints: [{workerSet: w, pod: x, "
                                                  "queuedPrompts: many}]"))], "queuedPrompts"),
        (lambda f, d: ["--telemetry", str(_write(d / "bad3.yaml", "providers: [{name: p, estimatedTTFT: soon}]"))],
         "estimatedTTFT"),
        # the policy author's trial: msgspec's raw words, `$.endpoints[0]` and no field meant
        (lambda f, d: ["--telemetry", str(_write(d / "bad4.yaml", "endpoints: [{workerSet: w, pod: x, "
                                                  "queuedPrompt: 3}]"))],
         "endpoints[0].queuedPrompt is not a field (did you mean `queuedPrompts`?)"),
        (lambda f, d: ["--telemetry", str(_write(d / "bad5.yaml", "providers: [{name: p, errorRate: high}]"))],
         "providers[0].errorRate: expected float | null, got str"),
        # the data port's words for the same bodies (kinference_common.request_body)
        (lambda f, d: ["--request", str(_write(d / "b.json", "[1]"))], "must be a JSON object"),
        (lambda f, d: ["--request", str(_write(d / "b2.json", "{\"messages\": []}"))], "lacks `model`"),
        (lambda f, d: ["--request", str(_write(d / "b4.json", "{\"model\": \"m\", \"messages\": \"hi\"}"))],
         "`messages` must be a list"),
        (lambda f, d: ["--request", str(_write(d / "b5.json", "{\"model\": \"m\", \"prompt\": \"x\", "
                                                       "\"max_tokens\": -5}"))], "`max_tokens` must be an integer"),
        (lambda f, d: ["--request", str(_write(d / "b3.json", "{nope"))], "not JSON"),
        (lambda f, d: ["--header", "novalue"], "expected NAME=VALUE"),
        # the trial: pii-maybe was taken, and stood for an answer of the classifier
        (lambda f, d: ["--tag", "pii-maybe"], "--tag pii-maybe: not a tag a classifier emits (the pii classifier"),
        (lambda f, d: ["--tag", "pii_confirmed"], "--tag pii_confirmed: not a tag a classifier emits (tags are"),
        (lambda f, d: ["--tag", "pii-none", "--tag", "pii-confirmed"], "pii already gave pii-none"),
        (lambda f, d: ["-f", str(_write(d / "broken.yaml", "kind: InferencePolicy\napiVersion: "
                                        "kinference.buoyant.io/v1alpha1\nmetadata: {name: x}\nspec: {rules: 3}"))],
         "broken.yaml"),
    ],
)
def test_invalid_input_is_one_line_and_exit_1(files, capsys, tmp_path, mutate, message) -> None:
    argv = base(files)
    extra = mutate(files, tmp_path)
    flag = extra[0]
    if flag in argv and flag != "--header":
        argv[argv.index(flag) + 1] = extra[1]
    else:
        argv += extra
    code, out, err = run(capsys, *argv)
    assert code == 1, out
    assert err.count("\n") == 1 and err.startswith("kinfctl: ") and message in err
    assert "Traceback" not in err


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_telemetry_of_a_worker_set_the_pool_lacks_is_said(files, capsys, tmp_path) -> None:
    """The trial: a misspelt workerSet was left out silently, and the request
    went to the provider as if the pod did not exist."""
    state = tmp_path / "typo.yaml"
    state.write_text(files["state"].read_text().replace("workerSet: qwen-2-5-32b", "workerSet: qwen-2-5-23b", 1))
    argv = base(files)
    argv[argv.index(str(files["state"]))] = str(state)
    code, _, err = run(capsys, *argv)
    assert code == 0
    assert "endpoints[0] names worker set default/qwen-2-5-23b, which pool default/inference-all does not have" \
        in err, err
    _, _, err = run(capsys, *base(files))
    assert "note:" not in err, err
