"""Where manifests come from.

:class:`DirectorySource` watches a directory by polling file metadata (mtime,
size, inode): simple, portable, and cheap at the sizes a manifests directory
has. Files are re-read only when they change.

"A bad file is reported and skipped; the last good configuration stays in
force": a file that fails to read, to parse, or has any document the API
server would reject keeps contributing the documents of its last good
version (if it ever had one), and its errors are reported. A file that is
removed stops contributing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

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


@dataclass
class _File:
    stamp: tuple[int, int, int]
    current_errors: list[ManifestError]
    good: list[Loaded] | None  # last good documents, None if never good


@dataclass
class DirectorySource:
    root: Path
    _files: dict[Path, _File] = field(default_factory=dict)

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
        for path, stamp in sorted(seen.items()):
            prev = self._files.get(path)
            if prev is not None and prev.stamp == stamp:
                continue
            loaded, errors = self._read(path)
            if errors:
                self._files[path] = _File(stamp, errors, prev.good if prev else None)
                changed = True  # errors to report
            else:
                self._files[path] = _File(stamp, [], loaded)
                changed = True
        return changed

    @staticmethod
    def _read(path: Path) -> tuple[list[Loaded], list[ManifestError]]:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return [], [ManifestError(DocumentRef(str(path), 0), "", f"cannot read: {exc}")]
        loaded = load_text(text, str(path))
        errors = [x for x in loaded if isinstance(x, ManifestError)]
        for x in loaded:
            if isinstance(x, LoadedObject):
                errors.extend(ManifestError(x.document, p, m) for p, m in validate.problems(x.obj))
        return loaded, errors

    def documents(self) -> list[Loaded]:
        out: list[Loaded] = []
        for _path, f in sorted(self._files.items()):
            if f.good:
                out.extend(f.good)
        return out

    def errors(self) -> list[ManifestError]:
        return [e for _p, f in sorted(self._files.items()) for e in f.current_errors]

    def kept_at_last_good(self) -> list[str]:
        """Files whose current version is bad but whose last good one is in force."""
        return [str(p) for p, f in sorted(self._files.items()) if f.current_errors and f.good]
