"""The prompt-token approximation and chained block hashes."""

from __future__ import annotations

from kinference_simulators import tokens


def test_four_characters_per_token() -> None:
    assert tokens.count_tokens("") == 1
    assert tokens.count_tokens("abcd") == 1
    assert tokens.count_tokens("abcde") == 2
    assert tokens.count_tokens("x" * 4000) == 1000


def test_only_full_blocks_are_hashed() -> None:
    bs = 16
    width = bs * tokens.CHARS_PER_TOKEN
    assert tokens.block_hashes("a" * (width - 1), bs) == ()
    assert len(tokens.block_hashes("a" * width, bs)) == 1
    assert len(tokens.block_hashes("a" * (3 * width + 5), bs)) == 3


def test_shared_prefix_shares_leading_hashes_only() -> None:
    bs = 4
    width = bs * tokens.CHARS_PER_TOKEN
    common = "s" * (2 * width)
    a = tokens.block_hashes(common + "a" * width, bs)
    b = tokens.block_hashes(common + "b" * width, bs)
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert tokens.block_hashes(common + "a" * width, bs) == a  # deterministic


def test_hashes_chain_on_the_prefix() -> None:
    bs = 4
    width = bs * tokens.CHARS_PER_TOKEN
    # the same second block after a different first block hashes differently
    a = tokens.block_hashes("x" * width + "same" * 4, bs)
    b = tokens.block_hashes("y" * width + "same" * 4, bs)
    assert a[1] != b[1]


def test_chat_template_keeps_a_common_system_prompt_as_prefix() -> None:
    sys_msg = {"role": "system", "content": "You are helpful. " * 20}
    a = tokens.render_chat([sys_msg, {"role": "user", "content": "first question"}])
    b = tokens.render_chat([sys_msg, {"role": "user", "content": "another one"}])
    common = len(tokens.render_chat([sys_msg])) - len("<|assistant|>\n")
    assert a[:common] == b[:common]
    assert tokens.messages_text(
        [sys_msg, {"role": "user", "content": [{"type": "text", "text": "part"}]}]
    ).endswith("\npart")


def test_output_is_seeded_by_seed_and_prompt() -> None:
    def words(seed: int, text: str) -> list[str]:
        it = tokens.token_texts(tokens.prompt_rng(seed, text))
        return [next(it) for _ in range(10)]

    assert words(1, "hello") == words(1, "hello")
    assert words(1, "hello") != words(2, "hello")
    lens = [tokens.natural_output_len(tokens.prompt_rng(0, str(i)), 50) for i in range(400)]
    assert min(lens) >= 1
    assert 35 < sum(lens) / len(lens) < 65


def test_token_ids_are_per_four_characters_and_position_free() -> None:
    ids = tokens.token_ids("abcdabcdxy")
    assert len(ids) == tokens.count_tokens("abcdabcdxy") == 3
    assert ids[0] == ids[1] != ids[2]
    assert all(0 <= i < tokens.VOCAB_SIZE for i in ids)
    assert tokens.token_ids("") == [0]
