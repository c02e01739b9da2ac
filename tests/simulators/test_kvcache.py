"""The KV block pool: reference counts, prefix lookup, LRU eviction of cached blocks."""

from __future__ import annotations

import pytest
from kinference_simulators.kvcache import BlockPool


def test_allocate_free_and_usage() -> None:
    pool = BlockPool(10)
    a = pool.allocate(4)
    assert a is not None and len(a) == 4
    assert pool.usage() == pytest.approx(0.4)
    assert pool.allocate(7) is None
    pool.free(a)
    assert pool.usage() == 0.0
    assert pool.num_free == 10


def test_cached_blocks_survive_free_until_evicted_oldest_first() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    assert a is not None
    pool.cache(a[0], b"h0")
    pool.cache(a[1], b"h1")
    pool.free(a)  # freed in reverse: a[1] then a[0] -> a[1] evicted first
    assert pool.lookup_prefix([b"h0", b"h1"]) == a
    fresh = pool.allocate(2)  # the two never-used blocks go first
    assert fresh is not None and set(fresh).isdisjoint(a)
    assert pool.lookup_prefix([b"h0", b"h1"]) == a
    pool.allocate(1)  # now the tail block (h1) is evicted, the head survives
    assert pool.lookup_prefix([b"h0", b"h1"]) == [a[0]]
    assert pool.evictions == 1


def test_touch_revives_a_free_cached_block_and_shares_it() -> None:
    pool = BlockPool(3)
    a = pool.allocate(1)
    assert a is not None
    pool.cache(a[0], b"h")
    pool.free(a)
    hit = pool.lookup_prefix([b"h", b"other"])
    assert hit == a
    assert pool.free_after_touch(hit) == 2
    pool.touch(hit)
    pool.touch(hit)  # a second request shares it
    assert pool.ref_count(a[0]) == 2
    assert pool.num_free == 2
    pool.free(hit)
    assert pool.num_free == 2
    pool.free(hit)
    assert pool.num_free == 3


def test_first_holder_of_a_hash_wins() -> None:
    pool = BlockPool(2)
    a = pool.allocate(2)
    assert a is not None
    pool.cache(a[0], b"h")
    pool.cache(a[1], b"h")
    assert pool.lookup_prefix([b"h"]) == [a[0]]
    assert pool.num_cached == 1
