"""Proposers: who drafts tokens for the target to verify. One protocol for the three methods:

- :class:`DraftModelProposer` — a smaller Llama with its own KV pool (draft-target); a lone
  sequence drafts through :meth:`LlamaModel.draft_logits` (fused weight copies, one row at a time),
  a greedy chain in one TorchScript call (:meth:`LlamaModel.greedy_chain`);
- :class:`MedusaProposer` — Medusa heads on the target's last final hidden state (no extra
  forward); a chain of top-1 (or sampled) tokens per head by default, or a static tree from
  ``choices`` (upstream semantics: a choice is a path of top-k indices, [0, 1] = 2nd best at
  depth 2 under the best at depth 1);
- :class:`EagleProposer` — the EAGLE-1 head on the target's features, one decoder layer per
  draft step over its own KV pool (a chain by default; a static tree from ``choices``). A lone
  sequence drafts through the lean :meth:`EagleHead.extend` path (batch 1 is where per-op
  overhead dominates), a greedy chain in one TorchScript call (:meth:`EagleHead.greedy_chain`);
  several sequences share batched forwards.

Trees are for greedy requests only; a sampled request gets the chain (lossless rejection sampling
needs the distribution each draft came from; multi-draft SpecInfer-style tree sampling is not
implemented). Every
proposer works on a batch of sequences with per-sequence draft counts, and rolls its own caches
back in :meth:`Proposer.accept` to what the target accepted. Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from pipeline.reference.kv_cache import SlotCache, common_prefix_length
from pipeline.reference.modeling import EagleHead, LlamaModel, MedusaHeads, StepInput
from pipeline.reference.sampling import choose

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.reference.scheduler import SeqState


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)  # chain order, or tree nodes (parents first)
    parents: list[int] | None = None  # tree: parent row per node (0 = the pending token); None = chain
    draft_probs: torch.Tensor | None = None  # [K, vocab] the drafts' distributions; None = greedy

    @property
    def depth(self) -> int:
        if self.parents is None:
            return len(self.tokens)
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent] + 1)
        return max(depths)


class Proposer(Protocol):
    max_draft_len: int  # the most draft tokens one step may carry (tree: node count)
    prefix_reuse: bool  # False: needs target features of every prompt position (no reuse)
    uses_features: bool  # wants ``seq.features`` (target hidden states of new positions)

    def start(self, seq: "SeqState") -> None: ...

    def propose(self, seqs: list["SeqState"], ks: list[int]) -> list[Proposal]: ...

    def accept(self, seq: "SeqState") -> None: ...

    def release(self, seq: "SeqState") -> None: ...


def _stack_probs(rows: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if not rows or rows[0] is None else torch.stack(rows)


# ----------------------------------------------------------------------------------------------


LEAN_DRAFT_ROWS = 2  # a verify round leaves at most 2 tokens to catch up (last draft + bonus)


@dataclass
class _DraftState:
    cache: SlotCache
    cached_tokens: list[int] = field(default_factory=list)  # the token each cache row encodes


class DraftModelProposer:
    prefix_reuse = True
    uses_features = False

    def __init__(self, model: LlamaModel, num_draft_tokens: int, slots: int, max_rows: int):
        self.model = model
        model.use_lean_decode()
        self.max_draft_len = num_draft_tokens
        self.pool = model.new_pool(slots, max_rows)

    def start(self, seq: "SeqState") -> None:
        seq.proposer_state = _DraftState(self.pool.allocate())

    def release(self, seq: "SeqState") -> None:
        if seq.proposer_state is not None:
            self.pool.release(seq.proposer_state.cache)
            seq.proposer_state = None

    def propose(self, seqs: list["SeqState"], ks: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, k in enumerate(ks) if k > 0]
        probs: dict[int, list] = {i: [] for i in rows}
        feed: dict[int, list[int]] = {}
        for i in rows:  # catch-up: every token not yet in the draft cache, pending one included
            state = seqs[i].proposer_state
            feed[i] = seqs[i].tokens[state.cache.length :]
        if len(rows) == 1 and self._chains(seqs[rows[0]], feed[rows[0]]):
            i = rows[0]
            drafts = self.model.greedy_chain(seqs[i].proposer_state.cache, feed[i], ks[i])
            seqs[i].proposer_state.cached_tokens.extend(feed[i] + drafts[:-1])
            proposals[i] = Proposal(drafts)
            return proposals
        step = 0
        while rows:
            logits = self._draft_logits(seqs, rows, feed)  # [B, vocab]
            for b, i in enumerate(rows):
                token, dist = choose(logits[b], seqs[i].params, seqs[i].generator)
                proposals[i].tokens.append(token)
                probs[i].append(dist)
                feed[i] = [token]
            step += 1
            rows = [i for i in rows if ks[i] > step]
        for i, rows_probs in probs.items():
            proposals[i].draft_probs = _stack_probs(rows_probs)
        return proposals

    def _chains(self, seq: "SeqState", feed: list[int]) -> bool:
        """A lone greedy sequence with a short catch-up drafts its whole chain in one scripted
        call (:meth:`LlamaModel.greedy_chain`: the tokens step-by-step drafting gives)."""
        return seq.params.greedy and len(feed) <= LEAN_DRAFT_ROWS and self.model.lean is not None

    def _draft_logits(self, seqs: list["SeqState"], rows: list[int], feed: dict[int, list[int]]) -> torch.Tensor:
        """Append each row's ``feed`` to its draft cache → next-token logits ``[B, vocab]``. A lone
        sequence with at most :data:`LEAN_DRAFT_ROWS` new tokens takes the lean one-row path
        (:meth:`LlamaModel.draft_logits`; batch 1 is where per-op overhead dominates); a prompt's
        catch-up and several sequences share one ragged forward."""
        for i in rows:
            seqs[i].proposer_state.cached_tokens.extend(feed[i])
        if len(rows) == 1 and len(feed[rows[0]]) <= LEAN_DRAFT_ROWS:
            return self.model.draft_logits(seqs[rows[0]].proposer_state.cache, feed[rows[0]])
        inputs = []
        for i in rows:
            start = seqs[i].proposer_state.cache.length
            inputs.append(StepInput(seqs[i].proposer_state.cache, feed[i], list(range(start, start + len(feed[i])))))
        hidden = self.model.forward(self.pool, inputs)  # [B, T, H]
        return self.model.logits(torch.stack([hidden[b, len(feed[i]) - 1] for b, i in enumerate(rows)]))

    def accept(self, seq: "SeqState") -> None:
        state = seq.proposer_state
        keep = common_prefix_length(tuple(state.cached_tokens), tuple(seq.tokens))
        state.cache.rollback(min(keep, state.cache.length))
        del state.cached_tokens[state.cache.length :]


# ----------------------------------------------------------------------------------------------


def sort_choices(choices: list[list[int]]) -> list[list[int]]:
    """Parents before children (by depth, then lexicographically), duplicates removed."""
    unique = {tuple(c) for c in choices if c}
    return [list(c) for c in sorted(unique, key=lambda c: (len(c), c))]


def validate_choices(choices: list[list[int]], max_depth: int) -> None:
    present = {tuple(c) for c in choices}
    for c in choices:
        if len(c) > max_depth:
            raise ValueError(f"choice {c} is deeper than the {max_depth} draft heads/layers")
        if len(c) > 1 and tuple(c[:-1]) not in present:
            raise ValueError(f"choice {c} has no parent {c[:-1]} in the tree")


class MedusaProposer:
    prefix_reuse = True  # one prompt token is always prefilled, for its hidden state
    uses_features = False

    def __init__(self, heads: MedusaHeads, num_heads: int, choices: list[list[int]] | None):
        self.heads = heads
        self.num_heads = min(num_heads, heads.num_heads)
        self.choices = sort_choices(choices) if choices else None
        if self.choices:
            validate_choices(self.choices, self.num_heads)
        self.max_draft_len = len(self.choices) if self.choices else self.num_heads

    def start(self, seq: "SeqState") -> None:
        seq.proposer_state = None

    def release(self, seq: "SeqState") -> None:
        seq.proposer_state = None

    def accept(self, seq: "SeqState") -> None:
        pass

    def propose(self, seqs: list["SeqState"], ks: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, k in enumerate(ks) if k > 0 and seqs[i].last_hidden is not None]
        if not rows:
            return proposals
        logits = self.heads.logits(torch.stack([seqs[i].last_hidden for i in rows]))  # [B, heads, vocab]
        for b, i in enumerate(rows):
            seq = seqs[i]
            if self.choices and seq.params.greedy and ks[i] >= len(self.choices):
                proposals[i] = self._tree(logits[b])
            else:
                proposals[i] = self._chain(logits[b], min(ks[i], self.num_heads), seq)
        return proposals

    def _chain(self, head_logits: torch.Tensor, k: int, seq: "SeqState") -> Proposal:
        tokens, dists = [], []
        for d in range(k):
            token, dist = choose(head_logits[d], seq.params, seq.generator)
            tokens.append(token)
            dists.append(dist)
        return Proposal(tokens, None, _stack_probs(dists))

    def _tree(self, head_logits: torch.Tensor) -> Proposal:
        width = max(c[-1] for c in self.choices) + 1
        top = head_logits[: self.num_heads].topk(width, -1).indices.tolist()  # [heads, width]
        row_of = {(): 0}
        tokens, parents = [], []
        for c in self.choices:
            tokens.append(top[len(c) - 1][c[-1]])
            parents.append(row_of[tuple(c[:-1])])
            row_of[tuple(c)] = len(tokens)
        return Proposal(tokens, parents, None)


# ----------------------------------------------------------------------------------------------


@dataclass
class _EagleState:
    cache: SlotCache  # rows [0, real) hold pairs (f_j, x_{j+1}) with real target features


class EagleProposer:
    """EAGLE-1 drafting. Chain: one EAGLE-layer step per draft token, batched over sequences.
    Tree (greedy requests, ``choices`` given): depth by depth, each expanded node is one new
    EAGLE row whose attention sees the real rows and its own ancestors' speculative rows only;
    children are the top-k tokens of its predicted feature (upstream ``choices`` semantics)."""

    prefix_reuse = False  # the EAGLE layer's KV is not in the prefix cache
    uses_features = True

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

    def start(self, seq: "SeqState") -> None:
        seq.proposer_state = _EagleState(self.pool.allocate())

    def release(self, seq: "SeqState") -> None:
        if seq.proposer_state is not None:
            self.pool.release(seq.proposer_state.cache)
            seq.proposer_state = None

    def accept(self, seq: "SeqState") -> None:
        pass  # speculative rows were already dropped at the end of propose()

    def _uses_tree(self, seq: "SeqState", k: int) -> bool:
        return self.choices is not None and seq.params.greedy and k >= len(self.choices)

    def propose(self, seqs: list["SeqState"], ks: list[int]) -> list[Proposal]:
        proposals = [Proposal() for _ in seqs]
        rows = [i for i, k in enumerate(ks) if k > 0 and seqs[i].features is not None]
        if not rows:
            return proposals
        if len(rows) == 1:  # one sequence: the lean path (no masks, attention for the last row only)
            i = rows[0]
            proposals[i] = self._propose_one(seqs[i], ks[i])
            return proposals
        feats, inputs, real = [], [], {}
        for i in rows:  # catch-up: pairs (f_j, x_{j+1}) for every new real feature
            seq, cache = seqs[i], seqs[i].proposer_state.cache
            start = cache.length
            n = seq.features.shape[0]
            inputs.append(StepInput(cache, seq.tokens[start + 1 : start + 1 + n], list(range(start, start + n))))
            feats.append(seq.features)
            real[i] = start + n
            seq.features = None
        width = max(f.shape[0] for f in feats)
        padded = torch.stack([torch.nn.functional.pad(f, (0, 0, 0, width - f.shape[0])) for f in feats])
        hidden = self.head.forward(self.pool, inputs, padded)  # [B, T, H]
        last = torch.stack([hidden[b, len(x.tokens) - 1] for b, x in enumerate(inputs)])  # [B, H]
        chain = []
        for b, i in enumerate(rows):
            if self._uses_tree(seqs[i], ks[i]):
                proposals[i] = self._tree(seqs[i], last[b])
            else:
                chain.append(b)
        if chain:
            self._chains(seqs, ks, [rows[b] for b in chain], last[chain], proposals)
        for i in rows:
            seqs[i].proposer_state.cache.rollback(real[i])
        return proposals

    def _propose_one(self, seq: "SeqState", k: int) -> Proposal:
        """One sequence: catch-up and every chain step through :meth:`EagleHead.extend` — a greedy
        chain in one scripted call (:meth:`EagleHead.greedy_chain`), same tokens."""
        cache = seq.proposer_state.cache
        start, n = cache.length, seq.features.shape[0]
        pairs = seq.tokens[start + 1 : start + 1 + n]
        if seq.params.greedy and not self._uses_tree(seq, k):
            drafts = self.head.greedy_chain(cache, pairs, seq.features, min(k, self.depth))
            if drafts is not None:
                seq.features = None
                return Proposal(drafts)
        last = self.head.extend(cache, pairs, seq.features)  # [1, H]
        seq.features = None
        real = cache.length
        if self._uses_tree(seq, k):
            proposal = self._tree(seq, last[0])
        else:
            tokens, dists = [], []
            for step in range(min(k, self.depth)):
                if step:
                    last = self.head.extend(cache, tokens[-1:], last)
                token, dist = choose(self.head.draft_logits(last)[0], seq.params, seq.generator)
                tokens.append(token)
                dists.append(dist)
            proposal = Proposal(tokens, None, _stack_probs(dists))
        cache.rollback(real)
        return proposal

    def _chains(self, seqs, ks, rows: list[int], last: torch.Tensor, proposals: list[Proposal]) -> None:
        probs: dict[int, list] = {i: [] for i in rows}
        step = 0
        while True:
            logits = self.head.logits(last)  # [B, vocab]
            for b, i in enumerate(rows):
                token, dist = choose(logits[b], seqs[i].params, seqs[i].generator)
                proposals[i].tokens.append(token)
                probs[i].append(dist)
            step += 1
            keep = [b for b, i in enumerate(rows) if min(ks[i], self.depth) > step]
            if not keep:
                break
            last = last[keep]
            rows = [rows[b] for b in keep]
            inputs = []
            for i in rows:
                cache = seqs[i].proposer_state.cache
                inputs.append(StepInput(cache, [proposals[i].tokens[-1]], [cache.length]))
            last = self.head.forward(self.pool, inputs, last.unsqueeze(1))[:, 0]
        for i, rows_probs in probs.items():
            proposals[i].draft_probs = _stack_probs(rows_probs)

    def _tree(self, seq: "SeqState", root: torch.Tensor) -> Proposal:
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
            visible = torch.zeros(len(expand), cache.length, dtype=torch.bool)
            visible[:, :real] = True
            for r, node in enumerate(expand):
                for d in range(1, depth):
                    visible[r, cache_row[node[:d]]] = True
            parents = torch.stack([root if depth == 1 else feature[node[:-1]] for node in expand])
            first = cache.length
            step = StepInput(cache, [token[n] for n in expand], [real + depth - 1] * len(expand),
                             torch.eye(len(expand), dtype=torch.bool), visible)
            predicted = self.head.forward(self.pool, [step], parents.unsqueeze(0))[0]  # [n, H]
            logits = self.head.logits(predicted)  # [n, vocab]
            for r, node in enumerate(expand):
                cache_row[node] = first + r
                feature[node] = predicted[r]
                top[node] = logits[r].topk(width).indices.tolist()
        row_of = {(): 0}
        tokens, parents_rows = [], []
        for c in self.choices:
            node = tuple(c)
            tokens.append(token[node])
            parents_rows.append(row_of[node[:-1]])
            row_of[node] = len(tokens)
        return Proposal(tokens, parents_rows, None)
