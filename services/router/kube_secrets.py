"""Provider API keys and tenant API keys from Kubernetes Secrets, watched
(``--source kubernetes``).

One watch of Secrets (in ``--namespaces``, or every namespace) through the
shared informer (:mod:`kinference_common.kube.informer`) serves both:

- **provider keys**: :meth:`KubeSecrets.read` answers the InferenceProvider's
  ``spec.auth.secretRef`` (the compiled pool names the Secret and the data
  key, in the provider's namespace) from the watch's cache, decoded at each
  request: a rotated key is used for the next request. Only ``Opaque``
  Secrets' data is kept (:func:`slim_secret`);
- **tenant keys**: a Secret labelled ``kinference.buoyant.io/tenant: <tenant>``
  with data key ``apiKey`` gives that tenant one key. On every change the
  :class:`~kinference_router.tenants.Authenticator`'s key set is replaced
  (it keeps only digests).

The same small interface as file mode: ``read(namespace, ref) -> str``
(:class:`~kinference_router.upstream.SecretFiles` in file mode) and
``Authenticator.set_keys`` (``Authenticator.load`` in file mode). Key values
are never logged, never published, never put in an error: messages name the
Secret and the data key, nothing more.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any

import structlog

from kinference_common.compiled import SecretRef
from kinference_router.tenants import Authenticator
from kinference_router.upstream import SecretError

log = structlog.get_logger("router.secrets")

TENANT_LABEL = "kinference.buoyant.io/tenant"
TENANT_KEY = "apiKey"

Obj = dict[str, Any]


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

    def read(self, namespace: str, ref: SecretRef) -> str:
        """The provider key the Secret holds now (``SecretFiles.read``'s contract)."""
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
