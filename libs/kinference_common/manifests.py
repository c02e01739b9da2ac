"""Reading manifests: files and directories of (multi-document) YAML or JSON.

Every document becomes either a typed resource (:data:`resources.Resource`) or a
:class:`ManifestError` that names the document (file, position, kind,
namespace/name when known), the field path and, for YAML text, the line the
field is on (a missing field: its parent's), in the words an operator can
act on. Documents of kinds Kinference does not read are kept as
:class:`SkippedDocument` so a caller can say what it ignored.

What a cluster would refuse is an error here too: a key written twice in one
YAML mapping (kubectl rejects it; PyYAML would keep the last), a kind that
Kinference's own group does not define (``InferencePolicyy``), a known kind
in the wrong case, an apiVersion whose version Kinference's own group does not serve
(:data:`resources.SERVED_VERSIONS`), and an unknown field anywhere in an
InferencePolicy (:func:`policy_unknown_fields`; in other kinds an unknown
field is a warning, and the API server prunes it).

Nothing here raises on bad input; the only exceptions are programming errors.
"""

from __future__ import annotations

import difflib
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
    1-based position among the documents of that source (0: the source as
    a whole); ``lines``: the line of each field path in the source, for a
    document read from YAML text."""

    source: str
    index: int
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    lines: dict[str, int] | None = field(default=None, compare=False, repr=False)

    def line_of(self, path: str) -> int | None:
        """The line of the field at ``path``, or of its nearest parent
        written in the source (a missing field: where it belongs); None
        when the document has no lines."""
        if not self.lines:
            return None
        while True:
            line = self.lines.get(path)
            if line is not None or not path:
                return line
            cut = max(path.rfind("."), path.rfind("["))
            path = path[:max(cut, 0)]

    def __str__(self) -> str:
        where = f"{self.source}#{self.index}" if self.index else self.source
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

    @property
    def line(self) -> int | None:
        """The source line of the field at fault (its parent's when it is missing)."""
        return self.document.line_of(self.path) if self.path else None

    def __str__(self) -> str:
        at = f" at {self.path}" if self.path else ""
        line = self.line
        return f"{self.document}{at}{f' (line {line})' if line else ''}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.document.source,
            "document": self.document.index,
            "kind": self.document.kind,
            "namespace": self.document.namespace,
            "name": self.document.name,
            "path": self.path,
            "line": self.line,
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


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping.

    PyYAML keeps the last value; kubectl (and the API server, for JSON)
    rejects the manifest, so a file that would not apply must not lint clean.
    Merge keys (``<<: *anchor``) still work: a key merged in and written
    again is an override, not a duplicate.
    """

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader says so below
                    continue
                if first is not None:
                    at = first.start_mark
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"duplicate key `{key}` (first at line {at.line + 1}, column {at.column + 1}); "
                        "kubectl rejects a manifest that writes a key twice: keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def load_text(text: str, source: str) -> list[Loaded]:
    """Load every document of a YAML (or JSON, which is YAML) text."""
    out: list[Loaded] = []
    try:
        docs = _documents(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        return [ManifestError(DocumentRef(source, 0), "", f"not valid YAML: {where}{problem}")]
    except RecursionError:
        return [ManifestError(DocumentRef(source, 0), "", "not valid YAML: nested too deeply")]
    index = 0
    for doc, lines in docs:
        if doc is None:  # an empty document between two `---`
            continue
        index += 1
        out.extend(_flatten_lists(doc, lines, source, index))
    return out


def _documents(text: str) -> list[tuple[Any, dict[str, int]]]:
    """Each document of ``text`` with the lines of its fields (:func:`_lines`),
    as ``yaml.load_all`` with :class:`StrictLoader` reads them."""
    loader = StrictLoader(text)
    try:
        out = []
        while loader.check_node():
            node = loader.get_node()
            lines = _lines(node)  # before construction, which rewrites merged mappings in place
            out.append((loader.construct_document(node), lines))
        return out
    finally:
        loader.dispose()


def _lines(node: yaml.Node) -> dict[str, int]:
    """The 1-based line of every field path of a document (``spec.rules[0].name``:
    the line of its key; a list item: where it starts; a field a merge key
    (``<<: *base``, or a list of them, merged in turn) brings in: the
    anchor's line, unless written again). The walk is in document order and
    takes each node once, at the first path that reaches it (an alias
    written later keeps the lines of its anchor's fields where the anchor
    is; a recursive anchor, or aliases of aliases, cannot make it loop or
    grow)."""
    lines: dict[str, int] = {"": node.start_mark.line + 1}
    seen: set[int] = set()
    stack: list[tuple[str, yaml.Node]] = [("", node)]
    while stack:
        path, n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        children: list[tuple[str, yaml.Node]] = []
        if isinstance(n, yaml.MappingNode):
            for key, value in _pairs(n):
                sub = f"{path}.{key.value}" if path else key.value
                if sub not in lines:  # written here first, merged ones after
                    lines[sub] = key.start_mark.line + 1
                    children.append((sub, value))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                sub = f"{path}[{i}]"
                lines.setdefault(sub, item.start_mark.line + 1)
                children.append((sub, item))
        stack.extend(reversed(children))  # the first child is walked first
    return lines


def _pairs(n: yaml.MappingNode) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
    """A mapping's scalar keys and values in precedence order: those written
    in it, then those of the mappings it merges (in the order listed, each
    with its own merges), each merged mapping once."""
    out: list[tuple[yaml.ScalarNode, yaml.Node]] = []
    todo: list[yaml.Node] = [n]
    done: set[int] = set()
    while todo:
        m = todo.pop(0)
        if not isinstance(m, yaml.MappingNode) or id(m) in done:
            continue
        done.add(id(m))
        merged: list[yaml.Node] = []
        for key, value in m.value:
            if key.tag == "tag:yaml.org,2002:merge":
                merged += value.value if isinstance(value, yaml.SequenceNode) else [value]
            elif isinstance(key, yaml.ScalarNode):
                out.append((key, value))
        todo[:0] = merged  # a mapping's own merges before those of the next one listed
    return out


_ITEM = re.compile(r"items\[(\d+)\]")


def _items_lines(lines: dict[str, int]) -> dict[int, dict[str, int]]:
    """The lines of each item of a List document, with paths from the item
    (one pass over the document's lines)."""
    out: dict[int, dict[str, int]] = {}
    for path, line in lines.items():
        m = _ITEM.match(path)
        if m is not None:
            out.setdefault(int(m.group(1)), {})[path[m.end():].lstrip(".")] = line
    return out


def _flatten_lists(doc: Any, lines: dict[str, int] | None, source: str, index: int) -> list[Loaded]:
    """A ``kind: List`` (what ``kubectl get -o yaml`` prints) holds items."""
    # kubectl's `kind: List`, or a typed one (`InferencePolicyList`, what the API returns)
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        items = _items_lines(lines) if lines else {}
        return [x for i, item in enumerate(doc["items"])
                for x in _decode(item, DocumentRef(source, index, lines=items.get(i)))]
    return _decode(doc, DocumentRef(source, index, lines=lines))


# ------------------------------------------------------------------- decoding

_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)


def split_validation_error(text: str) -> tuple[str, str]:
    """msgspec's ``ValidationError`` text -> (the field's path, as lint
    writes it, and msgspec's message): ``"Expected `int`, got `str` - at
    `$.spec.port`"`` -> ``("spec.port", "Expected `int`, got `str`")``."""
    m = _AT.match(text)
    assert m is not None  # the pattern matches any text
    return _path_of(m.group("path")), m.group("msg")


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


#: one step of a field path: ``name`` or ``[index]`` (``spec.rules[0].name``)
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _steps(path: str) -> list[tuple[str | None, int | None]]:
    """``spec.rules[0].name`` -> ``[("spec", None), ("rules", None), (None, 0), ("name", None)]``."""
    return [(m.group(1), None if m.group(2) is None else int(m.group(2))) for m in _STEP.finditer(path)]


def _allowed_values(struct_type: type, path: str) -> list[str]:
    """The enum values of the field at ``path`` (e.g. ``spec.rules[0].route.onEmpty``)."""
    t: Any = _type_info(struct_type)
    for part, index in _steps(path):
        while isinstance(t, msgspec.inspect.UnionType):
            t = next((m for m in t.types if not isinstance(m, msgspec.inspect.NoneType)), None)
        if index is not None:
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


#: fields whose value is a duration string (a number there is a common slip: `greaterThan: 500`)
_DURATION_FIELD = re.compile(r"(?:(?:predictedTTFT|estimatedTTFT)\.(?:greaterThan|lessThan)|timeouts\.(?:connect|firstToken)"
                             r"|maxQueueWait)$")


def _rephrase(message: str, struct_type: type, path: str) -> str:
    """msgspec's wording, made to read as the API server's."""
    message = message.replace("Object missing required field", "missing required field")
    m = re.match(r"Expected `([^`]*)`, got `([^`]*)`", message)
    if m:
        message = f"expected {_type_words(m.group(1))}, got {_type_words(m.group(2))}"
        if m.group(1) in ("str", "str | null") and _DURATION_FIELD.search(path):
            message += ": a duration is written with its unit, such as '800ms', '2s' or '1m30s'"
    m = re.match(r"Expected `(int|float)` (>=|<=|>|<) (-?[0-9.]+)$", message)
    if m:
        words = {">=": "at least", "<=": "at most", ">": "more than", "<": "less than"}[m.group(2)]
        message = f"must be {words} {m.group(3)}"
    m = re.match(r"Expected `(array|object|str)` of length (>=|<=) (\d+)$", message)
    if m:
        what = {"array": "item", "object": "entry", "str": "character"}[m.group(1)]
        bound = "at least" if m.group(2) == ">=" else "at most"
        n = int(m.group(3))
        message = f"must hold {bound} {n} {what}{'' if n == 1 else 's'}" if m.group(1) != "str" else \
            f"must be {bound} {n} {what}{'' if n == 1 else 's'} long"
    if message.startswith("Invalid enum value"):
        allowed = _allowed_values(struct_type, path)
        message = message.replace("Invalid enum value", "invalid value")
        if allowed:
            message += f"; allowed: {', '.join(allowed)}"
    return message


#: type errors reported per document at most (each costs a decode)
MAX_TYPE_ERRORS = 20
_GONE = object()
#: a value of each simple type msgspec names, standing in for one of the wrong type
_STAND_IN = {"str": "x", "int": 1, "float": 1.0, "bool": False}


def _without(doc: Any, path: str, value: Any = _GONE) -> Any | None:
    """A copy of ``doc`` without the mapping key at ``path``
    (``spec.rules[0].name``), or with ``value`` there; None when ``path`` is
    not one (a list item, a map key msgspec does not spell out, the document
    itself)."""
    steps = _steps(path)
    spelled = "".join(f".{k}" if k is not None else f"[{i}]" for k, i in steps).lstrip(".")
    if not steps or spelled != path or steps[-1][0] is None or not isinstance(doc, dict):
        return None
    root = node = dict(doc)  # copies along the path only: the rest is shared with ``doc``
    for key, index in steps[:-1]:
        child = node.get(key) if key is not None and isinstance(node, dict) else (
            node[index] if isinstance(node, list) and index is not None and index < len(node) else None)
        if not isinstance(child, dict | list):
            return None
        child = dict(child) if isinstance(child, dict) else list(child)
        node[key if key is not None else index] = child  # type: ignore[index]
        node = child
    last = steps[-1][0]
    if not isinstance(node, dict) or last not in node:
        return None
    if value is _GONE:
        del node[last]
    else:
        node[last] = value
    return root


def _type_errors(doc: Any, struct_type: type, ref: DocumentRef, exc: msgspec.ValidationError) -> list[Loaded]:
    """Every type error of a document, not only the first (msgspec stops at
    it): each offending value is replaced in a copy by one of the type
    expected (a string, a number, a boolean) or, failing that, taken out, and
    the copy decoded again. The search ends where neither can be done without
    guessing (a list item of the wrong type, a required mapping), or at an
    error of its own making (the field taken out was required)."""
    found: list[Loaded] = []
    seen: set[str] = set()
    while True:
        path, msg = split_validation_error(str(exc))
        if path in seen or any((f"{path}.{missing}" if path else missing) in seen for missing in
                               re.findall(r"^Object missing required field `([^`]*)`", msg)):
            break  # the field taken out was required: what it says next is of our making
        seen.add(path)
        found.append(ManifestError(ref, path, _rephrase(msg, struct_type, path)))
        if len(found) >= MAX_TYPE_ERRORS or msg.startswith("Object missing required field"):
            break
        expected = re.match(r"Expected `([a-z]+)`, got", msg)
        stand_in = _STAND_IN.get(expected.group(1), _GONE) if expected else _GONE
        allowed = _allowed_values(struct_type, path) if expected or msg.startswith("Invalid enum") else []
        if allowed:  # a field of a few values (engine, onEmpty, type): one of them, not "x"
            stand_in = allowed[0]
        smaller = _without(doc, path, stand_in)
        if smaller is None:
            break
        doc = smaller
        try:
            msgspec.convert(doc, struct_type, strict=True)
        except msgspec.ValidationError as again:
            exc = again
            continue
        except (TypeError, ValueError, RecursionError):
            pass
        break
    return found


def decode_document(doc: Any, ref: DocumentRef) -> Loaded:
    """Decode one parsed document into its Struct, or say precisely why not
    (the first problem, when there are several: :func:`load_text` lists them all)."""
    return _decode(doc, ref)[0]


def _decode(doc: Any, ref: DocumentRef) -> list[Loaded]:
    """The decoded document, or every error found in it (at least one)."""
    if not isinstance(doc, dict):
        return [ManifestError(ref, "", f"expected a mapping with apiVersion and kind, got {type(doc).__name__}")]
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
        ref.lines,
    )
    if not isinstance(kind, str) or not kind:
        return [ManifestError(ref, "kind", "missing required field `kind`")]
    if not isinstance(api_version, str) or not api_version:
        return [ManifestError(ref, "apiVersion", "missing required field `apiVersion`")]
    group, version = api_version.split("/", 1) if "/" in api_version else ("", api_version)
    struct_type = r.KINDS.get((group, kind))
    if struct_type is None:
        known = {k for (_, k) in r.KINDS}
        if kind in known and (group in _READ_GROUPS or kind in _OWN_KINDS):
            expected = sorted(g for (g, k) in r.KINDS if k == kind)
            return [ManifestError(
                ref, "apiVersion", f"{kind} is not served in {group or 'the core group'}; use {' or '.join(expected)}"
            )]
        unknown = _unknown_kind(group, kind)
        if unknown is not None:
            return [ManifestError(ref, "kind", unknown)]
        return [SkippedDocument(ref, f"kind {kind} ({api_version}) is not read by Kinference")]
    # only Kinference's own versions are judged: another project's CRD may
    # serve a version this table does not know, and the API server converts
    served = r.SERVED_VERSIONS.get((group, kind), ())
    if group in r.OWN_GROUPS and version not in served:
        use = " or ".join(f"`{group}/{v}`" if group else f"`{v}`" for v in served)
        return [ManifestError(
            ref, "apiVersion",
            f"{group or 'the core group'} serves {kind} in version {' and '.join(served)} only, "
            f"not {version or '(none)'}; write apiVersion: {use}",
        )]
    try:
        obj = msgspec.convert(doc, struct_type, strict=True)
    except msgspec.ValidationError as exc:
        found = _type_errors(doc, struct_type, ref, exc)
        if struct_type is r.InferencePolicy:  # its unknown fields are errors too: all of them in one run
            typed = {e.path for e in found if isinstance(e, ManifestError)}
            found += [ManifestError(ref, path, message) for path, message in policy_unknown_fields(doc)
                      if path not in typed]
        return found
    except (TypeError, ValueError, RecursionError) as exc:  # e.g. unhashable YAML keys
        return [ManifestError(ref, "", f"cannot be read: {exc}")]
    if struct_type is r.InferencePolicy:
        errors: list[Loaded] = [ManifestError(ref, path, message) for path, message in policy_unknown_fields(doc)]
        if errors:
            return errors
    return [LoadedObject(ref, obj, doc)]


#: the groups Kinference reads some kind of (a kind of another group, such
#: as Istio's Gateway, is someone else's: skipped)
_READ_GROUPS = frozenset(g for (g, _) in r.KINDS)
#: the kinds Kinference defines: in any other group, a wrong group
_OWN_KINDS = frozenset(k for (g, k) in r.KINDS if g in r.OWN_GROUPS)


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` most likely misspells: the same but for case
    first, then the closest by :func:`difflib.get_close_matches`, case
    ignored (the "did you mean" of every file Kinference reads)."""
    by_lower = {c.lower(): c for c in sorted(set(choices), reverse=True)}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def _unknown_kind(group: str, kind: str) -> str | None:
    """Why a document of a group Kinference reads, of a kind it does not
    read, would not apply; None when it is a kind of that group Kinference
    merely ignores.

    Kinference defines every kind of its own group, so any other kind there
    is an error. The other groups it reads (Gateway API, the Inference
    Extension's, core) have kinds Kinference does not read (GRPCRoute,
    ConfigMap...): there only a known kind written in the wrong case is an
    error (kinds are case-sensitive; ``httproute`` matches nothing).
    """
    kinds = sorted(k for (g, k) in r.KINDS if g == group)
    if not kinds:
        return None
    if group in r.OWN_GROUPS:
        guess = closest(kind, kinds)
        hint = f"; did you mean `{guess}`?" if guess else ""
        return f"{group} defines no kind `{kind}` (its kinds: {', '.join(kinds)}){hint}"
    same = [k for k in kinds if k.lower() == kind.lower()]
    if same:
        return f"{group or 'the core group'} defines no kind `{kind}` (kinds are case-sensitive); did you mean `{same[0]}`?"
    return None


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
    return [path for path, _ in _unknown_fields(raw, struct_type)]


def unknown_field_hints(raw: dict[str, Any], struct_type: type) -> list[tuple[str, str]]:
    """(path, "; did you mean `x`?" or the fields of that mapping) of every
    field of ``raw`` that ``struct_type`` does not define."""
    out = []
    for path, valid in _unknown_fields(raw, struct_type):
        guess = closest(path.rsplit(".", 1)[-1], valid)
        out.append((path, f"; did you mean `{guess}`?" if guess else f"; its fields: {', '.join(valid)}"))
    return out


def _unknown_fields(raw: dict[str, Any], struct_type: type) -> list[tuple[str, list[str]]]:
    """Each unknown field's path, with the fields its mapping does define."""
    found: list[tuple[str, list[str]]] = []
    info = _type_info(struct_type)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        if f.encode_name in raw and f.encode_name not in _IGNORED_TOP_LEVEL:
            _walk(raw[f.encode_name], f.type, f.encode_name, found)
    names = [f.encode_name for f in info.fields]
    for key in raw:
        if key not in names and key not in _IGNORED_TOP_LEVEL:
            found.append((str(key), names))
    return found


def _walk(value: Any, t: msgspec.inspect.Type, path: str, found: list[tuple[str, list[str]]]) -> None:
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
                found.append((f"{path}.{key}", list(names)))
            else:
                _walk(sub, f.type, f"{path}.{key}", found)
    elif isinstance(t, inspect.ListType) and isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, t.item_type, f"{path}[{i}]", found)
    elif isinstance(t, inspect.DictType) and isinstance(value, dict):
        for key, item in value.items():
            _walk(item, t.value_type, f"{path}.{key}", found)


# ------------------------------------------------------ unknown fields in policies

_RULE = r"spec\.rules\[\d+\]"

#: The predicates of an InferencePolicy: (where one starts, how it is named,
#: what it is about). Ignoring a field inside one makes it hold for more than
#: was written (a misspelled ``queuedPrompts`` in a ``drop`` drops every
#: Local candidate), which the error message says.
PREDICATES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(rf"^{_RULE}\.matches\[\d+\]\."), "a rule's `matches` entry", "requests"),
    (re.compile(rf"^{_RULE}\.route\.consider\[\d+\]\."), "a `consider` entry", "candidates"),
    (re.compile(rf"^{_RULE}\.route\.exclude\[\d+\]\.if\."), "an exclusion's `if`", "requests"),
    (re.compile(rf"^{_RULE}\.route\.exclude\[\d+\]\.drop\."), "an exclusion's `drop`", "candidates"),
    (re.compile(rf"^{_RULE}\.route\.select\[\d+\]\.backends\."), "a tier's `backends`", "candidates"),
)


def policy_unknown_fields(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """(path, message) of every unknown field of the InferencePolicy ``raw``:
    each is an error, not a warning. Every field of a policy decides where a
    request may go, so one that is ignored changes that silently: in a
    predicate it widens it; elsewhere it drops what it was meant to be
    (``exlude`` drops a rule's exclusions, a PII one included; ``matchs``
    makes a rule match every request; ``onEmtpy`` keeps the default)."""
    out: list[tuple[str, str]] = []
    for path, hint in unknown_field_hints(raw, r.InferencePolicy):
        for pattern, what, about in PREDICATES:
            m = pattern.match(path)
            if m is None:
                continue
            inner, _, key = path[m.end():].rpartition(".")
            where = f"`{inner}` in {what}" if inner else what
            out.append((path, f"`{key}` is not a field of {where}: ignoring it would widen the predicate (it "
                              f"would hold for more {about} than written), so it is an error{hint}"))
            break
        else:
            parent, _, key = path.rpartition(".")
            where = f"`{parent}`" if parent else "an InferencePolicy"
            out.append((path, f"`{key}` is not a field of {where}: ignoring it would change where requests "
                              f"go without a word, so it is an error{hint}"))
    return out
