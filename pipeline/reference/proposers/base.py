"""The one batched protocol every proposer implements, and what a proposer hands the scheduler.

A proposer drafts tokens for the target to verify, for a batch of sequences with a per-sequence
draft budget (``num_draft_tokens``, see :mod:`pipeline.reference.draft_len`). It owns its
per-sequence state (``seq.proposer_state``: a draft KV cache, target hidden states not consumed
yet...) and is told, through :meth:`Proposer.start` and :meth:`Proposer.accept`, the target's
final hidden states of the positions that became part of the sequence, so it never reads the
scheduler's internals. Reads and writes nothing on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from pipeline.reference.modeling import LlamaModel, ModelTypes, StepInput
from pipeline.reference.sampling import choose
from pipeline.reference.sequence import SeqState


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of every step row (row 0 = the pending token, depth 0; node i is row i+1)."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return depths


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)  # chain order, or tree nodes (parents first)
    parents: list[int] | None = None  # tree: parent row per node (0 = the pending token); None = chain
    draft_probs: torch.Tensor | None = None  # [K, vocab] the drafts' distributions; None = greedy

    @property
    def depth(self) -> int:
        """Drafts along the longest path (a chain: all of them)."""
        return len(self.tokens) if self.parents is None else max(tree_depths(self.parents))


class Proposer(Protocol):
    max_draft_len: int  # the most draft tokens one step may carry (tree: its node count)

    def reusable_prefix(self, prompt_len: int) -> int:
        """How many prompt tokens may come from the prefix cache; the rest but the pending token
        is prefilled, and their hidden states go to :meth:`start`."""

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        """A sequence joins; ``hidden [n, H]``: the target's final hidden states of the prefilled
        prompt positions (None when nothing was prefilled)."""

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        """Up to ``num_draft_tokens[i]`` drafts for ``seqs[i]`` (0: an empty Proposal)."""

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        """After a verify step: ``seq.tokens`` holds the accepted tokens and the next one;
        ``hidden [a+1, H]`` the target's final hidden states of the step rows now part of it
        (the pending token and the accepted drafts). Roll the proposer's caches back to that."""

    def release(self, seq: SeqState) -> None:
        """The sequence left: free what :meth:`start` took."""


# Optional: ``observe(seq, proposal, logits)`` — ``logits [1 + len(proposal.tokens), vocab]``,
# the target's logits of every step row, handed over before verification (the lookahead
# proposer's Jacobi window learns from the rows that are never accepted too).


def stack_probs(rows: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if not rows or rows[0] is None else torch.stack(rows)


def draft_chains(seqs: list[SeqState], rows: list[int], lengths: list[int], proposals: list[Proposal],
                 logits: torch.Tensor, advance: Callable[[list[int], list[int]], torch.Tensor]) -> None:
    """The draft-chain loop of every head-based proposer (EAGLE, EAGLE-3, Medusa): ``seqs[rows[b]]``
    drafts ``lengths[b]`` tokens into ``proposals[rows[b]]``, batched step by step. ``logits
    [len(rows), vocab]`` are the first step's; at each step every live row takes a token with
    :func:`~pipeline.reference.sampling.choose` (argmax, or a draw from its own generator and the
    distribution it came from), and rows with tokens still to draft go on: ``advance(keep,
    live)`` gets their positions in the step just drafted and their ``seqs`` indices (the new
    token is ``proposals[i].tokens[-1]``) and returns the next step's logits ``[len(keep), vocab]``.
    Sets each proposal's ``draft_probs`` (None when greedy)."""
    probs: list[list[torch.Tensor | None]] = [[] for _ in rows]
    live = list(range(len(rows)))  # positions in rows of the sequences still drafting
    step = 0
    while True:
        for j, b in enumerate(live):
            seq = seqs[rows[b]]
            token, dist = choose(logits[j], seq.params, seq.generator)
            proposals[rows[b]].tokens.append(token)
            probs[b].append(dist)
        step += 1
        keep = [j for j, b in enumerate(live) if lengths[b] > step]
        if not keep:
            break
        live = [live[j] for j in keep]
        logits = advance(keep, [rows[b] for b in live])
    for b, i in enumerate(rows):
        proposals[i].draft_probs = stack_probs(probs[b])


def feature_chains(head, pool, seqs: list[SeqState], rows: list[int], lengths: list[int], last: torch.Tensor,
                   proposals: list[Proposal]) -> None:
    """:func:`draft_chains` for a head that drafts from its own predicted feature (EAGLE, EAGLE-3):
    ``last [len(rows), H]`` is each row's feature after its real tokens; a step is
    ``head.logits(feature)``, then one ``head.forward`` row per live sequence over its draft KV
    cache (``seqs[i].proposer_state.cache``), fed the token just drafted and the feature it came from."""

    def advance(keep: list[int], live: list[int]) -> torch.Tensor:
        nonlocal last
        last = last[keep]
        inputs = [StepInput(seqs[i].proposer_state.cache, [proposals[i].tokens[-1]],
                            [seqs[i].proposer_state.cache.length]) for i in live]
        last = head.forward(pool, inputs, last.unsqueeze(1))[:, 0]  # [len(live), H]
        return head.logits(last)

    draft_chains(seqs, rows, lengths, proposals, head.logits(last), advance)


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


def tree_proposal(choices: list[list[int]], token: dict[tuple[int, ...], int]) -> Proposal:
    """The tree of sorted ``choices`` (upstream semantics: a choice is a path of top-k indices,
    [0, 1] = 2nd best at depth 2 under the best at depth 1) with ``token[path]`` per node."""
    row_of: dict[tuple[int, ...], int] = {(): 0}
    tokens, parents = [], []
    for c in choices:
        node = tuple(c)
        tokens.append(token[node])
        parents.append(row_of[node[:-1]])
        row_of[node] = len(tokens)
    return Proposal(tokens, parents, None)


@dataclass(frozen=True)
class BuildContext:
    """What a proposer's ``build(spec, ctx)`` gets from the engine: the target, the model
    classes to load drafts with (plain or fast, :class:`~pipeline.reference.modeling.ModelTypes`),
    the compute dtype, how many sequences and KV rows its own caches need, and the directory
    relative paths in ``spec`` are resolved against."""

    target: LlamaModel
    models: ModelTypes
    dtype: torch.dtype
    slots: int
    max_rows: int
    base: Path

    def path(self, value: str) -> Path:
        path = Path(value)
        return path if path.is_absolute() else (self.base / path)
