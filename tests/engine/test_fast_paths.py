"""The hot path's shortcuts give exactly what the plain computation gives:
the token features' skipped folds, the memoised prompt estimate, the chat
body's texts, and PredictedTTFT ranking over a subset of the candidates."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kinference_common.engine import InFlightLedger, PrefixIndex
from kinference_common.engine.decide import _rank_predicted_ttft
from kinference_common.engine.signals import DecisionContext
from kinference_common.engine.tokens import (
    _CLASSES,
    _DIGITS_ONLY,
    _SPACES_ONLY,
    _WORDS_ONLY,
    COEFFICIENTS,
    LONG_RUN,
    SEQUENCE_LINE,
    MEMO_MAX_CHARS,
    MEMO_TEXTS,
    _memo,
    block_hashes,
    estimate_prompt_tokens,
    estimate_tokens,
    features,
)
from kinference_common.engine.ttft import TTFTModel
from kinference_common.prompt_texts import texts_from_body
from kinference_common.request_body import BadRequest, parse

from .helpers import NOW, ep, pool, snap, ws

# ------------------------------------------------------------------ tokens


def _plain_features(text: str) -> tuple[int, ...]:
    """Every fold and count, none skipped; every long run's chunk looked at."""
    raw = text.encode("utf-8", "replace")
    cls = b"_" + raw.translate(_CLASSES)
    digits_only = cls.translate(_DIGITS_ONLY)
    words = cls.translate(_WORDS_ONLY)
    chunks: dict[bytes, list[bytes]] = {b"a": [], b"A": []}
    i = 0
    while i < len(words):  # each run of one case, cut into LONG_RUN-letter chunks
        j = i
        while j < len(words) and words[j] == words[i]:
            j += 1
        case = words[i : i + 1]
        if case in chunks:
            chunks[case] += [raw[k - 1 : k - 1 + LONG_RUN] for k in range(i, j - LONG_RUN + 1, LONG_RUN)]
        i = j
    long_runs = sum(len(c) for c in chunks.values())
    repeated = sum(c == c[:1] * LONG_RUN for cs in chunks.values() for c in cs)
    sequence_lines = 0
    for line in raw.split(b"\n") if b"\n" in raw else []:  # lines starting with 32-63 letters of one case
        n = 0
        while n < len(line) and 97 <= line[n] <= 122:
            n += 1
        if not n:
            while n < len(line) and 65 <= line[n] <= 90:
                n += 1
        sequence_lines += SEQUENCE_LINE <= n < LONG_RUN
    return (
        words.count(b"_a") + words.count(b"_A"),
        digits_only.count(b"_0"),
        digits_only.count(b"0"),
        cls.count(b"."),
        cls.count(b"\n"),
        cls.translate(_SPACES_ONLY).count(b"_  "),
        cls.count(b"K"),
        cls.count(b"R"),
        cls.count(b"L"),
        cls.count(b"G") + cls.count(b"P") + cls.count(b"U") + cls.count(b"E"),
        words.count(b"aA"),
        long_runs - repeated,
        repeated,
        sequence_lines,
    )


def _plain_estimate(text: str) -> int:
    if not text:
        return 0
    est = sum(c * f for c, f in zip(COEFFICIENTS, _plain_features(text)))
    return max(1, round(est))


TEXT = (st.text(st.sampled_from(list("ab Z09 \t\n\r.,;{}é中ру😀ßΩ\x00")) | st.characters(), max_size=60)
        # runs of letters long enough to count (at most four chunks of a case: all of them
        # sampled), and lines of them
        | st.lists(st.text(st.sampled_from(list("acgtACGT")), max_size=50)
                   | st.tuples(st.sampled_from(list("xXa 1é\n")), st.integers(1, 60)).map(lambda p: p[0] * p[1]),
                   max_size=8).map(lambda parts: "".join(parts)[: 4 * LONG_RUN]))


@settings(max_examples=500, deadline=None)
@given(TEXT)
def test_features_skip_only_folds_that_count_nothing(text: str) -> None:
    assert features(text) == _plain_features(text)
    assert estimate_tokens(text) == _plain_estimate(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXT, max_size=5))
def test_the_memoised_prompt_estimate_is_the_plain_sum(texts: list[str]) -> None:
    expected = sum(_plain_estimate(t) for t in texts) + 4 * len(texts)
    assert estimate_prompt_tokens(texts) == expected
    assert estimate_prompt_tokens(texts) == expected  # again, from the memo


def test_the_memo_is_bounded_and_holds_no_prompt_text() -> None:
    secret = "my card is 4111 1111 1111 1111"
    estimate_prompt_tokens([secret])
    for i in range(MEMO_TEXTS + 50):
        estimate_prompt_tokens([f"text number {i}"])
    assert len(_memo) <= MEMO_TEXTS
    assert all(type(h) is int and type(n) is int and type(v) is int for (h, n), v in _memo.items())
    assert estimate_prompt_tokens([secret]) == _plain_estimate(secret) + 4


def test_long_texts_are_estimated_without_the_memo() -> None:
    long = "word 12  " * (MEMO_MAX_CHARS // 9 + 1)
    assert len(long) > MEMO_MAX_CHARS
    assert estimate_prompt_tokens([long, "hi"], per_message_overhead=2) == (
        _plain_estimate(long) + _plain_estimate("hi") + 4)


# -------------------------------------------------------------------- body

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=5)})
_CONTENT = st.one_of(st.text(max_size=8), st.none(), st.integers(0, 3),
                     st.lists(st.text(max_size=5) | _PART, max_size=3))
_ARGUMENTS = st.fixed_dictionaries({"arguments": st.text(max_size=5)})
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "x"]), "content": _CONTENT}),
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant"]), "content": _CONTENT},
        optional={"name": st.text(max_size=5) | st.integers(),
                  "tool_calls": st.lists(st.fixed_dictionaries({"function": _ARGUMENTS}), max_size=2),
                  "function_call": _ARGUMENTS,
                  "extra": _JSON}),
    st.fixed_dictionaries({"content": _CONTENT}),
    st.fixed_dictionaries({"content": _CONTENT, "other": _JSON}),
)
_BODY = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(_MESSAGE, min_size=1, max_size=4)},
    optional={"prompt": st.text(max_size=5) | st.none(), "suffix": st.text(max_size=5) | st.integers(),
              "temperature": _JSON, "stream": _JSON, "tools": _JSON, "user": _JSON, "x": _JSON},
)


@settings(max_examples=500, deadline=None)
@given(_BODY)
def test_chat_body_texts_are_those_classifiers_read(body: dict) -> None:
    try:
        parsed = parse(msgspec.json.encode(body), chat=True)
    except BadRequest:
        return
    assert parsed.texts == texts_from_body(body).texts


# --------------------------------------------------------------- ranking


def test_fast_ranking_of_a_subset_agrees_with_the_exact_model() -> None:
    """Ranking the candidates a filter kept (ascending index, with gaps)."""
    rng = random.Random(5)
    eps = [ep("qwen", f"q{i:02}", queued=rng.randint(0, 9), running=rng.randint(0, 99), kv=rng.random(),
              kv_capacity_tokens=rng.choice([None, 20_000]), theta=rng.choice([None, 9000.0]))
           for i in range(30)]
    s = snap(pool([ws("qwen", "qwen-2.5")]), eps, ttft_model=TTFTModel(calibration=1.1))
    ledger = InFlightLedger()
    for c in rng.sample(s.candidates, 12):
        ledger.sent(c.ledger_key, rng.randint(1, 3000), NOW + rng.choice([-1, 1]))
    index = PrefixIndex()
    hashes = block_hashes("prefix " * 400)
    for c in rng.sample(s.candidates, 10):
        index.record(c.ledger_key, hashes[: rng.randint(1, len(hashes))])
    for step in (2, 3, 7):
        kept = s.candidates[1::step]
        for hs in ((), hashes):
            def context(hs=hs) -> DecisionContext:
                return DecisionContext(ledger.loads, 2000, hs, index, s.ttft_model)

            tied, best = _rank_predicted_ttft(s, kept, context())
            exact = {c.index: context().predicted_ttft(c) for c in kept}
            assert best == pytest.approx(min(exact.values()))
            assert {c.index for c in tied} == {i for i, v in exact.items() if v == pytest.approx(best)}
