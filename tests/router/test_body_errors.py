"""The 400 for an empty body says the body is empty (the trial got "body is
not JSON: Input data was truncated" from `curl -d ''`)."""

from __future__ import annotations

import pytest

from kinference_common.request_body import BadRequest, decode, parse


@pytest.mark.parametrize("data", [b"", b"  \n\t"])
def test_an_empty_body_is_named_empty(data: bytes) -> None:
    for call in (lambda: parse(data, chat=True), lambda: decode(data)):
        with pytest.raises(BadRequest) as err:
            call()
        assert str(err.value).startswith("body is empty"), err.value
        assert "truncated" not in str(err.value)


def test_a_truncated_body_is_still_not_json() -> None:
    with pytest.raises(BadRequest) as err:
        parse(b'{"model": "m", "messages": [', chat=True)
    assert str(err.value).startswith("body is not JSON: "), err.value
    assert "cut short" in str(err.value), err.value


def test_a_deep_cut_body_is_a_400_never_an_exception() -> None:
    """The review: a second parse of a cut body with Python's reader raised
    RecursionError for nesting just under msgspec's limit (a 500). Where that
    window falls depends on the caller's stack depth: every depth near the
    limit, called from stacks of several depths."""
    def nested(frames: int, data: bytes) -> None:
        if frames:
            return nested(frames - 1, data)
        parse(data, chat=True)

    for frames in range(0, 60, 2):
        for depth in range(900, 1100):
            with pytest.raises(BadRequest):
                nested(frames, b"[" * depth)


def test_a_lone_surrogate_escape_is_named_not_called_truncated() -> None:
    """The trial: ``"content": "héllo \\ud83d"`` got "Input data was truncated"
    (msgspec's words), though the body was whole."""
    body = '{"model": "m", "messages": [{"role": "user", "content": "h\u00e9llo \\ud83d"}]}'.encode()
    for call in (lambda: parse(body, chat=True), lambda: decode(body)):
        with pytest.raises(BadRequest) as err:
            call()
        assert "truncated" not in str(err.value) and "surrogate" in str(err.value), err.value


@pytest.mark.parametrize(("body", "message"), [
    (b'{"model": "m", "messages": "hi"}', "`messages` must be a list, not a string"),
    (b'{"model": 3, "messages": []}', "`model` must be a string, not a whole number"),
    (b'{"model": "m", "messages": [], "stream": "yes"}', "`stream` must be true or false, not a string"),
    (b'{"model": "m", "prompt": {"a": 1}}', "`prompt` must be a string or a list, not an object"),
    (b'{"model": "m", "messages": [], "max_tokens": 1.5}', "`max_tokens` must be a whole number, not a number"),
    (b'{"model": "m", "messages": ["x"]}', "`messages[0]` must be an object, not a string"),
])
def test_a_field_of_the_wrong_type_is_named_in_words(body: bytes, message: str) -> None:
    """The trial got msgspec's ``Expected `array | null`, got `str` - at
    `messages` `` for ``"messages": "hi"``."""
    with pytest.raises(BadRequest) as err:
        parse(body, chat=True)
    assert str(err.value) == message
