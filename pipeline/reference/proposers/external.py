"""External drafts: the request brings its own (``draft_input_ids``, optionally
``draft_logits``), as the draft-target target of TensorRT-LLM's Triton backend receives them from
the BLS orchestrator. The proposer hands them over as given, for exactly ONE verification step:
:meth:`ExternalDraftProposer.accept` ends the request after it (the result holds the accepted
drafts and one more token). The scheduler gives a request with ``draft_input_ids`` to this
proposer whatever the engine's own proposer is. Reads and writes nothing on disk.
"""

from __future__ import annotations

import torch

from pipeline.reference.proposers.base import Proposal
from pipeline.reference.sampling import to_probs
from pipeline.reference.sequence import SeqState


class ExternalDraftProposer:
    def __init__(self, max_draft_len: int, dtype: torch.dtype):
        self.max_draft_len = max_draft_len  # what the engine accepts (checked at submit)
        self.dtype = dtype

    def reusable_prefix(self, prompt_len: int) -> int:
        return prompt_len - 1  # no hidden states needed

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        pass

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        """The requests' own drafts (the budget does not cut them: they are verified as sent)."""
        return [self._proposal(seq) for seq in seqs]

    def _proposal(self, seq: SeqState) -> Proposal:
        drafts = list(seq.request.draft_input_ids or [])
        probs = None
        if seq.request.draft_logits is not None and drafts and not seq.params.greedy:
            probs = to_probs(torch.tensor(seq.request.draft_logits, dtype=self.dtype), seq.params)
        return Proposal(drafts, None, probs)

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        if not seq.finished:
            seq.finish_reason = "length"  # one verification step per request

    def release(self, seq: SeqState) -> None:
        pass
