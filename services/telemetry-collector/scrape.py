"""Fetching a page: bounded in time and size, every failure one :class:`ScrapeError`.

The caller owns the :class:`aiohttp.ClientSession` (one per collector). A page
larger than ``max_bytes`` is refused (by Content-Length before reading, or as
soon as the body passes the cap), a target slower than ``timeout`` (connect,
headers and the whole body together) is cut off, and compression is refused
(``Accept-Encoding: identity``, no auto-decompression) so a small hostile
body cannot inflate.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import msgspec

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
HEADERS = {"Accept": ACCEPT, "Accept-Encoding": "identity", "User-Agent": "kinference-collector"}


class ScrapeError(Exception):
    """One failed scrape; ``str()`` is short and safe to publish (no secrets)."""


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    """The collector's one session: no global timeout (each fetch sets its own)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, ttl_dns_cache=60, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=None),
        headers=HEADERS,
        auto_decompress=False,
        raise_for_status=False,
    )


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed scrape."""
    if isinstance(exc, ScrapeError):
        return str(exc)[:200]
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timeout"
    text = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def fetch(session: aiohttp.ClientSession, url: str, timeout: float, max_bytes: int) -> bytes:
    """GET ``url`` and return the body; raise :class:`ScrapeError` for any failure."""
    try:
        async with asyncio.timeout(timeout):
            async with session.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise ScrapeError(f"HTTP {resp.status}")
                if resp.headers.get("Content-Encoding", "identity").lower() not in ("identity", ""):
                    raise ScrapeError("compressed body refused")
                length = resp.content_length
                if length is not None:
                    if length > max_bytes:
                        raise ScrapeError(f"body too large ({length} > {max_bytes} bytes)")
                    return await resp.read()
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(65536):
                    size += len(chunk)
                    if size > max_bytes:
                        raise ScrapeError(f"body too large (> {max_bytes} bytes)")
                    chunks.append(chunk)
                return b"".join(chunks)
    except ScrapeError:
        raise
    except (TimeoutError, asyncio.TimeoutError):
        raise ScrapeError("timeout") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
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
