"""The ``pii`` classifier: personal data and secrets that must not leave the cluster.

Each candidate found by :mod:`kinference_common.detectors.patterns` is judged by a
validator into one of three verdicts; the request's tag is the strongest.

``pii-confirmed`` (validated or structurally unambiguous):

- e-mail address: RFC 5321-shaped local part and dotted domain whose last
  label is alphabetic and not a file extension (``icon@2x.png`` is not mail,
  nor is the scp-style ``git@github.com:org/repo``);
- payment card: 13-19 digits, Luhn-valid, in an issuer's IIN range with that
  issuer's length, written plain or grouped like a card (4-4-4-4, 4-6-5...);
- IBAN: python-stdnum's country length, BBAN format and mod-97 check;
- US SSN/ITIN: python-stdnum's validity rules (no area 000/666/9xx for SSNs,
  no group 00 or serial 0000, known advertising numbers refused), written
  ``AAA-GG-SSSS``/``AAA GG SSSS``, or bare after "SSN"/"social security (number)";
- phone number valid per libphonenumber, written with separators, a ``+``/
  ``00`` prefix, or after a cue ("phone:", "call me at"). Without ``+`` a
  number is read as NANP, or with a trunk ``0`` as one of a dozen European
  and Commonwealth regions (a cue widens that to Italy, India, Brazil, China);
- IP address that is globally routable, IPv6 only in 2000::/3 (private,
  loopback, link-local and documentation ranges are infrastructure, not
  personal data);
- national IDs that python-stdnum validates and whose written form is
  distinctive (ES DNI/NIE, IT codice fiscale, BR CPF, CH AHV, spaced IN
  Aadhaar, FI HETU, SE personnummer, CN RIC), or digit-only IDs (NL BSN, PL
  PESEL, DE IdNr, GB NHS, CA SIN, IN Aadhaar) when named next to the number;
- secrets: private key blocks, cloud access keys (AWS key ids, AWS secret keys
  next to their name, Google API keys, Azure storage account keys), tokens of
  common services by their documented prefixes (GitHub, GitLab, Slack, Stripe,
  OpenAI, Anthropic, Hugging Face, npm, PyPI, SendGrid, Databricks, Shopify,
  DigitalOcean, Google OAuth), and JWTs whose header decodes to JSON with
  ``alg``.

``pii-unknown`` (plausible but not validated: "cannot say it is clean"):

- a phone-shaped number that libphonenumber finds possible (right length) but
  not valid, or a bare ``0`` + 8-10 digit run valid in a trunk-prefix region
  (how much of Europe writes phone numbers, but also a zero-padded id);
- a Luhn-valid number grouped like a card but in no issuer range, or a bare
  13-digit Visa-like number that is also a valid EAN-13 barcode;
- a JWT-shaped token whose header does not decode;
- ``password = ...``/``api_key: ...`` assignments of a literal that looks
  random (entropy and character mix), not a placeholder or variable;
- the request carried parts that are not text (images, audio, token ids) and
  nothing was confirmed: those could hold anything.

Everything else is ``pii-none``: numbers failing their checksum, private IPs,
UUIDs, hashes, code, and bare digit runs without a cue (a ten-digit number in
a log is an id far more often than a phone). Names and street addresses are
judged by the context rules of :mod:`kinference_common.detectors.freetext`
(entities ``person``, ``address``, ``dob`` confirmed; ``age`` unknown).

What is scanned: each text as a model reads it. Characters written in place
of ASCII ones are folded first, one for one (:func:`fold`: other scripts'
digits, full-width digits, letters and ``@``, Unicode spaces, hyphens,
zero-width characters as spaces), so ``４１１１``, ``alice＠example.com`` or
a card grouped with no-break spaces is read as its ASCII form; a text
holding characters that show nothing (a soft hyphen, a zero-width space,
direction marks) is read without them too (:func:`without_invisible`). A value split between two texts
(two parts of one message, or two messages) is read across the seam: the
end of one text and the start of the next are scanned joined, as the model
sees them (:data:`SEAM_CHARS` of each side, or all the texts joined once
when they are short).

Rules run in the order of :data:`RULES`, cheap and unambiguous ones first:
the first confirmed candidate ends the request (the router needs a tag, not
every span), so libphonenumber, the slowest validator, runs last.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import functools
import ipaddress
import itertools
import json
import math
import re
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import phonenumbers
from kinference_common.detectors import freetext
from kinference_common.detectors.core import Budget, Detection, Verdict, check_tags
from kinference_common.detectors.patterns import Pattern, Scanner, build_scanner
from kinference_common.classifiers import PII
from stdnum import ean, luhn
from stdnum import iban as std_iban
from stdnum.br import cpf
from stdnum.ca import sin
from stdnum.ch import ssn as ch_ssn
from stdnum.cn import ric
from stdnum.de import idnr
from stdnum.es import dni, nie
from stdnum.fi import hetu
from stdnum.gb import nhs
from stdnum.in_ import aadhaar
from stdnum.it import codicefiscale
from stdnum.nl import bsn
from stdnum.pl import pesel
from stdnum.se import personnummer
from stdnum.us import itin, ssn

NONE, UNKNOWN, CONFIRMED = Verdict.NONE, Verdict.UNKNOWN, Verdict.POSITIVE

#: whitespace as both engines read it (``\s`` differs between them)
WS = r"[ \t\r\n\f\v]"
#: a few non-alphanumeric characters between a keyword and its number
GAP = r"[^0-9A-Za-z]{0,12}"

Validator = Callable[[str, int, int], Verdict]


@dataclass(frozen=True, slots=True)
class Rule:
    entity: str
    pattern: Pattern
    validate: Validator


# ------------------------------------------------------------ reading the text

#: the zero-width characters (a space to the scan: they split nothing a reader sees)
_ZERO_WIDTH = (0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF)
#: dashes and minus signs written for ``-``
_DASHES = (0x2010, 0x2011, 0x2012, 0x2013, 0x2014, 0x2015, 0x2212, 0xFE58, 0xFE63)
#: the full-width forms of ASCII ``!`` to ``~``
_FULL_WIDTH = range(0xFF01, 0xFF5F)


#: the mathematical digits (bold, double-struck, ...): the one block of digits
#: outside the BMP written for ASCII ones in practice
_MATH_DIGITS = range(0x1D7CE, 0x1D800)


@functools.cache
def _fold_table() -> tuple[dict[str, str], re.Pattern[str]]:
    """The folding (character -> ASCII character) and a pattern matching any
    character it folds. Built once, at the first text that needs it."""
    table: dict[int, int] = {}
    for cp in (*range(0x80, 0x10000), *_MATH_DIGITS):  # the BMP's digits and spaces, and math digits
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat == "Nd":
            table[cp] = 0x30 + unicodedata.decimal(ch)
        elif cat == "No" and unicodedata.digit(ch, None) is not None:  # superscript, circled ①
            table[cp] = 0x30 + unicodedata.digit(ch)
        elif cat == "Zs":
            table[cp] = 0x20
    for cp in _FULL_WIDTH:
        table[cp] = cp - 0xFEE0
    table.update(dict.fromkeys(_ZERO_WIDTH, 0x20))
    table.update(dict.fromkeys(_DASHES, 0x2D))
    table[0xFE6B] = 0x40  # small commercial at
    ranges: list[tuple[int, int]] = []
    for cp in sorted(table):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    # one character class: a bitmap over the BMP, so a search costs a few ns a character
    cls = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return {chr(k): chr(v) for k, v in table.items()}, re.compile(f"[{cls}]")


def fold(text: str) -> str:
    """``text`` with the characters written in place of ASCII ones folded to
    them, one for one (the same length: offsets stay the text's): decimal
    digits of the BMP's scripts, the mathematical, superscript and circled
    digits, full-width forms, Unicode spaces, dashes, the small commercial
    at; zero-width characters become spaces; and the letters of other
    alphabets near an ``@`` (Latin, Greek, Cyrillic) become ``a``, so that
    an address written in them (``josé@example.com``, ``alice@bücher.de``)
    is read as one. ASCII text is returned as it is, at once."""
    if text.isascii():
        return text
    table, pattern = _fold_table()
    text = pattern.sub(lambda m: table[m.group()], text)
    return _letters_near_at(text) if "@" in text else text


#: runs of letters of the alphabets addresses are written in beside ASCII
#: (Latin, Greek, Cyrillic; not CJK, whose text has ``@`` in other uses)
_OTHER_LETTERS = re.compile("[\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff"
                            "\u1e00-\u1eff]+")
_AT = re.compile("@")


def _letters_near_at(text: str) -> str:
    """Letters of other scripts within :data:`SEAM_CHARS` of an ``@`` read as ``a``
    (an e-mail address is no longer than that on either side, as the seams read it)."""
    if _OTHER_LETTERS.search(text) is None:  # nothing to fold (Chinese text with @ in it)
        return text
    out, done = [], 0
    for m in _AT.finditer(text):
        lo, hi = max(done, m.start() - SEAM_CHARS), min(len(text), m.end() + SEAM_CHARS)
        if hi <= done:
            continue
        out.append(text[done:lo])
        out.append(_OTHER_LETTERS.sub(lambda m: "a" * len(m.group()), text[lo:hi]))
        done = hi
    out.append(text[done:])
    return "".join(out)


#: characters that show nothing (format controls, the soft hyphen, joiners,
#: variation selectors, tag characters) or only mark the one before them (the
#: combining accents, the keycap of ``4️⃣``): a text holding one is also read
#: without them
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
                        "\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0"
                        "\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
                        "\U000e0000-\U000e007f\U000e0100-\U000e01ef]")


def without_invisible(text: str) -> str | None:
    """``text`` without the characters that show nothing; None when it holds none.
    (:func:`shown_at` says where each character left was in ``text``.)"""
    if text.isascii() or _INVISIBLE.search(text) is None:
        return None
    return _INVISIBLE.sub("", text)


def shown_at(text: str) -> list[int]:
    """Where each character of ``without_invisible(text)`` is in ``text``
    (asked only for a hit: a text of combining accents can be long)."""
    return [i for i, ch in enumerate(text) if not _INVISIBLE.match(ch)]


#: how much of each side of a seam between two texts is read joined (the
#: longest value split there that is found: an IBAN with its spaces, an
#: e-mail address of common length)
SEAM_CHARS = 64


def _side(texts: Sequence[str], i: int, tail: bool) -> tuple[str, str]:
    """The end of ``texts[:i + 1]`` (``tail``) or the start of ``texts[i:]``,
    read as one text: up to :data:`SEAM_CHARS` characters, running on
    through short texts, cut where a word or number begins or ends (a cut
    through one would read a part of it as a whole). Twice, of the same
    length: as written, and :func:`apart` where it runs on through texts."""
    text = apart_text = texts[i]
    if len(text) < SEAM_CHARS:  # run on through the short texts beyond
        got = [text]
        n = len(text)
        step = -1 if tail else 1
        i += step
        while 0 <= i < len(texts) and n < SEAM_CHARS:
            got.append(texts[i])
            n += len(texts[i])
            i += step
        if tail:
            got.reverse()
        text, apart_text = "".join(got), apart(got)
    if len(text) <= SEAM_CHARS:
        return text, apart_text
    if tail:
        cut = len(text) - SEAM_CHARS
        if text[cut - 1].isalnum():  # on past the word or number cut through
            m = _NOT_ALNUM.search(text, cut)
            cut = len(text) if m is None else m.start()
        return text[cut:], apart_text[cut:]
    cut = SEAM_CHARS
    if text[cut].isalnum():  # back to before the word or number cut through
        m = _BEFORE_LAST_NOT_ALNUM.match(text, 0, cut + 1)
        cut = 0 if m is None else m.end()
    return text[:cut], apart_text[:cut]


def apart(texts: Sequence[str]) -> str:
    """``texts`` joined, the same length as written, but where a letter meets
    a digit that letter is read as a space. A value split between texts
    meets itself as written (``alice1`` + ``@example.com``, ``DE`` +
    ``89 3704 ...``), but a word written up against a number may be another
    text: ``1111 1111`` + ``what is my balance?`` reads as the one token
    ``1111what``, and a card split before it is lost. So the seams read both."""
    out = list(texts)
    for k in range(len(out) - 1):
        a, b = out[k], out[k + 1]
        if not a or not b:
            continue
        if a[-1].isalpha() and b[0].isdigit():
            out[k] = a[:-1] + " "
        elif a[-1].isdigit() and b[0].isalpha():
            out[k + 1] = " " + b[1:]
    return "".join(out)


_NOT_ALNUM = re.compile(r"[\W_]")
#: the longest start ending with a character that is no letter or digit
_BEFORE_LAST_NOT_ALNUM = re.compile(r"[\s\S]*[\W_]")
_GROUP_END = re.compile(r"(?:^|[^0-9])[0-9]{4}$")
_GROUP_START = re.compile(r"[0-9]{4}(?:[^0-9]|$)")


def seams(texts: Sequence[str], direct: bool = True,
          budget: Budget | None = None) -> Iterator[tuple[int, str, int]]:
    """``(i, joined, at)`` for each seam between ``texts[i]`` and the next
    text: the end of the texts up to ``i`` and the start of the rest joined
    as a model reads them, and where they meet in ``joined`` (a value split
    over several short texts is read whole). Two groups of four digits
    meeting are joined both directly and with a space, or the ``-`` or ``.``
    the groups before the seam have (a card split as ``4111 1111`` +
    ``1111 1111``, ``4111-1111`` + ``1111-1111`` or ``41111111`` + ``11111111``); other
    digits only directly (with a space, ``2`` + ``011-09-16`` reads as
    a phone number). Each join is also read :func:`apart` when that
    differs. ``direct`` False: only the joins with a space."""
    kept = [(i, t) for i, t in enumerate(texts) if t]
    only = [t for _, t in kept]
    for k in range(len(only) - 1):
        if budget is not None and not k % 64:
            budget.check()
        spaced = only[k][-1].isdigit() and only[k + 1][0].isdigit()
        if not direct and not spaced:
            continue
        (left, left_apart), (right, right_apart) = _side(only, k, True), _side(only, k + 1, False)
        if not left or not right:  # one long token at the seam: nothing split there is read
            continue
        if direct:
            joined, other = left + right, apart((left_apart, right_apart))
            yield kept[k][0], joined, len(left)
            if other != joined:
                yield kept[k][0], other, len(left)
        if spaced and _GROUP_END.search(left, len(left) - 5) and _GROUP_START.match(right):
            # with the separator its groups have before the seam (4111-1111 + 1111-1111), else a space
            sep = left[-5] if len(left) > 4 and left[-5] in "-." else " "
            yield kept[k][0], left + sep + right, len(left)
            if left_apart != left or right_apart != right:
                yield kept[k][0], left_apart + sep + right_apart, len(left)


def _neighbours(text: str, start: int, end: int) -> tuple[str, str]:
    return (text[start - 1] if start > 0 else ""), (text[end] if end < len(text) else "")


def _inside_token(text: str, start: int, end: int) -> bool:
    """True when the span continues a larger dotted/dashed token (IPs, UUIDs, versions).

    A word of letters glued before it by one of those separators is a label,
    not more of the token: ``Card:4111…``, ``tel:+1415…``, ``pan-4111…``,
    ``ip:8.8.4.4`` are read as the value they name (not after a ``/``: a
    URL's path segment is an id more often than a label)."""
    before, after = _neighbours(text, start, end)
    if before in ".-_/:" and start > 1 and text[start - 2].isalnum() and (
            before == "/" or not _label_before(text, start - 1)):
        return True  # (after a ``/``: a URL's path segment, an id more often than a value named)
    if after in ".-_/:" and end + 1 < len(text) and text[end + 1].isalnum():
        return True
    return _glued(before) or _glued(after)


#: scripts written without spaces between words (Thai, Lao, Myanmar, Khmer,
#: CJK, kana, Hangul): a number written against their letters stands apart
#: (``カード番号は4539578763621486です``)
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u2e80-\u9fff\ua960-\ua97f"
                       "\uac00-\ud7ff\uf900-\ufaff\uff66-\uff9f]")


def _glued(ch: str) -> bool:
    """Whether a letter or digit ``ch`` next to a value makes it part of a longer token."""
    return ch.isalnum() and _UNSPACED.match(ch) is None


def _label_before(text: str, sep: int) -> bool:
    """True when the run of letters and digits ending just before ``text[sep]``
    is letters, perhaps with one digit after them (a label or a scheme:
    ``card``, ``tel``, ``cc_number``'s ``number``, ``ipv4``, ``card2``), not a
    piece of a number, a version or a hash (``sha256``, ``abc123``)."""
    if sep > 1 and text[sep - 2:sep].isdigit():  # two digits: a number's end, at once (dotted numbers are many)
        return False
    i = sep
    while i > 0 and text[i - 1].isalnum():
        i -= 1
    run = text[i:sep]
    return run.isalpha() or (len(run) > 1 and run[:-1].isalpha() and run[-1].isdigit())


# ----------------------------------------------------------------- validators


def _in_digit_groups(text: str, start: int, end: int) -> bool:
    """True when more digit groups continue the span (an IBAN, a table of numbers)."""
    if start >= 2 and text[start - 1] in " .-" and text[start - 2].isdigit():
        return True
    return end + 1 < len(text) and text[end] in " .-" and text[end + 1].isdigit()


_FILE_EXTENSIONS = frozenset(
    [
        "png",
        "jpg",
        "jpeg",
        "gif",
        "svg",
        "webp",
        "ico",
        "bmp",
        "tif",
        "tiff",
        "js",
        "mjs",
        "jsx",
        "ts",
        "tsx",
        "css",
        "scss",
        "less",
        "json",
        "yaml",
        "yml",
        "toml",
        "xml",
        "html",
        "htm",
        "txt",
        "csv",
        "log",
        "lock",
        "exe",
        "dll",
        "zip",
        "gz",
        "tgz",
        "tar",
        "pdf",
        "py",
        "pyc",
        "rb",
        "java",
        "kt",
        "class",
        "wasm",
        "map",
        "ini",
        "cfg",
        "conf",
        "bak",
        "tmp",
        "md5",
        "sha1",
        "sha256",
    ]
)
_EMAIL = re.compile(r"([A-Za-z0-9._%+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)", re.ASCII)


def email(text: str, start: int, end: int) -> Verdict:
    m = _EMAIL.fullmatch(text, start, end)
    if m is None:
        return NONE
    local, domain = m.group(1).strip("."), m.group(2)
    labels = domain.split(".")
    if not local or ".." in local or len(labels) < 2:
        return NONE
    if any(not lab or lab[0] == "-" or lab[-1] == "-" for lab in labels):
        return NONE
    tld = labels[-1]
    if not tld.isalpha() or tld.lower() in _FILE_EXTENSIONS:
        return NONE
    if end + 1 < len(text) and text[end] == ":" and not text[end + 1].isspace():
        return NONE  # git@github.com:org/repo: an scp-style SSH target, not a mailbox
    return CONFIRMED


def card_issuer(d: str) -> str | None:
    """The issuer whose IIN range and lengths admit ``d`` (digits only), if any."""
    n = len(d)
    p2, p3, p4, p6 = int(d[:2]), int(d[:3]), int(d[:4]), int(d[:6])
    if d[0] == "4" and n in (13, 16, 19):
        return "visa"
    if (51 <= p2 <= 55 or 2221 <= p4 <= 2720) and n == 16:
        return "mastercard"
    if p2 in (34, 37) and n == 15:
        return "amex"
    if (p4 == 6011 or 644 <= p3 <= 649 or p2 == 65 or 622126 <= p6 <= 622925) and 16 <= n <= 19:
        return "discover"
    # JCB's assigned range is 3528-3589; the whole 35 block is taken, as generators do.
    if (p2 == 35 and 16 <= n <= 19) or (p4 in (2131, 1800) and n == 15):
        return "jcb"
    if (300 <= p3 <= 305 or p4 == 3095 or p2 in (36, 38, 39)) and 14 <= n <= 19:
        return "diners"
    if 2200 <= p4 <= 2204 and 16 <= n <= 19:
        return "mir"
    if p2 == 62 and 16 <= n <= 19:
        return "unionpay"
    if (p2 == 50 or 56 <= p2 <= 69) and 12 <= n <= 19:
        return "maestro"
    return None


_CARD_GROUPS = {(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4), (4, 4, 5), (4, 4, 4, 1)}


def _card_digits(digits: str, grouped: bool) -> Verdict:
    """The verdict on a card's digits (``grouped``: written in groups)."""
    if not luhn.is_valid(digits):
        return NONE
    if card_issuer(digits):
        if not grouped and len(digits) == 13 and ean.is_valid(digits):
            return UNKNOWN  # as likely a product barcode as a 13-digit Visa
        return CONFIRMED
    return UNKNOWN if grouped else NONE


def card(text: str, start: int, end: int) -> Verdict:
    """Plain, or grouped like a card with one space or one ``-`` throughout.
    Another number written next to it (a quantity or a row number before,
    an expiry or a CVC after: groups of fewer than four digits at the ends,
    or a run of groups with the other separator) is left out."""
    if _inside_token(text, start, end) or _in_digit_groups(text, start, end):
        return NONE  # four groups inside a longer run (an IBAN's BBAN) are not a card
    tokens = _CARD_SPLIT.split(text[start:end])
    if len(tokens) == 1:
        return _card_digits(tokens[0], False)
    # runs of groups with one separator throughout, the longest first
    runs: list[list[str]] = [[tokens[0]]]
    for k in range(1, len(tokens), 2):
        if k > 1 and tokens[k] != tokens[k - 2]:
            runs.append([tokens[k - 1]])
        runs[-1].append(tokens[k + 1])
    best = NONE
    for parts in sorted(runs, key=len, reverse=True):
        verdict = _card_run(parts)
        if verdict is CONFIRMED:
            return verdict
        if verdict is UNKNOWN:
            best = verdict
    return best


_CARD_SPLIT = re.compile(r"([ -])")


def _card_run(parts: list[str]) -> Verdict:
    """The verdict on groups written with one separator: the whole run,
    else the run without up to two groups of fewer than four digits at
    either end (a number written next to the card)."""
    if tuple(len(g) for g in parts) in _CARD_GROUPS:
        verdict = _card_digits("".join(parts), True)
        if verdict is not NONE:
            return verdict
    best = NONE
    for lo in range(3):
        for hi in range(len(parts), max(lo, len(parts) - 3), -1):
            if not (lo or hi < len(parts)) or not all(len(g) < 4 for g in parts[:lo] + parts[hi:]):
                continue
            inner = parts[lo:hi]
            if len(inner) == 1 and 13 <= len(inner[0]) <= 19:
                verdict = _card_digits(inner[0], False)
            elif tuple(len(g) for g in inner) in _CARD_GROUPS:
                verdict = _card_digits("".join(inner), True)
            else:
                continue
            if verdict is CONFIRMED:
                return verdict
            if verdict is UNKNOWN:
                best = verdict
    return best


#: what else separates a card's groups, written by hand or pasted from a
#: form: one or two spaces or tabs (mixed), a dot, or a line break (once)
_CARD_SEP = r"(?:[ \t]{1,2}|\.|[ \t]?\r?\n[ \t]?)"
#: another four-digit group before or after, with such a separator: a row of a table
_SPACED_BEFORE = re.compile(r"(?:^|[^0-9])[0-9]{4}(?:[ \t]{1,2}|[ \t]?\r?\n[ \t]?)$")
_SPACED_AFTER = re.compile(r"(?:[ \t]{1,2}|[ \t]?\r?\n[ \t]?)[0-9]{4}(?:[^0-9]|$)")


def card_spaced(text: str, start: int, end: int) -> Verdict:
    """Four groups of four (or 4-4-4-4-3, 4-6-5, 4-6-4, 4-4-5) separated by spaces and tabs
    (one or two, mixed, at most one line break) or by dots throughout; not
    one row of a table of such numbers (the same separator and digits
    before or after it)."""
    raw = text[start:end]
    seps = _CARD_SEPARATOR.findall(raw)
    if all(sep == " " for sep in seps) or _inside_token(text, start, end):
        return NONE  # one space throughout: the ``card`` rule's
    if all(sep == "." for sep in seps):
        if (start >= 2 and text[start - 1] == "." and text[start - 2].isdigit()) or \
                (end + 1 < len(text) and text[end] == "." and text[end + 1].isdigit()):
            return NONE
    elif any(sep.strip() for sep in seps) or raw.count("\n") > 1:
        return NONE
    elif _SPACED_BEFORE.search(text[max(0, start - 10):start]) or _SPACED_AFTER.match(text[end:end + 10]):
        return NONE
    if tuple(len(g) for g in _CARD_SEPARATOR.split(raw)) not in _CARD_GROUPS:
        return NONE
    return _card_digits("".join(c for c in raw if c.isdigit()), True)


_CARD_SEPARATOR = re.compile(r"[^0-9]+")


def iban(text: str, start: int, end: int) -> Verdict:
    groups = text[start:end].upper().split()  # written in lower case too
    # The pattern may run on into following upper-case words: try shorter prefixes.
    for k in range(len(groups), 0, -1):
        candidate = "".join(groups[:k])
        if len(candidate) < 15:
            break
        if std_iban.is_valid(candidate):
            return CONFIRMED
    return NONE


def us_ssn(text: str, start: int, end: int) -> Verdict:
    raw = text[start:end]
    tail = re.search(r"\d{3}[- ]?\d{2}[- ]?\d{4}$", raw, re.ASCII)
    if tail is None:
        return NONE
    number = tail.group(0)
    seps = [c for c in number if not c.isdigit()]
    if seps and (len(seps) != 2 or seps[0] != seps[1]):
        return NONE
    if len(seps) == 0 and tail.start() == 0:
        return NONE  # a bare nine-digit number needs the keyword
    digits = number.replace("-", "").replace(" ", "")
    if ssn.is_valid(digits) or itin.is_valid(digits):
        return CONFIRMED
    return NONE


#: regions tried for a national-format number (trunk prefix 0), most used first
_TRUNK_REGIONS = ("GB", "DE", "FR", "IT", "ES", "NL", "BE", "AT", "CH", "SE", "IE", "AU", "IN")
#: regions tried for a number with no trunk or international prefix (NANP first;
#: Italian mobiles and Indian, Brazilian, Chinese numbers are also written so)
_PLAIN_REGIONS = ("US", "IT", "IN", "BR", "CN")


def phone(text: str, start: int, end: int, plain_regions: Sequence[str] = ("US",)) -> Verdict:
    """libphonenumber's verdict on a formatted candidate.

    A number with ``+``/``00`` is parsed internationally; one with a trunk ``0``
    against common trunk-prefix regions; any other against ``plain_regions``
    (NANP only, unless a keyword said it is a phone: a 3-3-4 number is American,
    and trying more regions would make almost any digit string valid somewhere).
    """
    raw = text[start:end]
    if _inside_token(text, start, end) or _in_digit_groups(text, start, end):
        return NONE
    digits = sum(c.isdigit() for c in raw)
    if digits < 7 or _DATE.fullmatch(raw) or _NOT_A_PHONE.fullmatch(raw):
        return NONE
    if "." in raw and raw[0] not in "+0(" and not _NANP_DOTTED.fullmatch(raw):
        return NONE  # 15.35.160: a version; dotted NANP numbers are 415.555.0100
    if raw.startswith("00"):
        raw = "+" + raw[2:]
    regions: Sequence[str | None]
    if raw.startswith("+"):
        regions = (None,)
    elif raw.lstrip("(").startswith("0"):
        regions = _TRUNK_REGIONS
    else:
        regions = plain_regions
    best = NONE
    for region in regions:
        try:
            num = phonenumbers.parse(raw, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(num):
            return CONFIRMED
        if best is NONE and phonenumbers.is_possible_number(num):
            best = UNKNOWN
    return best


#: a date written with separators (03.12.2024, 2024-12-03, 12/03/24, 03 12 2024): never a phone
_DATE = re.compile(
    r"(?:0?[1-9]|[12][0-9]|3[01])[ ./-](?:0?[1-9]|1[0-2])[ ./-](?:19|20)?[0-9]{2}"
    r"|(?:0?[1-9]|1[0-2])[ ./-](?:0?[1-9]|[12][0-9]|3[01])[ ./-](?:19|20)?[0-9]{2}"
    r"|(?:19|20)[0-9]{2}[ ./-](?:0?[1-9]|1[0-2])[ ./-](?:0?[1-9]|[12][0-9]|3[01])",
    re.ASCII,
)


#: shapes of other numbers: a Brazilian CPF (069.130.680-08), dots mixed with dashes
_NOT_A_PHONE = re.compile(r"[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}|.*\..*-.*|.*-.*\..*", re.ASCII)
_NANP_DOTTED = re.compile(r"(?:1[ .-]?)?[0-9]{3}\.[0-9]{3}\.[0-9]{4}(?:[ \t]{0,3}(?:x|ext\.?)[ \t]{0,3}[0-9]+)?",
                          re.ASCII | re.IGNORECASE)


def phone_grouped(text: str, start: int, end: int) -> Verdict:
    """A number written in groups the way much of the world writes phone
    numbers without a country code: a trunk ``0`` and groups of 2-4 digits
    (``07700 900 123``, ``0612 34 56 78``, ``030 123 45 67``), or a
    parenthesised area code (``(21) 555-0199``). Valid somewhere likely:
    confirmed; otherwise, being phone-shaped with separators, at least
    unknown when it has 8 to 12 digits (a plausible length) and is no date."""
    verdict = phone(text, start, end, _PLAIN_REGIONS)
    if verdict is not NONE:
        return verdict
    raw = text[start:end]
    if (_inside_token(text, start, end) or _in_digit_groups(text, start, end) or _DATE.fullmatch(raw)
            or _NOT_A_PHONE.fullmatch(raw)):
        return NONE
    return UNKNOWN if 8 <= sum(c.isdigit() for c in raw) <= 12 else NONE


def phone_after_keyword(text: str, start: int, end: int) -> Verdict:
    """A number right after "phone:", "call me at"...: the keyword stands in for formatting.

    libphonenumber's valid numbers are confirmed. A number of seven digits or
    more that it rejects (a typo, a plan it does not know, a made-up ``00``
    prefix) is still what the writer called a phone number: unknown, never
    none, so that the policy keeps it local."""
    m = re.search(
        r"[+(]?[0-9][0-9 ().-]*(?:[ \t]{0,3}(?:x|ext\.?)[ \t]{0,3}[0-9]+)?$",
        text[start:end],
        re.ASCII | re.IGNORECASE,
    )
    if m is None:
        return NONE
    num_start = start + m.start()
    verdict = phone(text, num_start, end, _PLAIN_REGIONS)
    if verdict is NONE and not _inside_token(text, num_start, end):
        if sum(c.isdigit() for c in text[num_start:end]) >= 7:
            return UNKNOWN
    return verdict


def phone_bare(text: str, start: int, end: int) -> Verdict:
    """``0`` + 9-10 digits, no separators: how much of Europe writes a phone number,
    but also a zero-padded identifier. At most unknown, and only if valid somewhere."""
    if _inside_token(text, start, end) or _in_digit_groups(text, start, end):
        return NONE
    return UNKNOWN if phone(text, start, end) is CONFIRMED else NONE


_PORT = re.compile(r":[0-9]{1,5}(?![0-9A-Za-z:.])")


def ip_address(text: str, start: int, end: int) -> Verdict:
    raw = text[start:end]
    before, after = _neighbours(text, start, end)
    if after == "." and end + 1 < len(text) and text[end + 1].isdigit():
        return NONE  # 1.2.3.4.5: a version or OID, not an address
    port = after == ":" and "." in raw and _PORT.match(text, end) is not None  # 8.8.4.4:53
    if (before == "." or (before == ":" and not _label_before(text, start - 1)) or (after == ":" and not port)
            or _glued(before) or _glued(after)):
        return NONE  # part of a longer dotted or colon-separated token (a::b::c, OIDs); ip:8.8.4.4 is one
    if "." in raw:
        octets = raw.split(".")
        if any(len(o) > 1 and o[0] == "0" for o in octets):
            return NONE  # 010.1.1.1: not an address ipaddress accepts
        a, b = int(octets[0]), int(octets[1])
        # Fast path for the ranges logs are full of; ipaddress decides the rest.
        if a in (0, 10, 127) or a >= 224 or (a, b) == (192, 168) or (a, b) == (169, 254):
            return NONE
        if a == 172 and 16 <= b <= 31:
            return NONE
    try:
        addr = ipaddress.ip_address(raw)
    except ValueError:
        return NONE
    if addr.version == 6 and addr not in _GLOBAL_UNICAST:
        return NONE  # only 2000::/3 is allocated for global unicast
    return CONFIRMED if addr.is_global else NONE


_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


def _stdnum(*modules: object, tail: str = r"[0-9][0-9 .-]*$") -> Validator:
    """Confirmed when one of the python-stdnum ``modules`` validates the number at the end."""

    def validate(text: str, start: int, end: int) -> Verdict:
        raw = text[start:end]
        m = re.search(tail, raw, re.ASCII)
        if m is None:
            return NONE
        value = m.group(0)
        for mod in modules:
            if mod.is_valid(value):  # type: ignore[attr-defined]
                return CONFIRMED
        return NONE

    return validate


def _distinct_stdnum(*modules: object) -> Validator:
    inner = _stdnum(*modules, tail=r"^.*$")

    def validate(text: str, start: int, end: int) -> Verdict:
        if _inside_token(text, start, end) or _in_digit_groups(text, start, end):
            return NONE
        return inner(text, start, end)

    return validate


def always_confirmed(text: str, start: int, end: int) -> Verdict:
    return CONFIRMED


def _b64url_json(segment: str) -> object:
    padded = segment + "=" * (-len(segment) % 4)
    return json.loads(base64.urlsafe_b64decode(padded))


def jwt(text: str, start: int, end: int) -> Verdict:
    header = text[start:end].split(".", 1)[0]
    try:
        decoded = _b64url_json(header)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return UNKNOWN
    return CONFIRMED if isinstance(decoded, dict) and "alg" in decoded else UNKNOWN


_PLACEHOLDER = re.compile(
    r"(?i)x{4,}|\*{3,}|changeme|change_me|example|placeholder|redacted|dummy|your[_-]|"
    r"<|\$\{|\{\{|environ|getenv|env\.|process\.env|secrets\.|settings\.|config\.|none|null|"
    r"true|false|password|secret|token"
)


def _entropy(s: str) -> float:
    counts: dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    n = len(s)
    return -sum(k / n * math.log2(k / n) for k in counts.values())


def secret_assignment(text: str, start: int, end: int) -> Verdict:
    raw = text[start:end]
    m = re.search(r"[:=][ \t]{0,3}[\"']?([^ \t\"']+)$", raw)
    if m is None:
        return NONE
    value = m.group(1)
    if _PLACEHOLDER.search(value) or value.isdigit() or value.isalpha():
        return NONE
    if "." in value and value.replace(".", "").replace("_", "").isalnum() and "(" not in value:
        # attribute access (self.api_key = cfg.key) is code, not a literal
        if value.count(".") >= 1 and not any(c.isdigit() for c in value):
            return NONE
    kinds = sum(
        (
            any(c.islower() for c in value),
            any(c.isupper() for c in value),
            any(c.isdigit() for c in value),
            any(not c.isalnum() for c in value),
        )
    )
    if kinds >= 3 and _entropy(value) >= 3.0:
        return UNKNOWN
    return NONE


# ---------------------------------------------------------------------- rules

_TOKENS = "|".join(
    (
        r"gh[pousr]_[A-Za-z0-9]{36}",
        r"github_pat_[A-Za-z0-9_]{60,100}",
        r"glpat-[A-Za-z0-9_-]{20}",
        r"xox[abposr]-[A-Za-z0-9-]{10,200}",
        r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,120}",
        r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,200}",
        r"sk-ant-(?:api|admin)[0-9]{2}-[A-Za-z0-9_-]{20,200}",
        r"hf_[A-Za-z]{30,40}",
        r"npm_[A-Za-z0-9]{36}",
        r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,300}",
        r"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}",
        r"dapi[0-9a-f]{32}",
        r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
        r"do[por]_v1_[a-f0-9]{64}",
        r"ya29\.[0-9A-Za-z_-]{20,300}",
        r"AIza[0-9A-Za-z_-]{35}",
        r"(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}",
    )
)

#: national IDs whose written form is distinctive: (name, pattern, python-stdnum module)
_NATIONAL_IDS: tuple[tuple[str, str, object], ...] = (
    ("es_dni", r"[0-9]{8}-?[A-Z]", dni),
    ("es_nie", r"[XYZ]-?[0-9]{7}-?[A-Z]", nie),
    ("it_codice_fiscale", r"[A-Z]{6}[0-9]{2}[A-Z][0-9]{2}[A-Z][0-9]{3}[A-Z]", codicefiscale),
    ("br_cpf", r"[0-9]{3}\.[0-9]{3}\.[0-9]{3}-[0-9]{2}", cpf),
    ("ch_ahv", r"756\.[0-9]{4}\.[0-9]{4}\.[0-9]{2}", ch_ssn),
    ("in_aadhaar", r"[2-9][0-9]{3} [0-9]{4} [0-9]{4}", aadhaar),
    ("fi_hetu", r"[0-9]{6}[-+A-FU-Y][0-9]{3}[0-9A-Y]", hetu),
    ("se_personnummer", r"(?:19|20)?[0-9]{6}[-+][0-9]{4}", personnummer),
    ("cn_ric", r"[1-9][0-9]{16}[0-9X]", ric),
)
#: words that may sit between a keyword and its number ("SSN is", "PESEL nr.")
FILLER = r"[^0-9A-Za-z]{0,8}(?:(?:is|was|number|no|nr|num|id|of|me)[^0-9A-Za-z]{1,8}){0,3}"

RULES: tuple[Rule, ...] = (
    # Cheap, unambiguous rules first: the first confirmed hit ends the request.
    Rule(
        "secret",
        Pattern("private_key", r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"),
        always_confirmed,
    ),
    # no trailing \b: several token alphabets end in "-" or "_"
    Rule("secret", Pattern("service_token", rf"\b(?:{_TOKENS})"), always_confirmed),
    Rule(
        "secret",
        Pattern(
            "cloud_secret",
            r"(?:aws_?secret_?access_?key|aws_?secret)[\"']?[ \t]{0,3}[:=][ \t]{0,3}[\"']?"
            r"[A-Za-z0-9/+]{40}"
            r"|AccountKey=[A-Za-z0-9+/]{86}==",
            caseless=True,
        ),
        always_confirmed,
    ),
    Rule(
        "secret",
        Pattern(
            "slack_webhook",
            r"https://hooks\.slack\.com/services/T[A-Z0-9]{6,12}/B[A-Z0-9]{6,12}/[A-Za-z0-9]{20,30}",
        ),
        always_confirmed,
    ),
    Rule(
        "secret",
        Pattern("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{0,600}"),
        jwt,
    ),
    Rule(
        "email",
        Pattern(
            "email",
            r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}"
            r"\.[A-Za-z]{2,24}\b",
        ),
        email,
    ),
    Rule("card", Pattern("card", r"\b(?:[0-9][ -]?){11,18}[0-9]\b"), card),
    Rule(
        "card",
        Pattern(
            "card_spaced",
            # the 19-digit layout first (alternatives are tried in order)
            rf"\b[0-9]{{4}}(?:{_CARD_SEP}[0-9]{{4}}){{3}}{_CARD_SEP}[0-9]{{3}}\b"
            rf"|\b[0-9]{{4}}(?:{_CARD_SEP}[0-9]{{4}}){{3}}\b"
            rf"|\b[0-9]{{4}}{_CARD_SEP}[0-9]{{6}}{_CARD_SEP}[0-9]{{4,5}}\b"
            rf"|\b[0-9]{{4}}{_CARD_SEP}[0-9]{{4}}{_CARD_SEP}[0-9]{{5}}\b",
        ),
        card_spaced,
    ),
    Rule(
        "iban",
        Pattern("iban", r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}\b", caseless=True),
        iban,
    ),
    Rule("ssn", Pattern("ssn", r"\b[0-9]{3}[- ][0-9]{2}[- ][0-9]{4}\b"), us_ssn),
    Rule(
        "ssn",
        Pattern(
            "ssn_keyword",
            rf"\b(?:ssn|social{WS}{{1,4}}security(?:{WS}{{1,4}}(?:number|no))?){FILLER}"
            r"[0-9]{3}[- ]?"
            rf"[0-9]{{2}}"
            rf"[- ]?[0-9]{{4}}\b",
            caseless=True,
        ),
        us_ssn,
    ),
    Rule("ip", Pattern("ipv4", r"\b(?:[0-9]{1,3}\.){3}[0-9]{1,3}\b"), ip_address),
    Rule(
        "ip",
        Pattern(
            "ipv6",
            # eight groups, or fewer around one "::" (times like 12:30:45 are neither)
            r"\b(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}\b"
            r"|\b(?:[0-9A-Fa-f]{1,4}:){1,6}(?::[0-9A-Fa-f]{1,4}){1,6}\b"
            # a prefix written with its trailing "::" (2a00:1450:4001::)
            r"|\b(?:[0-9A-Fa-f]{1,4}:){2,7}:",
        ),
        ip_address,
    ),
    *(
        Rule(
            "national_id",
            Pattern(f"national_id_{name}", rf"\b(?:{regex})\b"),
            _distinct_stdnum(module),
        )
        for name, regex, module in _NATIONAL_IDS
    ),
    Rule(
        "national_id",
        Pattern(
            "national_id_keyword",
            rf"\b(?:bsn|burgerservicenummer|pesel|steuer-?id|idnr|identifikationsnummer|aadhaa?r"
            rf"|nhs{WS}{{1,4}}(?:number|no)|social{WS}{{1,4}}insurance{WS}{{1,4}}(?:number|no)|sin){FILLER}"
            r"[0-9](?:[ -]?[0-9]){8,11}\b",
            caseless=True,
        ),
        _stdnum(bsn, pesel, idnr, nhs, sin, aadhaar),
    ),
    Rule(
        "secret",
        Pattern(
            "secret_assignment",
            r"\b(?:[A-Za-z0-9]{1,20}[_-]){0,3}(?:password|passwd|pwd|secret|client_?secret|api_?key|apikey"
            r"|access_?token"
            r"|auth_?token|secret_?key|private_?key)[\"']?[ \t]{0,3}[:=][ \t]{0,3}[\"']?"
            r"[A-Za-z0-9/+_.=!@#$%^&*~-]{11,200}[A-Za-z0-9]\b",
            caseless=True,
        ),
        secret_assignment,
    ),
    # Names, addresses, dates of birth and ages in free text (freetext.py).
    *(Rule(entity, pattern, validate) for entity, _rule, pattern, validate in freetext.CUES),  # type: ignore[arg-type]
    # libphonenumber is the slowest validator: last.
    Rule(
        "phone",
        Pattern(
            "phone_keyword",
            rf"\b(?:(?:phone|tel|telephone|mobile|cell|fax|whatsapp|contact|(?:call|reach|ring|text)"
            rf"{WS}(?:me|us))\b|tel\.)"
            r"[^0-9A-Za-z+(.]{0,5}(?:[A-Za-z]{1,8}[ \t]){0,3}[+(]?[0-9][0-9 ().-]{5,18}[0-9]"
            r"(?:[ \t]{0,3}(?:x|ext\.?)[ \t]{0,3}[0-9]{1,6})?\b",
            caseless=True,
        ),
        phone_after_keyword,
    ),
    Rule(
        "phone",
        Pattern(
            "phone_international",
            r"(?:\+|\b00)[1-9][0-9 ().-]{5,20}[0-9]"
            r"(?:[ \t]{0,3}(?:x|ext\.?)[ \t]{0,3}[0-9]{1,6})?\b",
        ),
        phone,
    ),
    Rule(
        "phone",
        Pattern(
            "phone_national",
            r"(?:\b1[ .-]?)?(?:\([0-9]{2,5}\)[ .-]?|\b[0-9]{2,5}[ .-])[0-9]{2,4}[ .-]?[0-9]{3,4}"
            r"(?:[ \t]{0,3}(?:x|ext\.?)[ \t]{0,3}[0-9]{1,6})?\b",
        ),
        phone,
    ),
    Rule("phone", Pattern("phone_pairs", r"\b0[1-9](?:[ .-][0-9]{2}){4}\b"), phone),
    Rule(
        "phone",
        Pattern(
            "phone_grouped",
            r"\b0[1-9][0-9]{0,4}(?:[ .-][0-9]{2,4}){2,4}\b"
            r"|\([0-9]{2,4}\)[ ]?[0-9]{3,5}[ -][0-9]{3,4}\b",
        ),
        phone_grouped,
    ),
    Rule("phone", Pattern("phone_bare_trunk", r"\b0[1-9][0-9]{7,9}\b"), phone_bare),
)

PATTERNS: tuple[Pattern, ...] = tuple(r.pattern for r in RULES)
#: the shaped identifiers alone (the classifier before free-text rules; the eval's baseline)
SHAPED_RULES: tuple[Rule, ...] = tuple(r for r in RULES if r.entity not in freetext.ENTITIES)


TAGS = check_tags(PII, {CONFIRMED: "pii-confirmed", UNKNOWN: "pii-unknown", NONE: "pii-none"})


def warm_up_phonenumbers() -> None:
    """Make libphonenumber build its per-region tables now, not on a live request."""
    for region in (*_PLAIN_REGIONS, *_TRUNK_REGIONS):
        example = phonenumbers.example_number(region)
        samples = ["0123 456 789", "555-123-4567", "3420837783"]
        if example is not None:
            samples += [
                phonenumbers.format_number(example, fmt)
                for fmt in (
                    phonenumbers.PhoneNumberFormat.NATIONAL,
                    phonenumbers.PhoneNumberFormat.INTERNATIONAL,
                )
            ]
        for sample in samples:
            phone(sample, 0, len(sample), (region,))
            phone("+" + sample, 0, len(sample) + 1)


class PiiDetector:
    """Scan every text once; validate candidates rule by rule; stop at the first confirmed."""

    info = PII
    tags = TAGS

    def warm_up(self) -> None:
        warm_up_phonenumbers()
        _fold_table()

    def __init__(
        self, engine: str | None = None, scanner: Scanner | None = None, rules: Sequence[Rule] = RULES
    ) -> None:
        self.rules = tuple(rules)
        self.scanner = scanner or build_scanner(tuple(r.pattern for r in self.rules), engine)

    @property
    def engine(self) -> str:
        return self.scanner.engine

    def judged(
        self, texts: Sequence[str], budget: Budget | None = None
    ) -> Iterator[tuple[int, Rule, int, int, Verdict]]:
        """Every candidate and its verdict, ``(text index, rule, start, end,
        verdict)``: each text folded, as written when folding changed it,
        and without its invisible characters when it holds some; then the
        candidates crossing a seam between two texts, each reported on the
        text it starts in, from its start to that text's end."""
        folded = [fold(t) for t in texts]
        for i, text in enumerate(folded):
            if budget is not None:
                budget.check()
            if not text:
                continue
            # as written too: a no-break space or a dash folded joins a
            # neighbouring number to a value the text as written keeps apart
            # (``2024\u00a04111 1111 1111 1111``)
            for view in (text,) if text is texts[i] else (text, texts[i]):
                for rule, start, end, verdict in self._judge(view, budget):
                    yield i, rule, start, end, verdict
            shown = without_invisible(texts[i])  # 4111<soft hyphen>1111...: read as shown too
            if shown:
                if budget is not None:
                    budget.check()
                where: list[int] | None = None
                for rule, start, end, verdict in self._judge(fold(shown), budget):
                    where = where or shown_at(texts[i])
                    yield i, rule, where[start], where[end - 1] + 1, verdict
        kept = [i for i, t in enumerate(folded) if t]
        if len(kept) < 2:
            return
        ends = list(itertools.accumulate(len(folded[i]) for i in kept))  # each text's end, all joined
        # many short texts: read them joined, once, rather than each seam's
        # window (which would read more than the texts hold)
        whole = ends[-1] < 2 * SEAM_CHARS * (len(kept) - 1)
        if whole:
            parts = [folded[i] for i in kept]
            joined, other = "".join(parts), apart(parts)
            for view in (joined,) if other == joined else (joined, other):  # and words apart from numbers
                yield from self._crossing(view, [0, *ends[:-1]], kept, ends, budget)
        end_of = dict(zip(kept, ends, strict=True))
        for i, window, at in seams(folded, direct=not whole, budget=budget):
            # where the window starts in the texts joined: text ``i`` ends at ``at`` in it
            yield from self._crossing(window, [0, at], kept, ends, budget, end_of[i] - at)

    def _judge(self, view: str, budget: Budget | None,
               keep: Callable[[int, int], bool] | None = None) -> Iterator[tuple[Rule, int, int, Verdict]]:
        """``(rule, start, end, verdict)`` for each candidate of ``view`` (only
        those ``keep`` keeps, before they are judged); the deadline checked
        every 64 candidates and after each rule (a text can hold thousands)."""
        scan = self.scanner.scan(view)
        for index in scan.fired():
            rule = self.rules[index]
            for n, (start, end) in enumerate(scan.hits(index), 1):
                if keep is None or keep(start, end):
                    yield rule, start, end, rule.validate(view, start, end)
                if budget is not None and not n % 64:
                    budget.check()
            if budget is not None:
                budget.check()

    def _crossing(self, joined: str, seams_at: list[int], kept: list[int], ends: list[int],
                  budget: Budget | None, base: int = 0) -> Iterator[tuple[int, Rule, int, int, Verdict]]:
        """Candidates of ``joined`` that cross one of ``seams_at`` (positions
        in ``joined``, the first 0), each reported on the text it starts
        in: ``(text index, rule, its start there, that text's end, verdict)``.
        ``base``: where ``joined`` starts in all the texts joined, whose
        ends are ``ends``."""
        if budget is not None:
            budget.check()
        if "@" in joined and not joined.isascii():  # an address split between texts: its letters too
            joined = _letters_near_at(joined)

        def crosses(start: int, end: int) -> bool:
            k = bisect.bisect_right(seams_at, start)
            return k < len(seams_at) and seams_at[k] < end

        for rule, start, end, verdict in self._judge(joined, budget, crosses):
            t = bisect.bisect_right(ends, base + start)  # the text it starts in
            first = ends[t - 1] if t else 0
            yield kept[t], rule, base + start - first, ends[t] - first, verdict

    def detect(
        self, texts: Sequence[str], roles: Sequence[str], unreadable: int, budget: Budget
    ) -> Detection:
        unknown: list[str] = []
        for _, rule, _, _, verdict in self.judged(texts, budget):
            if verdict is CONFIRMED:
                return Detection(CONFIRMED, [rule.entity])
            if verdict is UNKNOWN and rule.entity not in unknown:
                unknown.append(rule.entity)
        if unknown:
            return Detection(UNKNOWN, unknown)
        if unreadable:
            return Detection(UNKNOWN, ["unreadable"])
        return Detection(NONE)


def explain(
    detector: PiiDetector, texts: Sequence[str]
) -> list[tuple[int, str, str, int, int, Verdict]]:
    """Every candidate judged confirmed or unknown, ``(text index, entity, rule, start, end,
    verdict)``: what was found and which rule found it, never the text (for ``kinfctl classify
    --explain``; the service stops at the first confirmed hit instead)."""
    out = sorted({(i, rule.entity, rule.pattern.name, start, end, verdict)
                  for i, rule, start, end, verdict in detector.judged(texts) if verdict is not NONE},
                 key=lambda f: (f[0], f[3], f[4], f[1], f[2]))
    return out


def findings(text: str, engine: str | None = None) -> list[tuple[str, str, int, int, Verdict]]:
    """Every judged candidate of one text, ``(entity, pattern, start, end, verdict)``.

    For tools and tests (the service stops at the first confirmed hit instead).
    """
    scanner = build_scanner(PATTERNS, engine)
    text = fold(text)
    scan = scanner.scan(text)
    out = []
    for index in scan.fired():
        rule = RULES[index]
        for start, end in scan.hits(index):
            out.append(
                (rule.entity, rule.pattern.name, start, end, rule.validate(text, start, end))
            )
    return out
