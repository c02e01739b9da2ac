"""What of a body the classifiers read, as the strings a provider receives."""

from __future__ import annotations

from collections.abc import Iterable

from kinference_common.prompt_texts import label_of


def strings_read(texts: Iterable[str]) -> set[str]:
    """Every text, and both sides of each ``key: value`` text a walk writes for a
    string or big number under an object key (a superset: a text of the prompt
    holding ": " is split too)."""
    out: set[str] = set()
    for t in texts:
        out.add(t)
        label, sep, value = t.partition(": ")
        if sep:
            out.update((label, value))
    return out


def was_read(s: str, read: set[str]) -> bool:
    """Whether ``s`` (a string or key of the body) is among ``read``, itself or as its label."""
    return s in read or label_of(s) in read
