"""The message-prefix memo of the prompt's block-hash chain
(:func:`kinference_common.engine.tokens.prompt_block_hashes`): the same
hashes as hashing the joined prompt, whatever the memo holds."""

from __future__ import annotations

import random

import pytest
from kinference_common.engine import tokens
from kinference_common.engine.tokens import BLOCK_CHARS, block_hashes, prompt_block_hashes

KEY = b"k" * 32


@pytest.fixture(autouse=True)
def empty_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_chains", tokens.ChainMemo())


def random_text(rng: random.Random) -> str:
    alphabet = "abc de\n.Ωж漢😀"
    size = rng.choice([0, 1, 5, BLOCK_CHARS - 1, BLOCK_CHARS, BLOCK_CHARS + 1, 2 * BLOCK_CHARS, rng.randrange(900)])
    return "".join(rng.choice(alphabet) for _ in range(size))


@pytest.mark.parametrize("key", [None, KEY], ids=["unkeyed", "keyed"])
def test_conversations_hash_as_the_joined_prompt(key: bytes | None) -> None:
    rng = random.Random(11)
    systems = [random_text(rng) for _ in range(3)]
    for _ in range(300):
        # a conversation: a system prompt, earlier turns, a new message; some
        # turns are reused, some edited, some conversations start over
        texts = [rng.choice(systems)]
        for _turn in range(rng.randrange(5)):
            texts.append(random_text(rng))
            got = prompt_block_hashes(texts, key=key)
            assert got == block_hashes("\n".join(texts), key=key)
        if texts[1:] and rng.random() < 0.3:
            texts[-1] = texts[-1] + "edited"
            assert prompt_block_hashes(texts, key=key) == block_hashes("\n".join(texts), key=key)


def test_block_sizes_and_keys_do_not_share_chains() -> None:
    system = "the shared system prompt " * 40
    for block in (16, BLOCK_CHARS):
        for key in (None, KEY, b"another key"):
            texts = [system, "question"]
            assert prompt_block_hashes(texts, block, key) == block_hashes("\n".join(texts), block, key)
    assert len(tokens._chains.entries) == 6  # one chain per (block size, key)


def test_a_new_turn_resumes_from_the_messages_before_it() -> None:
    system = "s" * (3 * BLOCK_CHARS + 10)
    prompt_block_hashes([system, "first question"], key=KEY)
    assert len(tokens._chains.entries) == 1
    (ident, hashes), = tokens._chains.entries.items()
    assert hashes == block_hashes(system, key=KEY)
    # the memo, not the text, supplies the system prompt's blocks: a forged
    # entry shows in the answer (a real one is what hashing would give)
    forged = (-1, -2, -3)
    tokens._chains.entries[ident] = forged
    assert prompt_block_hashes([system, "second question"], key=KEY)[:3] == forged
    assert len(tokens._chains.entries) == 1


def test_the_longest_remembered_prefix_is_used_and_extended() -> None:
    system, answer = "s" * (2 * BLOCK_CHARS), "a" * (2 * BLOCK_CHARS)
    prompt_block_hashes([system, "q1"])
    three = [system, "q1", answer, "q2"]
    assert prompt_block_hashes(three) == block_hashes("\n".join(three))
    assert len(tokens._chains.entries) == 2  # [system] and [system, q1, answer]
    assert list(tokens._chains.entries.values())[-1] == block_hashes("\n".join(three[:3]))


def test_the_memo_holds_at_most_its_entries_and_its_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_chains", tokens.ChainMemo(entries=4, blocks=40))
    for k in range(10):
        texts = [f"system {k} " * 60, "q"]  # 540-600 characters: 2 blocks each
        assert prompt_block_hashes(texts, key=KEY) == block_hashes("\n".join(texts), key=KEY)
    assert len(tokens._chains.entries) == 4 and tokens._chains.blocks == 8
    # a long prompt pushes out the oldest until the hashes fit
    long = ["x" * (9 * BLOCK_CHARS), "q"]
    assert prompt_block_hashes(long) == block_hashes("\n".join(long))
    assert tokens._chains.blocks == 9 + 2 * 3 and len(tokens._chains.entries) == 4
    # one longer than a quarter of the memo is not kept at all (a 4 MB prompt cannot fill it)
    huge = ["y" * (11 * BLOCK_CHARS), "q"]
    assert prompt_block_hashes(huge) == block_hashes("\n".join(huge))
    assert tokens._chains.blocks == 15
    assert sum(len(h) for h in tokens._chains.entries.values()) == tokens._chains.blocks


def test_the_memo_keeps_no_text() -> None:
    """Only hashes: no string, and no hashing object (BLAKE2b buffers up to
    128 bytes of the input it was given)."""
    secret = "my card is 4111 1111 1111 1111 " * 20
    prompt_block_hashes([secret, "q"], key=KEY)
    prompt_block_hashes([secret, "q"])
    assert len(tokens._chains.entries) == 2
    for ident, hashes in tokens._chains.entries.items():
        assert type(ident) is int and type(hashes) is tuple and all(type(h) is int for h in hashes)


def test_a_used_prefix_is_not_the_first_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_chains", tokens.ChainMemo(entries=3))
    system = "the system prompt every conversation starts with " * 20
    prompt_block_hashes([system, "q0"])  # remembers [system]
    for k in range(4):  # second turns of other conversations resume from [system], then are remembered
        prompt_block_hashes([system, f"question {k} " * 30, "answer", "next"])
    # the shared system prompt's entry was resumed from by each: still held
    first = hash((hash((None, BLOCK_CHARS)), hash(system), len(system)))
    assert first in tokens._chains.entries


def test_short_prompts_are_not_remembered() -> None:
    assert prompt_block_hashes(["short", "q"]) == ()
    assert prompt_block_hashes(["one message only " * 40]) == block_hashes("one message only " * 40)
    assert len(tokens._chains.entries) == 0
