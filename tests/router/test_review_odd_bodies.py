"""Odd request bodies (hypothesis-style): the router answers 400 or reads
them, never crashes, and every string a provider would receive was read by
the classifiers, or sits in a part they count unreadable (which makes them
answer their "unknown" tag)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kinference_common import prompt_texts
from kinference_common.prompt_texts import texts_from_body
from kinference_router import provider_request
from kinference_common.request_body import BadRequest, parse

from .prompt_read import strings_read, was_read

CARD = "4111 1111 1111 1111"

json_leaf = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.booleans(), st.none())
json_tree = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3)
                         | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=10)


def strings(v: Any) -> list[str]:
    out: list[str] = []
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for k, y in x.items():
                out.append(k)
                stack.append(y)
        elif isinstance(x, list):
            stack.extend(x)
    return out


VOCABULARY = (prompt_texts.KNOWN_KEYS | prompt_texts.KNOWN_FIELDS | prompt_texts.SETTINGS | prompt_texts.ROLES
              | {"messages", "prompt", "model", "text", "input_text", "output_text", ""})


def test_a_part_or_role_of_an_odd_json_type_is_a_body_like_another() -> None:
    """``type`` of a content part or ``role`` of a message given as an
    object or array: read (or counted unreadable), not a TypeError (a 500)."""
    for msg in ({"role": ["user"], "content": CARD},
                {"role": {"x": "user"}, "content": CARD},
                {"role": "user", "content": [{"type": ["text"], "text": CARD}]},
                {"role": "user", "content": [{"type": {"k": "text"}, "text": CARD}]}):
        raw = {"model": "m", "messages": [msg]}
        ex = texts_from_body(raw)
        assert CARD in ex.texts or ex.unreadable > 0, msg
        parsed = parse(msgspec.json.encode(raw), chat=True)
        assert parsed.raw == raw


def test_strings_where_a_message_or_prompt_was_expected_are_read() -> None:
    for raw in ({"model": "m", "messages": [CARD]},
                {"model": "m", "messages": {"role": "user", "content": CARD}},
                {"model": "m", "messages": [{"role": "user", "content": {"text": CARD}}]},
                {"model": "m", "messages": [{"role": "user", "content": [[CARD]]}]},
                {"model": "m", "prompt": [[1, 2], {"text": CARD}]},
                {"model": "m", "prompt": {"text": CARD}}):
        ex = texts_from_body(raw)
        assert CARD in strings_read(ex.texts) and ex.unreadable > 0, raw


def test_a_non_text_part_is_read_but_for_its_payload() -> None:
    raw = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://img.example/u?email=bob@example.com"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_data": "JVBERi0=", "filename": "ssn-078-05-1120.pdf"}},
        {"0": None}]}]}
    ex = texts_from_body(raw)
    assert ex.unreadable == 5
    # read with their keys: "url: https://...", "filename: ssn-078-05-1120.pdf"
    read = strings_read(ex.texts)
    assert "https://img.example/u?email=bob@example.com" in read and "ssn-078-05-1120.pdf" in read
    assert "0" in ex.texts
    assert not any(t.startswith("data:") or t in ("UklGRg==", "JVBERi0=") for t in ex.texts)


def test_tool_call_arguments_given_as_an_object_are_read() -> None:
    """OpenAI sends ``arguments`` as a JSON string; a client may send an
    object. The provider receives it: its strings are read."""
    raw = {"model": "m", "messages": [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "pay", "arguments": {"card": CARD}}}]},
        {"role": "user", "content": [{"type": "text", "text": {"nested": "bob@example.com"}}]}]}
    read = strings_read(texts_from_body(raw).texts)
    assert CARD in read and "bob@example.com" in read


part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "refusal"])
                           | json_tree.filter(lambda t: not isinstance(t, str)),
                           "text": json_tree}, optional={"refusal": json_tree, "cache_control": json_tree}),
    st.fixed_dictionaries({"text": json_tree}, optional={"x": json_tree}),
    st.text(max_size=6),
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]) | json_tree,
     "content": st.text(max_size=6) | st.lists(part, max_size=3) | json_tree},
    optional={"name": json_tree, "extra": json_tree,
              "tool_calls": st.lists(st.fixed_dictionaries(
                  {"id": json_tree, "type": st.just("function"),
                   "function": st.fixed_dictionaries({"name": json_tree, "arguments": json_tree})}), max_size=2),
              "function_call": st.fixed_dictionaries({"name": json_tree, "arguments": json_tree})})
body = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.lists(message, min_size=1, max_size=3)},
    optional={"tools": json_tree, "n": json_tree, "logit_bias": st.dictionaries(st.text(max_size=5), st.integers()),
              "user": json_tree, "metadata": json_tree, "stop": json_tree, "x": json_tree})


@settings(max_examples=400, deadline=None)
@given(body)
@example({"model": "m", "messages": [{"role": "user", "content": [{"type": ["a"], "text": "b"}]}]})
def test_odd_bodies_never_crash_and_what_leaves_was_read(b: dict[str, Any]) -> None:
    try:
        parse(msgspec.json.encode(b), chat=True)
    except BadRequest:
        pass
    # even what the classifiers count unreadable (they answer "unknown") has its strings read: a
    # policy excluding only pii-confirmed still keeps a card found there in the cluster. Only
    # non-text parts (images, audio, files) are not read; this strategy draws none.
    read = strings_read(texts_from_body(b).texts)
    sent = msgspec.json.decode(provider_request.body(b, "provider-model"))
    sent.pop("model")
    for s in strings(sent):
        assert was_read(s, read) or s in VOCABULARY, (s, b)
