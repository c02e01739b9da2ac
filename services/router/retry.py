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
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinference_common.engine import Decision

#: the reason a request was not sent again, in the 502 and the decision event
MAY_HAVE_BEEN_RECEIVED = ("the connection closed after the request was written, before an answer: the upstream may "
                          "have received it, so it was not sent again")


def peer_closed(transport: Any) -> bool:
    """True when the peer has closed (or reset) this idle connection: a
    non-blocking peek at the socket finds end-of-file or an error, before the
    event loop has got round to telling the protocol. False when the
    connection looks alive (nothing to read) or cannot be checked."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        # a second socket object on the same descriptor (works with uvloop's
        # pseudo-sockets too); detach() leaves the descriptor open
        probe = socket.socket(sock.family, sock.type, 0, sock.fileno())
    except (OSError, ValueError):
        return False
    try:
        data = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False  # nothing to read: alive
    except OSError:
        return True  # reset
    finally:
        probe.detach()
    # end of file: closed; bytes on an idle connection: stray, it cannot be trusted either
    del data
    return True


def not_resent(d: Decision, backend: str) -> Decision:
    """The decision event of a request sent to ``backend`` whose connection
    then failed before an answer: the same decision, with the outcome the
    client saw (``upstream_error``) and why it was not sent again."""
    out = copy.copy(d)
    out.code = "upstream_error"
    out.reason = f"{backend}: {MAY_HAVE_BEEN_RECEIVED}"
    return out
