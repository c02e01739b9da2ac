"""Provider API keys and tenant API keys from Kubernetes Secrets, watched
(``--source kubernetes``).

One watch of Secrets per namespace of ``--secret-namespaces`` (default: the
router's own namespace; ``*``: every namespace) through the shared informer
(:mod:`kinference_common.kube.informer`) serves both:

- **provider keys**: :meth:`KubeSecrets.read` answers the InferenceProvider's
  ``spec.auth.secretRef`` (the compiled pool names the Secret and the data
  key, in the provider's namespace) from the watch's cache, decoded at each
  request: a rotated key is used for the next request. Only ``Opaque``
  Secrets' data is kept (:func:`slim_secret`);
- **tenant keys**: a Secret labelled ``kinference.buoyant.io/tenant: <tenant>``
  with data key ``apiKey`` gives that tenant one key. On every change the
  :class:`~kinference_router.tenants.Authenticator`'s key set is replaced
  (it keeps only digests).

Which namespaces, and why not the cluster: the router's ServiceAccount may
list Secrets only where a RoleBinding grants it (``deploy/k8s/rbac_gen.py``),
so the watches are namespaced too, never a cluster-wide list (which RBAC
would refuse). A provider whose Secret lies in a namespace outside them is
not a silent 502: :meth:`KubeSecrets.read` says so, and the router reports it
(:mod:`kinference_router.key_report`) for the provider's status.

The same small interface as file mode: ``read(namespace, ref) -> str``
(:class:`~kinference_router.upstream.SecretFiles` in file mode) and
``Authenticator.set_keys`` (``Authenticator.load`` in file mode). Key values
are never logged, never published, never put in an error: messages name the
Secret and the data key, nothing more.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import structlog

from kinference_common.compiled import SecretRef
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretError, SecretNotWatched

log = structlog.get_logger("router.secrets")

#: a DNS label, what a namespace's name is
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: where a pod's service account token says which namespace the pod runs in
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

TENANT_LABEL = "kinference.buoyant.io/tenant"
TENANT_KEY = "apiKey"

Obj = dict[str, Any]


def own_namespace() -> str:
    """The router's namespace: ``$POD_NAMESPACE`` (the downward API), else the
    service account's (in a pod), else ``default`` (outside a cluster)."""
    ns = os.environ.get("POD_NAMESPACE", "").strip()
    if not ns:
        try:
            ns = SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip()
        except OSError:
            ns = ""
    return ns or "default"


def secret_namespaces(flag: str | None) -> list[str] | None:
    """``--secret-namespaces``: the namespaces to watch (None: every namespace,
    for ``*``); absent or empty: the router's own. ValueError naming a bad name."""
    names = [n.strip() for n in (flag or "").split(",") if n.strip()]
    if names == ["*"]:
        return None
    for n in names:
        if not _NAMESPACE.fullmatch(n):
            raise ValueError(f"--secret-namespaces: {n!r} is not a namespace name ('*' alone means every "
                             "namespace)")
    return sorted(set(names)) if names else [own_namespace()]


def _decode(secret: Mapping[str, Any], key: str) -> str | None:
    """The data key's value as text (base64 ``data`` first, then ``stringData``); None when absent."""
    data = secret.get("data") or {}
    if key in data and data[key] is not None:
        return base64.b64decode(str(data[key]), validate=True).decode("utf-8").strip()
    string_data = secret.get("stringData") or {}
    if key in string_data and string_data[key] is not None:
        return str(string_data[key]).strip()
    return None


def slim_secret(secret: Obj) -> Obj:
    """What the router keeps of a Secret: name, namespace, labels, and the
    data of ``Opaque`` Secrets only (the type provider and tenant keys use;
    Kubernetes' default). Service-account tokens, TLS keys, registry
    credentials, Helm releases... are never held in memory."""
    meta = secret.get("metadata") or {}
    out: Obj = {"metadata": {k: meta[k] for k in ("name", "namespace", "labels", "resourceVersion") if k in meta}}
    if secret.get("type", "Opaque") == "Opaque":
        for field in ("data", "stringData"):
            if field in secret:
                out[field] = secret[field]
    return out


def tenant_keys(secrets: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """``(tenant, key)`` of every tenant Secret (pure); bad ones are logged by name and skipped."""
    out = []
    for s in secrets:
        meta = s.get("metadata") or {}
        tenant = (meta.get("labels") or {}).get(TENANT_LABEL)
        if tenant is None:
            continue
        where = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if not tenant.strip():
            log.warning("tenant secret ignored: empty tenant label", secret=where, label=TENANT_LABEL)
            continue
        try:
            key = _decode(s, TENANT_KEY)
        except (binascii.Error, ValueError):
            log.warning("tenant secret ignored: data.apiKey is not base64 text", secret=where)
            continue
        if not key:
            log.warning("tenant secret ignored: no data.apiKey", secret=where)
            continue
        out.append((tenant.strip(), key))
    return out


class KubeSecrets:
    """Secrets from the API server for the router. ``rc`` is a
    :class:`kinference_common.kube.client.ResourceClient`; ``auth`` (optional)
    receives the tenant keys."""

    def __init__(self, rc: Any, auth: Authenticator | None = None, *,
                 namespaces: list[str] | None = None) -> None:
        from kinference_common.kube import kinds
        from kinference_common.kube.informer import Informer

        self.auth = auth
        #: the namespaces watched (None: every namespace)
        self.namespaces: list[str] | None = sorted(set(namespaces)) if namespaces is not None else None
        # (kube.config.api_client keeps the client's body logging off: Secrets' data)
        self.informer = Informer(rc, kinds.SECRET, namespaces=namespaces, on_change=self._changed,
                                 transform=slim_secret)
        self.tenants = 0
        self._key_count = 0

    def _changed(self) -> None:
        if self.auth is None:
            return
        keys = tenant_keys(self.informer.items().values())
        self.auth.set_keys(keys)
        tenants = len({t for t, _ in keys})
        if (tenants, len(keys)) != (self.tenants, self._key_count):
            log.info("tenant keys loaded", tenants=tenants, keys=len(keys))  # counts only, never keys
        self.tenants, self._key_count = tenants, len(keys)

    def start(self) -> None:
        self.informer.start()

    async def stop(self) -> None:
        await self.informer.stop()

    async def wait_synced(self, timeout: float | None = None) -> None:
        from kinference_common.kube.informer import wait_synced

        await wait_synced([self.informer], timeout)

    @property
    def synced(self) -> bool:
        """Every watched namespace listed once (before that a Secret may be missing only from the cache)."""
        return self.informer.synced.is_set()

    def watches(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def listed(self, namespace: str) -> bool:
        """Whether the namespace's Secrets were listed (a 403 there keeps it False)."""
        return self.informer.listed(namespace)

    def read(self, namespace: str, ref: SecretRef) -> str:
        """The provider key the Secret holds now (``SecretFiles.read``'s contract)."""
        if not self.watches(namespace):
            raise SecretNotWatched(f"secret {namespace}/{ref.name}: this router does not watch the Secrets of "
                                   f"namespace {namespace} (--secret-namespaces)")
        secret = self.informer.get(namespace, ref.name)
        if secret is None:
            raise SecretError(f"secret {namespace}/{ref.name} not found")
        try:
            value = _decode(secret, ref.key)
        except (binascii.Error, ValueError):
            raise SecretError(f"secret {namespace}/{ref.name} key {ref.key} is not base64 text") from None
        if not value:
            raise SecretError(f"secret {namespace}/{ref.name} has no key {ref.key}")
        return value
