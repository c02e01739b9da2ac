"""What of an OpenAI-style body a classifier reads.

:func:`texts_from_body` turns a chat or legacy-completions body into the
``texts``/``roles``/``unreadable`` of a :class:`ClassifyRequest`. The rule:
every string a provider would receive is read, so that what leaves the
cluster is exactly what was classified (the router's
``provider_request`` forwards nothing else). In order:

- chat ``messages`` of every role: string ``content``, the ``text`` of each
  text part of multi-part content (``text``/``input_text``/``output_text``,
  and ``refusal``), a message's ``name``, the ``arguments`` of tool and
  function calls (model output the client sends back, which often carries
  what a tool returned), then every other string of the message (tool call
  names and ids, ``refusal``, ``tool_call_id``, fields of any other name);
- legacy ``prompt`` (a string or a list of strings) and ``suffix``;
- every other field of the body, walked to its leaves: tool and function
  definitions (names, descriptions, parameter schemas), ``tool_choice``,
  ``response_format`` schemas, ``stop``, ``prediction``, ``logit_bias``,
  fields this module does not know. A walk reads string values, object
  keys outside the OpenAI API's own vocabulary (:data:`KNOWN_KEYS`: a
  schema's property names are read, ``type`` or ``description`` are not)
  and numbers of 7 digits or more (a card or phone number sent as a JSON
  number; a float that is a whole number as its integer digits). A string
  or number under an object key is read as one text with its key,
  ``key: value`` (``ssn: 123456789``), as the same data written as prose
  is; see :meth:`Extracted.walk`. Tool and function definitions and
  ``response_format`` are read with the role ``developer``, the rest with
  no role.

Not read:

- ``model`` (the router replaces it with the destination's own name);
- :data:`PRIVATE_FIELDS` (``user``, ``metadata``, ``safety_identifier``,
  ``prompt_cache_key``): the router never forwards them to a provider, so
  an email address in ``user`` does not keep a clean prompt in the cluster;
- the booleans of :data:`SETTINGS` (``temperature``, ``max_tokens``,
  ``seed``, ...), their numbers under 9 digits and a ``seed``'s number of
  any size (a string there is read, and so is a number no setting takes:
  :func:`setting_is_content`);
- the payload of parts that are not text (``image_url``, ``input_audio``,
  ``file``: base64 data, ``data:`` URLs) and token-id prompts (lists of
  integers): they are counted in ``unreadable`` instead (the rest of such a
  part, an http URL or a file name, is read). An object or array where the API has a string (``arguments``, a
  part's ``text``, a part ``type``) is counted unreadable *and* walked: the
  provider receives its strings too. A classifier cannot say they are clean, so one that finds
  nothing answers its "unknown" tag.

The walks are iterative: a body nested deeper than Python's recursion limit
is read like any other (the router refuses bodies nested deeper than 64
levels before this runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})

#: top-level fields never forwarded to a provider (and so not read)
PRIVATE_FIELDS = frozenset({"user", "metadata", "safety_identifier", "prompt_cache_key"})

#: top-level sampling and framing settings: their numbers and booleans are
#: not content (a string in one of them is read)
SETTINGS = frozenset({
    "stream", "temperature", "top_p", "n", "max_tokens", "max_completion_tokens", "seed",
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "parallel_tool_calls", "store",
    "echo", "best_of", "top_k", "min_p", "repetition_penalty", "length_penalty", "min_tokens", "ignore_eos",
})

#: object keys of the OpenAI API (and JSON Schema) itself: a walk does not read them as text
KNOWN_KEYS = frozenset({
    "type", "function", "name", "description", "parameters", "arguments", "id", "strict", "properties",
    "required", "items", "enum", "const", "additionalProperties", "json_schema", "schema", "title", "default",
    "anyOf", "oneOf", "allOf", "not", "$ref", "$defs", "definitions", "format", "pattern", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems",
    "uniqueItems", "nullable", "examples", "include_usage", "tool_call_id", "refusal", "audio", "content",
    "role", "text", "image_url", "url", "detail", "input_audio", "data", "file", "file_id", "filename",
    "file_data", "voice", "tool_calls", "function_call", "custom", "grammar", "syntax", "definition",
})

#: fields whose walk has the role ``developer`` (written by the application, like a system prompt)
_DEVELOPER_FIELDS = frozenset({"tools", "functions", "response_format"})
#: message roles of the OpenAI API (another role's name is read as text)
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: the smallest number a walk reads (7 digits: a phone number's local part)
_BIG_NUMBER = 1_000_000
#: the smallest number of a setting that is read (9 digits: more than any count, rank
#: or penalty takes); never a ``seed``'s, which takes any 64-bit number (one random
#: seed in twenty would read as a card)
_SETTING_LIMIT = 100_000_000


@dataclass(slots=True)
class Extracted:
    texts: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    unreadable: int = 0

    def add(self, text: Any, role: str) -> None:
        if isinstance(text, str):
            if text:
                self.texts.append(text)
                self.roles.append(role)
        elif text is not None:
            self.unreadable += 1
            if isinstance(text, (dict, list)):  # not the API's shape, but the provider receives it: read it
                self.walk(text, role)

    def walk(self, value: Any, role: str, label: str | None = None) -> None:
        """Read every string of ``value`` (and its unknown keys, its big numbers), in document order.

        A string or big number under an object key is read as one text ``key: value``
        (``ssn: 123456789``, ``date of birth: 1985-07-03``): read apart, the key and its value
        meet at a seam with nothing between them, and the detectors' hints ("ssn",
        "dob", "phone") would not stand before the value. The first item of an array
        has its key (the others none: a value split over two items is read across their
        seam); ``label`` is the key of ``value`` itself (a top-level field's)."""
        stack: list[tuple[Any, str | None]] = [(value, label)]
        texts, roles = self.texts, self.roles
        while stack:
            v, at = stack.pop()
            text = v if type(v) is str else number_text(v)
            if text is not None:
                if text:
                    texts.append(f"{at}: {text}" if at else text)
                    roles.append(role)
            elif isinstance(v, dict):
                definition = _is_definition(v)
                for k, x in reversed(list(v.items())):
                    key = str(k)
                    if _reads(x):  # the key is read in the value's own text
                        stack.append((x, _child_label(key, at, definition)))
                        continue
                    stack.append((x, _child_label(key, at, False)))
                    if key not in KNOWN_KEYS:
                        stack.append((key, None))
            elif isinstance(v, list):  # the first item has the array's key: a value split over items meets itself
                stack.extend((x, None if i else at) for i, x in reversed(list(enumerate(v))))

    def read_field(self, key: str, value: Any, role: str, known: bool) -> None:
        """A field of a body or message: read with its key as label (its key alone
        first, unless ``known``, when the value is an object or array)."""
        if not known and not _reads(value):
            self.add(key, role)
        self.walk(value, role, label_of(key))


def number_text(value: Any) -> str | None:
    """A number of :data:`_BIG_NUMBER` or more as the text a walk reads (a float
    that is a whole number as its integer digits: ``4111111111111111.0`` and
    ``4.111111111111111e15`` are the card ``4111111111111111``); None for
    anything else (a smaller number, a boolean, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(value) >= _BIG_NUMBER:
        return None
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _reads(value: Any) -> bool:
    """Whether a walk reads ``value`` as a text of its own (a non-empty string, a big number)."""
    return (type(value) is str and value != "") or number_text(value) is not None


#: JSON Schema keywords whose value is an instance of the property's data
#: (``"ssn": {"default": "123456789"}``), and a ``value`` wrapping one
#: (``"ssn": {"value": "123456789"}``): read under the property's name
_VALUE_KEYWORDS = frozenset({"default", "examples", "example", "enum", "const", "value"})
#: keys whose string is the API's own vocabulary (``"type": "string"``, ``"role": "user"``)
#: or prose of its own (a text part's ``text``, a tool's ``description``): read bare, as
#: before, a label would add only words (and split a value written across two parts)
_BARE_KEYS = frozenset({
    "type", "role", "format", "detail", "required", "$ref", "syntax", "voice",
    "text", "content", "arguments", "refusal", "description", "title",
})
#: keys that make an object a tool, function or schema definition: its ``name`` is an identifier
_DEFINITION_KEYS = frozenset({"parameters", "schema", "input_schema", "strict"})


def _is_definition(obj: dict[Any, Any]) -> bool:
    return "name" in obj and not _DEFINITION_KEYS.isdisjoint(obj)


def _child_label(key: str, parent: str | None, definition: bool) -> str | None:
    """The label of a string or number under ``key``: the key, the parent's for a
    schema's example of its data, none for the API's vocabulary, for the name of a
    tool or schema definition (``"name": "Weather Report"`` names no one) and for a
    key that names things as often as people (:func:`_names_things`)."""
    if key in _VALUE_KEYWORDS:
        return parent
    if key in _BARE_KEYS or (definition and key == "name") or _names_things(key):
        return None
    return label_of(key)


#: keys ending in "name" that name a person (``customer_name``, ``fullName``)
_PERSON_NAME_KEYS = frozenset({
    "full name", "first name", "last name", "given name", "family name", "surname", "user name", "customer name",
    "patient name", "contact name", "cardholder name", "account holder name", "holder name", "person name",
    "employee name", "maiden name", "legal name", "middle name",
})


def _names_things(key: str) -> bool:
    """A key like ``name``, ``product_name``, ``displayName``, ``customer`` or
    ``client``: its value is a product, a project, a company as often as a
    person, and labelled as a form's field (``name: Blue Widget``) every
    two capitalised words under it would read as someone's name. Read bare,
    as before keys were read with their values."""
    words = label_of(key).lower()
    if words in ("customer", "client", "company", "organization", "organisation"):
        return True
    return (words == "name" or words.endswith(" name")) and words not in _PERSON_NAME_KEYS


#: a key of words: letters, joined by ``_`` or ``-`` or written camelCase (no digits: a
#: token or number used as a key is read as written)
_IDENTIFIER = re.compile(r"[A-Za-z]+(?:[_-][A-Za-z]+)*")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|[_-]")


def label_of(key: str) -> str:
    """A key as a label the detectors read: an identifier's words apart
    (``user_name``, ``userName``, ``date-of-birth`` -> ``user name``, ``date of
    birth``; the detectors' hints are whole words, and ``_`` joins words). The
    first word keeps its case (``Name`` is a form's label). Any other key (an
    e-mail address, a number, a token) as written."""
    if len(key) > 64 or not _IDENTIFIER.fullmatch(key):
        return key
    words = _CAMEL.split(key)
    return " ".join([words[0], *(w.lower() for w in words[1:])])


def setting_is_content(value: Any, key: str = "") -> bool:
    """Whether the value of the setting ``key`` (one of :data:`SETTINGS`) is read:
    a string, an object or array, or a number no setting takes
    (:data:`_SETTING_LIMIT` or more: a ``top_k`` of 16 digits is a card or phone
    number sent where nobody reads), except a ``seed``'s (any 64-bit number)."""
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return key != "seed" and abs(value) >= _SETTING_LIMIT
    return True


def _content(out: Extracted, content: Any, role: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        out.add(content, role)
        return
    if not isinstance(content, list):
        out.add(content, role)  # counted unreadable; an object's strings read
        return
    for part in content:
        if isinstance(part, str):
            out.add(part, role)
        elif isinstance(part, dict):
            kind = part.get("type")
            if kind is not None and not isinstance(kind, str):  # an object or array: no part type of the API
                out.unreadable += 1
                out.walk(part, role)
                continue
            if kind in _TEXT_PART_TYPES or (kind is None and "text" in part):
                out.add(part.get("text"), role)
                field_name = "text"
            elif kind == "refusal":
                out.add(part.get("refusal"), role)
                field_name = "refusal"
            else:  # an image, audio, a file: its payload is not text; every other string of it is read
                out.unreadable += 1
                out.walk(_without_payload(part), role)
                continue
            if len(part) > (field_name in part) + (kind is not None):  # anything else the part carries
                out.walk({k: v for k, v in part.items() if k != field_name and k != "type"}, role)
        else:
            out.add(part, role)


#: keys whose string value is a non-text part's payload (base64 data, a ``data:`` URL)
_PAYLOAD_KEYS = frozenset({"data", "file_data", "b64_json"})


def _payload(key: str, value: Any) -> bool:
    return isinstance(value, str) and (key in _PAYLOAD_KEYS or (key == "url" and value.startswith("data:")))


def _without_payload(part: dict[str, Any]) -> dict[str, Any]:
    """A non-text part without its payload (at the part's level and one below,
    where the API puts it: ``image_url.url``, ``input_audio.data``,
    ``file.file_data``), for the walk to read the rest (URLs, file names...)."""
    out: dict[str, Any] = {}
    for k, v in part.items():
        if k == "type" or _payload(k, v):
            continue
        if isinstance(v, dict):
            v = {k2: v2 for k2, v2 in v.items() if not _payload(k2, v2)}
        out[k] = v
    return out


def _prompt(out: Extracted, prompt: Any) -> None:
    if prompt is None:
        return
    if isinstance(prompt, str):
        out.add(prompt, "")
        return
    if isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, str):
                out.add(item, "")
            else:  # token ids, or a list of them (counted unreadable; any string in it read)
                out.unreadable += 1
                out.walk(item, "")
        return
    out.add(prompt, "")  # counted unreadable; an object's strings read


def _message(out: Extracted, msg: dict[str, Any]) -> None:
    role = msg.get("role") if isinstance(msg.get("role"), str) else ""
    if role not in ROLES:
        out.add(role, "")
    _content(out, msg.get("content"), role)
    if isinstance(msg.get("name"), str):
        out.add(msg["name"], role)
    calls = msg.get("tool_calls")
    rest_calls: list[Any] = []
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                out.add(fn.get("arguments"), role)
                rest_calls.append({**call, "function": {k: v for k, v in fn.items() if k != "arguments"}})
            else:
                rest_calls.append(call)
    fn = msg.get("function_call")
    rest_fn: Any = fn
    if isinstance(fn, dict):
        out.add(fn.get("arguments"), role)
        rest_fn = {k: v for k, v in fn.items() if k != "arguments"}
    # everything else the message carries (a provider receives it too)
    for key, value in msg.items():
        if key == "content" or (key == "role" and isinstance(value, str)):
            continue
        if key == "name" and isinstance(value, str):
            continue
        if key == "tool_calls" and isinstance(calls, list):
            value = rest_calls
        elif key == "function_call":
            value = rest_fn
        out.read_field(str(key), value, role, key in KNOWN_KEYS)


def texts_from_body(body: dict[str, Any]) -> Extracted:
    """The texts of a chat or completions body, with their roles."""
    out = Extracted()
    messages = body.get("messages")
    if isinstance(messages, list):
        for msg in messages:
            if not isinstance(msg, dict):
                out.add(msg, "")
                if isinstance(msg, str):  # not a message: read, and counted unreadable all the same
                    out.unreadable += 1
                continue
            _message(out, msg)
    elif messages is not None:
        out.add(messages, "")
        if isinstance(messages, str):
            out.unreadable += 1
    _prompt(out, body.get("prompt"))
    if isinstance(body.get("suffix"), str):
        out.add(body["suffix"], "")
    for key, value in body.items():
        if key in ("model", "messages", "prompt") or key in PRIVATE_FIELDS:
            continue
        if key == "suffix" and isinstance(value, str):
            continue
        if key in SETTINGS and not setting_is_content(value, key):
            continue
        role = "developer" if key in _DEVELOPER_FIELDS else ""
        out.read_field(str(key), value, role, key in KNOWN_KEYS or key in KNOWN_FIELDS)
    return out


#: top-level fields of the OpenAI API whose names are not read as text
KNOWN_FIELDS = frozenset({
    "suffix", "tools", "functions", "tool_choice", "response_format", "stop", "prediction", "logit_bias",
    "stream_options", "modalities", "reasoning_effort", "service_tier", "web_search_options", "verbosity",
})
