"""An OpenAI request body, parsed once: what the router's data port, its
Endpoint Picker, ``/debug/explain`` and ``kinfctl explain`` all read, so
that each refuses the same bodies with the same words.

The raw JSON is decoded once (msgspec, into plain Python objects, so it can be
forwarded with only ``model`` changed), then the fields the router needs are
checked with the types OpenAI's API gives them (:func:`parse`, then
:func:`check_body` for the token limits). Anything else in the body is
forwarded untouched.
"""

from __future__ import annotations


import re

from typing import Any

import msgspec

from kinference_common.prompt_texts import ROLES, SETTINGS, setting_is_content, texts_from_body

#: the deepest nesting of arrays and objects a body may have (a tool's JSON
#: schema nests a few levels; a thousand is an attack on the parser)
MAX_DEPTH = 64

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


#: the largest ``max_tokens`` taken (engines count tokens in 32-bit integers)
MAX_TOKENS = 2**31 - 1


class BadRequest(ValueError):
    """The body is not what the endpoint takes; the message says why."""


class _Fields(msgspec.Struct):
    model: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | list[Any] | None = None
    stream: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


class ParsedBody:
    __slots__ = ("raw", "fields", "texts")

    def __init__(self, raw: dict[str, Any], fields: _Fields, texts: list[str]) -> None:
        self.raw = raw
        self.fields = fields
        #: every text of the prompt, as the classifiers read it
        #: (:func:`kinference_common.prompt_texts.texts_from_body`)
        self.texts = texts

    @property
    def model(self) -> str:
        return self.fields.model

    @property
    def stream(self) -> bool:
        return self.fields.stream

    @property
    def max_tokens(self) -> int | None:
        return self.fields.max_completion_tokens or self.fields.max_tokens

    def encode(self, model: str | None = None) -> bytes:
        """The body to forward, with ``model`` replaced when given."""
        if model is not None and model != self.fields.model:
            return _encoder.encode({**self.raw, "model": model})
        return _encoder.encode(self.raw)


#: a JSON escape of a UTF-16 high surrogate not followed by one of a low surrogate
_LONE_HIGH_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})")


def _not_json(data: bytes, exc: Exception) -> str:
    """The 400's message; an empty body says so (msgspec would say "Input data
    was truncated", which reads as a network fault)."""
    if not data.strip():
        return "body is empty: send a JSON object with `model` and `messages` (or `prompt`)"
    if "truncated" in str(exc):
        # msgspec says "truncated" also of a whole body holding a lone UTF-16 surrogate
        # escape: that body is whole, its text is not Unicode. Looked for in the bytes (no
        # second parse: a body near the size cap, or nested deep, costs nothing more here)
        if _LONE_HIGH_SURROGATE.search(data):
            return ("body is not JSON: a \\uD800-\\uDBFF escape (the first half of a UTF-16 surrogate pair) "
                    "is not followed by its second half")
        return "body is not JSON: it ends before its JSON value does (cut short)"
    return f"body is not JSON: {exc}"


#: msgspec's names of JSON types, as the error says them
_TYPE_WORDS = {"array": "a list", "object": "an object", "str": "a string", "int": "a whole number",
               "float": "a number", "bool": "true or false", "null": "null"}
_WRONG_TYPE = re.compile(r"Expected `([^`]+)`, got `([^`]+)` - at `\$\.([^`]+)`")


def _wrong_type(message: str) -> str:
    """msgspec's ``Expected `array | null`, got `str` - at `$.messages``` as
    ``"`messages` must be a list, not a string"``; anything else as it is."""
    m = _WRONG_TYPE.fullmatch(message)
    if m is None:
        return message.replace("$.", "")
    want = [_TYPE_WORDS.get(t.strip(), t.strip()) for t in m.group(1).split("|") if t.strip() != "null"]
    got = _TYPE_WORDS.get(m.group(2), m.group(2))
    return f"`{m.group(3)}` must be {' or '.join(want) or 'null'}, not {got}"


def _load(data: bytes) -> Any:
    """JSON text decoded, or BadRequest saying why it is not JSON (the depth
    beyond msgspec's own limit is the caller's check)."""
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise BadRequest(_not_json(data, exc)) from None
    except RecursionError:  # msgspec gives up near Python's recursion limit
        raise BadRequest(f"body is nested more than {MAX_DEPTH} levels deep") from None


def decode(data: bytes) -> Any:
    """JSON text decoded; BadRequest when it is not JSON or nests more than
    :data:`MAX_DEPTH` levels."""
    raw = _load(data)
    # more brackets than the limit is the only way to nest deeper than it
    if (data.count(b"[") + data.count(b"{") > MAX_DEPTH and isinstance(raw, (dict, list))
            and _too_deep(raw)):
        raise BadRequest(f"body is nested more than {MAX_DEPTH} levels deep")
    return raw


def parse(data: bytes, *, chat: bool) -> ParsedBody:
    raw = _load(data)
    if not isinstance(raw, dict):
        raise BadRequest("body must be a JSON object")
    if "model" not in raw:
        raise BadRequest("body lacks `model`")
    try:
        fields = msgspec.convert(raw, _Fields)
    except msgspec.ValidationError as exc:
        raise BadRequest(_wrong_type(str(exc))) from None
    if not fields.model:
        raise BadRequest("`model` is empty")
    if chat and not fields.messages:
        raise BadRequest("`messages` must be a non-empty list")
    if not chat and fields.prompt is None:
        raise BadRequest("body lacks `prompt`")
    texts = _simple_texts(raw, fields)
    if texts is None:  # not the common shape (which nests 3 levels): the depth is checked, then the general walk
        if _too_deep(raw):
            raise BadRequest(f"body is nested more than {MAX_DEPTH} levels deep")
        texts = texts_from_body(raw).texts
    return ParsedBody(raw, fields, texts)


def reads_as_chat(raw: Any) -> bool:
    """Whether a body sent to no endpoint in particular (an explain) is read
    as a chat body: a completions body has a ``prompt`` and no ``messages``."""
    return not isinstance(raw, dict) or "messages" in raw or "prompt" not in raw


def check_body(body: ParsedBody) -> None:
    """BadRequest naming the field when a token limit is not a positive integer in range."""
    f = body.fields
    for name, value in (("max_tokens", f.max_tokens), ("max_completion_tokens", f.max_completion_tokens)):
        if value is not None and not 1 <= value <= MAX_TOKENS:
            raise BadRequest(f"`{name}` must be an integer from 1 to {MAX_TOKENS}, not {value}")


def _simple_texts(raw: dict[str, Any], fields: _Fields) -> list[str] | None:
    """``texts_from_body(raw).texts`` for the common chat body, without its
    general walk; None for any other body. Common: every message is exactly
    ``{role, content}`` with a standard role and a string ``content``, and
    every other field is ``model`` or a number, boolean or null of
    :data:`~kinference_common.prompt_texts.SETTINGS` that is not read (not a
    number no setting takes; not multi-part content,
    names, tool calls, tools, ``stop``...)."""
    messages = fields.messages
    if messages is None:
        return None
    for key, value in raw.items():
        if key not in _SIMPLE_FIELDS or (key in SETTINGS and setting_is_content(value, key)):
            return None
    texts: list[str] = []
    for msg in messages:
        content = msg.get("content")
        role = msg.get("role")
        if len(msg) != 2 or type(role) is not str or role not in ROLES or type(content) is not str:
            return None
        if content:
            texts.append(content)
    return texts


_SIMPLE_FIELDS = SETTINGS | {"model", "messages"}


def _too_deep(value: Any) -> bool:
    """Whether arrays and objects nest more than :data:`MAX_DEPTH` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = v.values() if isinstance(v, dict) else v
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False
