"""Candidate finding: one multi-pattern scan (hyperscan) or a pure-``re`` fallback.

A :class:`Pattern` is a regular expression written in the subset that
Hyperscan and Python's ``re`` read the same way: ASCII only, no look-around,
no back-references, explicit character classes (``[ \\t]`` rather than
``\\s``, whose membership differs between engines), ``\\b`` only as an ASCII
word boundary. Both engines therefore accept the same language.

*Hits* are defined by the ``re`` semantics, so the two paths agree by
construction: for each pattern, the hits are exactly
``regex.finditer(text)`` (leftmost, non-overlapping). The fallback computes
that directly. The Hyperscan path scans the text once for all patterns
and then emulates ``finditer`` using only the reports:

- if no report ends after the current position, no further match exists
  (every match ends somewhere and Hyperscan reports every end offset), so the
  scan stops without running ``re`` on the rest of the text;
- otherwise the next ``finditer`` match cannot start before the smallest
  start bound among reports ending after the position (a match ``[p, e)``
  makes Hyperscan report ``e``, whose bound is ``<= p``), so
  ``regex.search`` starts there and never re-reads clean text.

Clean text, the common case, costs one Hyperscan scan and no ``re`` work at
all. The property the construction relies on (Hyperscan reports a superset of
``re``'s match ends) is checked by a differential test on generated text.

Start offsets: a bounded pattern (longest match ``W`` characters, computed
from the regex) needs no start tracking, since a match ending at ``e``
starts at or after ``e - W``; ``re`` then searches only the windows
``[e - W, e)`` around reports (see ``_HsScan._hits_bounded``). Only unbounded
patterns are compiled with ``HS_FLAG_SOM_LEFTMOST``, which costs Hyperscan
several times more per byte.

The fallback exists for platforms without the Hyperscan wheel; it is about
thirty times slower (bench: ~7 ms for 8 KB of log-heavy text against ~0.2 ms),
so large prompts there hit the deadline and get the failure tag: slow, but
still closed.

Non-ASCII text: Hyperscan scans bytes. Every non-ASCII character (and lone
surrogate) is replaced by one ``\\x1a`` byte before the scan, so byte offsets
equal character offsets, and ``\\x1a`` behaves like a non-ASCII character for
every pattern (not a word character, not in any positive class; patterns must
not mention ``\\x1a``).
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

_SUB = "\x1a"


def _substitute(exc: UnicodeError) -> tuple[str, int]:
    assert isinstance(exc, UnicodeEncodeError)
    return _SUB * (exc.end - exc.start), exc.end


codecs.register_error("kinference-ascii-sub", _substitute)


def ascii_view(text: str) -> bytes:
    """``text`` as ASCII bytes, one byte per character (non-ASCII -> ``\\x1a``)."""
    if text.isascii():
        return text.encode("ascii")
    return text.encode("ascii", "kinference-ascii-sub")


@dataclass(frozen=True, slots=True)
class Pattern:
    """One candidate pattern. ``name`` is unique within a pattern set."""

    name: str
    regex: str
    caseless: bool = False
    multiline: bool = False

    @property
    def flags(self) -> int:
        flags = re.ASCII
        if self.caseless:
            flags |= re.IGNORECASE
        if self.multiline:
            flags |= re.MULTILINE
        return flags

    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex, self.flags)

    def _width(self) -> tuple[int, int]:
        from re import _parser  # type: ignore[attr-defined]

        lo, hi = _parser.parse(self.regex, self.flags).getwidth()
        return int(lo), int(hi)

    @property
    def max_width(self) -> int | None:
        """The longest match in characters, or None when unbounded."""
        hi = self._width()[1]
        return None if hi >= _UNBOUNDED else hi

    def check(self) -> None:
        """Refuse a pattern that can match the empty string (it would find nothing useful
        and break the one-hit-per-position reasoning of both paths)."""
        if self._width()[0] == 0:
            raise ValueError(f"pattern {self.name!r} can match the empty string")


#: widths at or above this count as unbounded (sre caps them at MAXREPEAT)
_UNBOUNDED = 1 << 16


#: (pattern index, start, end) in characters of the scanned text
Hit = tuple[int, int, int]


class Scan(Protocol):
    """The result of scanning one text: which patterns fired, and their hits."""

    def fired(self) -> list[int]:
        """Indices of patterns that may have hits, ascending."""
        ...

    def hits(self, index: int) -> Iterator[tuple[int, int]]:
        """``(start, end)`` of every hit of pattern ``index``, in text order."""
        ...


class Scanner(Protocol):
    engine: str
    patterns: tuple[Pattern, ...]

    def scan(self, text: str) -> Scan: ...


def all_hits(scanner: Scanner, text: str) -> list[Hit]:
    """Every hit of every pattern, sorted (used by the differential test and tools)."""
    scan = scanner.scan(text)
    out = [(i, s, e) for i in scan.fired() for s, e in scan.hits(i)]
    out.sort(key=lambda h: (h[1], h[2], h[0]))
    return out


# ------------------------------------------------------------------ fallback


class _ReScan:
    __slots__ = ("_regexes", "_text")

    def __init__(self, regexes: Sequence[re.Pattern[str]], text: str) -> None:
        self._regexes = regexes
        self._text = text

    def fired(self) -> list[int]:
        return list(range(len(self._regexes)))

    def hits(self, index: int) -> Iterator[tuple[int, int]]:
        for m in self._regexes[index].finditer(self._text):
            if m.end() > m.start():
                yield m.start(), m.end()


class ReScanner:
    """Pure-Python path: ``finditer`` per pattern. Slower, same hits."""

    engine = "re"

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        self.patterns = tuple(patterns)
        self._regexes = [p.compiled() for p in self.patterns]

    def scan(self, text: str) -> Scan:
        return _ReScan(self._regexes, text)


# ----------------------------------------------------------------- hyperscan


class _HsScan:
    __slots__ = ("_regexes", "_reports", "_text", "_widths")

    def __init__(
        self,
        regexes: Sequence[re.Pattern[str]],
        widths: Sequence[int | None],
        text: str,
        reports: dict[int, list[tuple[int, int]]],
    ) -> None:
        self._regexes = regexes
        self._widths = widths
        self._text = text
        self._reports = reports

    def fired(self) -> list[int]:
        return sorted(self._reports)

    def hits(self, index: int) -> Iterator[tuple[int, int]]:
        reports = self._reports.get(index)
        if not reports:
            return
        width = self._widths[index]
        if width is None:
            yield from self._hits_som(index, reports)
        else:
            yield from self._hits_bounded(index, reports, width)

    def _hits_bounded(
        self, index: int, reports: list[tuple[int, int]], width: int
    ) -> Iterator[tuple[int, int]]:
        """``finditer`` for a pattern whose matches are at most ``width`` long.

        A match starting at ``p`` ends at some reported ``e`` with
        ``e - width <= p < e``, so match starts lie in clusters of such windows.
        Each cluster ``[a, b)`` is searched with ``endpos = b + width + 1``: every
        path of the regex from a start before ``b`` reads only characters before
        that (``\b`` reads one past the match), so the search is exact for starts
        in the cluster and never reads the clean text between clusters.
        """
        regex = self._regexes[index]
        text = self._text
        size = len(text)
        n = len(reports)
        pos = 0
        k = 0
        while True:
            while k < n and reports[k][1] <= pos:
                k += 1
            if k == n:
                return
            a = max(pos, reports[k][1] - width)
            b = reports[k][1]
            j = k + 1
            while j < n and reports[j][1] - width <= b:
                b = reports[j][1]
                j += 1
            m = regex.search(text, a, min(size, b + width + 1))
            if m is not None and m.start() < b and m.end() > m.start():
                yield m.start(), m.end()
                pos = m.end()
            else:  # no match starts in [a, b)
                pos = b
                k = j

    def _hits_som(self, index: int, reports: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
        """``finditer`` for an unbounded pattern, from Hyperscan's leftmost starts."""
        # Reports come in order of end offset; suffix minima of their starts give,
        # for any position, the earliest start among reports ending after it.
        n = len(reports)
        suffix_min = [0] * n
        low = len(self._text)
        for k in range(n - 1, -1, -1):
            low = min(low, reports[k][0])
            suffix_min[k] = low
        regex = self._regexes[index]
        text = self._text
        pos = 0
        k = 0
        while True:
            while k < n and reports[k][1] <= pos:
                k += 1
            if k == n:
                return
            m = regex.search(text, max(pos, suffix_min[k]))
            if m is None:
                return
            start, end = m.span()
            if end == start:  # empty matches are never hits; step like finditer
                pos = end + 1
                continue
            yield start, end
            pos = end


class HyperscanScanner:
    """One Hyperscan block-mode database for all patterns, ``re`` for the spans."""

    engine = "hyperscan"

    def __init__(self, patterns: Sequence[Pattern]) -> None:
        import hyperscan

        self.patterns = tuple(patterns)
        self._regexes = [p.compiled() for p in self.patterns]
        self._widths = [p.max_width for p in self.patterns]
        flags = []
        for p, width in zip(self.patterns, self._widths, strict=True):
            f = hyperscan.HS_FLAG_SOM_LEFTMOST if width is None else 0
            if p.caseless:
                f |= hyperscan.HS_FLAG_CASELESS
            if p.multiline:
                f |= hyperscan.HS_FLAG_MULTILINE
            flags.append(f)
        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(
            expressions=[p.regex.encode("ascii") for p in self.patterns],
            ids=list(range(len(self.patterns))),
            elements=len(self.patterns),
            flags=flags,
        )
        self._scratch = hyperscan.Scratch(self._db)

    def scan(self, text: str) -> Scan:
        reports: dict[int, list[tuple[int, int]]] = {}

        def on_match(pid: int, start: int, end: int, _flags: int, _ctx: object) -> None:
            lst = reports.get(pid)
            if lst is None:
                reports[pid] = [(start, end)]
            else:
                lst.append((start, end))

        self._db.scan(ascii_view(text), match_event_handler=on_match, scratch=self._scratch)
        return _HsScan(self._regexes, self._widths, text, reports)


def hyperscan_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except Exception:
        return False
    return True


def build_scanner(patterns: Sequence[Pattern], engine: str | None = None) -> Scanner:
    """A scanner for ``patterns``.

    ``engine`` is ``"hyperscan"``, ``"re"`` or ``"auto"`` (default, also read
    from ``KINFERENCE_CLASSIFIER_ENGINE``): Hyperscan when its wheel imports
    and compiles the patterns, else the ``re`` fallback.
    """
    engine = engine or os.environ.get("KINFERENCE_CLASSIFIER_ENGINE", "auto")
    for p in patterns:
        p.check()
    if engine == "re":
        return ReScanner(patterns)
    if engine == "hyperscan":
        return HyperscanScanner(patterns)
    if engine != "auto":
        raise ValueError(f"unknown engine {engine!r} (hyperscan, re, auto)")
    try:
        return HyperscanScanner(patterns)
    except Exception as exc:
        import structlog

        structlog.get_logger("kinference.classifier").warning(
            "hyperscan unavailable, using the re fallback",
            error=f"{type(exc).__name__}: {exc}",
        )
        return ReScanner(patterns)
