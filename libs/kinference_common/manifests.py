"""Reading manifests: files and directories of (multi-document) YAML or JSON.

Every document becomes either a typed resource (:data:`resources.Resource`) or a
:class:`ManifestError` that names the document (file, position, kind,
namespace/name when known) and the field path, in the words an operator can
act on. Documents of kinds Kinference does not read are kept as
:class:`SkippedDocument` so a caller can say what it ignored.

Nothing here raises on bad input; the only exceptions are programming errors.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import msgspec
import yaml

from kinference_common import resources as r

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True, slots=True)
class DocumentRef:
    """Where a document came from: ``source`` (a path, or ``<stdin>``) and its
    1-based position among the documents of that source."""

    source: str
    index: int
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = f"{self.source}#{self.index}"
        if self.kind and self.name:
            return f"{where} ({self.kind} {self.namespace or 'default'}/{self.name})"
        if self.kind:
            return f"{where} ({self.kind})"
        return where


@dataclass(frozen=True, slots=True)
class ManifestError:
    """A document the API server would reject."""

    document: DocumentRef
    path: str
    message: str

    def __str__(self) -> str:
        at = f" at {self.path}" if self.path else ""
        return f"{self.document}{at}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.document.source,
            "document": self.document.index,
            "kind": self.document.kind,
            "namespace": self.document.namespace,
            "name": self.document.name,
            "path": self.path,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class LoadedObject:
    """A decoded resource, with where it came from and the raw mapping (for
    unknown-field checks)."""

    document: DocumentRef
    obj: r.Resource
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def group(self) -> str:
        return self.obj.api_version.split("/", 1)[0] if "/" in self.obj.api_version else ""


@dataclass(frozen=True, slots=True)
class SkippedDocument:
    document: DocumentRef
    reason: str


Loaded = Union[LoadedObject, ManifestError, SkippedDocument]


# ------------------------------------------------------------------ discovery


def iter_manifest_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path | ManifestError]:
    """Expand files and directories (recursively, sorted) into manifest files."""
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(
                f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in MANIFEST_SUFFIXES
            )
            if not found:
                yield ManifestError(DocumentRef(str(path), 0), "", "directory holds no .yaml, .yml or .json file")
            yield from found
        elif path.is_file():
            yield path
        else:
            yield ManifestError(DocumentRef(str(path), 0), "", "no such file or directory")


def load_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Loaded]:
    """Load every document under ``paths``."""
    out: list[Loaded] = []
    for item in iter_manifest_files(paths):
        if isinstance(item, ManifestError):
            out.append(item)
            continue
        try:
            text = item.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            out.append(ManifestError(DocumentRef(str(item), 0), "", f"cannot read: {exc}"))
            continue
        out.extend(load_text(text, str(item)))
    return out


def load_text(text: str, source: str) -> list[Loaded]:
    """Load every document of a YAML (or JSON, which is YAML) text."""
    out: list[Loaded] = []
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [ManifestError(DocumentRef(source, 0), "", f"not valid YAML: {where}{problem}")]
    except RecursionError:
        return [ManifestError(DocumentRef(source, 0), "", "not valid YAML: nested too deeply")]
    index = 0
    for doc in docs:
        if doc is None:  # an empty document between two `---`
            continue
        index += 1
        out.extend(_flatten_lists(doc, source, index))
    return out


def _flatten_lists(doc: Any, source: str, index: int) -> list[Loaded]:
    """A ``kind: List`` (what ``kubectl get -o yaml`` prints) holds items."""
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        return [decode_document(item, DocumentRef(source, index)) for item in doc["items"]]
    return [decode_document(doc, DocumentRef(source, index))]


# ------------------------------------------------------------------- decoding

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def _path_of(msgspec_path: str | None) -> str:
    """``$.spec.rules[0].name`` -> ``spec.rules[0].name``."""
    if not msgspec_path:
        return ""
    return msgspec_path[1:] if msgspec_path.startswith(".") else msgspec_path


_TYPE_WORDS = {
    "float": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def _type_words(spec: str) -> str:
    """`` `str | array | null` `` -> ``a string or a list`` (null is implied)."""
    parts = [p.strip() for p in spec.split("|") if p.strip() != "null"]
    return " or ".join(_TYPE_WORDS.get(p, p) for p in parts) or "null"


def _allowed_values(struct_type: type, path: str) -> list[str]:
    """The enum values of the field at ``path`` (e.g. ``spec.rules[0].route.onEmpty``)."""
    t: Any = _type_info(struct_type)
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        while isinstance(t, msgspec.inspect.UnionType):
            t = next((m for m in t.types if not isinstance(m, msgspec.inspect.NoneType)), None)
        if part.startswith("["):
            t = getattr(t, "item_type", None)
        elif isinstance(t, msgspec.inspect.StructType):
            t = next((f.type for f in t.fields if f.encode_name == part), None)
        else:
            return []
    values: list[str] = []
    members = t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)
    for m in members:
        if isinstance(m, msgspec.inspect.LiteralType):
            values.extend(str(v) for v in m.values)
    return values


def _rephrase(message: str, struct_type: type, path: str) -> str:
    """msgspec's wording, made to read as the API server's."""
    message = message.replace("Object missing required field", "missing required field")
    m = re.match(r"Expected `([^`]*)`, got `([^`]*)`", message)
    if m:
        message = f"expected {_type_words(m.group(1))}, got {_type_words(m.group(2))}"
    if message.startswith("Invalid enum value"):
        allowed = _allowed_values(struct_type, path)
        message = message.replace("Invalid enum value", "invalid value")
        if allowed:
            message += f"; allowed: {', '.join(allowed)}"
    return message


def decode_document(doc: Any, ref: DocumentRef) -> Loaded:
    """Decode one parsed document into its Struct, or say precisely why not."""
    if not isinstance(doc, dict):
        return ManifestError(ref, "", f"expected a mapping with apiVersion and kind, got {type(doc).__name__}")
    kind = doc.get("kind")
    api_version = doc.get("apiVersion")
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) else None
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else None
    ref = DocumentRef(
        ref.source,
        ref.index,
        kind if isinstance(kind, str) else None,
        namespace or ("default" if name else None),
        name,
    )
    if not isinstance(kind, str) or not kind:
        return ManifestError(ref, "kind", "missing required field `kind`")
    if not isinstance(api_version, str) or not api_version:
        return ManifestError(ref, "apiVersion", "missing required field `apiVersion`")
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    struct_type = r.KINDS.get((group, kind))
    if struct_type is None:
        known = {k for (_, k) in r.KINDS}
        if kind in known:
            expected = sorted(g for (g, k) in r.KINDS if k == kind)
            return ManifestError(
                ref, "apiVersion", f"{kind} is not served in {group or 'the core group'}; use {' or '.join(expected)}"
            )
        return SkippedDocument(ref, f"kind {kind} ({api_version}) is not read by Kinference")
    try:
        obj = msgspec.convert(doc, struct_type, strict=True)
    except msgspec.ValidationError as exc:
        m = _AT.match(str(exc))
        assert m is not None
        path = _path_of(m.group("path"))
        return ManifestError(ref, path, _rephrase(m.group("msg"), struct_type, path))
    except (TypeError, ValueError, RecursionError) as exc:  # e.g. unhashable YAML keys
        return ManifestError(ref, "", f"cannot be read: {exc}")
    return LoadedObject(ref, obj, doc)


# -------------------------------------------------------------- unknown fields

@functools.lru_cache(maxsize=64)
def _type_info(struct_type: type) -> Any:
    """``msgspec.inspect.type_info``, once per type: it re-evaluates every
    annotation on each call, which was 98% of a compile."""
    return msgspec.inspect.type_info(struct_type)


_IGNORED_TOP_LEVEL = frozenset({"apiVersion", "kind", "metadata", "status"})


def unknown_fields(raw: dict[str, Any], struct_type: type) -> list[str]:
    """Paths of fields in ``raw`` that ``struct_type`` does not define.

    ``metadata`` and ``status`` are the API server's business, not ours.
    """
    found: list[str] = []
    info = _type_info(struct_type)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        if f.encode_name in raw and f.encode_name not in _IGNORED_TOP_LEVEL:
            _walk(raw[f.encode_name], f.type, f.encode_name, found)
    for key in raw:
        if key not in {f.encode_name for f in info.fields} and key not in _IGNORED_TOP_LEVEL:
            found.append(str(key))
    return found


def _walk(value: Any, t: msgspec.inspect.Type, path: str, found: list[str]) -> None:
    inspect = msgspec.inspect
    if isinstance(t, inspect.UnionType):
        for member in t.types:
            if isinstance(member, inspect.StructType) and isinstance(value, dict):
                _walk(value, member, path, found)
                return
            if isinstance(member, inspect.ListType) and isinstance(value, list):
                _walk(value, member, path, found)
                return
        return
    if isinstance(t, inspect.StructType) and isinstance(value, dict):
        names = {f.encode_name: f for f in t.fields}
        for key, sub in value.items():
            f = names.get(key)
            if f is None:
                found.append(f"{path}.{key}")
            else:
                _walk(sub, f.type, f"{path}.{key}", found)
    elif isinstance(t, inspect.ListType) and isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, t.item_type, f"{path}[{i}]", found)
    elif isinstance(t, inspect.DictType) and isinstance(value, dict):
        for key, item in value.items():
            _walk(item, t.value_type, f"{path}.{key}", found)
