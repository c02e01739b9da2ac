"""What of a request body the classifiers read."""

from __future__ import annotations

from kinference_common.prompt_texts import texts_from_body


def test_chat_messages_all_roles_and_text_parts() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be nice"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at this"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                    {"type": "input_text", "text": "and this"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": '{"q": "x"}'}}],
            },
            {"role": "tool", "content": "result", "name": "f"},
        ],
    }
    out = texts_from_body(body)
    assert out.texts == ["be nice", "look at this", "and this", '{"q": "x"}', "result", "f"]
    assert out.roles == ["system", "user", "user", "assistant", "tool", "tool"]
    assert out.unreadable == 1


def test_legacy_prompt_string_and_list() -> None:
    assert texts_from_body({"prompt": "hello"}).texts == ["hello"]
    out = texts_from_body({"prompt": ["a", "b"], "suffix": "c"})
    assert out.texts == ["a", "b", "c"]
    assert out.roles == ["", "", ""]


def test_token_id_prompts_are_unreadable() -> None:
    out = texts_from_body({"prompt": [1, 2, 3]})
    assert out.texts == [] and out.unreadable == 3
    out = texts_from_body({"prompt": [[1, 2], [3]]})
    assert out.unreadable == 2


def test_configuration_is_not_content() -> None:
    out = texts_from_body({"model": "secret-model", "temperature": 0, "tools": [{"x": "y"}]})
    assert out.texts == [] and out.unreadable == 0
