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

  The file is read strictly (:func:`parse_tenants`): an unknown field (with
  the closest valid name suggested), a wrong type, a tenant without keys or a
  key given to two tenants is a :class:`TenantsFileError` naming the file, the
  tenant and the field, never a tenant silently left without its keys. The
  file is read once, at start-up; a failed :meth:`Authenticator.load` keeps
  the keys already loaded.

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
from typing import Any, Literal

import yaml

from kinference_common.manifests import StrictLoader, closest

AuthMode = Literal["none", "header", "apiKey"]
TENANT_HEADER = "x-kinference-tenant"
ANONYMOUS = "anonymous"


class TenantsFileError(ValueError):
    """A tenants file that cannot be used, with one line saying where and why."""


_TOP_FIELDS = ("tenants",)
_TENANT_FIELDS = ("name", "apiKeys")
_FORMAT = "tenants: [{name: NAME, apiKeys: [KEY, ...]}]"


def _kind(value: Any) -> str:
    """What a YAML value is, for a message (never the value: it may be a key)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _unknown(field: Any, valid: tuple[str, ...]) -> str:
    name = str(field)
    guess = closest(name, valid)
    hint = f" (did you mean {guess!r}?)" if guess else ""
    return f"unknown field {name!r}{hint}; the fields are {', '.join(valid)}"


def parse_tenants(raw: Any, where: str) -> list[tuple[str, list[str]]]:
    """``(tenant, keys)`` of a tenants file's parsed YAML, checked strictly;
    :class:`TenantsFileError` (``where`` and what is wrong, one line) else.
    Messages name fields and tenants, never a key."""
    if raw is None:
        raise TenantsFileError(f"{where}: the file is empty; expected {_FORMAT}")
    if not isinstance(raw, dict):
        raise TenantsFileError(f"{where}: expected a mapping {_FORMAT}, got {_kind(raw)}")
    for k in raw:
        if k not in _TOP_FIELDS:
            raise TenantsFileError(f"{where}: {_unknown(k, _TOP_FIELDS)}")
    entries = raw.get("tenants")
    if not isinstance(entries, list):
        if entries is None:
            raise TenantsFileError(f"{where}: field 'tenants' is missing or empty: no tenant could authenticate")
        raise TenantsFileError(f"{where}: field 'tenants' must be a list of {{name, apiKeys}}, "
                               f"got {_kind(entries)}")
    if not entries:
        raise TenantsFileError(f"{where}: field 'tenants' is empty: no tenant could authenticate")
    out: list[tuple[str, list[str]]] = []
    owner: dict[str, str] = {}
    for i, entry in enumerate(entries):
        at = f"{where}: tenants[{i}]"
        if not isinstance(entry, dict):
            raise TenantsFileError(f"{at}: expected a mapping {{name, apiKeys}}, got {_kind(entry)}")
        name = entry.get("name")
        if isinstance(name, str) and name.strip():
            at = f"{where}: tenant {name!r} (tenants[{i}])"
        for k in entry:
            if k not in _TENANT_FIELDS:
                raise TenantsFileError(f"{at}: {_unknown(k, _TENANT_FIELDS)}")
        if isinstance(name, str) and name != name.strip():
            raise TenantsFileError(f"{at}: field 'name' has leading or trailing whitespace")
        if not isinstance(name, str) or not name.strip():
            what = ("missing" if name is None else "empty" if isinstance(name, str)
                    else f"{_kind(name)}, not a string" + (" (quote it)" if isinstance(name, (int, float)) else ""))
            raise TenantsFileError(f"{at}: field 'name' is {what}")
        keys = entry.get("apiKeys")
        if keys is None or keys == []:
            raise TenantsFileError(f"{at}: no keys: field 'apiKeys' is missing or empty "
                                   f"(every request of {name!r} would get 401)")
        if not isinstance(keys, list):
            raise TenantsFileError(f"{at}: field 'apiKeys' must be a list of strings, got {_kind(keys)}"
                                   + (" (write apiKeys: [KEY])" if isinstance(keys, str) else ""))
        for j, key in enumerate(keys):
            if not isinstance(key, str):
                raise TenantsFileError(f"{at}: field 'apiKeys[{j}]' must be a string, got {_kind(key)}"
                                       + (" (quote it)" if isinstance(key, (int, float, bool)) else ""))
            if not key.strip():
                raise TenantsFileError(f"{at}: field 'apiKeys[{j}]' is empty")
            if key != key.strip():
                raise TenantsFileError(f"{at}: field 'apiKeys[{j}]' has leading or trailing whitespace "
                                       "(a presented key never has them: it could never match)")
            other = owner.setdefault(key, name)
            if other != name:
                raise TenantsFileError(f"{at}: field 'apiKeys[{j}]' is also a key of tenant {other!r}: "
                                       "a key must belong to one tenant")
        out.append((name, keys))
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error in one line: what and where."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'cannot parse'}{where}"
    return " ".join(str(exc).split())


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
        elif path is not None:  # ignoring it would leave the router open while its keys look in force
            raise TenantsFileError(f"--tenants-file {path} is read only with --auth apiKey (this router runs "
                                   f"--auth {mode}, where the file's keys would not be asked for)")
        return auth

    def load(self, path: Path) -> None:
        """Replace the keys with the file's; on any error (raised, one line)
        the keys already loaded stay."""
        where = f"tenants file {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TenantsFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise TenantsFileError(f"{where}: not UTF-8 text") from None
        try:
            raw = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader that refuses duplicate keys
        except yaml.YAMLError as exc:
            raise TenantsFileError(f"{where}: not valid YAML: {_yaml_problem(exc)}") from None
        tenants = parse_tenants(raw, where)
        self._keys = [(_digest(key), name) for name, keys in tenants for key in keys]

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
