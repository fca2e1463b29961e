"""Draft-target speculation inside one engine: a smaller Llama with its own KV pool drafts a
chain, token by token, for every sequence of the batch at once (one ragged forward per draft
position). A lone sequence drafts through the model's one-sequence entry points
(``draft_logits``; a greedy chain through ``greedy_chain`` when the model has one in one call —
the fast path does). Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.errors import UsageError
from pipeline.reference.draft_len import draft_model_chain
from pipeline.reference.kv_cache import SlotCache, common_prefix_length
from pipeline.reference.modeling import LlamaModel, StepInput
from pipeline.reference.proposers.base import BuildContext, Proposal, stack_probs
from pipeline.reference.sampling import choose
from pipeline.reference.sequence import SeqState

LONE_FEED_ROWS = 2  # a verify round leaves at most 2 tokens to catch up (last draft + bonus)


@dataclass
class _DraftState:
    cache: SlotCache
    cached_tokens: list[int] = field(default_factory=list)  # the token each cache row encodes


class DraftModelProposer:
    def __init__(self, model: LlamaModel, num_draft_tokens: int, slots: int, max_rows: int):
        self.model = model
        model.prepare_drafting()
        self.max_draft_len = num_draft_tokens
        self.pool = model.new_pool(slots, max_rows)

    def reusable_prefix(self, prompt_len: int) -> int:
        return prompt_len - 2

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        seq.proposer_state = _DraftState(self.pool.allocate())

    def release(self, seq: SeqState) -> None:
        if seq.proposer_state is not None:
            self.pool.release(seq.proposer_state.cache)
            seq.proposer_state = None

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        state = seq.proposer_state
        keep = common_prefix_length(tuple(state.cached_tokens), tuple(seq.tokens))
        state.cache.rollback(min(keep, state.cache.length))
        del state.cached_tokens[state.cache.length :]

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, n in enumerate(num_draft_tokens) if n > 0]
        # catch-up: every token not yet in the draft cache, the pending one included
        feed = {i: seqs[i].tokens[seqs[i].proposer_state.cache.length :] for i in rows}
        if len(rows) == 1:
            drafts = self._chain_in_one_call(seqs[rows[0]], feed[rows[0]], num_draft_tokens[rows[0]])
            if drafts is not None:
                proposals[rows[0]] = Proposal(drafts)
                return proposals
        probs: dict[int, list] = {i: [] for i in rows}
        step = 0
        while rows:
            logits = self._draft_logits(seqs, rows, feed)  # [B, vocab]
            for b, i in enumerate(rows):
                token, dist = choose(logits[b], seqs[i].params, seqs[i].generator)
                proposals[i].tokens.append(token)
                probs[i].append(dist)
                feed[i] = [token]
            step += 1
            rows = [i for i in rows if num_draft_tokens[i] > step]
        for i, rows_probs in probs.items():
            proposals[i].draft_probs = stack_probs(rows_probs)
        return proposals

    def _chain_in_one_call(self, seq: SeqState, feed: list[int], num_draft_tokens: int) -> list[int] | None:
        """A lone greedy sequence with a short catch-up: the model's whole-chain call, where it
        has one (the tokens step-by-step drafting gives); None: draft step by step."""
        if not seq.params.greedy or len(feed) > LONE_FEED_ROWS:
            return None
        drafts = self.model.greedy_chain(seq.proposer_state.cache, feed, num_draft_tokens)
        if drafts is not None:
            seq.proposer_state.cached_tokens.extend(feed + drafts[:-1])
        return drafts

    def _draft_logits(self, seqs: list[SeqState], rows: list[int], feed: dict[int, list[int]]) -> torch.Tensor:
        """Append each row's ``feed`` to its draft cache → next-token logits ``[B, vocab]``. A lone
        sequence with at most :data:`LONE_FEED_ROWS` new tokens goes through the model's
        one-sequence ``draft_logits``; a prompt's catch-up and several sequences share one
        ragged forward."""
        for i in rows:
            seqs[i].proposer_state.cached_tokens.extend(feed[i])
        if len(rows) == 1 and len(feed[rows[0]]) <= LONE_FEED_ROWS:
            return self.model.draft_logits(seqs[rows[0]].proposer_state.cache, feed[rows[0]])
        inputs = []
        for i in rows:
            start = seqs[i].proposer_state.cache.length
            inputs.append(StepInput(seqs[i].proposer_state.cache, feed[i], list(range(start, start + len(feed[i])))))
        hidden = self.model.forward(self.pool, inputs)  # [B, T, H]
        return self.model.logits(torch.stack([hidden[b, len(feed[i]) - 1] for b, i in enumerate(rows)]))


def build(spec: dict, ctx: BuildContext) -> DraftModelProposer:
    draft = ctx.models.llama(ctx.path(spec["draft_dir"]), ctx.dtype)
    if draft.shape.vocab_size != ctx.target.shape.vocab_size:
        raise UsageError(f"draft vocab {draft.shape.vocab_size} != target vocab {ctx.target.shape.vocab_size}")
    return DraftModelProposer(draft, draft_model_chain(spec), ctx.slots, ctx.max_rows)
