"""Medusa speculation: heads on the target's last final hidden state draft without a forward of
their own — a chain of top-1 (or sampled) tokens, one per head, or for greedy requests a static
tree from ``choices`` (upstream semantics: a choice is a path of top-k indices, [0, 1] = 2nd
best at depth 2 under the best at depth 1). The proposer keeps each sequence's last hidden state.
Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.reference.draft_len import medusa_heads
from pipeline.reference.modeling import MedusaHeads
from pipeline.reference.proposers.base import (
    BuildContext,
    Proposal,
    draft_chains,
    sort_choices,
    tree_proposal,
    validate_choices,
)
from pipeline.reference.sequence import SeqState


@dataclass
class _MedusaState:
    last_hidden: torch.Tensor | None  # [H] target final hidden state of the last cached position


class MedusaDrafter:
    def __init__(self, heads: MedusaHeads, num_draft_tokens: int, choices: list[list[int]] | None):
        self.heads = heads
        self.num_heads = min(num_draft_tokens, heads.num_heads)  # drafting heads: the chain length
        self.choices = sort_choices(choices) if choices else None
        if self.choices:
            validate_choices(self.choices, self.num_heads)
        self.max_draft_len = len(self.choices) if self.choices else self.num_heads

    def reusable_prefix(self, prompt_len: int) -> int:
        return prompt_len - 2  # one prompt token is always prefilled, for its hidden state

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        seq.proposer_state = _MedusaState(None if hidden is None else hidden[-1])

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        seq.proposer_state.last_hidden = hidden[-1]

    def release(self, seq: SeqState) -> None:
        seq.proposer_state = None

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, n in enumerate(num_draft_tokens) if n > 0 and seqs[i].proposer_state.last_hidden is not None]
        if not rows:
            return proposals
        logits = self.heads.logits(torch.stack([seqs[i].proposer_state.last_hidden for i in rows]))  # [B, heads, vocab]
        chain = []
        for b, i in enumerate(rows):
            if self.choices and seqs[i].params.greedy and num_draft_tokens[i] >= len(self.choices):
                proposals[i] = self._tree(logits[b])
            else:
                chain.append(b)
        if chain:
            self._chains(seqs, [rows[b] for b in chain], num_draft_tokens, logits[chain], proposals)
        return proposals

    def _chains(self, seqs: list[SeqState], rows: list[int], num_draft_tokens: list[int], head_logits: torch.Tensor,
                proposals: list[Proposal]) -> None:
        """``head_logits [len(rows), heads, vocab]``: head d drafts position d, no forward between."""
        depth = 0

        def advance(keep: list[int], live: list[int]) -> torch.Tensor:
            nonlocal depth, head_logits
            depth += 1
            head_logits = head_logits[keep]
            return head_logits[:, depth]

        draft_chains(seqs, rows, [min(num_draft_tokens[i], self.num_heads) for i in rows], proposals,
                     head_logits[:, 0], advance)

    def _tree(self, head_logits: torch.Tensor) -> Proposal:
        width = max(c[-1] for c in self.choices) + 1
        top = head_logits[: self.num_heads].topk(width, -1).indices.tolist()  # [heads, width]
        return tree_proposal(self.choices, {tuple(c): top[len(c) - 1][c[-1]] for c in self.choices})


def build(spec: dict, ctx: BuildContext) -> MedusaDrafter:
    heads = ctx.models.medusa(ctx.path(spec["heads_dir"]), ctx.dtype, medusa_heads(spec))
    return MedusaDrafter(heads, medusa_heads(spec) or heads.num_heads, spec.get("choices"))
