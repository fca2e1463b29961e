"""Verifier algebra and distribution tests (no models): greedy chain/tree rules, the exact
one-step identity of speculative sampling, and a chi-square test with a negative control."""

from __future__ import annotations

import pytest
import torch

from pipeline.reference import verify
from pipeline.reference.api import SamplingParams
from pipeline.reference.sampling import mask_position, to_probs
from tests.reference_fixtures import chi2_pvalue


def _dist(gen: torch.Generator, vocab: int, sharp: float = 2.0) -> torch.Tensor:
    return torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * sharp, -1)


def test_greedy_chain_accepts_longest_matching_prefix():
    logits = torch.zeros(4, 10)
    for row, tok in enumerate([3, 5, 7, 9]):
        logits[row, tok] = 1.0
    assert verify.verify_greedy_chain(logits, [3, 5, 7]) == verify.VerifyResult([1, 2, 3], 9)  # bonus
    assert verify.verify_greedy_chain(logits, [3, 6, 7]) == verify.VerifyResult([1], 5)  # correction
    assert verify.verify_greedy_chain(logits, [4]) == verify.VerifyResult([], 3)
    assert verify.verify_greedy_chain(logits[:1], []) == verify.VerifyResult([], 3)


def test_greedy_tree_follows_the_matching_branch():
    # rows: 0 pending, 1 node(tok 4, parent 0), 2 node(tok 3, parent 0), 3 node(tok 8, parent 2)
    logits = torch.zeros(4, 10)
    logits[0, 3] = logits[1, 1] = logits[2, 8] = logits[3, 2] = 1.0
    verdict = verify.verify_greedy_tree(logits, [4, 3, 8], [0, 0, 2])
    assert verdict == verify.VerifyResult([2, 3], 2)


def test_one_step_algebra_is_exact():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        p, q = _dist(gen, 37), _dist(gen, 37)
        assert torch.allclose(verify.one_step_distribution(p, q), p, atol=1e-12, rtol=0)
    # a broken residual (the target itself) is not lossless
    p, q = _dist(gen, 37), _dist(gen, 37)
    accept = torch.minimum(p, q)
    broken = accept + (1 - accept.sum()) * p
    assert (broken - p).abs().max() > 1e-3


def _first_token_counts(p, q, residual_fn, n, seed):
    gen = torch.Generator().manual_seed(seed)
    target_probs = torch.stack([p, p])  # [K+1, vocab], K = 1
    counts = torch.zeros(p.shape[0])
    for _ in range(n):
        draft = int(torch.multinomial(q, 1, generator=gen))
        verdict = verify.verify_sampled_chain(target_probs, q[None], [draft], gen, residual_fn=residual_fn)
        first = draft if verdict.accepted else verdict.next_token
        counts[first] += 1
    return counts


def test_sampled_verification_matches_target_and_broken_residual_fails():
    gen = torch.Generator().manual_seed(1)
    p, q = _dist(gen, 12), _dist(gen, 12)
    good = _first_token_counts(p, q, None, 2000, seed=2)
    bad = _first_token_counts(p, q, lambda tp, dp: tp, 2000, seed=2)
    assert chi2_pvalue(good, p) > 1e-3
    assert chi2_pvalue(bad, p) < 1e-3


def test_to_probs_top_k_top_p_and_greedy():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    assert to_probs(logits, SamplingParams(top_k=1)).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert to_probs(logits, SamplingParams()).tolist() == [[1.0, 0.0, 0.0, 0.0]]  # default greedy
    topk = to_probs(logits, SamplingParams(top_k=2))
    assert (topk[0, 2:] == 0).all() and topk.sum().item() == pytest.approx(1.0)
    full = torch.softmax(logits, -1)
    topp = to_probs(logits, SamplingParams(top_p=float(full[0, 0]) + 1e-6))
    assert (topp[0, :2] > 0).all() and (topp[0, 2:] == 0).all()
    hot = to_probs(logits, SamplingParams(top_p=1.0, temperature=0.5))
    assert torch.allclose(hot, torch.softmax(logits / 0.5, -1))


def test_mask_position_min_tokens_and_bad_words():
    logits = torch.zeros(6)
    mask_position(logits, [1, 2], generated=0, min_tokens=1, end_id=5, bad_words=[[4], [2, 3], [9, 1]])
    assert logits[5] == float("-inf") and logits[4] == float("-inf") and logits[3] == float("-inf")
    assert logits[1] == 0
