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
    # the tool call's function name is read too (with its key): a provider receives it
    assert out.texts == ["be nice", "look at this", "and this", '{"q": "x"}', "f", "result", "f"]
    assert out.roles == ["system", "user", "user", "assistant", "assistant", "tool", "tool"]
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


def test_settings_and_model_are_not_content() -> None:
    out = texts_from_body({"model": "secret-model", "temperature": 0.7, "seed": 42, "stream": True, "max_tokens": 256,
                           "top_k": 40, "top_p": 1, "n": 1, "logprobs": False, "repetition_penalty": 1.05})
    assert out.texts == [] and out.unreadable == 0


def test_a_number_no_setting_takes_is_read() -> None:
    """A seed of 16 digits is no seed anyone picks: it is read, with its key."""
    out = texts_from_body({"model": "m", "seed": 4111111111111111, "top_k": 4155550132, "temperature": 4111111111111111.0})
    # a seed takes any 64-bit number (one random seed in twenty would read as a card): never read
    assert out.texts == ["top k: 4155550132", "temperature: 4111111111111111"]


def test_every_string_a_provider_receives_is_read() -> None:
    out = texts_from_body({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {
            "name": "pay", "description": "card 4111 1111 1111 1111",
            "parameters": {"type": "object", "properties": {"jane@example.com": {"type": "string"}}}}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"title": "T"}}},
        "stop": ["END"], "x_custom": {"phone": 4155550100},
        "user": "jane@example.com", "metadata": {"card": "4111111111111111"},
    })
    # a string or big number under a key is read with it ("phone: 4155550100"); the API's own
    # vocabulary ("type"), prose ("description") and a definition's name ("pay", "s") bare
    assert out.texts == ["hi", "function", "pay", "card 4111 1111 1111 1111", "object", "jane@example.com",
                         "string", "json_schema", "s", "T", "stop: END", "x_custom", "phone: 4155550100"]
    assert out.roles[1:10] == ["developer"] * 9 and out.roles[10:] == [""] * 3
    assert "4111111111111111" not in out.texts  # metadata and user are never sent to a provider


def test_the_router_s_fast_path_reads_a_number_no_setting_takes() -> None:
    """The common chat body is read without the general walk; a top_k of 16 digits takes it (a seed never)."""
    import msgspec

    from kinference_common.request_body import parse

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_k": 4111111111111111, "top_p": 1}
    assert parse(msgspec.json.encode(body), chat=True).texts == ["hi", "top k: 4111111111111111"]
    body["top_k"] = 42
    body["seed"] = 4111111111111111
    assert parse(msgspec.json.encode(body), chat=True).texts == ["hi"]
