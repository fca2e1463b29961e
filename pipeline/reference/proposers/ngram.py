"""N-gram (prompt-lookup) proposer: no draft model. The last n tokens of the sequence (prompt +
output so far) are looked up among earlier positions, and the tokens that followed the match are
the drafts. Prompts that the output copies from (code being edited, tables, retrieved passages,
summaries) give long accepted runs at the cost of a dictionary lookup; free text gives few.

Semantics follow upstream's two n-gram drafters (read, not copied):

- TensorRT-LLM ``NGramDecodingConfig`` (``tensorrt_llm/llmapi/llm_args.py``) and its pool
  (``NGramPoolManager`` in ``tensorrt_llm/_torch/speculative/ngram.py``): ``max_draft_len`` caps
  the drafts per step; ``max_matching_ngram_size`` is the longest pattern tried, and the longest
  pattern that matches wins; ``is_keep_all`` keeps every earlier occurrence of a pattern (False:
  only the first); ``is_use_oldest`` proposes from the oldest occurrence (False: the newest);
  ``is_public_pool`` shares one pool between all requests (False: each request sees only its own
  tokens).
- vLLM's ``NgramDrafter`` (``vllm/v1/spec_decode/ngram_proposer.py``; the knobs in
  ``vllm/config/speculative.py``): ``prompt_lookup_min`` / ``prompt_lookup_max`` bound the
  pattern length; here ``min_matching_ngram_size`` is the lower bound (TensorRT-LLM's is 1) and
  ``max_matching_ngram_size`` the upper one. vLLM's choice — the longest suffix n-gram, earliest
  occurrence, fewer drafts when the match is near the end — is this module's default
  (``is_use_oldest``), with a private pool.

Where this differs from upstream, and why: a pool entry records *where* a pattern occurred, not
a copy of the tokens after it, and the drafts are read from the sequence at lookup time. A
continuation cut short by the end of the sequence therefore grows with the sequence (TensorRT-LLM
gets the same by re-scanning the tail every step and replacing shorter matches). "Newest" is the
most recent occurrence (TensorRT-LLM: the most recently added distinct continuation). The public
pool keeps at most :data:`PUBLIC_POOL_PATTERNS` patterns, dropping the oldest inserted (upstream's
public pool is never pruned; a long-running CPU server should not grow without bound).

Lossless under the engine's verifier: the drafts are a function of tokens already fixed before
the step, never of this step's random draws, so a sampled request verifies them as one-hot
draft distributions (``draft_probs`` None → accept with min(1, p(token)), else resample from p
without that token; :mod:`pipeline.reference.verify`); greedy requests keep the target's argmax.
Implements the :class:`pipeline.reference.proposers.base.Proposer` protocol (registered as
``ngram`` in :data:`pipeline.reference.proposers.BUILDERS`); the pool and the matching are
:mod:`pipeline.reference.ngram_match` (torch-free, shared with the BLS). Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.reference.ngram_match import NgramMatcher, NgramPool
from pipeline.reference.proposers.base import BuildContext, Proposal
from pipeline.reference.sequence import SeqState

PUBLIC_POOL_PATTERNS = 1 << 17  # bound of the shared pool (patterns); oldest inserted leave first


@dataclass
class _NgramState:
    pool: NgramPool
    indexed: int = 1  # positions < this (as "the token after a pattern") are in the pool
    drafts: list[int] = field(default_factory=list)  # the last proposal (for tests and debugging)


class NgramDrafter:
    """Prompt-lookup drafting over a private or a shared :class:`NgramPool` (see the module
    docstring for the knobs and their upstream sources)."""

    def __init__(self, max_draft_len: int, max_matching_ngram_size: int = 2, min_matching_ngram_size: int = 1,
                 is_keep_all: bool = True, is_use_oldest: bool = True, is_public_pool: bool = True):
        if max_draft_len < 1:
            raise ValueError(f"max_draft_len must be >= 1, got {max_draft_len}")
        self.matcher = NgramMatcher(max_matching_ngram_size, min_matching_ngram_size, is_use_oldest)
        self.max_draft_len = max_draft_len
        self.max_n = max_matching_ngram_size
        self.min_n = min_matching_ngram_size
        self.keep_all = is_keep_all
        self.use_oldest = is_use_oldest
        self.public = NgramPool(is_keep_all, PUBLIC_POOL_PATTERNS) if is_public_pool else None

    @classmethod
    def from_spec(cls, spec: dict) -> "NgramDrafter":
        """From an engine.json ``proposer`` entry (``{"method": "ngram", "max_draft_len": …}``)."""
        return cls(int(spec["max_draft_len"]), int(spec.get("max_matching_ngram_size", 2)),
                   int(spec.get("min_matching_ngram_size", 1)), bool(spec.get("is_keep_all", True)),
                   bool(spec.get("is_use_oldest", True)), bool(spec.get("is_public_pool", True)))

    def reusable_prefix(self, prompt_len: int) -> int:
        return prompt_len - 1  # needs no target hidden states: the prefix cache works as for the baseline

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        seq.proposer_state = _NgramState(self.public if self.public is not None else NgramPool(self.keep_all))

    def release(self, seq: SeqState) -> None:
        seq.proposer_state = None  # a shared pool keeps the sequence's patterns (and its tokens)

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        pass  # drafts never enter seq.tokens; new tokens are indexed at the next propose()

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        proposals = []
        for seq, k in zip(seqs, num_draft_tokens):
            state = seq.proposer_state
            self._index(state, seq.tokens)
            drafts = self.lookup(state.pool, seq.tokens, min(k, self.max_draft_len)) if k > 0 else []
            state.drafts = drafts
            proposals.append(Proposal(drafts))  # draft_probs None: deterministic (one-hot) drafts
        return proposals

    def _index(self, state: _NgramState, tokens: list[int]) -> None:
        state.indexed = self.matcher.index(state.pool, tokens, state.indexed)

    def lookup(self, pool: NgramPool, tokens: list[int], k: int) -> list[int]:
        return self.matcher.lookup(pool, tokens, k)


def build(spec: dict, ctx: BuildContext) -> NgramDrafter:
    """No checkpoint to load: the proposer is its knobs (``ctx`` unused)."""
    return NgramDrafter.from_spec(spec)
