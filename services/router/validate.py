"""How an upstream's refusal reaches the client (docs/hardening.md, "Error
codes"), and the shape of an explain request. What is wrong with a body is
:mod:`kinference_common.request_body`'s; a prompt longer than every
candidate's context window is the engine's
(:func:`kinference_common.engine.interpret`).

- :func:`upstream_refusal`: an upstream's 4xx or 5xx becomes the router's
  error envelope (with the decision id), keeping a 4xx's message.
- :func:`explain_input`: the shape of a ``POST /debug/explain`` body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from kinference_common.classifiers import given_tags
from kinference_common.request_body import BadRequest, decode, reads_as_chat
from kinference_router.upstream import parse_retry_after


class _UpstreamError(msgspec.Struct):
    message: Any = None
    code: Any = None


class _UpstreamEnvelope(msgspec.Struct):
    """OpenAI's ``{"error": {...}}``, vLLM's ``{"message", "code"}`` or FastAPI's ``{"detail"}``."""

    error: Any = None
    message: Any = None
    code: Any = None
    detail: Any = None


_envelope = msgspec.json.Decoder(_UpstreamEnvelope)
_CODES = {400: "bad_request", 404: "not_found", 409: "conflict", 413: "payload_too_large", 422: "bad_request"}


def upstream_refusal(status: int, payload: bytes, backend: str, retry_after: str | None = None,
                     ) -> tuple[int, str, str, float | None]:
    """``(status, code, message, retry_after)`` of the router's answer to an
    upstream's error status, at both front doors (the data port's send, the
    Endpoint Picker's response phase): a 4xx's message kept, its string
    ``code`` kept (``context_length_exceeded`` recognised in vLLM's wording).
    A 401, 403 or 404 is the router's configuration (a wrong key, a wrong
    served name), not the client's fault: 502 ``upstream_error`` naming the
    backend, as is a 5xx (its body not read: ``payload`` may be empty). A
    429 keeps its ``Retry-After``."""
    if status >= 500:
        return 502, "upstream_error", f"{backend} answered {status}", None
    message, code = _upstream_message(payload)
    if status in (401, 403, 404):
        what = f"answered {status}" + (f": {message}" if message else "")
        return 502, "upstream_error", f"{backend} {what}", None
    if status == 429:
        return 429, "rate_limited", message or f"{backend} is rate limiting", parse_retry_after(retry_after, 1.0)
    if code is None and message and "maximum context length" in message:
        code = "context_length_exceeded"
    return status, code or _CODES.get(status, "bad_request"), message or f"{backend} answered {status}", None


def _upstream_message(payload: bytes) -> tuple[str | None, str | None]:
    try:
        env = _envelope.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        text = payload.decode("utf-8", "replace").strip()
        return (text[:500] or None), None
    inner = env.error if isinstance(env.error, dict) else {}
    message = inner.get("message", env.message if env.message is not None else env.detail)
    if message is None and isinstance(env.error, str):
        message = env.error
    code = inner.get("code", env.code)
    return (message if isinstance(message, str) else (None if message is None else str(message)),
            code if isinstance(code, str) and code else None)


@dataclass
class ExplainInput:
    """A ``POST /debug/explain`` body: the request body to explain and the
    ``tenant``, ``tags`` and ``headers`` to explain it with."""

    body: dict[str, Any]
    chat: bool
    tenant: str
    headers: dict[str, str]
    tags: frozenset[str] | None


def explain_input(data: bytes) -> ExplainInput:
    """BadRequest naming the field that does not have its shape."""
    raw = decode(data)
    if not isinstance(raw, dict):
        raise BadRequest("expected a JSON object")
    inner = raw.get("body", raw)
    if not isinstance(inner, dict):
        raise BadRequest("`body` must be a JSON object: the request body to explain")
    inner = {k: v for k, v in inner.items() if k not in ("tenant", "tags", "headers")}
    headers = raw.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, (str, int, float)) for v in headers.values()):
        raise BadRequest("`headers` must be an object of header names to values")
    tags = raw.get("tags")
    if tags is not None and (not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)):
        raise BadRequest("`tags` must be a list of strings")
    if tags is not None:
        try:
            given_tags(tags)
        except ValueError as exc:
            raise BadRequest(f"`tags`: {exc}") from None
    tenant = raw.get("tenant")
    if tenant is not None and not isinstance(tenant, str):
        raise BadRequest("`tenant` must be a string")
    return ExplainInput(body=inner, chat=reads_as_chat(inner), tenant=tenant or "anonymous",
                        headers={str(k).lower(): str(v) for k, v in headers.items()},
                        tags=frozenset(tags) if tags is not None else None)
