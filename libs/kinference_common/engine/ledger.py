"""The router's own ledger of requests in flight.

Telemetry lags (a scrape every second or so); a burst of requests decided in
that gap would all see the same idle endpoint. The ledger is what this router
knows for certain about its own sends, updated the moment they happen:

- ``in_flight``: requests open to a candidate (sent, not finished) - the
  ``inFlight`` signal, and ``LeastInFlight``;
- ``pending``: requests sent that have not produced a first token yet, with
  their prompt tokens - the prefill work queued ahead of a new request;
- ``unseen``: the pending sends made after the endpoint's last scrape, which
  the engine's own ``num_requests_waiting`` cannot include yet.

- ``drained``: sends the last scrape saw waiting that have produced their
  first token since: they left the engine's queue, but the engine's
  ``num_requests_waiting`` of that scrape still counts them.

So ``queuedPrompts = engine waiting - drained + unseen``; when the endpoint's
telemetry is stale or unknown, ``queuedPrompts = pending`` (this router's own
view). ``drained`` keeps the estimate moving between scrapes, and when
telemetry stops arriving (the collector or NATS gone) it keeps it honest
until the telemetry counts as stale: a frozen "saturated" scrape no longer
holds back an endpoint whose queue this router has watched drain. It is reset
by each new telemetry message (so a first token between a scrape and its
message arriving, a few milliseconds, is not counted: an under-estimate of
the drain, never an over-estimate).

Keys: ``<namespace>/<workerset>/<pod>`` for an endpoint,
``<namespace>/<provider>`` for a provider (see ``Candidate.ledger_key``).

The ledger is owned by one router and mutated only from its event loop; the
engine reads :attr:`InFlightLedger.loads` (a dict holding only keys with a
non-zero count, so a decision looks up few entries). Times are whatever
clock the router passes (its wall clock, comparable with ``scrapedAt``).
"""

from __future__ import annotations

from collections import deque


class EndpointLoad:
    """What this router has open to one endpoint or provider."""

    __slots__ = ("in_flight", "pending_count", "pending_tokens", "unseen_count", "unseen_tokens",
                 "drained_count")

    def __init__(self) -> None:
        self.in_flight = 0
        self.pending_count = 0
        self.pending_tokens = 0
        self.unseen_count = 0
        self.unseen_tokens = 0
        self.drained_count = 0

    def is_idle(self) -> bool:
        return self.in_flight == 0 and self.pending_count == 0 and self.drained_count == 0

    def __repr__(self) -> str:
        return (
            f"EndpointLoad(in_flight={self.in_flight}, pending={self.pending_count}/"
            f"{self.pending_tokens}t, unseen={self.unseen_count}, drained={self.drained_count})"
        )


class Send:
    """One request this router sent; the handle passed back to the ledger."""

    __slots__ = ("key", "tokens", "sent_at", "first_token", "seen", "done")

    def __init__(self, key: str, tokens: int, sent_at: float) -> None:
        self.key = key
        self.tokens = tokens
        self.sent_at = sent_at
        self.first_token = False
        self.seen = False
        self.done = False


class InFlightLedger:
    """In-flight and not-yet-prefilled requests per endpoint/provider."""

    def __init__(self) -> None:
        #: key -> load; only keys with something open
        self.loads: dict[str, EndpointLoad] = {}
        self._unseen: dict[str, deque[Send]] = {}

    def _load(self, key: str) -> EndpointLoad:
        load = self.loads.get(key)
        if load is None:
            load = self.loads[key] = EndpointLoad()
        return load

    def sent(self, key: str, prompt_tokens: int, now: float) -> Send:
        """Record a request sent to ``key`` at ``now``; keep the returned handle."""
        send = Send(key, max(0, prompt_tokens), now)
        load = self._load(key)
        load.in_flight += 1
        load.pending_count += 1
        load.pending_tokens += send.tokens
        load.unseen_count += 1
        load.unseen_tokens += send.tokens
        self._unseen.setdefault(key, deque()).append(send)
        return send

    def first_token(self, send: Send) -> None:
        """The first token arrived: the request's prefill is done."""
        if send.first_token or send.done:
            return
        send.first_token = True
        load = self._load(send.key)
        load.pending_count -= 1
        load.pending_tokens -= send.tokens
        if not send.seen:
            send.seen = True  # leaves the unseen count; dropped from the deque lazily
            load.unseen_count -= 1
            load.unseen_tokens -= send.tokens
        else:  # the last scrape counted it waiting; it is not any more
            load.drained_count += 1
        self._gc(send.key, load)

    def finished(self, send: Send) -> None:
        """The request ended (completed, failed or cancelled)."""
        if send.done:
            return
        self.first_token(send)
        send.done = True
        load = self._load(send.key)
        load.in_flight -= 1
        self._gc(send.key, load)

    def observed(self, key: str, scraped_at: float) -> None:
        """Telemetry for ``key`` scraped at ``scraped_at`` arrived: sends made
        before then are now in the engine's own counts."""
        load = self.loads.get(key)
        if load is not None and load.drained_count:
            load.drained_count = 0  # the new scrape's waiting count no longer holds them
            if load.is_idle():
                self.loads.pop(key, None)
        queue = self._unseen.get(key)
        if not queue:
            return
        while queue and queue[0].sent_at <= scraped_at:
            send = queue.popleft()
            if not send.seen:
                send.seen = True
                if load is not None:
                    load.unseen_count -= 1
                    load.unseen_tokens -= send.tokens
        if not queue:
            del self._unseen[key]

    def _gc(self, key: str, load: EndpointLoad) -> None:
        if load.is_idle():
            self.loads.pop(key, None)
            self._unseen.pop(key, None)

    def in_flight(self, key: str) -> int:
        load = self.loads.get(key)
        return load.in_flight if load else 0
