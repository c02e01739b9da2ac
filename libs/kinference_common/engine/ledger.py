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

Other router replicas
---------------------
Several replicas of one router each send a part of the traffic; each
replica's ledger knows only its own sends. :meth:`InFlightLedger.summary`
is what this replica tells the others (per endpoint: its in-flight count,
each not-yet-prefilled send's time and prompt tokens, and the sends whose
first token arrived in the last :data:`PREFILLED_WINDOW` seconds); a peer's
summary enters with :meth:`InFlightLedger.merge_peer`, level-triggered: it
replaces that replica's previous one, an older one (lower ``seq``) is
ignored, and :meth:`InFlightLedger.expire_peers` forgets a replica that went
quiet. The peers' sends are folded into the same :class:`EndpointLoad` the
decision reads (the ``peer_*`` fields), classified against this replica's own
latest scrape of the endpoint: a peer's send made before the scrape is in the
engine's ``num_requests_waiting`` already (``peer_seen_count``, not counted
twice), one made after is not (``peer_unseen_count``), one prefilled since
the scrape still is (``peer_drained_count``). ``queue_tokens`` then counts the
peers' real prompt tokens instead of a default per engine-queued request.
Nothing here does I/O: the router's ``replica_sync`` module carries the
summaries over NATS.

Keys: ``<namespace>/<workerset>/<pod>`` for an endpoint,
``<namespace>/<provider>`` for a provider (see ``Candidate.ledger_key``).

The ledger is owned by one router and mutated only from its event loop; the
engine reads :attr:`InFlightLedger.loads` (a dict holding only keys with a
non-zero count, so a decision looks up few entries). Times are whatever
clock the router passes (its wall clock, comparable with ``scrapedAt``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Callable, Protocol

#: seconds a first token is remembered for peers (a peer's scrape of the
#: endpoint may still count the send as waiting; scrapes are ~0.1-1 s apart)
PREFILLED_WINDOW = 2.0
#: at most this many sends per endpoint in a summary (the newest; older
#: pending sends are summed into ``more_count``/``more_tokens``)
MAX_SENDS_PER_ENDPOINT = 256


class EndpointLoad:
    """What this router has open to one endpoint or provider."""

    __slots__ = ("in_flight", "pending_count", "pending_tokens", "unseen_count", "unseen_tokens",
                 "drained_count", "peer_in_flight", "peer_pending_count", "peer_pending_tokens",
                 "peer_unseen_count", "peer_seen_count", "peer_drained_count")

    def __init__(self) -> None:
        self.in_flight = 0
        self.pending_count = 0
        self.pending_tokens = 0
        self.unseen_count = 0
        self.unseen_tokens = 0
        self.drained_count = 0
        # other router replicas' sends (see "Other router replicas" above)
        self.peer_in_flight = 0
        self.peer_pending_count = 0
        self.peer_pending_tokens = 0
        #: peers' pending sends made after this replica's last scrape of the endpoint
        self.peer_unseen_count = 0
        #: peers' sends that scrape counts waiting (pending before it, or prefilled since)
        self.peer_seen_count = 0
        #: of those, the ones prefilled since the scrape
        self.peer_drained_count = 0

    def is_idle(self) -> bool:
        return (self.in_flight == 0 and self.pending_count == 0 and self.drained_count == 0
                and self.peer_in_flight == 0 and self.peer_pending_count == 0 and self.peer_seen_count == 0)

    def __repr__(self) -> str:
        return (
            f"EndpointLoad(in_flight={self.in_flight}, pending={self.pending_count}/"
            f"{self.pending_tokens}t, unseen={self.unseen_count}, drained={self.drained_count}, "
            f"peers={self.peer_in_flight}/{self.peer_pending_count}/{self.peer_pending_tokens}t)"
        )


class PeerEndpoint(Protocol):
    """One endpoint in a peer's summary (:class:`EndpointSummary`, or the wire
    message :class:`kinference_common.messages.ReplicaEndpoint`)."""

    key: str
    in_flight: int
    #: (sent_at, prompt tokens) of each send without a first token yet
    pending: Sequence[tuple[float, int]]
    #: (sent_at, first_token_at) of sends prefilled in the last PREFILLED_WINDOW
    prefilled: Sequence[tuple[float, float]]
    #: pending sends beyond MAX_SENDS_PER_ENDPOINT (the oldest), summed
    more_count: int
    more_tokens: int


class EndpointSummary:
    """This replica's view of one endpoint, as :meth:`InFlightLedger.summary` gives it."""

    __slots__ = ("key", "in_flight", "pending", "prefilled", "more_count", "more_tokens")

    def __init__(self, key: str, in_flight: int, pending: list[tuple[float, int]],
                 prefilled: list[tuple[float, float]], more_count: int = 0, more_tokens: int = 0) -> None:
        self.key, self.in_flight, self.pending, self.prefilled = key, in_flight, pending, prefilled
        self.more_count, self.more_tokens = more_count, more_tokens

    def __repr__(self) -> str:
        return (f"EndpointSummary({self.key}, in_flight={self.in_flight}, pending={len(self.pending)}"
                f"+{self.more_count}, prefilled={len(self.prefilled)})")


class _Peer:
    __slots__ = ("seq", "received_at", "endpoints")

    def __init__(self, seq: int, received_at: float, endpoints: dict[str, PeerEndpoint]) -> None:
        self.seq, self.received_at, self.endpoints = seq, received_at, endpoints


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
        #: key -> sends without a first token (insertion order: oldest first)
        self._open: dict[str, dict[Send, None]] = {}
        #: key -> (sent_at, first_token_at) of recent first tokens (for peers)
        self._prefilled: dict[str, deque[tuple[float, float]]] = {}
        #: key -> scrapedAt of the last telemetry observed
        self._scraped: dict[str, float] = {}
        #: other replicas: id -> their last summary
        self._peers: dict[str, _Peer] = {}
        #: bumped by every change of this replica's own sends (a publisher
        #: sends a summary only when it moved)
        self.version = 0
        #: keep recent first tokens for :meth:`summary` (set by whoever publishes it)
        self.sharing = False
        #: called after a send and after a first token (the replica sync's
        #: publish trigger, not after ``finished``); must not call back into the ledger
        self.on_change: Callable[[], None] | None = None

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
        opened = self._open.get(key)
        if opened is None:
            opened = self._open[key] = {}
        opened[send] = None
        self.version += 1
        if self.on_change is not None:
            self.on_change()
        return send

    def first_token(self, send: Send, now: float | None = None) -> None:
        """The first token arrived (at ``now``, the clock of ``sent``): the
        request's prefill is done."""
        if send.first_token or send.done:
            return
        send.first_token = True
        self.version += 1
        opened = self._open.get(send.key)
        if opened is not None:
            opened.pop(send, None)
            if not opened:
                del self._open[send.key]
        if self.sharing:
            recent = self._prefilled.get(send.key)
            if recent is None:
                recent = self._prefilled[send.key] = deque(maxlen=MAX_SENDS_PER_ENDPOINT)
            recent.append((send.sent_at, send.sent_at if now is None else now))
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
        if self.on_change is not None:
            self.on_change()

    def finished(self, send: Send, now: float | None = None) -> None:
        """The request ended (completed, failed or cancelled)."""
        if send.done:
            return
        self.first_token(send, now)
        send.done = True
        self.version += 1
        load = self._load(send.key)
        load.in_flight -= 1
        self._gc(send.key, load)
        # no on_change: the end of a request only lowers inFlight, which goes
        # with the next publish; publishing it at once would spend the sync's
        # interval and delay the next send's message (measured: a worse tail)

    def observed(self, key: str, scraped_at: float) -> None:
        """Telemetry for ``key`` scraped at ``scraped_at`` arrived: sends made
        before then are now in the engine's own counts."""
        self._scraped[key] = scraped_at
        if self._peers:
            self._refresh_peers(key)
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

    # -- other router replicas ---------------------------------------------

    def summary(self, now: float) -> list[EndpointSummary]:
        """This replica's own sends per endpoint, for its peers: every
        endpoint with something in flight or a first token in the last
        :data:`PREFILLED_WINDOW` seconds (``now``: the clock of ``sent``)."""
        out: list[EndpointSummary] = []
        horizon = now - PREFILLED_WINDOW
        for key in list(self._prefilled):
            recent = self._prefilled[key]
            while recent and recent[0][1] < horizon:
                recent.popleft()
            if not recent:
                del self._prefilled[key]
        for key in self.loads.keys() | self._prefilled.keys():
            load = self.loads.get(key)
            in_flight = load.in_flight if load is not None else 0
            opened = self._open.get(key)
            pending = [(s.sent_at, s.tokens) for s in opened] if opened else []
            more_count = more_tokens = 0
            if len(pending) > MAX_SENDS_PER_ENDPOINT:
                old = pending[:-MAX_SENDS_PER_ENDPOINT]
                pending = pending[-MAX_SENDS_PER_ENDPOINT:]
                more_count, more_tokens = len(old), sum(t for _, t in old)
            recent = self._prefilled.get(key)
            prefilled = list(recent) if recent else []
            if in_flight or pending or prefilled or more_count:
                out.append(EndpointSummary(key, in_flight, pending, prefilled, more_count, more_tokens))
        return out

    def merge_peer(self, replica: str, seq: int, endpoints: Iterable[PeerEndpoint], received_at: float) -> bool:
        """A peer's summary: it replaces that replica's previous one. False
        (and nothing changes) when ``seq`` is not newer than the last one
        merged from ``replica``. ``received_at``: this replica's clock, which
        :meth:`expire_peers` compares."""
        old = self._peers.get(replica)
        if old is not None and seq <= old.seq:
            return False
        fresh = {e.key: e for e in endpoints}
        self._peers[replica] = _Peer(seq, received_at, fresh)
        for key in (old.endpoints.keys() | fresh.keys()) if old is not None else fresh.keys():
            self._refresh_peers(key)
        return True

    def expire_peers(self, now: float, ttl: float) -> list[str]:
        """Forget every peer whose last summary arrived more than ``ttl``
        seconds before ``now``; the ids forgotten."""
        gone = [r for r, p in self._peers.items() if now - p.received_at > ttl]
        for r in gone:
            self.forget_peer(r)
        return gone

    def forget_peer(self, replica: str) -> None:
        old = self._peers.pop(replica, None)
        if old is not None:
            for key in old.endpoints:
                self._refresh_peers(key)

    @property
    def peers(self) -> list[str]:
        """The replicas whose summaries are merged."""
        return list(self._peers)

    @property
    def has_peers(self) -> bool:
        """Whether any replica's summary is merged (cheap: no list)."""
        return bool(self._peers)

    def _refresh_peers(self, key: str) -> None:
        """Recompute the peers' share of ``key``'s load against this
        replica's last scrape of it."""
        scraped = self._scraped.get(key)
        in_flight = count = tokens = unseen = seen = drained = 0
        for peer in self._peers.values():
            e = peer.endpoints.get(key)
            if e is None:
                continue
            in_flight += e.in_flight
            count += len(e.pending) + e.more_count
            tokens += e.more_tokens
            seen += e.more_count  # the oldest sends: a scrape has counted them
            for sent_at, t in e.pending:
                tokens += t
                if scraped is not None and sent_at <= scraped:
                    seen += 1
                else:
                    unseen += 1
            if scraped is not None:
                for sent_at, first_at in e.prefilled:
                    if sent_at <= scraped < first_at:
                        drained += 1
        seen += drained
        load = self.loads.get(key)
        if load is None:
            if not (in_flight or count or seen):
                return
            load = self.loads[key] = EndpointLoad()
        load.peer_in_flight, load.peer_pending_count, load.peer_pending_tokens = in_flight, count, tokens
        load.peer_unseen_count, load.peer_seen_count, load.peer_drained_count = unseen, seen, drained
        if load.is_idle():
            self._gc(key, load)
