"""An approximate prefix index: which endpoint probably holds a prompt's prefix.

vLLM's prefix cache keeps KV blocks of prompts it has seen; a request sharing
a long prefix with an earlier one prefills only the rest. The router cannot
see the engine's cache, so it remembers what it sent where:

- a prompt is cut into fixed-size blocks whose hashes are chained
  (:func:`.tokens.block_hashes`): hash *i* stands for blocks 0..i;
- after each pick the router calls :meth:`PrefixIndex.record` with the pick's
  key and the request's block hashes;
- :meth:`PrefixIndex.match` returns, per endpoint, how many leading blocks of
  a new prompt it was sent before. Cost: O(prompt blocks x
  ``max_holders_per_block``), independent of the pool's size.

Memory is bounded: each endpoint keeps at most ``max_blocks_per_endpoint``
hashes, and each block remembers at most ``max_holders_per_block`` endpoints
(the most recent; when more hold a prefix than that, affinity no longer
matters much: many endpoints have it), least recently used evicted first (the engine's cache evicts too, so
old entries are wrong anyway). ``record`` touches blocks last-to-first, so a
prompt's first blocks are the most recent and are evicted last: a prefix
survives longer than its tail, as prefix matching needs.

It is approximate: hash collisions are negligible (64-bit), but the engine may
have evicted a block the index still lists.

Other router replicas: with a journal (:meth:`PrefixIndex.start_journal`)
every :meth:`record` is also kept for :meth:`take_journal`, which the router's
replica sync publishes; a peer's records enter with :meth:`record_peer`
(same KV-sized cap, not journalled again, so nothing echoes). A record lost
in transit is a prefix this replica does not know about, as before sharing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    """Per-endpoint LRU sets of prompt-block hashes, with an inverted index."""

    def __init__(self, max_blocks_per_endpoint: int = 16384, max_holders_per_block: int = 16) -> None:
        self.max_blocks = max_blocks_per_endpoint
        self.max_holders = max_holders_per_block
        self._by_endpoint: dict[str, OrderedDict[int, None]] = {}
        #: block hash -> endpoints holding it, least recent first
        self._holders: dict[int, dict[str, None]] = {}
        #: records since the last take_journal() (None: not kept)
        self._journal: list[tuple[str, tuple[int, ...], int | None]] | None = None

    #: at most this many records wait for take_journal() (the oldest dropped)
    MAX_JOURNAL = 4096

    def start_journal(self) -> None:
        """Keep every :meth:`record` from now on for :meth:`take_journal`."""
        if self._journal is None:
            self._journal = []

    def take_journal(self) -> list[tuple[str, tuple[int, ...], int | None]]:
        """The ``(key, block_hashes, max_blocks)`` recorded since the last call."""
        out = self._journal or []
        if self._journal is not None:
            self._journal = []
        return out

    def record_peer(self, key: str, block_hashes: Sequence[int], max_blocks: int | None = None) -> None:
        """Another replica's :meth:`record` (not journalled)."""
        self._record(key, block_hashes, max_blocks)

    def record(self, key: str, block_hashes: Sequence[int], max_blocks: int | None = None) -> None:
        """Remember that the prompt with these blocks was sent to ``key``.

        ``max_blocks``: what the endpoint's KV cache can hold, in prompt
        blocks (:attr:`.candidates.Candidate.cache_blocks`); the endpoint's
        set is kept that small (least recent out first), so that the index
        forgets a prefix about when the engine's own LRU would have evicted
        it. An index that remembers more than the cache holds promises
        prefix hits the engine no longer has: a full prefill where a cheap
        one was predicted, which is a tail request (docs/routing-benchmark.md).
        """
        if self._journal is not None and block_hashes:
            if len(self._journal) >= self.MAX_JOURNAL:
                del self._journal[: len(self._journal) - self.MAX_JOURNAL + 1]
            self._journal.append((key, tuple(block_hashes), max_blocks))
        self._record(key, block_hashes, max_blocks)

    def _record(self, key: str, block_hashes: Sequence[int], max_blocks: int | None) -> None:
        if not block_hashes:
            return
        lru = self._by_endpoint.get(key)
        if lru is None:
            lru = self._by_endpoint[key] = OrderedDict()
        holders = self._holders
        cap = self.max_holders
        for h in reversed(block_hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
            owners = holders.get(h)
            if owners is None:
                holders[h] = {key: None}
            else:
                owners.pop(key, None)
                owners[key] = None  # most recent last
                if len(owners) > cap:
                    del owners[next(iter(owners))]
        cap = self.max_blocks if max_blocks is None else max(1, min(self.max_blocks, max_blocks))
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            owners = holders.get(old)
            if owners is not None:
                owners.pop(key, None)
                if not owners:
                    del holders[old]

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Per endpoint key, the number of leading blocks it holds (>= 1 only).

        Walks the prompt's blocks intersecting the holder sets (C-level set
        operations on at most ``max_holders_per_block`` keys) and stops at the
        first block nobody holds.
        """
        holders = self._holders
        if not block_hashes:
            return {}
        first = holders.get(block_hashes[0])
        if not first:
            return {}
        out: dict[str, int] = {}
        alive = set(first)
        n = 1
        for h in block_hashes[1:]:
            owners = holders.get(h)
            still = alive.intersection(owners) if owners else set()
            if len(still) != len(alive):
                for key in alive.difference(still):
                    out[key] = n
            alive = still
            if not alive:
                break
            n += 1
        for key in alive:
            out[key] = n
        return out

    def forget(self, key: str) -> None:
        """Drop an endpoint (it went away, or restarted with an empty cache)."""
        lru = self._by_endpoint.pop(key, None)
        if not lru:
            return
        for h in lru:
            owners = self._holders.get(h)
            if owners is not None:
                owners.pop(key, None)
                if not owners:
                    del self._holders[h]

    def held(self) -> dict[str, int]:
        """Blocks held per endpoint key (what :meth:`blocks` says of each)."""
        return {k: len(lru) for k, lru in self._by_endpoint.items() if lru}

    def blocks(self, key: str) -> int:
        lru = self._by_endpoint.get(key)
        return len(lru) if lru else 0
