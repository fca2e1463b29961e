"""EAGLE-3 speculation: the EAGLE-3 head (:class:`pipeline.reference.eagle3_model.Eagle3Head`)
on the target's low, middle and high hidden states, one decoder-layer step per draft token over
its own KV pool, a chain, batched over sequences (greedy or sampled; no trees).

The proposer names the target layers it needs (``capture_layers``, from the head's config): the
scheduler then hands :meth:`start` / :meth:`accept` those layers' outputs concatenated
``[n, 3H]`` instead of the final hidden states. It keeps each sequence's draft cache and the
captured states it has not consumed yet. Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.reference.eagle3_model import Eagle3Head
from pipeline.reference.kv_cache import SlotCache
from pipeline.reference.modeling import StepInput
from pipeline.reference.proposers.base import BuildContext, Proposal, feature_chains
from pipeline.reference.sequence import SeqState


@dataclass
class _Eagle3State:
    cache: SlotCache  # rows [0, real) hold pairs (g_j, x_{j+1}) of real positions
    captured: torch.Tensor | None = None  # [n, 3H] target hidden states not consumed yet


class Eagle3Drafter:
    def __init__(self, head: Eagle3Head, depth: int, slots: int, max_rows: int):
        self.head = head
        self.depth = self.max_draft_len = depth
        self.capture_layers = head.capture
        self.pool = head.new_pool(slots, max_rows)

    def reusable_prefix(self, prompt_len: int) -> int:
        return 0  # the head needs the captured states of every prompt position

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        seq.proposer_state = _Eagle3State(self.pool.allocate(), hidden)

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        state = seq.proposer_state
        state.captured = hidden if state.captured is None else torch.cat([state.captured, hidden])

    def release(self, seq: SeqState) -> None:
        if seq.proposer_state is not None:
            self.pool.release(seq.proposer_state.cache)
            seq.proposer_state = None

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, n in enumerate(num_draft_tokens) if n > 0 and seqs[i].proposer_state.captured is not None]
        if not rows:
            return proposals
        inputs, fused = [], []
        for i in rows:  # catch up: one pair per new real position
            state, seq = seqs[i].proposer_state, seqs[i]
            start, n = state.cache.length, state.captured.shape[0]
            inputs.append(StepInput(state.cache, seq.tokens[start + 1 : start + 1 + n], list(range(start, start + n))))
            fused.append(self.head.fuse(state.captured))
            state.captured = None
        real = {i: inp.cache.length + len(inp.tokens) for i, inp in zip(rows, inputs)}
        width = max(f.shape[0] for f in fused)
        g = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - f.shape[0])) for f in fused])
        out = self.head.forward(self.pool, inputs, g)  # [B, T, H]
        last = torch.stack([out[b, len(x.tokens) - 1] for b, x in enumerate(inputs)])  # [B, H]
        # the head's own output is the next step's g (no fc)
        feature_chains(self.head, self.pool, seqs, rows, [min(num_draft_tokens[i], self.depth) for i in rows],
                       last, proposals)
        for i in rows:
            seqs[i].proposer_state.cache.rollback(real[i])
        return proposals


def build(spec: dict, ctx: BuildContext) -> Eagle3Drafter:
    head = Eagle3Head(ctx.path(spec["head_dir"]), ctx.target, ctx.dtype)
    return Eagle3Drafter(head, int(spec["max_draft_len"]), ctx.slots, ctx.max_rows)
