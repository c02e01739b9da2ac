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
(same KV-sized cap and KV usage, not journalled again, so nothing echoes). A record lost
in transit is a prefix this replica does not know about, as before sharing.

How much of an endpoint's cache holds prompts (:meth:`PrefixIndex.fill`): the
engine's cache also holds the tokens it generated, which the index never
sees, so the index keeps at most a part of the cache's size in prompt blocks.
It counts the blocks running requests hold (the endpoint's scraped KV usage)
as prompts (they also hold the tokens generated so far: where answers are
long, the fill is that much too high), and the rest of the cache, what
finished requests left, as prompts and generated tokens in the proportion
the endpoint computed them (:meth:`PrefixIndex.observe_output`, from each
answer's usage). Where few requests run and answers are long against the
new part of the prompts (a conversation's turns), that part is well under
:attr:`PrefixIndex.KV_FILL`, and an index kept to ``KV_FILL`` promises
prefixes the engine has evicted.

How full of *live* prefixes an endpoint's cache is (:meth:`PrefixIndex.pressure`):
in steady state every engine's cache is full of something, so the blocks it
holds say nothing; what matters before placing a second copy of a prefix there
is how much of it requests are using now. The index counts, per endpoint, the
distinct blocks sent to it (by this router and its peers) in each window of
``hot_window`` seconds, and calls the larger of the last full window's count
and the current one's, over the endpoint's cache size in blocks, its hot
fraction. A prompt's blocks are chained, so once a record reaches a block
already counted in this window, the blocks before it were counted too: a
record costs one comparison per block it adds, not per block it has.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence


class PrefixIndex:
    """Per-endpoint LRU sets of prompt-block hashes, with an inverted index."""

    #: hot fractions above this are what :meth:`pressure` reports (the TTFT
    #: model's stickiness starts to grow there: :attr:`.ttft.TTFTModel.busy_kv`)
    PRESSED = 0.5

    #: the most of an endpoint's KV cache the index keeps of blocks no longer
    #: in use (:meth:`record` says how; :meth:`fill`, how much less). The
    #: engine's cache also holds the tokens it generated, which the index
    #: never sees, so it evicts an unused prefix before a cache of that size
    #: filled with prompts would: sized to the whole cache, one
    #: ``shared_prefix_long`` request in ten went to a pod the index said held
    #: its 6,000-token prefix, which prefilled all of it
    #: (docs/routing-benchmark.md, fix 11)
    KV_FILL = 0.85
    #: the fill is never taken below this part of the cache (nor above ``kv_fill``): at
    #: low load the prefill share undercounts prompts shared by many requests, which stay
    #: cached (0.5 took ``shared_prefix_long``'s p50 at load 0.4 from 86 to 150 ms on
    #: three seeds of six)
    MIN_FILL = 0.75
    #: an endpoint's prompt share before any answer was observed there
    PROMPT_SHARE = 0.7
    #: the weight of one answer in an endpoint's prompt share (about the last 20)
    SHARE_WEIGHT = 0.05

    def __init__(self, max_blocks_per_endpoint: int = 16384, max_holders_per_block: int = 16,
                 hot_window: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 kv_fill: float = KV_FILL) -> None:
        if not 0.0 < kv_fill <= 1.0:
            raise ValueError(f"kv_fill must be in (0, 1], not {kv_fill}")
        self.max_blocks = max_blocks_per_endpoint
        self.kv_fill = kv_fill
        self.max_holders = max_holders_per_block
        self.hot_window = hot_window
        self._clock = clock
        #: block hash -> the hot window it was last counted in, per endpoint, least recent first
        self._by_endpoint: dict[str, OrderedDict[int, int]] = {}
        #: endpoint -> [window, blocks counted in it, in the window before, cache size in blocks]
        self._hot: dict[str, list[int]] = {}
        #: endpoints whose hot fraction is over PRESSED -> that fraction (as of _pressed_window)
        self._pressed: dict[str, float] = {}
        self._pressed_window = -1
        #: counts changes of :meth:`pressure`'s answer
        self.pressure_version = 0
        #: block hash -> endpoints holding it, least recent first
        self._holders: dict[int, dict[str, None]] = {}
        #: records since the last take_journal() (None: not kept)
        self._journal: list[tuple[str, tuple[int, ...], int | None, float | None]] | None = None
        #: endpoint -> its KV usage as last given to :meth:`record`
        self._usage: dict[str, float] = {}
        #: endpoint -> prompt tokens computed / (those + tokens generated), over its recent answers
        self._share: dict[str, float] = {}
        #: endpoint -> the engine's prompt tokens per estimated token, over its recent answers
        self._ratio: dict[str, float] = {}
        #: endpoint -> the last block of each prompt sent to it that it still
        #: holds (:meth:`continued_on`)
        self._ends: dict[str, set[int]] = {}

    #: at most this many records wait for take_journal() (the oldest dropped)
    MAX_JOURNAL = 4096

    def start_journal(self) -> None:
        """Keep every :meth:`record` from now on for :meth:`take_journal`."""
        if self._journal is None:
            self._journal = []

    def take_journal(self) -> list[tuple[str, tuple[int, ...], int | None, float | None]]:
        """The ``(key, block_hashes, max_blocks, kv_usage)`` recorded since the last call."""
        out = self._journal or []
        if self._journal is not None:
            self._journal = []
        return out

    def record_peer(self, key: str, block_hashes: Sequence[int], max_blocks: int | None = None,
                    kv_usage: float | None = None, whole: bool = True) -> None:
        """Another replica's :meth:`record` (not journalled), with the KV
        usage it saw (None: this replica's last one for ``key`` stands). The
        prompt share stays this replica's, learned from its own answers.
        ``whole``: False when ``block_hashes`` are the first of a longer
        prompt's (their last is not where the prompt ended)."""
        self._usage_seen(key, kv_usage)
        self._record(key, block_hashes, max_blocks, whole)

    def _usage_seen(self, key: str, kv_usage: float | None) -> None:
        if kv_usage is not None and 0.0 <= kv_usage <= 1.0:  # (not NaN)
            self._usage[key] = kv_usage

    def record(self, key: str, block_hashes: Sequence[int], max_blocks: int | None = None,
               kv_usage: float | None = None) -> None:
        """Remember that the prompt with these blocks was sent to ``key``.

        ``max_blocks``: what the endpoint's KV cache can hold, in prompt
        blocks (:attr:`.candidates.Candidate.cache_blocks`); ``kv_usage``:
        its scraped KV usage (0..1; None or out of range: not known, the
        last one given stands). The endpoint's set is trimmed, least recent first, to
        :meth:`fill` of it, stopping at a block sent in this hot window or the one before
        (running requests' blocks, which the engine cannot evict: kept up to
        the whole cache), so that the index forgets a prefix about when the
        engine's own LRU would have evicted it. An index that remembers more
        than the cache holds promises prefix hits the engine no longer has:
        a full prefill where a cheap one was predicted, which is a tail
        request (docs/routing-benchmark.md).
        """
        self._usage_seen(key, kv_usage)
        if self._journal is not None and block_hashes:
            if len(self._journal) >= self.MAX_JOURNAL:
                del self._journal[: len(self._journal) - self.MAX_JOURNAL + 1]
            self._journal.append((key, tuple(block_hashes), max_blocks, kv_usage))
        self._record(key, block_hashes, max_blocks)

    def _record(self, key: str, block_hashes: Sequence[int], max_blocks: int | None, whole: bool = True) -> None:
        if not block_hashes:
            return
        lru = self._by_endpoint.get(key)
        if lru is None:
            lru = self._by_endpoint[key] = OrderedDict()
        w = int(self._clock() // self.hot_window)
        hot = self._hot.get(key)
        if hot is None:
            hot = self._hot[key] = [w, 0, 0, 0]
        elif hot[0] != w:
            hot[2] = hot[1] if hot[0] == w - 1 else 0
            hot[0], hot[1] = w, 0
        fresh = 0
        for h in reversed(block_hashes):
            if lru.get(h) == w:  # counted in this window, and so were the blocks before it
                break
            lru[h] = w
            fresh += 1
        holders = self._holders
        cap = self.max_holders
        for h in reversed(block_hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = w
            owners = holders.get(h)
            if owners is None:
                holders[h] = {key: None}
            else:
                owners.pop(key, None)
                owners[key] = None  # most recent last
                if len(owners) > cap:
                    del owners[next(iter(owners))]
        if max_blocks is None:
            size = keep = self.max_blocks
        else:
            # the cache's size (never exceeded; the hot fraction's measure)
            size = max(1, min(self.max_blocks, max_blocks))
            keep = max(1, int(size * self.fill(key)))
        while len(lru) > keep:
            old, seen = lru.popitem(last=False)
            if seen >= w - 1 and len(lru) < size:
                # recent, and so is every block after it: put back, kept
                lru[old] = seen
                lru.move_to_end(old, last=False)
                break
            owners = holders.get(old)
            if owners is not None:
                owners.pop(key, None)
                if not owners:
                    del holders[old]
        ends = self._ends.get(key)
        if ends is None:
            ends = self._ends[key] = set()
        if whole:
            ends.add(block_hashes[-1])
        if len(ends) > len(lru):  # ends the LRU let go of: dropped when they could outnumber what it holds
            ends.intersection_update(lru)
        hot[1] += fresh
        hot[3] = size
        self._press(key, self._fraction(hot, w))

    def continued_on(self, keys: Sequence[str], block_hash: int) -> list[str]:
        """Those of ``keys`` where a prompt whose match ends at
        ``block_hash`` continues a prompt sent there: that block was the
        last full block of a prompt sent there, and the endpoint still holds
        it (a conversation's next turn, where a prefix shared by several
        prompts ends inside them)."""
        out = []
        for key in keys:
            ends = self._ends.get(key)
            if ends and block_hash in ends:
                lru = self._by_endpoint.get(key)
                if lru is not None and block_hash in lru:
                    out.append(key)
        return out

    def fill(self, key: str) -> float:
        """The part of ``key``'s cache the index keeps of prompt blocks no
        longer in use: the KV usage (running requests' blocks, taken as
        prompts) plus the rest of the cache at the endpoint's prompt share,
        between :attr:`MIN_FILL` and :attr:`kv_fill`; :attr:`kv_fill` until
        a KV usage of the endpoint was given (after that, the last one given
        stands while no newer one comes: a stale scrape gives none)."""
        usage = self._usage.get(key)
        if usage is None:
            return self.kv_fill
        f = usage + (1.0 - usage) * self.prompt_share(key)
        return self.kv_fill if f >= self.kv_fill else max(f, min(self.MIN_FILL, self.kv_fill))

    def prompt_share(self, key: str) -> float:
        """``key``'s prompt share: :attr:`PROMPT_SHARE` until an answer was observed there."""
        return self._share.get(key, self.PROMPT_SHARE)

    def observe_output(self, key: str, prefill_tokens: float, output_tokens: int, prompt_estimate: int = 0,
                       prompt_counted: int | None = None) -> None:
        """An answer from ``key`` ended: ``prefill_tokens`` of its prompt were
        to be computed there (the router's estimate when it sent it: the
        prompt less what the index said was cached) and it generated
        ``output_tokens`` (its usage). Moves the endpoint's prompt share
        (what :meth:`fill` reads) by :attr:`SHARE_WEIGHT` towards this
        answer's; answers of unknown length are not observed.

        The share is in the engine's tokens: where the answer's usage counted
        the prompt (``prompt_counted``, against the router's estimate of the
        whole prompt, ``prompt_estimate``), the prefill is scaled by that
        count over the estimate, and the endpoint's tokens per estimated
        token are learned (over about its last 20 such answers); an answer
        without the count (a stream whose client did not ask for usage) is
        scaled by what was learned, 1 before any."""
        w = self.SHARE_WEIGHT
        if prompt_counted is not None and prompt_counted > 0 and prompt_estimate > 0:
            ratio = prompt_counted / prompt_estimate
            known = self._ratio.get(key)
            self._ratio[key] = ratio if known is None else known * (1.0 - w) + w * ratio
        else:
            ratio = self.tokens_per_estimated(key)
        prefill = prefill_tokens * ratio
        total = prefill + output_tokens
        if not (prefill >= 0 and output_tokens >= 0 and total > 0):  # (nor NaN)
            return
        self._share[key] = self.prompt_share(key) * (1.0 - w) + w * prefill / total

    def tokens_per_estimated(self, key: str) -> float:
        """The engine's prompt tokens per token of the router's estimate at
        ``key``, as its answers' usage counted them; 1 before any."""
        return self._ratio.get(key, 1.0)

    def _press(self, key: str, f: float) -> None:
        """Keep ``key``'s fraction in :attr:`_pressed`, in steps of 1/64, and
        count a change in :attr:`pressure_version` (what users cache on)."""
        if f > self.PRESSED:
            f = int(f * 64) / 64
            if self._pressed.get(key) != f:
                self._pressed[key] = f
                self.pressure_version += 1
        elif self._pressed.pop(key, None) is not None:
            self.pressure_version += 1

    @staticmethod
    def _fraction(hot: list[int], w: int) -> float:
        if hot[0] == w:
            n = hot[1] if hot[1] > hot[2] else hot[2]
        elif hot[0] == w - 1:
            n = hot[1]
        else:
            return 0.0
        return min(1.0, n / hot[3]) if hot[3] else 0.0

    def hot_fraction(self, key: str) -> float:
        """The endpoint's hot fraction now (see the module docstring)."""
        return self.hot_fractions([key])[0]

    def hot_fractions(self, keys: list[str]) -> list[float]:
        """:meth:`hot_fraction` of each of ``keys`` (one clock read)."""
        w = int(self._clock() // self.hot_window)
        get, frac = self._hot.get, self._fraction
        return [frac(hot, w) if (hot := get(k)) else 0.0 for k in keys]

    def pressure(self) -> dict[str, float]:
        """Endpoints whose hot fraction is over :attr:`PRESSED`, with it (in
        steps of 1/64; :attr:`pressure_version` counts changes).

        Kept up to date by each record; an endpoint nothing was sent to since
        is re-read once per window (its count ages out), so a read costs
        nothing between windows. Do not modify the result."""
        w = int(self._clock() // self.hot_window)
        if w != self._pressed_window:
            self._pressed_window = w
            for key in list(self._pressed):
                self._press(key, self._fraction(self._hot[key], w))
        return self._pressed

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
        self._hot.pop(key, None)
        self._usage.pop(key, None)
        self._share.pop(key, None)
        self._ratio.pop(key, None)
        self._ends.pop(key, None)
        self._press(key, 0.0)
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

    def blocks_of(self, keys: list[str]) -> list[int]:
        """:meth:`blocks` of each of ``keys``."""
        get = self._by_endpoint.get
        return [len(lru) if (lru := get(k)) else 0 for k in keys]
