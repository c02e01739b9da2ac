"""The OpenAI-compatible surface both simulators share: request parsing, responses, SSE.

Handlers parse a body into a :class:`Prompted` (what the engine needs), then
hand :func:`respond` an async iterator of ``(token_text, finish_reason)``;
it writes either one JSON body or an SSE stream (``data: {...}`` chunks, an
optional usage chunk when ``stream_options.include_usage`` is set, then
``data: [DONE]``), exactly as OpenAI and vLLM do.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from . import tokens

_json = msgspec.json.Encoder()


class ChatRequest(msgspec.Struct):
    messages: list[dict[str, Any]]
    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1


class CompletionRequest(msgspec.Struct):
    prompt: Any
    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1


class TokenizeRequest(msgspec.Struct):
    """vLLM's ``POST /tokenize`` body: a completion ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: Any = None
    messages: list[dict[str, Any]] | None = None


_chat_decoder = msgspec.json.Decoder(ChatRequest)
_tokenize_decoder = msgspec.json.Decoder(TokenizeRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "BadRequestError",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.headers = headers or {}

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.type, self.headers)


def error_response(
    status: int, message: str, type_: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": status}}
    return web.Response(
        status=status, body=_json.encode(body), content_type="application/json", headers=headers
    )


@dataclass(frozen=True, slots=True)
class Prompted:
    """A parsed request."""

    chat: bool
    model: str | None
    #: what the engine tokenizes (chat: the rendered template)
    prompt: str
    #: what the user sent, as plain text (message contents joined by newlines)
    text: str
    #: prompt tokens given directly (a token-id completion prompt), else None
    prompt_token_ids: int | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool

    @property
    def prompt_tokens(self) -> int:
        if self.prompt_token_ids is not None:
            return self.prompt_token_ids
        return tokens.count_tokens(self.prompt)


def _decode(decoder: msgspec.json.Decoder, body: bytes) -> Any:  # type: ignore[type-arg]
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"invalid request: {exc}") from None


def parse(body: bytes, *, chat: bool) -> Prompted:
    if chat:
        req = _decode(_chat_decoder, body)
        if not req.messages:
            raise ApiError(400, "messages must not be empty")
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        prompt = tokens.render_chat(req.messages)
        text = tokens.messages_text(req.messages)
        ids = None
    else:
        req = _decode(_completion_decoder, body)
        max_tokens = req.max_tokens
        p = req.prompt
        ids = None
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if isinstance(p, str):
            prompt = text = p
        elif isinstance(p, list) and p and all(isinstance(t, int) for t in p):
            prompt = text = " ".join(str(t) for t in p)
            ids = len(p)
        else:
            raise ApiError(400, "prompt must be a string, a list of one string, or token ids")
    if req.n != 1:
        raise ApiError(400, "the simulator supports n=1 only")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}")
    if req.min_tokens < 0:
        raise ApiError(400, "min_tokens must be non-negative")
    opts = req.stream_options or {}
    return Prompted(
        chat=chat,
        model=req.model,
        prompt=prompt,
        text=text,
        prompt_token_ids=ids,
        stream=req.stream,
        include_usage=bool(req.stream and opts.get("include_usage")),
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
    )


def parse_tokenize(body: bytes) -> tuple[str | None, str]:
    """``(model, text)`` of a ``/tokenize`` body: the prompt string, or the chat
    messages rendered as a chat request's prompt is (so the ids match what
    the engine caches)."""
    req = _decode(_tokenize_decoder, body)
    if req.messages is not None:
        if req.prompt is not None:
            raise ApiError(400, "give either prompt or messages, not both")
        if not req.messages:
            raise ApiError(400, "messages must not be empty")
        return req.model, tokens.render_chat(req.messages)
    p = req.prompt
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
        p = p[0]
    if not isinstance(p, str):
        raise ApiError(400, "prompt must be a string (or give messages)")
    return req.model, p


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


async def respond(
    request: web.Request,
    p: Prompted,
    *,
    response_id: str,
    model: str,
    prompt_tokens: int,
    stream: AsyncIterator[tuple[str, str | None]],
    cached_tokens: Callable[[], int | None] | None = None,
    fingerprint: str | None = None,
) -> web.StreamResponse:
    """Answer with the tokens of ``stream``, as one JSON body or as SSE chunks;
    ``cached_tokens`` (called once the stream is done): the usage's
    ``prompt_tokens_details.cached_tokens``, when given; ``fingerprint``: the
    ``system_fingerprint`` of the body and of every chunk, when given."""
    cached = cached_tokens or (lambda: None)
    extra: dict[str, Any] = {} if fingerprint is None else {"system_fingerprint": fingerprint}
    created = int(time.time())
    obj = "chat.completion" if p.chat else "text_completion"
    if not p.stream:
        parts: list[str] = []
        reason: str | None = None
        async for text, fin in stream:
            parts.append(text)
            reason = fin or reason
        content = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if p.chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice["text"] = content
        body = {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage(prompt_tokens, len(parts), cached()),
            **extra,
        }
        return web.Response(body=_json.encode(body), content_type="application/json")

    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    chunk_obj = "chat.completion.chunk" if p.chat else "text_completion"

    def chunk(delta: dict[str, Any] | str, fin: str | None) -> bytes:
        c: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": fin}
        if p.chat:
            c["delta"] = delta
        else:
            c["text"] = delta
        return (
            b"data: "
            + _json.encode(
                {
                    "id": response_id,
                    "object": chunk_obj,
                    "created": created,
                    "model": model,
                    "choices": [c],
                    **extra,
                }
            )
            + b"\n\n"
        )

    try:
        if p.chat:
            await resp.write(chunk({"role": "assistant", "content": ""}, None))
        n = 0
        async for text, fin in stream:
            n += 1
            await resp.write(chunk({"content": text} if p.chat else text, fin))
        if p.include_usage:
            await resp.write(
                b"data: "
                + _json.encode(
                    {
                        "id": response_id,
                        "object": chunk_obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage(prompt_tokens, n, cached()),
                        **extra,
                    }
                )
                + b"\n\n"
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the caller cleans up what it started
    return resp
