"""Authentication: the caller becomes a tenant (RESOURCES.md, Tenants).

Modes:

- ``none`` (local development default): every caller is ``anonymous``;
- ``header``: trust ``x-kinference-tenant`` (a gateway in front has
  authenticated the caller; must be chosen explicitly);
- ``apiKey``: ``Authorization: Bearer <key>``. In local mode keys come from a
  YAML file::

      tenants:
        - name: alice
          apiKeys: [sk-alice-1, sk-alice-2]

Keys are never kept in the clear: the presented key is hashed (SHA-256) and
its digest compared with every known digest by ``hmac.compare_digest``.
Unknown or missing keys are rejected before any other work. Nothing secret is
logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec
import yaml

AuthMode = Literal["none", "header", "apiKey"]
TENANT_HEADER = "x-kinference-tenant"
ANONYMOUS = "anonymous"


class TenantsFileError(ValueError):
    pass


class _Tenant(msgspec.Struct, rename="camel"):
    name: str
    api_keys: list[str] = []


class _TenantsFile(msgspec.Struct):
    tenants: list[_Tenant] = []


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass
class Authenticator:
    mode: AuthMode = "none"
    _keys: list[tuple[bytes, str]] = field(default_factory=list)

    @classmethod
    def from_file(cls, mode: AuthMode, path: Path | None) -> Authenticator:
        auth = cls(mode)
        if mode == "apiKey":
            if path is None:
                raise TenantsFileError("apiKey mode needs a tenants file (--tenants-file)")
            auth.load(path)
        return auth

    def load(self, path: Path) -> None:
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            parsed = msgspec.convert(raw, _TenantsFile)
        except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
            raise TenantsFileError(f"{path}: {exc}") from None
        self._keys = [(_digest(key), t.name) for t in parsed.tenants for key in t.api_keys]

    def set_keys(self, keys: Iterable[tuple[str, str]]) -> None:
        """Replace every known key with ``(tenant, key)`` pairs (the
        Kubernetes mode's Secrets); the next request sees the new set."""
        self._keys = [(_digest(key), tenant) for tenant, key in keys]

    def tenant(self, headers: Mapping[str, str]) -> str | None:
        """The tenant of a request, or None when it must be rejected (401).
        ``headers`` has lower-cased names, as the router's HTTP server gives them."""
        get = headers.get
        if self.mode == "none":
            return ANONYMOUS
        if self.mode == "header":
            value = get(TENANT_HEADER)
            return value.strip() if value and value.strip() else None
        auth = get("authorization") or ""
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = _digest(key.strip())
        found: str | None = None
        # every known digest is compared, with no early exit: the time taken
        # does not depend on which key (if any) matched
        for known, tenant in self._keys:
            if hmac.compare_digest(known, digest):
                found = tenant
        return found
