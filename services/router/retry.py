"""When a request may be sent again (docs/hardening.md, "The retry rule").

A generation must never run twice without the client knowing: a duplicate
to a pod is twice the GPU work, a duplicate to a provider a duplicate bill.
So a request is sent again only when it provably was not received:

- the connection could not be made (``ConnectFailed``: refused,
  unreachable, TLS failure, connect timeout), or
- the connection was found closed before the request was fully written: an
  idle pooled connection whose peer already closed it (:func:`peer_closed`,
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
import select
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinference_common.engine import Decision

#: the reason a request was not sent again, in the 502 and the decision event
MAY_HAVE_BEEN_RECEIVED = "the request was written whole, so the upstream may have received it: not sent again"


def peer_closed(transport: Any) -> bool:
    """True when the peer has closed (or reset) this idle connection, or sent
    bytes nobody asked for: a zero-timeout poll of its socket finds it
    readable (end of file, data) or hung up, before the event loop has got
    round to telling the protocol. False when it looks alive (nothing to
    read) or cannot be checked. About a microsecond."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock.fileno(), _POLL_MASK)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


#: readable (end of file or stray bytes), peer hung up, error
_POLL_MASK = select.POLLIN | select.POLLPRI | getattr(select, "POLLRDHUP", 0)


def not_resent(d: Decision, backend: str) -> Decision:
    """The decision event of a request sent to ``backend`` whose connection
    then failed before an answer: the same decision, with the outcome the
    client saw (``upstream_error``) and why it was not sent again."""
    out = copy.copy(d)
    out.code = "upstream_error"
    out.reason = f"{backend}: {MAY_HAVE_BEEN_RECEIVED}"
    return out
