"""Preallocated KV caches for the reference engine: a pool of per-sequence slots.

A :class:`KVPool` holds one preallocated slot per concurrent sequence, laid out
``[layers, slots, max_rows, kv_heads, head_dim]`` for keys and values. A sequence owns one slot
and a length pointer (:class:`SlotCache`); rolling back rejected tokens is setting the length,
compacting an accepted tree path is gathering rows. Prefix reuse copies rows out of a slot into
an LRU (:class:`PrefixCache`) keyed by the token prefix they encode, and back into a new slot.
Reads nothing from disk; writes nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


class KVPool:
    def __init__(self, layers: int, slots: int, max_rows: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype):
        shape = (layers, slots, max_rows, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.max_rows = max_rows
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))

    def in_use(self) -> int:
        """Slots allocated and not yet released (the engine's leak gauge)."""
        return self.slots - len(self._free)

    def allocate(self) -> "SlotCache":
        if not self._free:
            raise RuntimeError("KV pool exhausted (more sequences than max_batch_size)")
        return SlotCache(self, self._free.pop())

    def release(self, cache: "SlotCache") -> None:
        if cache.slot >= 0:
            self._free.append(cache.slot)
            cache.slot = -1
            cache.length = 0


@dataclass
class SlotCache:
    """One sequence's rows in a pool: rows [0, length) are valid."""

    pool: KVPool
    slot: int
    length: int = 0

    def rollback(self, length: int) -> None:
        """Exact rollback: rows beyond ``length`` are ignored from now on."""
        if length > self.length:
            raise ValueError(f"cannot roll forward ({self.length} -> {length})")
        self.length = length

    def compact(self, start: int, rows: list[int]) -> None:
        """Move the rows ``rows`` (absolute indices, ascending, ≥ start) to ``start, start+1, …``
        and set the length to ``start + len(rows)`` (accepting one path of a draft tree)."""
        if rows != list(range(start, start + len(rows))):
            index = torch.tensor(rows, dtype=torch.long)
            dest = slice(start, start + len(rows))
            self.pool.k[:, self.slot, dest] = self.pool.k[:, self.slot].index_select(1, index)
            self.pool.v[:, self.slot, dest] = self.pool.v[:, self.slot].index_select(1, index)
        self.length = start + len(rows)

    def export(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of rows [0, length): ``([layers, length, kv_heads, head_dim],) * 2``."""
        return (self.pool.k[:, self.slot, :length].clone(), self.pool.v[:, self.slot, :length].clone())

    def load(self, k: torch.Tensor, v: torch.Tensor, length: int) -> None:
        self.pool.k[:, self.slot, :length] = k[:, :length]
        self.pool.v[:, self.slot, :length] = v[:, :length]
        self.length = length


class PrefixCache:
    """LRU of finished sequences' KV rows, keyed by the tokens the rows encode. An entry that a
    newer one extends (its key is a prefix of the newer key) is dropped when the newer one is
    stored: the newer rows serve every lookup the older ones could (draft-target orchestration
    re-sends a growing context every round, which would otherwise fill the LRU with copies of one
    conversation)."""

    def __init__(self, entries: int):
        self.entries = entries
        self._store: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def put(self, tokens: list[int], cache: SlotCache) -> None:
        if self.entries <= 0 or cache.length == 0:
            return
        key = tuple(tokens[: cache.length])
        for old in [k for k in self._store if len(k) <= len(key) and key[: len(k)] == k]:
            del self._store[old]
        self._store[key] = cache.export(cache.length)
        while len(self._store) > self.entries:
            self._store.popitem(last=False)

    def restore(self, tokens: list[int], cache: SlotCache, limit: int) -> int:
        """Copy the longest stored prefix of ``tokens[:limit]`` into ``cache``; return its length."""
        wanted = tuple(tokens[:limit])
        best_key, best_len = None, 0
        for key in self._store:
            n = common_prefix_length(key, wanted)
            if n > best_len:
                best_key, best_len = key, n
        if best_key is None:
            return 0
        k, v = self._store[best_key]
        self._store.move_to_end(best_key)
        cache.load(k, v, best_len)
        return best_len


def common_prefix_length(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix, by tuple-slice comparisons (C speed) and bisection
    instead of a Python loop over tokens."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
