"""Manifests from a Kubernetes API server: a :class:`ManifestSource` over
informers' caches, so the cluster is compiled by the same code path as a
directory.

Every kind the compiler reads (InferencePolicy, InferencePool,
InferenceWorkerSet, InferenceProvider; HTTPRoute, ReferenceGrant, Gateway and
GatewayClass; the Inference Extension's InferenceObjective and
InferenceModelRewrite in both of their groups and its InferencePool (v1);
Services, for endpointPickerRef) is listed and watched in the namespaces in scope (all when
none is given). A change of any cache only marks the source dirty;
:meth:`poll` reports it and the service recompiles everything from the
caches (level-triggered). Until every informer has listed once,
:meth:`poll` answers False and :meth:`documents` is empty, so nothing is
compiled, written or published from a partial picture.

Each object is decoded exactly as a file's document is
(:func:`kinference_common.manifests.decode_document`). "A bad document is
reported and skipped; the last good configuration stays in force": an
object that does not decode or fails the schema rules is reported (an
error, and a Warning Event on it) and its last good version, if the same
object (same uid) ever had one, stays in force.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from kinference_common.compiler import validate
from kinference_common.kube import kinds
from kinference_common.kube.client import Obj, ResourceClient
from kinference_common.kube.informer import Informer
from kinference_common.kube.kinds import Kind
from kinference_common.manifests import DocumentRef, Loaded, LoadedObject, ManifestError, decode_document

#: what the compiler watches
WATCHED: tuple[Kind, ...] = kinds.COMPILER_INPUTS


def source_name(kind: Kind, namespace: str, name: str) -> str:
    """How an object is named where a file path would be: ``InferencePool default/x``."""
    group = f".{kind.group}" if kind.group and kind.group != "kinference.buoyant.io" else ""
    return f"{kind.kind}{group} {namespace}/{name}"


@dataclass
class _Decoded:
    version: str
    loaded: Loaded
    errors: list[ManifestError]


class KubernetesSource:
    def __init__(
        self,
        rc: ResourceClient,
        namespaces: Collection[str] | None = None,
        *,
        watch_timeout: int = 300,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
    ) -> None:
        self.rc = rc
        self.namespaces = sorted(set(namespaces)) if namespaces is not None else None
        self._dirty = True
        #: called whenever a cache changes (the service's wake)
        self.on_change: Callable[[], None] = lambda: None
        self.informers: dict[Kind, Informer] = {
            k: Informer(rc, k, namespaces=self.namespaces if k.namespaced else None, on_change=self._changed,
                        watch_timeout=watch_timeout, backoff_base=backoff_base, backoff_cap=backoff_cap)
            for k in WATCHED
        }
        #: (kind, namespace, name) -> the last decode of that object
        self._decoded: dict[tuple[Kind, str, str], _Decoded] = {}
        #: (kind, namespace, name) -> (uid, last good Loaded)
        self._good: dict[tuple[Kind, str, str], tuple[str, LoadedObject]] = {}
        #: every Service in scope is watched, so an endpointPickerRef can be checked
        self.services_visible = True

    # -------------------------------------------------------------- lifecycle

    def _changed(self) -> None:
        self._dirty = True
        self.on_change()

    def start(self) -> None:
        for inf in self.informers.values():
            inf.start()

    async def stop(self) -> None:
        await asyncio.gather(*(inf.stop() for inf in self.informers.values()))

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers.values())

    async def wait_synced(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(asyncio.gather(*(i.synced.wait() for i in self.informers.values())), timeout)

    # ------------------------------------------------------- ManifestSource

    def poll(self) -> bool:
        if not self.synced or not self._dirty:
            return False
        self._dirty = False
        self._decode_all()
        return True

    def documents(self) -> list[Loaded]:
        out: list[Loaded] = []
        for key, d in sorted(self._decoded.items(), key=lambda kv: _sort_key(kv[0])):
            if not d.errors:
                out.append(d.loaded)
            elif key in self._good:
                out.append(self._good[key][1])
        return out

    def errors(self) -> list[ManifestError]:
        return [e for key, d in sorted(self._decoded.items(), key=lambda kv: _sort_key(kv[0])) for e in d.errors]

    def kept_at_last_good(self) -> list[str]:
        return [source_name(*key) for key, d in sorted(self._decoded.items(), key=lambda kv: _sort_key(kv[0]))
                if d.errors and key in self._good]

    # ----------------------------------------------------------- for status

    def observed(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        """The object as last seen (for its resourceVersion and status)."""
        return self.informers[kind].get(namespace, name)

    # ---------------------------------------------------------------- decode

    def _decode_all(self) -> None:
        seen: set[tuple[Kind, str, str]] = set()
        for kind, inf in self.informers.items():
            for (ns, name), obj in inf.items().items():
                key = (kind, ns, name)
                seen.add(key)
                version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                prev = self._decoded.get(key)
                if prev is not None and prev.version == version:
                    continue
                self._decoded[key] = d = self._decode(kind, ns, name, version, obj)
                uid = str((obj.get("metadata") or {}).get("uid", ""))
                if not d.errors and isinstance(d.loaded, LoadedObject):
                    self._good[key] = (uid, d.loaded)
                elif key in self._good and self._good[key][0] != uid:
                    del self._good[key]  # a new object of the same name: its predecessor is no fallback
        for key in set(self._decoded) - seen:
            del self._decoded[key]
            self._good.pop(key, None)

    @staticmethod
    def _decode(kind: Kind, ns: str, name: str, version: str, obj: Obj) -> _Decoded:
        doc: dict[str, Any] = dict(obj)
        doc.setdefault("apiVersion", kind.api_version)
        doc.setdefault("kind", kind.kind)
        # errors then read "kinference.buoyant.io/v1alpha1#1 (InferencePool team/x) at spec...: ..."
        loaded = decode_document(doc, DocumentRef(kind.api_version, 1))
        errors: list[ManifestError] = []
        if isinstance(loaded, ManifestError):
            errors.append(loaded)
        elif isinstance(loaded, LoadedObject):
            errors.extend(ManifestError(loaded.document, p, m) for p, m in validate.problems(loaded.obj))
        return _Decoded(version, loaded, errors)


def _sort_key(key: tuple[Kind, str, str]) -> tuple[int, str, str]:
    return (WATCHED.index(key[0]), key[1], key[2])
