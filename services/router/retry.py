"""When a request may be sent again (docs/hardening.md, "The retry rule").

A generation must never run twice without the client knowing: a duplicate
to a pod is twice the GPU work, a duplicate to a provider a duplicate bill.
So a request is sent again only when it provably was not received:

- the connection could not be made (``ConnectFailed``: refused,
  unreachable, TLS failure, connect timeout), or
- the connection was found closed before the request was fully written: an
  idle pooled connection whose peer already closed it (:func:`~kinference_common.upstream_http.peer_closed`,
  checked before anything is written on it), or a connection lost while
  part of the request was still in the router's write buffer.

Anything else (the request was written whole and the connection then
closed before any byte of the answer, or in the middle of it) may have
been received and acted on: the client gets 502 ``upstream_error``, and the
decision event is published once more with that outcome
(:func:`not_resent`) so that ``kinfctl events`` shows why.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from kinference_common.upstream_http import MAY_HAVE_BEEN_RECEIVED

if TYPE_CHECKING:
    from kinference_common.engine import Decision

__all__ = ["MAY_HAVE_BEEN_RECEIVED", "answered", "not_resent"]


def not_resent(d: Decision, backend: str) -> Decision:
    """The decision event of a request sent to ``backend`` whose connection
    then failed before an answer: the same decision, with the outcome the
    client saw (``upstream_error``) and why it was not sent again."""
    return answered(d, "upstream_error", f"{backend}: {MAY_HAVE_BEEN_RECEIVED}")


def answered(d: Decision, code: str, reason: str) -> Decision:
    """A routed decision's second event: the same decision, with the code and
    reason the client was answered with once the pick could not be carried
    out (published again, after the decision's own event)."""
    out = copy.copy(d)
    out.code = code
    out.reason = reason
    return out
