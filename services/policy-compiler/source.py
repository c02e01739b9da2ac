"""Where manifests come from.

:class:`DirectorySource` watches a directory by polling file metadata (mtime,
size, inode): simple, portable, and cheap at the sizes a manifests directory
has. Files are re-read only when they change.

"A bad file is reported and skipped; the last good configuration stays in
force": a file that fails to read, to parse, or has any document the API
server would reject keeps contributing the documents of its last good
version (if it ever had one), and its errors are reported. A file that is
removed stops contributing.

An object defined in two files is taken from the file that was in force
first (the compiler keeps the first definition it is given and refuses the
other): a new file reusing the name of a policy in force is refused, whatever
its name sorts as, rather than replacing the policy. Files are given in the
order they were first read (by path among those read together), and that
order is stored with the last good versions, so it outlives a restart.

The last good versions outlive the process: the compiler stores each file's
last good text next to the pools it published (see ``publisher.py``) and
hands them back with :meth:`DirectorySource.restore_last_good` before the
first poll, so a file that is broken when the compiler starts keeps its
last good version in force instead of deleting what it published.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from kinference_common.manifests import (
    MANIFEST_SUFFIXES,
    DocumentRef,
    Loaded,
    LoadedObject,
    ManifestError,
    load_text,
)
from kinference_common.compiler import validate


class ManifestSource(Protocol):
    """Anything that can say what the current manifests are."""

    def poll(self) -> bool:
        """Look for changes; True when the documents in force changed."""

    def documents(self) -> list[Loaded]:
        """The documents in force (last good version of every file)."""

    def errors(self) -> list[ManifestError]:
        """Errors of the current versions (files kept at their last good version)."""


class LastGoodSource(Protocol):
    """A source whose last good versions can be stored and read back (the
    directory source; the Kubernetes API server keeps its own)."""

    def last_good_texts(self) -> dict[str, str]:
        """File (relative to the root) -> the text of its last good version."""

    def restore_last_good(self, texts: dict[str, str]) -> None:
        """Last good versions read back from storage, for files broken at start."""


@dataclass
class _File:
    stamp: tuple[int, int, int]
    current_errors: list[ManifestError]
    good: list[Loaded] | None  # last good documents, None if never good
    good_text: str | None = None  # the text they were read from


@dataclass
class DirectorySource:
    root: Path
    _files: dict[Path, _File] = field(default_factory=dict)
    #: last good versions read back from storage: path -> (text, documents)
    _restored: dict[Path, tuple[str, list[Loaded]]] = field(default_factory=dict)
    #: file -> its place in the order files were first read (restored ones first)
    _order: dict[Path, int] = field(default_factory=dict)
    #: the next place: only ever grows (a removed file must not hand its number to a newcomer)
    _next: int = 0
    #: object (group, kind, namespace, name) -> (a digest of the definition in force, its file):
    #: it stays first among definitions of that object (its file edited, or renamed)
    _in_force: dict[tuple[str, str, str, str], tuple[bytes, str]] = field(default_factory=dict)

    def _place(self, path: Path) -> int:
        if path not in self._order:
            self._order[path] = self._next
            self._next += 1
        return self._order[path]

    def _scan(self) -> dict[Path, tuple[int, int, int]]:
        found: dict[Path, tuple[int, int, int]] = {}
        if not self.root.is_dir():
            return found
        for dirpath, _dirs, names in os.walk(self.root):
            for n in names:
                if n.startswith(".") or not n.lower().endswith(MANIFEST_SUFFIXES):
                    continue
                p = Path(dirpath) / n
                try:
                    s = p.stat()
                except OSError:
                    continue
                found[p] = (s.st_mtime_ns, s.st_size, s.st_ino)
        return found

    def poll(self) -> bool:
        changed = False
        seen = self._scan()
        for path in list(self._files):
            if path not in seen:
                del self._files[path]
                changed = True
        for path in [p for p in self._order if p not in seen]:
            del self._order[path]  # gone (or restored but gone meanwhile): back later, it is a newcomer
        for path, stamp in sorted(seen.items()):
            prev = self._files.get(path)
            if prev is not None and prev.stamp == stamp:
                continue
            text, loaded, errors = self._read(path)
            self._place(path)
            if errors:
                if prev is not None and prev.good is not None:
                    good, good_text = prev.good, prev.good_text
                elif path in self._restored:  # broken since start: the stored last good version
                    good_text, good = self._restored[path]
                else:
                    good, good_text = None, None
                self._files[path] = _File(stamp, errors, good, good_text)
                changed = True  # errors to report
            else:
                self._files[path] = _File(stamp, [], loaded, text)
                changed = True
            self._restored.pop(path, None)  # read once; from now on memory has it
        return changed

    @staticmethod
    def _read(path: Path) -> tuple[str | None, list[Loaded], list[ManifestError]]:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return None, [], [ManifestError(DocumentRef(str(path), 0), "", f"cannot read: {exc}")]
        loaded, errors = _load(text, str(path))
        return text, loaded, errors

    def _in_force_order(self) -> list[tuple[Path, _File]]:
        return sorted(self._files.items(), key=lambda pf: (self._order[pf[0]], pf[0]))

    def last_good_texts(self) -> dict[str, str]:
        """In the order the files were first read (a restart reads them back so)."""
        return {self._name(p): f.good_text for p, f in self._in_force_order()
                if f.good is not None and f.good_text is not None}

    def restore_last_good(self, texts: dict[str, str]) -> None:
        for name, text in texts.items():
            path = self.root / name
            self._place(path)  # stored in the order they were in force
            loaded, errors = _load(text, str(path))
            if not errors:  # a stored version is good by construction; never trust it blindly
                self._restored[path] = (text, loaded)

    def _name(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def documents(self) -> list[Loaded]:
        """Files in force earlier first, and of an object defined more than
        once the definition in force first: the compiler keeps the first, so
        it keeps the one in force and refuses a newcomer, also when the file
        in force was edited (its file stays first) or renamed (its
        definition, unchanged, is found in the new file). The first is then
        the one in force. Not kept: a rename and an edit of the file in
        force seen in one poll, and, after a restart, a rename made while
        the duplicate was there (the order stored is the files')."""
        out: list[Loaded] = []
        for _path, f in self._in_force_order():
            if f.good:
                out.extend(f.good)
        by_key: dict[tuple[str, str, str, str], list[int]] = {}
        digests: list[bytes | None] = []
        for i, item in enumerate(out):
            digest = None
            if isinstance(item, LoadedObject):
                key = _object_key(item)
                by_key.setdefault(key, []).append(i)
                digest = _digest(item)
            digests.append(digest)
        for key, places in by_key.items():
            if len(places) > 1 and key in self._in_force:
                held, where = self._in_force[key]
                # the file it was in (edited or not), else the same definition moved (a rename; a
                # copy of it next to the file in force is not taken for it: a review)
                first = next((i for i in places if out[i].document.source == where), None)
                if first is None:
                    first = next((i for i in places if digests[i] == held), places[0])
                if first != places[0]:  # put the definition in force in the first place
                    out[places[0]], out[first] = out[first], out[places[0]]
                    digests[places[0]], digests[first] = digests[first], digests[places[0]]
            self._in_force[key] = (digests[places[0]], out[places[0]].document.source)  # type: ignore[assignment]
        for key in [k for k in self._in_force if k not in by_key]:
            del self._in_force[key]
        return out

    def errors(self) -> list[ManifestError]:
        return [e for _p, f in sorted(self._files.items()) for e in f.current_errors]

    def kept_at_last_good(self) -> list[str]:
        """Files whose current version is bad but whose last good one is in force."""
        return [str(p) for p, f in sorted(self._files.items()) if f.current_errors and f.good]


def _object_key(item: LoadedObject) -> tuple[str, str, str, str]:
    meta = item.obj.metadata
    return item.group, item.obj.kind, meta.namespace, meta.name


def _digest(item: LoadedObject) -> bytes:
    """The definition's content, wherever it is written."""
    try:
        data = msgspec.json.encode(item.raw, order="sorted")
    except (TypeError, msgspec.EncodeError):
        data = repr(item.raw).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


def _load(text: str, source: str) -> tuple[list[Loaded], list[ManifestError]]:
    loaded = load_text(text, source)
    errors = [x for x in loaded if isinstance(x, ManifestError)]
    for x in loaded:
        if isinstance(x, LoadedObject):
            errors.extend(ManifestError(x.document, p, m) for p, m in validate.problems(x.obj))
    return loaded, errors
