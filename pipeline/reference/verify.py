"""Verification of draft tokens against the target: greedy (longest prefix, or longest tree path,
matching the target's argmax) and lossless speculative sampling for chains (Leviathan et al.,
arXiv 2211.17192: accept with min(1, p/q); on rejection resample from norm(max(0, p − q))).

Glossary (the names the whole engine uses):

- *draft tokens* — what a proposer offers for one step: a chain of K, or the N nodes of a tree;
- *accepted tokens* — the drafts the target agrees with: a prefix of the chain, a path of the tree;
- *correction token* — at the first rejected position, the target's own token there (greedy: its
  argmax; sampled: a draw from the residual). vLLM's rejection sampler calls it "recovered";
- *bonus token* — when every draft on the path is accepted, the target's token after the last
  one (free: its logits come from the same pass);
- one verify step emits the accepted tokens plus one: the correction or the bonus
  (:class:`VerifyResult`); ``p`` is the target's distribution, ``q`` the draft's.

Sampled trees are verified only when every node is a deterministic draft (one-hot ``q``, the
lookahead proposer's): :func:`verify_sampled_tree`. Proposers whose drafts are sampled from a
distribution give sampled requests a chain (documented in :mod:`pipeline.reference.proposers`).
Randomness only from the request's ``torch.Generator``. Reads and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.reference.sampling import sample


@dataclass
class VerifyResult:
    accepted: list[int]  # step rows (1-based; row 0 is the pending token) of the accepted drafts, in order
    next_token: int  # the correction token, or the bonus token when every draft on the path passed


def verify_greedy_chain(target_logits: torch.Tensor, drafts: list[int]) -> VerifyResult:
    """``target_logits [K+1, vocab]``: row j is the target's view after the pending token and
    drafts[:j]."""
    choice = target_logits.argmax(-1).tolist()  # [K+1]
    a = 0
    while a < len(drafts) and drafts[a] == choice[a]:
        a += 1
    return VerifyResult(list(range(1, a + 1)), choice[a])


def verify_greedy_tree(target_logits: torch.Tensor, tokens: list[int], parents: list[int]) -> VerifyResult:
    """Tree: node i (1-based row i+1 … see below) has ``parents[i]`` (0 = the pending token).
    ``target_logits [N+1, vocab]``, row 0 = pending, row i+1 = node i. Follows the child whose
    token is the target's argmax at each step (the longest accepted path)."""
    choice = target_logits.argmax(-1).tolist()
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i + 1)
    path, current = [], 0
    while True:
        nxt = next((c for c in children.get(current, []) if tokens[c - 1] == choice[current]), None)
        if nxt is None:
            return VerifyResult(path, choice[current])
        path.append(nxt)
        current = nxt


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p − q)); falls back to p when p ≤ q everywhere (then rejection had prob. 0)."""
    diff = (target_probs - draft_probs).clamp_min(0.0)
    total = diff.sum()
    return diff / total if total > 0 else target_probs


def verify_sampled_chain(target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: list[int],
                         generator: torch.Generator, residual_fn=None) -> VerifyResult:
    """``target_probs [K+1, vocab]``, ``draft_probs [K, vocab]`` (the distributions the drafts
    were drawn from; one-hot rows for deterministic drafts). ``residual_fn`` exists for the
    negative-control test only."""
    residual_fn = residual_fn or residual
    for i, token in enumerate(drafts):
        p, q = float(target_probs[i, token]), float(draft_probs[i, token])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if q > 0 and u < min(1.0, p / q):
            continue
        return VerifyResult(list(range(1, i + 1)), sample(residual_fn(target_probs[i], draft_probs[i]), generator))
    return VerifyResult(list(range(1, len(drafts) + 1)), sample(target_probs[len(drafts)], generator))


def verify_sampled_tree(target_probs: torch.Tensor, tokens: list[int], parents: list[int],
                        generator: torch.Generator, residual_fn=None) -> VerifyResult:
    """A tree of deterministic drafts (each node's draft distribution one-hot at its token).
    ``target_probs [N+1, vocab]``, row 0 = pending, row i+1 = node i. At each row its children
    are tried in order, each with the chain's rule — accept with min(1, p/q), q = 1 — against
    the residual norm(max(0, p − q)) that the siblings rejected before it left (SpecInfer's
    multi-draft rule, arXiv 2305.09781, for one-hot drafts); no child accepted → a draw from that
    residual (the correction token); a leaf accepted → the bonus token from its row. On a chain
    this draws exactly as :func:`verify_sampled_chain` with one-hot ``draft_probs``."""
    residual_fn = residual_fn or residual
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent, []).append(i + 1)
    path, current = [], 0
    while True:
        probs = target_probs[current]  # [vocab]
        accepted = None
        for child in children.get(current, []):
            token = tokens[child - 1]
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u < min(1.0, float(probs[token])):
                accepted = child
                break
            probs = residual_fn(probs, torch.nn.functional.one_hot(torch.tensor(token), probs.shape[-1]).to(probs.dtype))
        if accepted is None:
            return VerifyResult(path, sample(probs, generator))
        path.append(accepted)
        current = accepted


def one_step_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Exact distribution of the first emitted token under :func:`verify_sampled_chain`:
    Σ_x q(x)·min(1, p(x)/q(x))·δ_x + P(reject)·residual. Equals ``target_probs`` (the test)."""
    accept = torch.minimum(draft_probs, target_probs)  # q·min(1, p/q)
    return accept + (1.0 - accept.sum()) * residual(target_probs, draft_probs)
