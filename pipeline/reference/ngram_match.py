"""N-gram (prompt-lookup) matching over a token list, without torch: the pattern pool and the
suffix lookup that both the CPU engine's proposer (:mod:`pipeline.reference.proposers.ngram`) and
the BLS's external-draft n-gram flow (:mod:`pipeline.triton_models.ngram_bls`) draft with. The
knobs and their upstream sources are in the proposer's docstring. Reads and writes nothing."""

from __future__ import annotations


class NgramPool:
    """pattern (tuple of 1..max tokens) → its first and its latest occurrence, each as
    (the token list it occurred in, the index of the token that followed it)."""

    def __init__(self, keep_all: bool, capacity: int | None = None):
        self.keep_all = keep_all
        self.capacity = capacity
        self.entries: dict[tuple[int, ...], list] = {}  # [first_tokens, first_at, last_tokens, last_at]

    def add(self, pattern: tuple[int, ...], tokens: list[int], at: int) -> None:
        entry = self.entries.get(pattern)
        if entry is None:
            self.entries[pattern] = [tokens, at, tokens, at]
            if self.capacity is not None and len(self.entries) > self.capacity:
                del self.entries[next(iter(self.entries))]
        elif self.keep_all:
            entry[2], entry[3] = tokens, at

    def continuation(self, pattern: tuple[int, ...], oldest: bool, k: int) -> list[int] | None:
        entry = self.entries.get(pattern)
        if entry is None:
            return None
        tokens, at = (entry[0], entry[1]) if oldest or not self.keep_all else (entry[2], entry[3])
        return tokens[at : at + k]


class NgramMatcher:
    """The pattern lengths and the occurrence choice: indexes a token list into a pool and looks
    its suffix up there."""

    def __init__(self, max_matching_ngram_size: int = 2, min_matching_ngram_size: int = 1,
                 is_use_oldest: bool = True):
        if not 1 <= min_matching_ngram_size <= max_matching_ngram_size:
            raise ValueError(f"need 1 <= min_matching_ngram_size ({min_matching_ngram_size}) <= "
                             f"max_matching_ngram_size ({max_matching_ngram_size})")
        self.max_n = max_matching_ngram_size
        self.min_n = min_matching_ngram_size
        self.use_oldest = is_use_oldest

    def index(self, pool: NgramPool, tokens: list[int], indexed: int) -> int:
        """Add every pattern that is now followed by a token: for each position ``at`` from
        ``indexed`` on (the token after the pattern), the patterns of min..max tokens ending right
        before it. Returns the new ``indexed`` (positions below it are in the pool)."""
        for at in range(indexed, len(tokens)):
            for n in range(self.min_n, min(self.max_n, at) + 1):
                pool.add(tuple(tokens[at - n : at]), tokens, at)
        return max(indexed, len(tokens))

    def lookup(self, pool: NgramPool, tokens: list[int], k: int) -> list[int]:
        """Drafts for ``tokens``: the longest suffix pattern (max..min tokens) found in ``pool``
        proposes up to ``k`` of the tokens that followed it; [] when none matches."""
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            drafts = pool.continuation(tuple(tokens[len(tokens) - n :]), self.use_oldest, k)
            if drafts:
                return drafts
        return []
