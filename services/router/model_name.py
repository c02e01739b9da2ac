"""The client's model name put back in an answer, at both front doors.

A pod answers with its served name (``Qwen/Qwen2.5-32B-Instruct``), a
provider with its upstream name (``databricks-qwen25-32b``), and an
InferenceModelRewrite changes the name the client sent; the client gets
back the name it asked for, from the data port (:mod:`kinference_router.app`)
as from the Endpoint Picker (:mod:`kinference_router.epp`). Only a
``"model"`` field whose value is exactly the served name changes (a string
inside the text is JSON-escaped, so never matches). A :class:`Restorer`
exists only when the names differ: an answer in the client's name costs
nothing.
"""

from __future__ import annotations

import msgspec

#: a partial line held for its end at most this long (a line that never ends passes on as it comes)
MAX_HELD_LINE = 64 * 1024


class Restorer:
    """Puts the client's name back: :meth:`whole` for a whole answer;
    :meth:`feed` then :meth:`flush` for a stream cut anywhere (complete
    lines pass at once, a partial line waits for its end, as the client
    would, so a name cut in two is still found)."""

    __slots__ = ("_pairs", "_held")

    def __init__(self, served: str, client: str) -> None:
        s, c = msgspec.json.encode(served), msgspec.json.encode(client)
        self._pairs = ((b'"model":' + s, b'"model":' + c), (b'"model": ' + s, b'"model": ' + c))
        self._held = b""

    @classmethod
    def of(cls, served: str, client: str) -> Restorer | None:
        """The restorer an answer needs; None when the names are the same."""
        return None if served == client else cls(served, client)

    def whole(self, data: bytes) -> bytes:
        for served, client in self._pairs:
            data = data.replace(served, client)
        return data

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        cut = data.rfind(b"\n") + 1
        if len(data) - cut > MAX_HELD_LINE:
            cut = len(data)
        self._held = data[cut:]
        return self.whole(data[:cut])

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self.whole(held)
