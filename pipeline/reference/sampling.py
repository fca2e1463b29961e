"""Logit processing shared by drafts and target: temperature, top-k, top-p, and the per-position
masks of a request (``min_tokens`` suppressing ``end_id``; ``bad_words``). Pure tensor functions;
randomness only from the ``torch.Generator`` passed in. Reads and writes nothing.
"""

from __future__ import annotations

import torch

from pipeline.reference.api import SamplingParams

NEG_INF = float("-inf")


def to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``logits [..., vocab]`` → the sampling distribution ``[..., vocab]`` (greedy: one-hot argmax)."""
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / max(params.temperature, 1e-6)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    probs = torch.softmax(logits, -1)
    if 0.0 < params.top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly before each token
        drop_sorted = before >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from ``probs [vocab]``."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, torch.Tensor | None]:
    """A token from ``logits [vocab]`` and the distribution it came from (None when greedy)."""
    if params.greedy:
        return int(logits.argmax().item()), None
    probs = to_probs(logits, params)
    return sample(probs, generator), probs


def mask_position(logits: torch.Tensor, context: list[int], generated: int, min_tokens: int,
                  end_id: int | None, bad_words: list[list[int]]) -> None:
    """In place on ``logits [vocab]`` for the token following ``context`` (``generated`` new tokens
    exist before it): suppress ``end_id`` below ``min_tokens``; ban completions of bad words."""
    if end_id is not None and generated < min_tokens:
        logits[end_id] = NEG_INF
    for word in bad_words:
        if not word:
            continue
        head = word[:-1]
        if not head or (len(context) >= len(head) and context[-len(head):] == head):
            logits[word[-1]] = NEG_INF
