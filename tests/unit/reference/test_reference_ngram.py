"""The n-gram (prompt-lookup) proposer on its own: matching (longest pattern first, oldest or
newest occurrence, min/max pattern sizes), edge cases (no match, a match at the end of the
sequence, n larger than the sequence, k = 0), private vs public pool, a batch with mixed matches,
and the bounded public pool. No model: the proposer only reads token lists."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.reference.proposers.ngram import NgramDrafter, NgramPool


def _seq(tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(tokens=list(tokens), proposer_state=None)


def _propose(proposer: NgramDrafter, tokens: list[int], k: int | None = None) -> list[int]:
    seq = _seq(tokens)
    proposer.start(seq, None)
    return proposer.propose([seq], [proposer.max_draft_len if k is None else k])[0].tokens


def test_vllm_docstring_example_longest_suffix_then_what_followed():
    # vllm/v1/spec_decode/ngram_proposer.py: [1,2,3,4,2,3], min 2, max 3, k 4 → [4, 2, 3]
    proposer = NgramDrafter(4, max_matching_ngram_size=3, min_matching_ngram_size=2, is_public_pool=False)
    assert _propose(proposer, [1, 2, 3, 4, 2, 3]) == [4, 2, 3]


def test_no_match_proposes_nothing():
    proposer = NgramDrafter(4, 3, is_public_pool=False)
    assert _propose(proposer, [10, 11, 12, 13, 14]) == []


def test_match_near_the_end_proposes_only_what_exists():
    proposer = NgramDrafter(5, 2, is_public_pool=False)
    # (7, 8) occurred at the start; after it come 9, 7, 8 and then the sequence ends
    assert _propose(proposer, [7, 8, 9, 7, 8]) == [9, 7, 8]


def test_n_larger_than_the_sequence():
    proposer = NgramDrafter(4, max_matching_ngram_size=5, is_public_pool=False)
    assert _propose(proposer, [5]) == []  # nothing earlier to match
    assert _propose(proposer, [5, 5]) == [5]  # only the 1-gram (5,) has an earlier occurrence
    assert _propose(NgramDrafter(4, 5, min_matching_ngram_size=3, is_public_pool=False), [5, 5, 5]) == []


def test_longest_pattern_wins_over_a_shorter_one():
    proposer = NgramDrafter(2, 2, is_use_oldest=False, is_public_pool=False)
    # (2,) was last followed by 40, but (1, 2) matches and was followed by 30
    assert _propose(proposer, [1, 2, 30, 31, 9, 2, 40, 41, 1, 2]) == [30, 31]
    assert _propose(NgramDrafter(2, 1, is_public_pool=False), [1, 2, 30, 31, 9, 2, 40, 41, 1, 2]) == [30, 31]
    assert _propose(NgramDrafter(2, 1, is_use_oldest=False, is_public_pool=False),
                    [1, 2, 30, 31, 9, 2, 40, 41, 1, 2]) == [40, 41]


def test_min_ngram_size_refuses_short_matches():
    tokens = [4, 50, 51, 9, 4]
    assert _propose(NgramDrafter(2, 3, min_matching_ngram_size=1, is_public_pool=False), tokens) == [50, 51]
    assert _propose(NgramDrafter(2, 3, min_matching_ngram_size=2, is_public_pool=False), tokens) == []


@pytest.mark.parametrize(("keep_all", "oldest", "expected"), [
    (True, True, [10, 11]), (True, False, [20, 21]), (False, True, [10, 11]), (False, False, [10, 11]),
])
def test_oldest_newest_and_keep_all(keep_all, oldest, expected):
    # without keep_all only the first occurrence of a pattern is kept, so oldest/newest agree
    proposer = NgramDrafter(2, 2, is_keep_all=keep_all, is_use_oldest=oldest, is_public_pool=False)
    assert _propose(proposer, [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]) == expected


def test_k_caps_the_drafts_and_zero_means_none():
    proposer = NgramDrafter(4, 2, is_public_pool=False)
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert _propose(proposer, tokens) == [3, 4, 5, 6]
    assert _propose(proposer, tokens, k=2) == [3, 4]
    assert _propose(proposer, tokens, k=0) == []


def test_a_continuation_grows_with_the_sequence():
    proposer = NgramDrafter(4, 1, is_public_pool=False)
    seq = _seq([3, 8, 3])
    proposer.start(seq, None)
    assert proposer.propose([seq], [4])[0].tokens == [8, 3]  # (3,) at 0: then 8, 3, and the end
    seq.tokens.extend([9, 3])  # the scheduler appends accepted tokens in place
    # the oldest (3,) still wins and now has 8, 3, 9, 3 after it
    assert proposer.propose([seq], [4])[0].tokens == [8, 3, 9, 3]


def test_public_pool_shares_patterns_between_requests_private_does_not():
    for public, expected in ((True, [3, 4]), (False, [])):
        proposer = NgramDrafter(2, 2, is_public_pool=public)
        first = _seq([1, 2, 3, 4])
        proposer.start(first, None)
        proposer.propose([first], [2])
        proposer.release(first)  # a finished request's patterns stay in the public pool
        assert _propose(proposer, [9, 1, 2]) == expected, f"public={public}"


def test_batch_with_mixed_matches():
    proposer = NgramDrafter(3, 2, is_public_pool=False)
    seqs = [_seq([1, 2, 3, 4, 1, 2]), _seq([5, 6, 5]), _seq([7, 8, 9]), _seq([4, 4, 4, 4])]
    for seq in seqs:
        proposer.start(seq, None)
    out = proposer.propose(seqs, [3, 3, 3, 0])
    assert [p.tokens for p in out] == [[3, 4, 1], [6, 5], [], []]
    assert all(p.parents is None and p.draft_probs is None for p in out)  # a chain, one-hot drafts


def test_public_pool_is_bounded_oldest_inserted_leave_first():
    pool = NgramPool(keep_all=True, capacity=2)
    tokens = [1, 2, 3, 4]
    for at in (1, 2, 3):
        pool.add((tokens[at - 1],), tokens, at)
    assert sorted(pool.entries) == [(2,), (3,)]
    assert pool.continuation((1,), True, 2) is None and pool.continuation((3,), True, 2) == [4]


def test_invalid_knobs_are_refused():
    with pytest.raises(ValueError, match="max_draft_len"):
        NgramDrafter(0)
    with pytest.raises(ValueError, match="min_matching_ngram_size"):
        NgramDrafter(2, max_matching_ngram_size=2, min_matching_ngram_size=3)


def test_from_spec_reads_engine_json_fields_with_upstream_defaults():
    proposer = NgramDrafter.from_spec({"method": "ngram", "max_draft_len": 3})
    assert (proposer.max_draft_len, proposer.max_n, proposer.min_n) == (3, 2, 1)
    assert proposer.keep_all and proposer.use_oldest and proposer.public is not None
    proposer = NgramDrafter.from_spec({"method": "ngram", "max_draft_len": 5, "max_matching_ngram_size": 4,
                                        "min_matching_ngram_size": 2, "is_keep_all": False,
                                        "is_use_oldest": False, "is_public_pool": False})
    assert (proposer.max_draft_len, proposer.max_n, proposer.min_n, proposer.keep_all, proposer.use_oldest,
            proposer.public) == (5, 4, 2, False, False, None)
