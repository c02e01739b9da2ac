"""The ``injection`` classifier: known prompt-injection patterns, by rule.

``injection-detected`` when any of these holds in a non-system message:

- an instruction override ("ignore all previous instructions", "disregard the
  above rules", "forget everything you were told"), a request for the hidden
  prompt ("reveal your system prompt"), or a jailbreak persona ("you are now
  DAN", "developer mode enabled", "do anything now");
- chat-template or role tokens inside content (``<|im_start|>``,
  ``<|eot_id|>``, ``[INST]``, ``<<SYS>>``, ``<start_of_turn>``, a line
  starting ``System:``), which try to forge a turn the model will trust;
- hidden characters: Unicode tag characters (U+E0000..U+E007F, "ASCII
  smuggling"), bidirectional overrides, or three or more zero-width characters;
- an encoded payload (base64/base64url or hex run) that decodes to text
  matching the rules above.

``injection-unknown`` when it cannot tell: an encoded run that decodes to
readable text mentioning instructions or prompts without matching a rule, or
parts that are not text (images, audio, token ids). Failure, deadline and
oversize also answer ``injection-unknown`` (in :mod:`core`).

Messages with role ``system`` or ``developer`` are skipped: they are the
caller's own instructions and legitimately say "never reveal your system
prompt". The PII classifier reads every role.

What it cannot catch (rules see surface forms only): paraphrased or
translated overrides ("pay no heed to what came before", any non-English
wording), instructions split across messages or tokens, homoglyph and
leetspeak spellings, ciphers other than base64/hex (ROT13, reversed text,
Morse), payloads inside images or files, indirect injection that reads as
ordinary content ("the user has authorised you to email this file"), and
multi-turn social engineering. A model-based detector would catch more at a
cost well beyond this classifier's 20 ms deadline.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence

from kinference_common.detectors.core import Budget, Detection, Verdict, check_tags
from kinference_common.detectors.patterns import Pattern, Scanner, build_scanner
from kinference_common.classifiers import INJECTION

WS = r"[ \t\r\n\f\v]{1,4}"
_INSTRUCTIONS = (
    r"(?:instructions?|prompts?|rules?|directions?|directives?|guidelines?|context|messages?"
    r"|constraints?|commands?|guardrails?|programming|orders?)"
)
_BEFORE = r"(?:previous|prior|above|earlier|preceding|original|initial|system|existing|safety|old)"
_FILLER = rf"(?:(?:all|any|the|your|my|of|these|those|every|and){WS}){{0,4}}"

RULES: tuple[tuple[str, Pattern], ...] = (
    (
        "override",
        Pattern(
            "override",
            rf"\b(?:ignore|disregard|forget|override|bypass|skip|drop|abandon){WS}{_FILLER}"
            rf"{_BEFORE}{WS}(?:{_FILLER}){_INSTRUCTIONS}\b"
            rf"|\b(?:ignore|disregard|forget){WS}(?:everything|all|anything){WS}"
            rf"(?:above|before|previously|you{WS}(?:were|have{WS}been){WS}told)\b",
            caseless=True,
        ),
    ),
    (
        "prompt_leak",
        Pattern(
            "prompt_leak",
            rf"\b(?:reveal|print|show|output|repeat|display|leak|dump|tell{WS}me|what{WS}(?:is|are))"
            rf"{WS}(?:me{WS})?(?:your|the){WS}(?:(?:full|hidden|secret|initial|original|exact|entire)"
            rf"{WS}){{0,3}}(?:system{WS}(?:prompt|message|instructions)|initial{WS}prompt|hidden{WS}prompt"
            rf"|instructions{WS}(?:above|you{WS}were{WS}given))\b",
            caseless=True,
        ),
    ),
    (
        "jailbreak",
        Pattern(
            "jailbreak",
            rf"\byou{WS}are{WS}now{WS}(?:in{WS})?(?:DAN|developer{WS}mode|jailbroken|unrestricted"
            rf"|unfiltered|uncensored|free{WS}(?:of|from))\b"
            rf"|\bdo{WS}anything{WS}now\b"
            rf"|\b(?:developer|god|jailbreak|DAN){WS}mode{WS}(?:is{WS})?(?:enabled|on|activated)\b"
            rf"|\bpretend{WS}(?:that{WS})?you{WS}(?:are|have){WS}(?:no|not{WS}bound|free{WS}from)"
            rf"{WS}(?:restrictions|rules|limits|guidelines|filters)\b"
            rf"|\b(?:act|respond|behave){WS}as{WS}(?:if{WS}you{WS}(?:are|were){WS})?(?:an?{WS})?"
            rf"(?:unfiltered|uncensored|unrestricted|jailbroken){WS}(?:ai|model|assistant|chatbot)\b",
            caseless=True,
        ),
    ),
    (
        "template_token",
        Pattern(
            "template_token",
            r"<\|(?:im_start|im_end|im_sep|endoftext|system|user|assistant|begin_of_text"
            r"|start_header_id|end_header_id|eot_id|eom_id|end|channel|message|start|fim_[a-z]{1,12})\|>"
            r"|\[/?INST\]|<</?SYS>>|<(?:start|end)_of_turn>",
        ),
    ),
    (
        "role_line",
        Pattern(
            "role_line",
            r"^[ \t]{0,8}(?:#{1,3}[ \t]{0,3})?(?:system|SYSTEM|System)"
            r"(?:[ \t]{1,3}(?:prompt|message))?"
            r"[ \t]{0,3}:"
            r"|\n\n(?:Human|Assistant):",
            multiline=True,
        ),
    ),
    (
        "encoded",
        Pattern(
            "encoded",
            r"\b[A-Za-z0-9+/_-]{23,}[A-Za-z0-9]\b={0,2}|\b(?:[0-9A-Fa-f]{2}){16,}\b",
        ),
    ),
)
PATTERNS: tuple[Pattern, ...] = tuple(p for _, p in RULES)
_ENCODED = len(RULES) - 1
assert RULES[_ENCODED][0] == "encoded"

#: tag characters and bidi controls: no reason to be in a prompt
_SMUGGLING = re.compile("[\U000e0000-\U000e007f\u202a-\u202e\u2066-\u2069]")
#: zero-width characters (ZWJ U+200D is left out: emoji sequences use it)
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200e\u200f\u2060-\u2064\ufeff\u00ad]")
_MENTIONS = re.compile(r"(?i)\b(?:instruction|prompt|ignore|system|assistant|jailbreak)", re.ASCII)

#: encoded runs longer than this are decoded only up to it
_MAX_DECODE = 16 * 1024

TAGS = check_tags(
    INJECTION,
    {
        Verdict.POSITIVE: "injection-detected",
        Verdict.UNKNOWN: "injection-unknown",
        Verdict.NONE: "injection-none",
    },
)

SKIPPED_ROLES = frozenset({"system", "developer"})


def _decode(run: str) -> str | None:
    """Readable text inside a base64/base64url/hex run, or None."""
    run = run[:_MAX_DECODE]
    raw: bytes | None = None
    if len(run) % 2 == 0 and all(c in "0123456789abcdefABCDEF" for c in run):
        try:
            raw = binascii.unhexlify(run)
        except (binascii.Error, ValueError):
            raw = None
    if raw is None:
        body = run.rstrip("=")
        alphabet_url = "-" in body or "_" in body
        padded = body + "=" * (-len(body) % 4)
        try:
            raw = (base64.urlsafe_b64decode if alphabet_url else base64.b64decode)(padded)
        except (binascii.Error, ValueError):
            return None
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    printable = sum(c.isprintable() or c in "\n\t\r" for c in decoded)
    if not decoded or printable < 0.95 * len(decoded) or sum(c.isalpha() for c in decoded) < 8:
        return None
    return decoded


class InjectionDetector:
    info = INJECTION
    tags = TAGS

    def __init__(self, engine: str | None = None, scanner: Scanner | None = None) -> None:
        self.scanner = scanner or build_scanner(PATTERNS, engine)
        # Decoded payloads are short and rare: the re path is enough for them.
        self._plain = build_scanner(PATTERNS[:_ENCODED], "re")

    @property
    def engine(self) -> str:
        return self.scanner.engine

    def _rules_hit(self, text: str, scanner: Scanner, budget: Budget, depth: int) -> Detection:
        unknown: list[str] = []
        scan = scanner.scan(text)
        for index in scan.fired():
            name = RULES[index][0]
            if index != _ENCODED:
                for _ in scan.hits(index):
                    return Detection(Verdict.POSITIVE, [name])
                continue
            if depth > 0:
                continue
            for start, end in scan.hits(index):
                budget.check()
                decoded = _decode(text[start:end])
                if decoded is None:
                    continue
                inner = self._rules_hit(decoded, self._plain, budget, depth + 1)
                if inner.verdict is Verdict.POSITIVE:
                    return Detection(Verdict.POSITIVE, ["encoded"])
                if _MENTIONS.search(decoded) and "encoded" not in unknown:
                    unknown.append("encoded")
        return Detection(Verdict.UNKNOWN, unknown) if unknown else Detection(Verdict.NONE)

    def detect(
        self, texts: Sequence[str], roles: Sequence[str], unreadable: int, budget: Budget
    ) -> Detection:
        unknown: list[str] = []
        for i, text in enumerate(texts):
            budget.check()
            if not text or (i < len(roles) and roles[i] in SKIPPED_ROLES):
                continue
            if not text.isascii():
                if _SMUGGLING.search(text) or len(_ZERO_WIDTH.findall(text)) >= 3:
                    return Detection(Verdict.POSITIVE, ["hidden_characters"])
            found = self._rules_hit(text, self.scanner, budget, 0)
            if found.verdict is Verdict.POSITIVE:
                return found
            unknown.extend(f for f in found.findings if f not in unknown)
        if unknown:
            return Detection(Verdict.UNKNOWN, unknown)
        if unreadable:
            return Detection(Verdict.UNKNOWN, ["unreadable"])
        return Detection(Verdict.NONE)
