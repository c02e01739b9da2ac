"""KV-cache blocks with prefix caching (a model of vLLM V1's block pool).

Blocks are reference counted. A block whose content is known (a full prompt
block, identified by its chained hash) stays findable after its last user
frees it: it sits in the free queue, still cached, until a new allocation
evicts it. The free queue is LRU: allocation takes from the front, freeing
appends to the back (a request's blocks in reverse order, so its tail blocks
are evicted before the shared head).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}
        self._by_hash: dict[bytes, int] = {}
        self.evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated (including cached blocks nobody uses)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._by_hash)

    def usage(self) -> float:
        """Fraction of blocks in use by requests, 0..1 (vLLM's kv_cache_usage_perc)."""
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    def lookup_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (not yet referenced)."""
        found: list[int] = []
        for h in hashes:
            block = self._by_hash.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def free_after_touch(self, blocks: Sequence[int]) -> int:
        """Free blocks left if ``blocks`` were referenced."""
        return len(self._free) - sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks (reviving them from the free queue)."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks, evicting least recently freed cached blocks; None if short."""
        if n > len(self._free):
            return None
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            h = self._hash_of.pop(b, None)
            if h is not None:
                del self._by_hash[h]
                self.evictions += 1
            self._ref[b] = 1
            out.append(b)
        return out

    def free(self, blocks: Sequence[int]) -> None:
        for b in reversed(blocks):
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free[b] = None

    def cache(self, block: int, h: bytes) -> None:
        """Record that ``block`` holds the content hashed ``h`` (first holder wins)."""
        if h in self._by_hash or block in self._hash_of:
            return
        self._by_hash[h] = block
        self._hash_of[block] = h

    def reset_cache(self) -> None:
        """Forget every cached hash (vLLM's reset_prefix_cache)."""
        self._by_hash.clear()
        self._hash_of.clear()
