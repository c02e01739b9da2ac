"""An in-process Kubernetes API server, enough of one for the real
``kubernetes_asyncio`` client and for ``kubectl get`` / ``kubectl describe``.

There is no kube-apiserver on these machines, so the Kubernetes paths of the
services are tested against this. It keeps the semantics the controllers rely
on, exactly:

- one global, monotonically increasing ``resourceVersion``; a list answers
  ``metadata.resourceVersion``; a watch from it streams ``ADDED`` /
  ``MODIFIED`` / ``DELETED`` lines, ``BOOKMARK`` events when asked
  (``allowWatchBookmarks``), and ends after ``timeoutSeconds``;
- a watch from a version older than the compaction window answers an
  ``ERROR`` event with a ``Status`` of code 410 (as the real server does);
- the ``status`` subresource: writes to ``.../status`` change only
  ``status``; writes to the main resource never change ``status``;
  ``metadata.generation`` rises only when something other than metadata and
  status changes; ``uid`` and ``creationTimestamp`` are set on create;
- optimistic concurrency: an update (PUT, or a patch carrying
  ``metadata.resourceVersion``) with a stale version is a 409 Conflict;
- ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!``)
  and ``fieldSelector`` (any dotted field, ``=``/``==``/``!=``) on list and
  watch;
- JSON merge patch, JSON patch (a list body) and strategic merge patch
  (treated as a merge patch: lists are replaced);
- Table responses (``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``)
  from the CRDs' ``additionalPrinterColumns``; ``events.k8s.io/v1`` Events are
  also served as core ``v1`` Events (``involvedObject``, ``count``...), so
  ``kubectl describe`` lists them.

CustomResourceDefinitions: given as files (``--crds``) or created through
the API (``kubectl apply -f deploy/k8s/crds``), their kinds are served from
then on; deleting one stops serving its kinds.

Defaulting: the CRDs' ``default:`` values are filled in on create and
update, as the real server does (so ``kubectl get infpol`` shows
``UNMATCHED ServeLocal`` for a policy that does not say). What it does not
do: schema validation or pruning (objects are stored as sent otherwise, so
a manifest's unknown fields reach the controllers, as they do from files),
authentication (a bearer token only names the user in the
request log), admission, finalizers, garbage collection, server-side apply.
Authorization is off (every request is allowed, and recorded) except for the
users given rules in :attr:`FakeKubeAPI.roles` (``--role USER=SERVICE`` as a
process): a request their rules do not cover is answered 403 Forbidden, as
RBAC would. A rule granted per namespace (``per_namespace``: the router's
Secrets) allows only in the namespaces of :attr:`FakeKubeAPI.role_namespaces`
(``--role-namespaces USER=NS,...``), as RoleBindings would, never at the
cluster scope.

Test hooks (methods of :class:`FakeKubeAPI`): :meth:`~FakeKubeAPI.drop_watches`,
:meth:`~FakeKubeAPI.compact` (the next watch from an older version gets 410),
:meth:`~FakeKubeAPI.go_down` (every request answers 503 for a while, open
watches are cut), and :attr:`~FakeKubeAPI.requests`: every request as a
:class:`RequestRecord` (who, verb, group, resource[/subresource]). Objects can
be read and written directly (:meth:`~FakeKubeAPI.get`,
:meth:`~FakeKubeAPI.apply`, :meth:`~FakeKubeAPI.set_status`,
:meth:`~FakeKubeAPI.delete`), bypassing HTTP.

As a process::

    python -m kinference_simulators.kubeapi --port 0 --crds deploy/k8s/crds \\
        --kubeconfig-out /tmp/kubeconfig

writes a kubeconfig pointing at it (``kubectl --kubeconfig /tmp/kubeconfig
get infpol -A``) and serves until SIGTERM. ``--token NAME=TOKEN`` adds a
user whose bearer token identifies it in the request log; ``--role
NAME=SERVICE`` restricts that user to the service's declared RBAC rules
(``kinference_common.kube.rbac.SERVICE_RULES``), so a service started with
a kubeconfig for that token (``--kubeconfig-out`` writes one per token, as
``FILE.NAME``) runs with exactly the permissions its Role grants.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import signal
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from kinference_common.kube.rbac import allowed_at

Obj = dict[str, Any]


# ------------------------------------------------------------------ resources


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    #: a status subresource: main writes keep status, /status writes only status
    status_subresource: bool = False
    #: additionalPrinterColumns of the CRD (name, type, jsonPath, priority, description)
    columns: tuple[dict[str, Any], ...] = ()
    #: the storage another type shares (core v1 Events read events.k8s.io's)
    view_of: tuple[str, str] | None = None
    #: the CRD version's openAPIV3Schema: its ``default:`` values are applied
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


def _builtin(group: str, version: str, plural: str, kind: str, **kw: Any) -> ResourceType:
    return ResourceType(group, version, plural, kind, singular=kind.lower(), **kw)


GIE_GROUPS = ("inference.networking.x-k8s.io", "llm-d.ai")

BUILTIN_TYPES: list[ResourceType] = [
    _builtin("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    _builtin("", "v1", "pods", "Pod", short_names=("po",), status_subresource=True, columns=(
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "IP", "type": "string", "jsonPath": ".status.podIP"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
             namespaced=False, short_names=("crd", "crds"), status_subresource=True),
    _builtin("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    _builtin("", "v1", "events", "Event", short_names=("ev",), view_of=("events.k8s.io", "events")),
    _builtin("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease", columns=(
        {"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})),
    _builtin("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute", status_subresource=True,
             categories=("gateway-api",)),
    _builtin("gateway.networking.k8s.io", "v1", "gateways", "Gateway", short_names=("gtw",),
             status_subresource=True, categories=("gateway-api",)),
    _builtin("gateway.networking.k8s.io", "v1", "gatewayclasses", "GatewayClass", namespaced=False,
             short_names=("gc",), status_subresource=True, categories=("gateway-api",)),
    _builtin("", "v1", "services", "Service", short_names=("svc",)),
    _builtin("gateway.networking.k8s.io", "v1beta1", "referencegrants", "ReferenceGrant",
             short_names=("refgrant",), categories=("gateway-api",)),
    *[_builtin(g, "v1alpha2", "inferenceobjectives", "InferenceObjective", status_subresource=True)
      for g in GIE_GROUPS],
    *[_builtin(g, "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite", status_subresource=True)
      for g in GIE_GROUPS],
]


def load_crds(paths: Iterable[str | Path]) -> list[ResourceType]:
    """ResourceTypes from CustomResourceDefinition files or directories."""
    out: list[ResourceType] = []
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        files.extend(sorted(p.glob("*.y*ml")) if p.is_dir() else [p])
    for f in files:
        for doc in yaml.safe_load_all(f.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                out.extend(crd_types(doc))
    return out


def crd_types(doc: Obj) -> list[ResourceType]:
    """The ResourceTypes one CustomResourceDefinition serves (a version each)."""
    spec = doc["spec"]
    names = spec["names"]
    return [ResourceType(
        group=spec["group"], version=v["name"], plural=names["plural"], kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        singular=names.get("singular", names["kind"].lower()),
        short_names=tuple(names.get("shortNames", [])),
        categories=tuple(names.get("categories", [])),
        status_subresource="status" in (v.get("subresources") or {}),
        columns=tuple(v.get("additionalPrinterColumns", [])),
        schema=(v.get("schema") or {}).get("openAPIV3Schema"),
    ) for v in spec.get("versions", []) if v.get("served", True)]


# ------------------------------------------------------------------ selectors


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


_SET_RE = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")


def label_matcher(selector: str | None) -> Any:
    """A predicate on a labels dict for a ``labelSelector`` string."""
    if not selector:
        return lambda labels: True
    tests = []
    for term in _split_top(selector):
        m = _SET_RE.match(term)
        if m:
            k, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                tests.append(lambda lb, k=k, vals=vals: lb.get(k) in vals)
            else:
                tests.append(lambda lb, k=k, vals=vals: lb.get(k) not in vals)
        elif "!=" in term:
            k, v = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda lb, k=k, v=v: lb.get(k) != v)
        elif "=" in term:
            k, v = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda lb, k=k, v=v: lb.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda lb, k=term[1:].strip(): k not in lb)
        else:
            tests.append(lambda lb, k=term: k in lb)
    return lambda labels: all(t(labels) for t in tests)


def _dotted(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    return str(cur).lower() if isinstance(cur, bool) else str(cur)


def field_matcher(selector: str | None) -> Any:
    """A predicate on an object for a ``fieldSelector`` string."""
    if not selector:
        return lambda obj: True
    tests = []
    for term in _split_top(selector):
        if "!=" in term:
            k, v = term.split("!=", 1)
            tests.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) != v)
        else:
            k, v = term.replace("==", "=").split("=", 1)
            tests.append(lambda o, k=k.strip(), v=v.strip(): _dotted(o, k) == v)
    return lambda obj: all(t(obj) for t in tests)


# ---------------------------------------------------------------- json paths


def _jsonpath(obj: Any, path: str) -> list[Any]:
    """The subset of kubectl's JSONPath that printer columns use:
    ``.a.b``, ``[0]``, ``[*]``, ``[?(@.k=="v")]``."""
    tokens = re.findall(r"\.([A-Za-z0-9_-]+)|\[(\*|\d+|\?\(@\.[A-Za-z0-9_.-]+==[\"'][^\"']*[\"']\))\]", path)
    values = [obj]
    for name, bracket in tokens:
        nxt: list[Any] = []
        for v in values:
            if name:
                if isinstance(v, dict) and name in v:
                    nxt.append(v[name])
            elif bracket == "*":
                if isinstance(v, list):
                    nxt.extend(v)
            elif bracket.isdigit():
                if isinstance(v, list) and int(bracket) < len(v):
                    nxt.append(v[int(bracket)])
            else:
                m = re.match(r"\?\(@\.([A-Za-z0-9_.-]+)==[\"']([^\"']*)[\"']\)", bracket)
                assert m
                if isinstance(v, list):
                    nxt.extend(x for x in v if isinstance(x, dict) and _dotted(x, m.group(1)) == m.group(2))
        values = nxt
    return values


def human_age(ts: str | None, now: float | None = None) -> str:
    """``kubectl``'s short duration (``5s``, ``3m``, ``2d``) since an RFC 3339 time."""
    if not ts:
        return "<unknown>"
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return "<invalid>"
    s = max(0, int((now or time.time()) - then))
    if s < 120:
        return f"{s}s"
    if s < 3600 * 3:
        return f"{s // 60}m"
    if s < 86400 * 2:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


# ------------------------------------------------------------------- patches


def apply_defaults(schema: dict[str, Any] | None, value: Any) -> Any:
    """``value`` with the schema's ``default:`` values filled in where a
    property is absent, in objects and in list items, as the API server does
    for a structural schema (in place; returns ``value``)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if not isinstance(sub, dict):
                continue
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                apply_defaults(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in list(value):
                if name not in (schema.get("properties") or {}):
                    apply_defaults(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def _default_spec(t: ResourceType, obj: Obj) -> None:
    """The schema's defaults in everything but ``metadata`` (``spec`` and
    ``status`` alike, as the API server does)."""
    props = (t.schema or {}).get("properties") or {}
    for name, sub in props.items():
        if name in ("metadata", "apiVersion", "kind") or not isinstance(sub, dict):
            continue
        if name not in obj and "default" in sub:
            obj[name] = copy.deepcopy(sub["default"])
        if name in obj:
            apply_defaults(sub, obj[name])


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


class PatchError(Exception):
    pass


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    doc = copy.deepcopy(doc)

    def parent(path: str) -> tuple[Any, str]:
        parts = _pointer(path)
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(path: str) -> Any:
        cur = doc
        for p in _pointer(path) if path else []:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    for op in ops:
        try:
            kind, path = op["op"], op["path"]
            if kind in ("add", "replace", "copy", "move"):
                value = copy.deepcopy(op["value"]) if kind in ("add", "replace") else get(op["from"])
                if kind == "move":
                    c, k = parent(op["from"])
                    del c[int(k) if isinstance(c, list) else k]
                c, k = parent(path)
                if isinstance(c, list):
                    if k == "-":
                        c.append(value)
                    elif kind == "replace":
                        c[int(k)] = value
                    else:
                        c.insert(int(k), value)
                else:
                    if kind == "replace" and k not in c:
                        raise PatchError(f"replace: {path} does not exist")
                    c[k] = value
            elif kind == "remove":
                c, k = parent(path)
                del c[int(k) if isinstance(c, list) else k]
            elif kind == "test":
                if get(path) != op["value"]:
                    raise PatchError(f"test failed at {path}")
            else:
                raise PatchError(f"unknown op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(f"cannot apply {op!r}: {exc}") from None
    return doc


# --------------------------------------------------------------- the storage


@dataclass(frozen=True)
class RequestRecord:
    """One request: who (bearer token's user, else User-Agent), what verb on
    which group and resource (``"inferencepolicies/status"`` for a
    subresource), in which namespace (None: all / cluster)."""

    who: str
    verb: str
    group: str
    resource: str
    namespace: str | None = None


@dataclass(eq=False)
class _Watch:
    rtype: ResourceType
    namespace: str | None
    labels: Any
    fields: Any
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Obj:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class FakeKubeAPI:
    """The storage, the HTTP app and the test hooks. Start with
    :meth:`start` (binds 127.0.0.1, port 0 by default), stop with :meth:`stop`."""

    def __init__(
        self,
        crds: Iterable[str | Path] = (),
        *,
        extra_types: Iterable[ResourceType] = (),
        history: int = 10_000,
        bookmark_interval: float = 1.0,
        tokens: dict[str, str] | None = None,
    ) -> None:
        self.types: list[ResourceType] = [*BUILTIN_TYPES, *load_crds(crds), *extra_types]
        self._by_key = {(t.group, t.version, t.plural): t for t in self.types}
        self._store: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        #: (rv, storage key, event type, object) of recent changes
        self._history: deque[tuple[int, tuple[str, str], str, Obj]] = deque(maxlen=history)
        self._compacted = 0
        self._watches: set[_Watch] = set()
        self._down_until = 0.0
        self.bookmark_interval = bookmark_interval
        #: bearer token -> user name (the identity in :attr:`requests`)
        self.tokens: dict[str, str] = dict(tokens or {})
        #: user -> RBAC rules (objects with ``allows(verb, group, resource)``); users
        #: not listed may do anything
        self.roles: dict[str, list[Any]] = {}
        #: user -> the namespaces where its ``per_namespace`` rules are bound (RoleBindings);
        #: elsewhere, and at the cluster scope, those rules allow nothing
        self.role_namespaces: dict[str, set[str]] = {}
        self.requests: list[RequestRecord] = []
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self.host = "127.0.0.1"

    # ------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> FakeKubeAPI:
        self.host = host
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, user: str = "test", token: str | None = None, namespace: str = "default") -> Obj:
        """A kubeconfig (as a dict) pointing at this server."""
        u: Obj = {"token": token} if token else {}
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": u}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": user, "namespace": namespace}}],
        }

    def write_kubeconfig(self, path: str | Path, user: str = "test", token: str | None = None) -> Path:
        """Write :meth:`kubeconfig` to ``path``; with ``token``, register it
        for ``user`` so the request log names the user."""
        if token:
            self.tokens[token] = user
        p = Path(path)
        p.write_text(yaml.safe_dump(self.kubeconfig(user, token)), encoding="utf-8")
        return p

    # ---------------------------------------------------------------- hooks

    def drop_watches(self) -> None:
        """End every open watch stream (the clients see their watch end)."""
        for w in list(self._watches):
            w.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the history: a watch from any version before now gets 410 Gone."""
        self._history.clear()
        self._bump()  # every version a client has seen is now too old
        self._compacted = self._rv

    def go_down(self, seconds: float) -> None:
        """Answer 503 to every request for ``seconds``; open watches are cut."""
        self._down_until = time.monotonic() + seconds
        self.drop_watches()

    def come_back(self) -> None:
        self._down_until = 0.0

    def unserve(self, group: str, plural: str | None = None) -> None:
        """Stop serving a group's kinds (or one), as if its CRD were not installed."""
        self.types = [t for t in self.types if not (t.group == group and plural in (None, t.plural))]
        self._by_key = {(t.group, t.version, t.plural): t for t in self.types}

    def serve(self, *types: ResourceType) -> None:
        """Serve more kinds (a CRD installed while running)."""
        self.types.extend(types)
        self._by_key = {(t.group, t.version, t.plural): t for t in self.types}

    @property
    def open_watches(self) -> int:
        """How many watch streams are open now."""
        return len(self._watches)

    @property
    def resource_version(self) -> int:
        return self._rv

    def used(self, who: str) -> set[tuple[str, str, str]]:
        """(verb, group, resource[/subresource]) that ``who`` requested."""
        return {(r.verb, r.group, r.resource) for r in self.requests if r.who == who}

    # --------------------------------------------------------- direct access

    def rtype(self, group: str, kind_or_plural: str, version: str | None = None) -> ResourceType:
        for t in self.types:
            if t.group == group and kind_or_plural in (t.kind, t.plural) and t.view_of is None \
                    and (version is None or t.version == version):
                return t
        raise KeyError(f"no resource {kind_or_plural} in group {group!r}")

    def rtype_for(self, obj: Obj) -> ResourceType:
        api = obj.get("apiVersion", "")
        group, _, version = api.rpartition("/")
        return self.rtype(group, obj.get("kind", ""), version or None)

    def get(self, group: str, kind: str, namespace: str | None, name: str) -> Obj | None:
        t = self.rtype(group, kind)
        o = self._store.get(t.key, {}).get((namespace or "", name))
        return copy.deepcopy(o) if o is not None else None

    def list(self, group: str, kind: str, namespace: str | None = None) -> list[Obj]:
        t = self.rtype(group, kind)
        return [copy.deepcopy(o) for (ns, _), o in sorted(self._store.get(t.key, {}).items())
                if namespace is None or ns == namespace]

    def apply(self, obj: Obj) -> Obj:
        """Create or replace an object, as ``kubectl apply`` would (status
        kept as is for kinds without a status subresource, and on create of
        Pods, so tests can make ready pods in one step)."""
        t = self.rtype_for(obj)
        meta = obj.get("metadata", {})
        ns = meta.get("namespace", "default") if t.namespaced else ""
        cur = self._store.get(t.key, {}).get((ns, meta["name"]))
        if cur is None:
            return self._create(t, ns, obj, keep_status=True)
        body = copy.deepcopy(obj)
        body.setdefault("metadata", {})["resourceVersion"] = cur["metadata"]["resourceVersion"]
        return self._update(t, ns, meta["name"], body, status=False)

    def set_status(self, group: str, kind: str, namespace: str | None, name: str, status: Obj) -> Obj:
        t = self.rtype(group, kind)
        return self._patch(t, namespace or "", name, {"status": status}, status=True)

    def delete(self, group: str, kind: str, namespace: str | None, name: str) -> Obj:
        t = self.rtype(group, kind)
        return self._delete(t, namespace or "", name)

    # ------------------------------------------------------------ mutations

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, t: ResourceType, etype: str, obj: Obj) -> None:
        if t.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_changed(etype, obj)
        snap = copy.deepcopy(obj)
        self._history.append((self._rv, t.key, etype, snap))
        ns = obj["metadata"].get("namespace", "")
        labels = obj["metadata"].get("labels") or {}
        for w in list(self._watches):
            st = w.rtype.view_of or w.rtype.key
            if st != t.key or (w.namespace is not None and w.namespace != ns):
                continue
            view = self._view(w.rtype, snap)
            if w.labels(labels) and w.fields(view):
                w.queue.put_nowait({"type": etype, "object": view})

    def _crd_changed(self, etype: str, crd: Obj) -> None:
        """A CustomResourceDefinition created, changed or deleted through the API
        (``kubectl apply -f deploy/k8s/crds``): serve its kinds from now on, or
        stop serving them (their objects are kept, unlike a real server's)."""
        try:
            spec = crd["spec"]
            group, plural = spec["group"], spec["names"]["plural"]
            new = [] if etype == "DELETED" else crd_types(crd)
        except (KeyError, TypeError):
            return  # not a usable definition: serves nothing
        self.types = [t for t in self.types if not (t.group == group and t.plural == plural)] + new
        self._by_key = {(t.group, t.version, t.plural): t for t in self.types}

    def _create(self, t: ResourceType, ns: str, body: Obj, keep_status: bool = False) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            else:
                raise ApiError(422, "Invalid", f"{t.kind} is invalid: metadata.name: Required value")
        if t.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the "
                               "namespace of the request")
            meta["namespace"] = ns
        table = self._store.setdefault(t.key, {})
        key = (ns, meta["name"])
        if key in table:
            raise ApiError(409, "AlreadyExists", f'{t.plural}.{t.group} "{meta["name"]}" already exists'
                           if t.group else f'{t.plural} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": t.group, "kind": t.plural})
        obj["apiVersion"], obj["kind"] = t.api_version, t.kind
        _default_spec(t, obj)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        if t.status_subresource and not (keep_status and t.kind == "Pod"):
            obj.pop("status", None)
        meta["resourceVersion"] = self._bump()
        table[key] = obj
        self._emit(t, "ADDED", obj)
        return copy.deepcopy(obj)

    def _current(self, t: ResourceType, ns: str, name: str) -> Obj:
        cur = self._store.get(t.key, {}).get((ns, name))
        if cur is None:
            what = f"{t.plural}.{t.group}" if t.group else t.plural
            raise ApiError(404, "NotFound", f'{what} "{name}" not found',
                           {"name": name, "group": t.group, "kind": t.plural})
        return cur

    def _conflict(self, t: ResourceType, name: str) -> ApiError:
        what = f"{t.plural}.{t.group}" if t.group else t.plural
        return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {what} "{name}": the object has '
                        "been modified; please apply your changes to the latest version and try again",
                        {"name": name, "group": t.group, "kind": t.plural})

    def _update(self, t: ResourceType, ns: str, name: str, body: Obj, status: bool) -> Obj:
        cur = self._current(t, ns, name)
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if rv and rv != cur["metadata"]["resourceVersion"]:
            raise self._conflict(t, name)
        new = copy.deepcopy(body)
        new["apiVersion"], new["kind"] = t.api_version, t.kind
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name of the request")
        # what the server owns stays the server's
        for k in ("uid", "creationTimestamp", "generation", "namespace", "name"):
            if k in cur["metadata"]:
                meta[k] = cur["metadata"][k]
            else:
                meta.pop(k, None)
        if t.status_subresource:
            if status:  # only status changes
                keep = copy.deepcopy(cur)
                if "status" in new:
                    keep["status"] = new["status"]
                else:
                    keep.pop("status", None)
                new = keep
            elif "status" in cur:
                new["status"] = copy.deepcopy(cur["status"])
            else:
                new.pop("status", None)
        _default_spec(t, new)
        if new == cur or (_strip_rv(new) == _strip_rv(cur)):
            return copy.deepcopy(cur)  # a no-op write does not bump the version
        if _spec_part(new) != _spec_part(cur):
            new["metadata"]["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = self._bump()
        self._store[t.key][(ns, name)] = new
        self._emit(t, "MODIFIED", new)
        return copy.deepcopy(new)

    def _patch(self, t: ResourceType, ns: str, name: str, patch: Any, status: bool) -> Obj:
        cur = self._current(t, ns, name)
        try:
            if isinstance(patch, list):
                patched = json_patch(cur, patch)
            elif isinstance(patch, dict):
                patched = merge_patch(cur, patch)
            else:
                raise PatchError("a patch is a JSON object (merge patch) or a list (JSON patch)")
        except PatchError as exc:
            raise ApiError(422, "Invalid", str(exc)) from None
        if isinstance(patch, dict):
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise self._conflict(t, name)
        patched.setdefault("metadata", {})["resourceVersion"] = cur["metadata"]["resourceVersion"]
        return self._update(t, ns, name, patched, status=status)

    def _delete(self, t: ResourceType, ns: str, name: str) -> Obj:
        cur = self._current(t, ns, name)
        del self._store[t.key][(ns, name)]
        gone = copy.deepcopy(cur)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._emit(t, "DELETED", gone)
        return gone

    # ------------------------------------------------------------------ views

    def _view(self, t: ResourceType, obj: Obj) -> Obj:
        """The object as ``t`` shows it (core v1 Events from events.k8s.io/v1)."""
        if t.view_of is None:
            return obj
        return _core_event(obj)

    # ------------------------------------------------------------------- http

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if time.monotonic() < self._down_until:
            err = ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            return web.json_response(err.status(), status=503)
        try:
            return await handler(request)
        except ApiError as exc:
            return web.json_response(exc.status(), status=exc.code)

    def _who(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[7:].strip()
            return self.tokens.get(token, token)
        return request.headers.get("User-Agent", "")

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if request.path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if request.path == "/version":
            return web.json_response({"major": "1", "minor": "32", "gitVersion": "v1.32.0-kinference-fake",
                                      "platform": "linux/amd64", "goVersion": "go1.23"})
        if parts == ["api"]:
            return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]})
        if parts == ["apis"]:
            return web.json_response(self._group_list())
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        elif len(parts) == 2 and parts[0] == "apis":
            return web.json_response(self._group(parts[1]) or {}, status=200 if self._group(parts[1]) else 404)
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        if not rest:
            return web.json_response(self._resource_list(group, version))
        return await self._resource_request(request, group, version, rest)

    def _group_list(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for t in self.types:
            if t.group and t.version not in groups.setdefault(t.group, []):
                groups[t.group].append(t.version)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in groups]}

    def _group(self, group: str) -> Obj | None:
        versions = []
        for t in self.types:
            if t.group == group and t.version not in versions:
                versions.append(t.version)
        if not versions:
            return None
        vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": vs, "preferredVersion": vs[0]}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources = []
        for t in self.types:
            if t.group != group or t.version != version:
                continue
            resources.append({
                "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                **({"shortNames": list(t.short_names)} if t.short_names else {}),
                **({"categories": list(t.categories)} if t.categories else {}),
            })
            if t.status_subresource:
                resources.append({"name": f"{t.plural}/status", "singularName": "", "namespaced": t.namespaced,
                                  "kind": t.kind, "verbs": ["get", "patch", "update"]})
        if not resources:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({group}/{version})")
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    async def _resource_request(self, request: web.Request, group: str, version: str,
                                rest: list[str]) -> web.StreamResponse:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural = rest[0]
        t = self._by_key.get((group, version, plural))
        if t is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({plural})")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub not in (None, "status") or len(rest) > 3 or (sub == "status" and not t.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not t.namespaced:
            namespace = None
        q = request.query
        watching = q.get("watch") in ("1", "true", "True")
        verb = {"GET": "watch" if watching else ("get" if name else "list"), "POST": "create", "PUT": "update",
                "PATCH": "patch", "DELETE": "delete"}.get(request.method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed")
        who = self._who(request)
        resource = f"{plural}/{sub}" if sub else plural
        self.requests.append(RequestRecord(who, verb, group, resource, namespace))
        if who in self.roles and not allowed_at(self.roles[who], verb, group, resource, namespace,
                                                self.role_namespaces.get(who, ())):
            where = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            raise ApiError(403, "Forbidden", f'{plural}{"." + group if group else ""} is forbidden: User "{who}" '
                           f'cannot {verb} resource "{resource}" in API group "{group}" {where}',
                           {"kind": plural, "group": group})
        ns = namespace or ""
        store_t = self.rtype(*t.view_of) if t.view_of else t
        if verb == "watch":
            return await self._watch(request, t, namespace)
        if verb == "list":
            return self._list(request, t, store_t, namespace)
        if verb == "get":
            assert name
            obj = self._view(t, self._current(store_t, ns, name))
            if _wants_table(request):
                return web.json_response(self._table(t, [obj]))
            return web.json_response(obj)
        if t.view_of is not None:
            raise ApiError(405, "MethodNotAllowed", f"write {t.plural} through {t.view_of[0]}")
        if verb == "delete":
            if name is None:
                raise ApiError(405, "MethodNotAllowed", "DELETE needs an object name")
            return web.json_response(self._delete(t, ns, name))
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, "BadRequest", f"the request body is not JSON: {exc}") from None
        if verb == "create":
            if name:
                raise ApiError(405, "MethodNotAllowed", "POST to a collection, not to an object")
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the object must be a JSON object")
            return web.json_response(self._create(t, ns, body), status=201)
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{request.method} needs an object name")
        if verb == "update":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the object must be a JSON object")
            return web.json_response(self._update(t, ns, name, body, status=sub == "status"))
        return web.json_response(self._patch(t, ns, name, body, status=sub == "status"))

    def _list(self, request: web.Request, t: ResourceType, store_t: ResourceType,
              namespace: str | None) -> web.Response:
        q = request.query
        labels, fields = label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector"))
        items = []
        for (ns, _), o in sorted(self._store.get(store_t.key, {}).items()):
            if namespace is not None and ns != namespace:
                continue
            v = self._view(t, o)
            if labels(o["metadata"].get("labels") or {}) and fields(v):
                items.append(copy.deepcopy(v))
        if _wants_table(request):
            return web.json_response(self._table(t, items))
        return web.json_response({"kind": f"{t.kind}List", "apiVersion": t.api_version,
                                  "metadata": {"resourceVersion": str(self._rv)}, "items": items})

    async def _watch(self, request: web.Request, t: ResourceType, namespace: str | None) -> web.StreamResponse:
        q = request.query
        store_key = t.view_of or t.key
        rv_text = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds", "0") or 0) or 1800.0
        bookmarks = q.get("allowWatchBookmarks") in ("1", "true", "True")
        w = _Watch(t, namespace, label_matcher(q.get("labelSelector")), field_matcher(q.get("fieldSelector")))
        resp = web.StreamResponse(headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        await resp.prepare(request)

        async def send(event: Obj) -> None:
            await resp.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")

        def matches(o: Obj) -> bool:
            ns = o["metadata"].get("namespace", "")
            return (namespace is None or ns == namespace) and w.labels(o["metadata"].get("labels") or {}) \
                and w.fields(self._view(t, o))

        initial: list[Obj] = []
        if rv_text in ("", "0"):
            for o in self._store.get(store_key, {}).values():
                if matches(o):
                    initial.append({"type": "ADDED", "object": self._view(t, copy.deepcopy(o))})
        else:
            try:
                rv = int(rv_text)
            except ValueError:
                rv = -1
            if rv < self._compacted or rv > self._rv:
                gone = ApiError(410, "Expired", f"too old resource version: {rv_text} ({self._compacted})")
                await send({"type": "ERROR", "object": gone.status()})
                return resp
            for hrv, key, etype, o in self._history:
                if hrv > rv and key == store_key and matches(o):
                    initial.append({"type": etype, "object": self._view(t, o)})
        self._watches.add(w)
        try:
            for ev in initial:
                await send(ev)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, self.bookmark_interval) if bookmarks else left
                try:
                    ev = await asyncio.wait_for(w.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and time.monotonic() < deadline:
                        await send({"type": "BOOKMARK", "object": {
                            "kind": t.kind, "apiVersion": t.api_version,
                            "metadata": {"resourceVersion": str(self._rv)}}})
                    continue
                if ev is None:  # dropped by a hook
                    break
                await send(ev)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._watches.discard(w)
        return resp

    # ----------------------------------------------------------------- tables

    def _table(self, t: ResourceType, items: list[Obj]) -> Obj:
        cols: list[dict[str, Any]] = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
                                       "description": "Name must be unique within a namespace."}]
        specs = list(t.columns) or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        for c in specs:
            cols.append({"name": c["name"], "type": "string" if c.get("type") == "date" else c.get("type", "string"),
                         "format": c.get("format", ""), "priority": c.get("priority", 0),
                         "description": c.get("description", "")})
        rows = []
        for o in items:
            cells: list[Any] = [o["metadata"]["name"]]
            for c in specs:
                values = _jsonpath(o, c["jsonPath"])
                if c.get("type") == "date":
                    cells.append(human_age(values[0]) if values else "<unknown>")
                elif not values:
                    cells.append(None)
                elif len(values) == 1 and not isinstance(values[0], (dict, list)):
                    cells.append(values[0])
                else:
                    cells.append(",".join(json.dumps(v) if isinstance(v, (dict, list)) else str(v)
                                          for v in values))
            rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata",
                                                    "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": str(self._rv)},
                "columnDefinitions": cols, "rows": rows}


def pod(name: str, namespace: str, labels: dict[str, str], ip: str, *, ready: bool = True,
        phase: str = "Running", node: str = "node-1") -> Obj:
    """A Pod as the kubelet would report it: ``status.podIP``, ``phase`` and
    a ``Ready`` condition (``FakeKubeAPI.apply`` keeps a Pod's status on
    create; change it later with ``set_status("", "Pod", ns, name, {...})``)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "simulated"}]},
        "status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": _now()}]},
    }


def _strip_rv(o: Obj) -> Obj:
    c = dict(o)
    c["metadata"] = {k: v for k, v in o.get("metadata", {}).items() if k != "resourceVersion"}
    return c


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first


def _seconds(micro_time: str | None) -> str | None:
    """``2026-01-01T00:00:00.123456Z`` -> ``2026-01-01T00:00:00Z``."""
    return micro_time[:19] + "Z" if micro_time and len(micro_time) >= 19 else None


def _core_event(e: Obj) -> Obj:
    """An events.k8s.io/v1 Event as core v1 shows it."""
    meta = e["metadata"]
    series = e.get("series") or {}
    out: Obj = {
        "apiVersion": "v1", "kind": "Event", "metadata": meta,
        "involvedObject": e.get("regarding") or {},
        "reason": e.get("reason", ""), "message": e.get("note", ""), "type": e.get("type", ""),
        "source": {"component": e.get("reportingController", "")},
        "reportingComponent": e.get("reportingController", ""),
        "reportingInstance": e.get("reportingInstance", ""),
        "action": e.get("action", ""),
        "count": series.get("count") or e.get("deprecatedCount") or 1,
        "firstTimestamp": e.get("deprecatedFirstTimestamp") or _seconds(e.get("eventTime")),
        "lastTimestamp": e.get("deprecatedLastTimestamp") or _seconds(series.get("lastObservedTime"))
        or _seconds(e.get("eventTime")),
        "eventTime": e.get("eventTime"),
    }
    return out


# ------------------------------------------------------------------ process


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kinference_simulators.kubeapi",
                                description="An in-process fake Kubernetes API server for tests and demos.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see the kubeconfig)")
    p.add_argument("--crds", action="append", default=[], metavar="DIR|FILE",
                   help="CustomResourceDefinition files or directories to serve (repeatable)")
    p.add_argument("--kubeconfig-out", type=Path, metavar="FILE", help="write a kubeconfig pointing here")
    p.add_argument("--token", action="append", default=[], metavar="USER=TOKEN",
                   help="a bearer token and the user it identifies in the request log")
    p.add_argument("--role", action="append", default=[], metavar="USER=SERVICE",
                   help="allow USER only what SERVICE's declared RBAC rules allow (policy-compiler, "
                        "telemetry-collector, router); others get 403 Forbidden")
    p.add_argument("--role-namespaces", action="append", default=[], metavar="USER=NS[,NS...]",
                   help="where USER's per-namespace rules (the router's Secrets) are bound, as RoleBindings "
                        "would (default: nowhere, so every Secret is refused)")
    p.add_argument("--apply", action="append", default=[], metavar="FILE|DIR",
                   help="create these manifests at start (YAML, multi-document)")
    args = p.parse_args(argv)
    tokens = {}
    for t in args.token:
        user, _, token = t.partition("=")
        if not token:
            p.error(f"--token {t!r}: expected USER=TOKEN")
        tokens[token] = user
    from kinference_common.kube.rbac import SERVICE_RULES

    roles = {}
    for r in args.role:
        user, _, service = r.partition("=")
        if service not in SERVICE_RULES:
            p.error(f"--role {r!r}: expected USER=SERVICE, SERVICE one of {', '.join(sorted(SERVICE_RULES))}")
        roles[user] = SERVICE_RULES[service]

    bound: dict[str, set[str]] = {}
    for r in args.role_namespaces:
        user, _, names = r.partition("=")
        if not user or not names:
            p.error(f"--role-namespaces {r!r}: expected USER=NS[,NS...]")
        bound.setdefault(user, set()).update(n.strip() for n in names.split(",") if n.strip())

    async def run() -> None:
        api = FakeKubeAPI(args.crds, tokens=tokens)
        api.roles.update(roles)
        api.role_namespaces.update(bound)
        await api.start(args.host, args.port)
        for path in args.apply:
            for f in sorted(Path(path).glob("*.y*ml")) if Path(path).is_dir() else [Path(path)]:
                for doc in yaml.safe_load_all(f.read_text(encoding="utf-8")):
                    if isinstance(doc, dict) and doc.get("kind"):
                        try:
                            api.apply(doc)
                        except (KeyError, ApiError) as exc:
                            print(f"kubeapi: {f}: skipped {doc.get('kind')}: {exc}", file=sys.stderr)
        if args.kubeconfig_out:
            api.write_kubeconfig(args.kubeconfig_out)
            for token, user in sorted(tokens.items()):
                api.write_kubeconfig(f"{args.kubeconfig_out}.{user}", user=user, token=token)
        print(f"kubeapi: serving on {api.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await api.stop()

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
