"""Fetching a page: bounded in time and size, every failure one :class:`ScrapeError`.

The caller owns the client (one per collector,
:class:`kinference_common.upstream_http.UpstreamClient`: keep-alive
connections, one per target, the response parsed by ``httptools``; a scrape
costs about half the CPU it did through aiohttp's ``ClientSession``). A page
larger than ``max_bytes`` is refused (by Content-Length before reading, or as
soon as the body passes the cap), a target slower than ``timeout`` (connect,
headers and the whole body together) is cut off, and compression is refused
(``Accept-Encoding: identity``, and a compressed answer is an error) so a
small hostile body cannot inflate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from kinference_common.upstream_http import UpstreamClient, UpstreamError

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
HEADERS = (("Accept", ACCEPT), ("Accept-Encoding", "identity"), ("User-Agent", "kinference-collector"))


class ScrapeError(Exception):
    """One failed scrape; ``str()`` is short and safe to publish (no secrets)."""


def new_client() -> UpstreamClient:
    """The collector's one client. Idle connections are closed after 4 s, below
    the 5 s after which vLLM's server (uvicorn) closes them: a target scraped
    less often than that gets a new connection each time. Up to 65,536 parsed
    URLs are kept (two a pod, its page and its models, and one an exporter)."""
    return UpstreamClient(idle_timeout=4.0, max_urls=1 << 16)


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed scrape."""
    if isinstance(exc, ScrapeError):
        return str(exc)[:200]
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def fetch(client: UpstreamClient, url: str, timeout: float, max_bytes: int) -> bytes:
    """GET ``url`` and return the body; raise :class:`ScrapeError` for any failure."""
    try:
        async with asyncio.timeout(timeout):
            async with await client.get(url, HEADERS, connect_timeout=timeout, read_timeout=timeout) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}")
                if (resp.header("Content-Encoding") or "identity").strip().lower() != "identity":
                    raise ScrapeError("compressed body refused")
                length = resp.header("Content-Length")
                if length is not None and length.strip().isdigit() and int(length) > max_bytes:
                    raise ScrapeError(f"body too large ({int(length)} > {max_bytes} bytes)")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.chunks():
                    size += len(chunk)
                    if size > max_bytes:
                        raise ScrapeError(f"body too large (> {max_bytes} bytes)")
                    chunks.append(chunk)
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except ScrapeError:
        raise
    except (TimeoutError, asyncio.TimeoutError):
        raise ScrapeError("timeout") from None
    except (UpstreamError, OSError, ValueError) as exc:
        raise ScrapeError(describe(exc)) from None


class _Model(msgspec.Struct):
    id: str = ""
    max_model_len: int | None = None


class _Models(msgspec.Struct):
    data: list[_Model] = []


_models_decoder = msgspec.json.Decoder(_Models)


def context_window(body: bytes, model: str) -> int | None:
    """``max_model_len`` of ``model`` (or of the only/first model) in a /v1/models answer."""
    try:
        models = _models_decoder.decode(body)
    except msgspec.DecodeError:
        return None
    best: Any = None
    for m in models.data:
        if m.id == model:
            best = m
            break
        if best is None:
            best = m
    if best is None or best.max_model_len is None:
        return None
    return best.max_model_len if 0 < best.max_model_len < 1 << 31 else None
