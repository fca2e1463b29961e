"""EAGLE-1 speculation: the EAGLE head on the target's features, one decoder layer per draft
step over its own KV pool — a chain by default, or for greedy requests a static tree from
``choices``. Several sequences share batched forwards; a lone sequence goes through the head's
one-sequence entry points (``extend``; a greedy chain through ``greedy_chain`` when the head has
one in one call — the fast path does). The proposer keeps each sequence's draft cache and the
target features it has not consumed yet. Reads and writes nothing on disk.

Chain: one EAGLE-layer step per draft token, batched over sequences. Tree: depth by depth, each
expanded node is one new EAGLE row whose attention sees the real rows and its own ancestors'
speculative rows only; children are the top-k tokens of its predicted feature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.reference.draft_len import eagle_depth
from pipeline.reference.kv_cache import SlotCache
from pipeline.reference.modeling import EagleHead, StepInput
from pipeline.reference.proposers.base import (
    BuildContext,
    Proposal,
    draft_chains,
    feature_chains,
    sort_choices,
    tree_proposal,
    validate_choices,
)
from pipeline.reference.sequence import SeqState


@dataclass
class _EagleState:
    cache: SlotCache  # rows [0, real) hold pairs (f_j, x_{j+1}) with real target features
    features: torch.Tensor | None = None  # [n, H] target features not consumed yet


class EagleDrafter:
    def __init__(self, head: EagleHead, depth: int, slots: int, max_rows: int,
                 choices: list[list[int]] | None = None):
        self.head = head
        self.choices = sort_choices(choices) if choices else None
        if self.choices and self.choices == [[0] * d for d in range(1, len(self.choices) + 1)]:
            depth, self.choices = len(self.choices), None  # [[0], [0, 0], …] is a chain: same drafts, cheaper
        self.depth = max(len(c) for c in self.choices) if self.choices else depth
        if self.choices:
            validate_choices(self.choices, self.depth)
        self.max_draft_len = len(self.choices) if self.choices else depth
        self.pool = head.new_pool(slots, max_rows + (len(self.choices) if self.choices else 0))

    def reusable_prefix(self, prompt_len: int) -> int:
        return 0  # the EAGLE layer needs the target features of every prompt position

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        seq.proposer_state = _EagleState(self.pool.allocate(), hidden)

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        # the speculative rows were dropped at the end of propose(); keep the new real features
        state = seq.proposer_state
        state.features = hidden if state.features is None else torch.cat([state.features, hidden])

    def release(self, seq: SeqState) -> None:
        if seq.proposer_state is not None:
            self.pool.release(seq.proposer_state.cache)
            seq.proposer_state = None

    def _uses_tree(self, seq: SeqState, num_draft_tokens: int) -> bool:
        return self.choices is not None and seq.params.greedy and num_draft_tokens >= len(self.choices)

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, n in enumerate(num_draft_tokens) if n > 0 and seqs[i].proposer_state.features is not None]
        if len(rows) == 1:  # one sequence: the head's one-sequence entry points
            proposals[rows[0]] = self._propose_one(seqs[rows[0]], num_draft_tokens[rows[0]])
        elif rows:
            self._propose_batch(seqs, num_draft_tokens, rows, proposals)
        return proposals

    def _catch_up(self, seq: SeqState) -> tuple[StepInput, torch.Tensor]:
        """The pairs (f_j, x_{j+1}) for every new real feature: the step input and the features."""
        state = seq.proposer_state
        start, features = state.cache.length, state.features
        n = features.shape[0]
        state.features = None
        return StepInput(state.cache, seq.tokens[start + 1 : start + 1 + n], list(range(start, start + n))), features

    def _propose_batch(self, seqs: list[SeqState], num_draft_tokens: list[int], rows: list[int],
                       proposals: list[Proposal]) -> None:
        inputs, feats = zip(*(self._catch_up(seqs[i]) for i in rows))
        real = {i: inp.cache.length + len(inp.tokens) for i, inp in zip(rows, inputs)}
        width = max(f.shape[0] for f in feats)
        padded = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - f.shape[0])) for f in feats])
        hidden = self.head.forward(self.pool, list(inputs), padded)  # [B, T, H]
        last = torch.stack([hidden[b, len(x.tokens) - 1] for b, x in enumerate(inputs)])  # [B, H]
        chain = []
        for b, i in enumerate(rows):
            if self._uses_tree(seqs[i], num_draft_tokens[i]):
                proposals[i] = self._tree(seqs[i], last[b])
            else:
                chain.append(b)
        if chain:
            chain_rows = [rows[b] for b in chain]
            feature_chains(self.head, self.pool, seqs, chain_rows,
                           [min(num_draft_tokens[i], self.depth) for i in chain_rows], last[chain], proposals)
        for i in rows:
            seqs[i].proposer_state.cache.rollback(real[i])

    def _propose_one(self, seq: SeqState, num_draft_tokens: int) -> Proposal:
        """One sequence: catch-up and every chain step through ``head.extend``; a greedy chain
        in one call where the head has one (``head.greedy_chain``, the same tokens)."""
        step, features = self._catch_up(seq)
        cache = step.cache
        chain = min(num_draft_tokens, self.depth)
        if seq.params.greedy and not self._uses_tree(seq, num_draft_tokens):
            drafts = self.head.greedy_chain(cache, step.tokens, features, chain)
            if drafts is not None:
                return Proposal(drafts)
        last = self.head.extend(cache, step.tokens, features)  # [1, H]
        real = cache.length
        if self._uses_tree(seq, num_draft_tokens):
            proposal = self._tree(seq, last[0])
        else:
            proposal = Proposal()

            def advance(keep: list[int], live: list[int]) -> torch.Tensor:
                nonlocal last
                last = self.head.extend(cache, proposal.tokens[-1:], last)  # [1, H]
                return self.head.draft_logits(last)

            draft_chains([seq], [0], [chain], [proposal], self.head.draft_logits(last), advance)
        cache.rollback(real)
        return proposal

    def _tree(self, seq: SeqState, root: torch.Tensor) -> Proposal:
        cache = seq.proposer_state.cache
        real = cache.length
        width = max(c[-1] for c in self.choices) + 1
        has_children = {tuple(c[:-1]) for c in self.choices}
        top = {(): self.head.logits(root[None])[0].topk(width).indices.tolist()}
        token, cache_row, feature = {}, {}, {}
        for depth in range(1, self.depth + 1):
            level = [tuple(c) for c in self.choices if len(c) == depth]
            for node in level:
                token[node] = top[node[:-1]][node[-1]]
            expand = [node for node in level if node in has_children]
            if not expand:
                continue
            first = cache.length
            predicted = self._expand(cache, real, depth, expand, token, cache_row,
                                     torch.stack([root if depth == 1 else feature[node[:-1]] for node in expand]))
            logits = self.head.logits(predicted)  # [n, vocab]
            for r, node in enumerate(expand):
                cache_row[node] = first + r
                feature[node] = predicted[r]
                top[node] = logits[r].topk(width).indices.tolist()
        return tree_proposal(self.choices, token)

    def _expand(self, cache: SlotCache, real: int, depth: int, expand: list[tuple[int, ...]], token: dict,
                cache_row: dict, parents: torch.Tensor) -> torch.Tensor:
        """One EAGLE row per node of ``expand`` (all at ``depth``), each seeing the real rows and
        its ancestors' rows only → their predicted features ``[n, H]``."""
        visible = torch.zeros(len(expand), cache.length, dtype=torch.bool)
        visible[:, :real] = True
        for r, node in enumerate(expand):
            for d in range(1, depth):
                visible[r, cache_row[node[:d]]] = True
        step = StepInput(cache, [token[n] for n in expand], [real + depth - 1] * len(expand),
                         torch.eye(len(expand), dtype=torch.bool), visible)
        return self.head.forward(self.pool, [step], parents.unsqueeze(0))[0]


def build(spec: dict, ctx: BuildContext) -> EagleDrafter:
    head = ctx.models.eagle(ctx.path(spec["head_dir"]), ctx.target, ctx.dtype)
    return EagleDrafter(head, eagle_depth(spec), ctx.slots, ctx.max_rows, spec.get("choices"))
