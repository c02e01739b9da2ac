"""What an off-cluster provider receives: exactly what was classified, or
known to be harmless (docs/hardening.md, "What a provider receives").

A local pod gets the client's request as it came (minus hop-by-hop headers
and the client's own credentials: :mod:`kinference_router.app`). A provider
gets

- **headers**: only what the router sets itself: ``Content-Type:
  application/json``, ``Accept`` (``text/event-stream`` for a stream,
  ``application/json`` otherwise), ``User-Agent: kinference-router``,
  ``X-Client-Request-Id`` (the decision id, random), ``Authorization``
  (the provider's key, from its Secret; added by the caller) and the
  ``Host``/``Content-Length`` the HTTP client writes. No client header is
  forwarded unless the operator names it (``--provider-header NAME``), and
  a name in :func:`forbidden_header` (cookies, credentials, forwarding
  chains, ``X-User-*``...) cannot be named.
- **body**: the client's body without the fields of
  :data:`~kinference_common.prompt_texts.PRIVATE_FIELDS` (``user``,
  ``metadata``, ``safety_identifier``, ``prompt_cache_key``) and with
  ``model`` set to the provider's name for it (and, for a stream,
  ``stream_options.include_usage``). Every other string in it is
  one the classifiers read
  (:func:`kinference_common.prompt_texts.texts_from_body`): what is not
  dropped here is classified there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kinference_common.prompt_texts import PRIVATE_FIELDS
from kinference_router.stream_usage import ask_usage

USER_AGENT = "kinference-router"

_encoder = msgspec.json.Encoder()

#: header names no operator allowlist may forward to a provider
_FORBIDDEN = frozenset({
    "cookie", "cookie2", "set-cookie", "authorization", "proxy-authorization", "x-api-key", "api-key",
    "x-auth-token", "x-access-token", "x-csrf-token", "x-xsrf-token", "forwarded", "x-real-ip",
    "true-client-ip", "cf-connecting-ip", "x-client-ip", "x-cluster-client-ip", "via", "x-kinference-tenant",
    "host", "content-length", "content-type", "connection", "keep-alive", "transfer-encoding", "te",
    "upgrade", "trailer", "expect",
})
_FORBIDDEN_PREFIXES = ("x-forwarded-", "x-user-", "x-amzn-", "x-envoy-", "x-b3-", "x-goog-", "x-ms-")


def forbidden_header(name: str) -> str | None:
    """Why ``name`` may never be forwarded to a provider (None when it may)."""
    n = name.strip().lower()
    if not n:
        return "an empty header name"
    if n in _FORBIDDEN:
        return f"{name} is a credential, a cookie, a forwarding or a hop-by-hop header, or set by the router"
    if n.startswith(_FORBIDDEN_PREFIXES):
        return f"{name} identifies the client or the path it came by"
    return None


def check_allowlist(names: Iterable[str]) -> frozenset[str]:
    """The operator's ``--provider-header`` names, lower-cased; ValueError
    naming the first one that may never be forwarded."""
    out = set()
    for name in names:
        why = forbidden_header(name)
        if why is not None:
            raise ValueError(f"--provider-header {name!r} refused: {why}")
        out.add(name.strip().lower())
    return frozenset(out)


def headers(client_headers: Mapping[str, str], *, stream: bool, request_id: str,
            allow: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The headers of a provider request (``Authorization`` is the caller's
    to add). ``client_headers`` have lower-cased names (the HTTP server's
    ``Request.headers``); only those named in ``allow`` are forwarded."""
    out = [("Content-Type", "application/json"),
           ("Accept", "text/event-stream" if stream else "application/json"),
           ("User-Agent", USER_AGENT),
           ("X-Client-Request-Id", request_id)]
    for name in allow:
        value = client_headers.get(name)
        if value is not None:
            out.append((name, value))
    return out


def body(raw: Mapping[str, Any], model: str, *, usage: bool = True) -> bytes:
    """The body of a provider request: ``raw`` without its private fields,
    ``model`` replaced; a stream asks for its usage (``stream_usage``: the
    router counts a provider's tokens, the client gets only what it asked for).
    ``usage=False``: the Endpoint Picker's body for the egress, whose send
    path (this one) asks for the usage itself: the body the egress token
    covers keeps the client's own ``stream_options``, which then decide
    whether the client gets the usage event."""
    src = ask_usage(raw) if usage else raw
    return _encoder.encode({**{k: v for k, v in src.items() if k not in PRIVATE_FIELDS}, "model": model})
