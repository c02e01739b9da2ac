"""Prompt tokens without a tokenizer: a deterministic, documented approximation.

The simulators never load a real tokenizer. A prompt's text is cut into
tokens of :data:`CHARS_PER_TOKEN` characters (about what BPE tokenizers give
for English), so ``count_tokens(text) == ceil(len(text) / 4)``.

Prefix caching works on blocks of ``block_size`` tokens. Only full blocks
are hashed, and each hash chains the previous one (like vLLM's block hashes):
the hash of block ``i`` covers the whole prefix up to the end of block ``i``.
The same text therefore maps to the same hashes, and two prompts that share
their first ``k * block_size * 4`` characters share their first ``k`` hashes.

Chat requests are rendered with a fixed template (:func:`render_chat`), so
requests with the same system prompt share a prefix as they would on a real
engine.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CHARS_PER_TOKEN = 4

_WORDS = (
    "the",
    "model",
    "answer",
    "is",
    "a",
    "token",
    "of",
    "simulated",
    "text",
    "and",
    "cache",
    "prefix",
    "block",
    "engine",
    "request",
    "queue",
    "batch",
    "step",
    "GPU",
    "latency",
    "router",
    "pod",
    "policy",
    "in",
    "to",
    "for",
    "with",
    "on",
    "it",
    "we",
)


def count_tokens(text: str) -> int:
    """Tokens of ``text``: one per started group of four characters (at least 1)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


#: the simulated vocabulary's size (token ids are in ``[0, VOCAB_SIZE)``)
VOCAB_SIZE = 1 << 17


def token_ids(text: str) -> list[int]:
    """Token ids of ``text``, as ``/tokenize`` returns them: one per group of
    four characters, the id a function of that group alone (like a real
    vocabulary), so equal prefixes give equal id prefixes and
    ``len(token_ids(text)) == count_tokens(text)``."""
    if not text:
        return [0]
    step = CHARS_PER_TOKEN
    return [zlib.crc32(text[i : i + step].encode("utf-8", "surrogatepass")) % VOCAB_SIZE
            for i in range(0, len(text), step)]


def block_hashes(text: str, block_size: int) -> tuple[bytes, ...]:
    """Chained hashes of the full ``block_size``-token blocks of ``text``."""
    width = block_size * CHARS_PER_TOKEN
    full = len(text) // width
    out: list[bytes] = []
    parent = b""
    for i in range(full):
        chunk = text[i * width : (i + 1) * width]
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(chunk.encode("utf-8", "surrogatepass"))
        parent = h.digest()
        out.append(parent)
    return tuple(out)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """The prompt a chat request turns into (a fixed, ChatML-like template)."""
    out = []
    for m in messages:
        out.append(f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}<|end|>\n")
    out.append("<|assistant|>\n")
    return "".join(out)


def messages_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """The plain text of a chat request's messages, joined by newlines (for logs of record)."""
    return "\n".join(_content_text(m.get("content")) for m in messages)


def prompt_rng(seed: int, text: str) -> random.Random:
    """A random source for one prompt: the same seed and text give the same output."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return random.Random(f"{seed}/{digest}")


def natural_output_len(rng: random.Random, mean: float) -> int:
    """Tokens a model would write before its end-of-sequence token (geometric-like, >= 1)."""
    if mean <= 1:
        return 1
    return 1 + int(rng.expovariate(1.0 / (mean - 1)))


def token_texts(rng: random.Random) -> Iterable[str]:
    """An endless stream of token texts (words with a leading space)."""
    while True:
        yield " " + rng.choice(_WORDS)
