"""Personal data sent as JSON beside the messages (extra fields, tool schemas, settings): read
with its key, as the same data written as prose is, so that it never leaves the cluster."""

from __future__ import annotations

import json

import pytest

from kinference_common.detectors.core import Classifiers
from kinference_common.prompt_texts import texts_from_body

_ENGINES: dict[str, Classifiers] = {}


def _tag(extra: str) -> list[str]:
    """The pii tag of a chat request carrying ``extra`` (JSON fields after ``messages``),
    with Hyperscan, checked equal to the ``re`` fallback's."""
    if not _ENGINES:
        _ENGINES.update(auto=Classifiers(engine="auto"), re=Classifiers(engine="re"))
    body = json.loads('{"model":"qwen-2.5","messages":[{"role":"user","content":"hi"}]' + extra + "}")
    ex = texts_from_body(body)
    hs, rx = (c.classify("pii", ex.texts, roles=ex.roles, unreadable=ex.unreadable) for c in _ENGINES.values())
    assert hs.tags == rx.tags, extra
    return hs.tags


_TOOL = ('"tools":[{"type":"function","function":{"name":"lookup","description":"Find a customer",'
         '"parameters":{"type":"object","properties":%s}}}]')

LEAKED = [
    # the trial's: a key and its value were read apart, or a known key ("name") not at all
    ',"extra":{"ssn":"123456789"}',
    ',"extra":{"full_name":"Maria Gonzalez"}',
    ',"extra":{"customerName":"Maria Gonzalez"}',
    ',"extra":{"dob":"1985-07-03"}',
    ',"extra":{"phone":"4155550132"}',
    ',"documents":[{"ssn":"123456789","name":"Maria Gonzalez"}]',
    ',"chat_template_kwargs":{"user_name":"Maria Gonzalez"}',
    ',"extra":{"dateOfBirth":"1985-07-03"}',
    "," + _TOOL % '{"ssn":{"type":"string","default":"123456789"}}',
    "," + _TOOL % '{"p":{"type":"object"}},"examples":[{"name":"Maria Gonzalez","phone":"4155550132"}]',
    "," + _TOOL % '{"phone":{"type":"string","examples":["4155550132"]}}',
    ',"response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object",'
    '"examples":[{"name":"Maria Gonzalez","phone":"4155550132"}]}}}',
    # a number no setting takes; a card sent as a JSON float
    ',"top_k":4111111111111111',
    ',"temperature":4111111111111111',
    ',"extra":4111111111111111.0',
    ',"extra":4.111111111111111e15',
    ',"extra":{"card":4.111111111111111e15}',
    # JSON text in a string field
    ',"extra":{"note":"{\\"full name\\": \\"Maria Gonzalez\\"}"}',
    # a value split over two items of an array (a review: each item with the array's key hid it)
    ',"stop":["alice.smith@exam","ple.com"]',
    ',"extra":{"notes":["SSN 123-45-","6789"]}',
    ',"extra":["call +1 415 555","0132 today"]',
    # a recheck: a value wrapped in an object of its own
    ',"extra":{"ssn":{"value":"123456789"}}',
    ',"extra":{"dob":{"value":"1985-07-03"}}',
]


@pytest.mark.parametrize("extra", LEAKED)
def test_personal_data_as_json_fields_is_confirmed(extra: str) -> None:
    assert _tag(extra) == ["pii-confirmed"]


@pytest.mark.parametrize("content", ['{"full_name": "Maria Gonzalez"}', '{"dob": "1985-07-03"}',
                                     "{'patient': 'Maria Gonzalez', 'plan': 'gold'}"])
def test_json_in_message_content_is_confirmed(content: str) -> None:
    body = {"model": "qwen-2.5", "messages": [{"role": "user", "content": content}]}
    ex = texts_from_body(body)
    assert Classifiers().classify("pii", ex.texts, roles=ex.roles).tags == ["pii-confirmed"]


CLEAN = [
    ',"seed":42,"temperature":0.7,"max_tokens":256,"top_p":1,"top_k":40,"n":1,"stream":true',
    ',"seed":2147483647,"max_tokens":2147483647',
    ',"tool_choice":"auto","parallel_tool_calls":true,' + _TOOL % (
        '{"location":{"type":"string","description":"City name, e.g. Paris"},'
        '"unit":{"type":"string","enum":["celsius","fahrenheit"],"default":"celsius"},'
        '"days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"]'),
    ',"response_format":{"type":"json_schema","json_schema":{"name":"Weather Report","strict":true,'
    '"schema":{"type":"object","title":"Weather Report","properties":{"name":{"type":"string","title":"Name"}}}}}',
    ',"tools":[{"type":"function","function":{"name":"Get Weather","parameters":{"type":"object"}}}]',
    ',"stop":["END","\\n\\n"],"logit_bias":{"50256":-100},"stream_options":{"include_usage":true}',
    ',"chat_template_kwargs":{"enable_thinking":false},"extra":{"model_name":"qwen","retries":3}',
    # a review: keys that name products, projects and companies as often as people, a random 64-bit seed
    ',"extra":{"project":{"name":"Apollo Launch"}},"items":[{"name":"Blue Widget","price":9.99}]',
    ',"extra":{"customer":"Acme Corp","product_name":"Blue Widget","displayName":"Green Team"}',
    ',"seed":6974517200266348566',
]


@pytest.mark.parametrize("extra", CLEAN)
def test_ordinary_settings_and_schemas_stay_none(extra: str) -> None:
    assert _tag(extra) == ["pii-none"]


def test_a_message_name_and_tool_call_are_read_as_before() -> None:
    body = {"model": "m", "messages": [
        {"role": "user", "name": "maria", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "pay", "arguments": '{"card": "4111111111111111"}'}}]}]}
    ex = texts_from_body(body)
    assert ex.texts == ["hi", "maria", '{"card": "4111111111111111"}', "id: c1", "function", "pay"]
    assert Classifiers().classify("pii", ex.texts, roles=ex.roles).tags == ["pii-confirmed"]
