"""KV pool, exact rollback and the prefix LRU (pipeline.reference.kv_cache): restored rows equal
the rows stored, the longest stored prefix wins within the limit, an entry a newer one extends is
dropped, capacity is an LRU, and the fast common-prefix length equals a token-by-token scan."""

from __future__ import annotations

import random

import torch

from pipeline.reference.kv_cache import KVPool, PrefixCache, common_prefix_length


def _filled(pool: KVPool, length: int, seed: int):
    cache = pool.allocate()
    gen = torch.Generator().manual_seed(seed)
    pool.k[:, cache.slot, :length] = torch.randn(pool.k[:, cache.slot, :length].shape, generator=gen)
    pool.v[:, cache.slot, :length] = torch.randn(pool.v[:, cache.slot, :length].shape, generator=gen)
    cache.length = length
    return cache


def test_restore_copies_the_longest_stored_prefix_within_the_limit():
    pool = KVPool(layers=2, slots=4, max_rows=32, kv_heads=2, head_dim=4, dtype=torch.float32)
    prefix = PrefixCache(entries=8)
    short = _filled(pool, 3, seed=1)
    prefix.put([1, 2, 3, 9], short)  # rows encode tokens 1 2 3
    other = _filled(pool, 5, seed=2)
    prefix.put([1, 2, 7, 7, 7, 9], other)  # shares 1 2 only
    target = pool.allocate()
    assert prefix.restore([1, 2, 3, 4, 5], target, limit=4) == 3
    assert torch.equal(pool.k[:, target.slot, :3], pool.k[:, short.slot, :3]) and target.length == 3
    again = pool.allocate()
    assert prefix.restore([1, 2, 3, 4, 5], again, limit=2) == 2  # the limit caps the reuse
    pool.release(again)
    assert prefix.restore([8, 8], pool.allocate(), limit=2) == 0


def test_an_entry_a_newer_one_extends_is_dropped():
    pool = KVPool(layers=1, slots=4, max_rows=32, kv_heads=1, head_dim=2, dtype=torch.float32)
    prefix = PrefixCache(entries=8)
    tokens = [4, 5, 6]
    for round_ in range(6):  # a draft-target conversation: the context grows every round
        tokens = tokens + [10 + round_]
        cache = _filled(pool, len(tokens) - 1, seed=round_)
        prefix.put(tokens, cache)
        pool.release(cache)
    assert len(prefix) == 1
    prefix.put([4, 5, 9, 9], _filled(pool, 3, seed=9))  # a branch is kept beside it
    assert len(prefix) == 2


def test_capacity_evicts_the_least_recently_used():
    pool = KVPool(layers=1, slots=2, max_rows=8, kv_heads=1, head_dim=2, dtype=torch.float32)
    prefix = PrefixCache(entries=2)
    for first in (1, 2, 3):
        cache = _filled(pool, 2, seed=first)
        prefix.put([first, 0, 0], cache)
        pool.release(cache)
    probe = pool.allocate()
    assert prefix.restore([1, 0, 0], probe, limit=2) == 0  # evicted
    assert prefix.restore([3, 0, 0], probe, limit=2) == 2


def test_common_prefix_length_equals_a_token_by_token_scan():
    rng = random.Random(7)
    for _ in range(500):
        a = tuple(rng.choice([1, 2]) for _ in range(rng.randint(0, 30)))
        b = tuple(rng.choice([1, 2]) for _ in range(rng.randint(0, 30)))
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix_length(a, b) == n
