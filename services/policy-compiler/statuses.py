"""Writing statuses where an operator can read them in local mode: one YAML
file per object under the status directory,
``<dir>/<Kind>/<namespace>/<name>.yaml`` holding ``{status: ...}``, plus
``<dir>/errors.yaml`` listing manifest errors. Files are replaced atomically;
files of objects that no longer exist are removed. ``lastTransitionTime`` is
kept for conditions whose status did not change (Kubernetes conventions).
Level-triggered like the Kubernetes writer: the first write reads what the
directory holds (a compiler restarted), so that an unchanged status is not
written again with a new ``lastTransitionTime`` and the file of an object
removed while the compiler was down goes too.
In Kubernetes mode the same statuses go to each object's status subresource.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import yaml

from kinference_common.compiler import CompileResult
from kinference_common.compiler.status import Condition, GieParentStatus, carry_transition_times
from kinference_common.manifests import ManifestError


def _statuses(res: CompileResult) -> dict[tuple[str, str, str], Any]:
    out: dict[tuple[str, str, str], Any] = {}
    for (ns, name), st in res.policy_status.items():
        out[("InferencePolicy", ns, name)] = st
    for (ns, name), st in res.pool_status.items():
        out[("InferencePool", ns, name)] = st
    for (ns, name), gst in res.gie_pool_status.items():
        out[("InferencePool.inference.networking.k8s.io", ns, name)] = gst
    for (ns, name), st in res.provider_status.items():
        out[("InferenceProvider", ns, name)] = st
    for (group, ns, name), st in res.objective_status.items():
        out[(f"InferenceObjective.{group}", ns, name)] = st
    for (group, ns, name), st in res.rewrite_status.items():
        out[(f"InferenceModelRewrite.{group}", ns, name)] = st
    return out


def _carry(old: Any, new: Any) -> Any:
    """``new`` with the ``lastTransitionTime`` of ``old``'s conditions that did
    not change: the object's own (copied to each of its parents, as the
    pool's status has them), or, for an Inference Extension pool (parents
    only), each parent's from the same parent's."""
    if old is None:
        return new
    if hasattr(new, "conditions"):
        conditions = carry_transition_times(old.conditions, new.conditions)
        changes: dict[str, Any] = {"conditions": conditions}
        if getattr(new, "parents", None):
            changes["parents"] = [msgspec.structs.replace(p, conditions=conditions) for p in new.parents]
        return msgspec.structs.replace(new, **changes)
    if getattr(new, "parents", None):
        before = {_ref(p.parent_ref): p.conditions for p in getattr(old, "parents", [])}
        return msgspec.structs.replace(new, parents=[
            msgspec.structs.replace(p, conditions=carry_transition_times(before.get(_ref(p.parent_ref), []),
                                                                          p.conditions))
            for p in new.parents])
    return new


def _ref(ref: Any) -> tuple[Any, ...]:
    return (ref.group, ref.kind, ref.name, ref.namespace)


#: the kinds (status directories) the compiler writes: only their files are read back
_OWN_KINDS = ("InferencePolicy", "InferencePool", "InferencePool.inference.networking.k8s.io", "InferenceProvider")
_OWN_KIND_PREFIXES = ("InferenceObjective.", "InferenceModelRewrite.")


def _own_kind(name: str) -> bool:
    return name in _OWN_KINDS or name.startswith(_OWN_KIND_PREFIXES)


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False, allow_unicode=True)
    os.replace(tmp, path)


#: added to the first condition's message (the MESSAGE printer column) while a manifest is refused
REFUSED_NOTE = "; WARNING: a manifest of it is refused (ManifestValid=False says which and why)"


def with_refused_condition(conditions: list[dict[str, Any]], refused: dict[str, Any]) -> list[dict[str, Any]]:
    """``conditions`` plus the ``ManifestValid=False`` one; the first
    condition's message also says so, since ``kubectl get`` shows that one
    (MESSAGE) and a refused edit was otherwise seen only in ``-o yaml``."""
    out = [dict(c) for c in conditions]
    if out and not out[0].get("message", "").endswith(REFUSED_NOTE):
        out[0]["message"] = out[0].get("message", "") + REFUSED_NOTE
    return [*out, refused]


def _broken_objects(errors: list[ManifestError], documents: Iterable[Any]) -> dict[tuple[str, str, str], dict]:
    """Status key -> the condition an object gets while its file's current
    version is broken and its last good version stays in force."""
    by_source: dict[str, list[ManifestError]] = {}
    for e in errors:
        by_source.setdefault(e.document.source, []).append(e)
    out: dict[tuple[str, str, str], dict] = {}
    for d in documents:
        doc = getattr(d, "document", None)
        if doc is None or doc.source not in by_source or doc.kind is None or doc.name is None:
            continue
        errs = by_source[doc.source]
        message = "; ".join(str(e) for e in errs[:3]) + (f" (and {len(errs) - 3} more)" if len(errs) > 3 else "")
        twice = all("is defined twice" in e.message for e in errs)
        key = (doc.kind, doc.namespace or "default", doc.name)
        if twice and key in out:
            continue  # the definition in force's own file is broken too: that says more
        out[key] = {
            "type": "ManifestValid", "status": "False", "reason": "InvalidManifest",
            "message": (f"another file defines it too, and that definition is refused (this one stays in "
                        f"force): {message}" if twice else
                        f"the file's current version is broken, its last good version stays in force: {message}")}
    return out


class StatusDirectory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._last: dict[tuple[str, str, str], Any] = {}
        self._written: dict[tuple[str, str, str], bytes] = {}
        self._observed = False

    def _observe(self) -> None:
        """What the directory holds of the kinds the compiler writes: each
        object's status file as written, its conditions (and an Inference
        Extension pool's parents') for their ``lastTransitionTime``. A file
        that cannot be read is written again, or removed when its object is
        gone; a file of another kind is left alone."""
        self._observed = True
        for path in sorted(self.root.glob("*/*/*.yaml")):
            kind, ns, name = path.parent.parent.name, path.parent.name, path.stem
            if not _own_kind(kind):
                continue
            key = (kind, ns, name)
            try:
                body = yaml.safe_load(path.read_text(encoding="utf-8"))
                status = body["status"]
                conditions = msgspec.convert(status.get("conditions") or [], list[Condition])
                parents = (msgspec.convert(status.get("parents") or [], list[GieParentStatus])
                           if kind == "InferencePool.inference.networking.k8s.io" else [])
            except Exception:  # noqa: BLE001 - not readable: written again (or removed) by this write
                self._written[key] = b""
                continue
            self._written[key] = msgspec.json.encode(body)
            self._last[key] = SimpleNamespace(conditions=conditions, parents=parents)

    def write(self, res: CompileResult, errors: list[ManifestError], documents: Iterable[Any] = ()) -> int:
        """Write changed statuses; return how many files changed. ``documents``:
        those in force (with where each came from), so that an object whose
        file is broken now, and kept at its last good version, says so."""
        if not self._observed:
            self._observe()
        current = {k: _carry(self._last.get(k), v) for k, v in _statuses(res).items()}
        broken = _broken_objects(errors, documents)
        changed = 0
        for key, st in sorted(current.items()):
            body = {"status": msgspec.to_builtins(st)}
            if key in broken:
                body["status"]["conditions"] = with_refused_condition(body["status"].get("conditions", []),
                                                                      broken[key])
            encoded = msgspec.json.encode(body)
            if self._written.get(key) == encoded:
                continue
            kind, ns, name = key
            _write(self.root / kind / ns / f"{name}.yaml", body)
            self._written[key] = encoded
            changed += 1
        for key in sorted(set(self._written) - set(current)):
            kind, ns, name = key
            (self.root / kind / ns / f"{name}.yaml").unlink(missing_ok=True)
            del self._written[key]
            changed += 1
        _write(self.root / "errors.yaml", {"errors": [e.to_dict() for e in errors],
                                           "warnings": msgspec.to_builtins(res.document_warnings)})
        self._last = current
        return changed


__all__ = ["StatusDirectory", "Condition"]
