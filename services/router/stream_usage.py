"""Usage of a streamed provider answer, asked for upstream and given to the
client only when it asked for it.

A streamed OpenAI answer carries token usage only when the request sets
``stream_options.include_usage``: then a last event, before ``[DONE]``, has
empty ``choices`` and the ``usage``. The router needs that usage for every
provider request (``kinference_provider_tokens_total``, the cost of burst
traffic), so :func:`ask_usage` sets it in what a provider receives, and
:class:`UsageStripper` removes that event from the client's stream when the
client did not ask for it, so the client gets the stream it asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

_decoder = msgspec.json.Decoder()


def client_asked(raw: Mapping[str, Any]) -> bool:
    """Whether the client's own body asks for the usage event."""
    opts = raw.get("stream_options")
    return isinstance(opts, Mapping) and opts.get("include_usage") is True


def ask_usage(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with ``stream_options.include_usage`` set when it streams (a
    request that does not stream gets usage in its answer anyway)."""
    out = dict(raw)
    if out.get("stream") is True:
        opts = out.get("stream_options")
        out["stream_options"] = {**(opts if isinstance(opts, Mapping) else {}), "include_usage": True}
    return out


def _is_usage_only(event: bytes) -> bool:
    """An SSE event whose data is a chunk with usage and no choices."""
    for line in event.splitlines():
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if not data.startswith(b"{") or b'"usage"' not in data:
                return False
            try:
                chunk = _decoder.decode(data)
            except msgspec.DecodeError:
                return False
            return isinstance(chunk, dict) and not chunk.get("choices") and chunk.get("usage") is not None
    return False


class UsageStripper:
    """Removes the usage-only event from a stream, across chunk boundaries.

    ``feed`` returns the bytes to send now: whole events pass at once,
    except one that may be the usage event, held until its end (an event
    ends at a blank line). ``flush`` returns what is held at the stream's end."""

    def __init__(self) -> None:
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk
        out = []
        start = 0
        while True:
            end = data.find(b"\n\n", start)
            sep = 2
            crlf = data.find(b"\r\n\r\n", start)
            if crlf >= 0 and (end < 0 or crlf < end):
                end, sep = crlf, 4
            if end < 0:
                break
            event = data[start:end + sep]
            if not _is_usage_only(event):
                out.append(event)
            start = end + sep
        rest = data[start:]
        # a partial event that cannot be usage-only goes now (tokens as they come)
        if rest and b'"usage"' not in rest and b'"choices":[{' in rest.replace(b" ", b""):
            out.append(rest)
            rest = b""
        self._held = rest
        return b"".join(out)

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return b"" if _is_usage_only(held) else held


def stripper(raw: Mapping[str, Any], is_local: bool) -> UsageStripper | None:
    """The stripper a streamed answer needs: None for a local pod (its body is
    the client's own) or a client that asked for usage."""
    if is_local or client_asked(raw):
        return None
    return UsageStripper()
