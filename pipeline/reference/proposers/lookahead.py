"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", arXiv 2402.02057): no draft model. Each step carries two branches in the
target's one forward pass:

- the *lookahead branch* — a Jacobi window of ``W`` columns over ``N − 1`` levels, each column a
  trajectory of guesses for consecutive future positions. The target's argmax at the top of every
  column is one more Jacobi iteration: it becomes the newest level, the oldest level is dropped,
  and each column plus its new token is an n-gram for the pool;
- the *verification branch* — up to ``G`` pooled n-grams that start with the last token, as
  draft chains after it.

Parameters are named as upstream's ``LookaheadDecodingConfig`` (TensorRT-LLM
``tensorrt_llm/llmapi/llm_args.py``, ``cpp/tensorrt_llm/executor/decodingConfig.cpp``):
``max_window_size`` (W), ``max_ngram_size`` (N), ``max_verification_set_size`` (G), the same
legality rules and defaults (4, 3, 4) and the same capacity, ``max_draft_len =
(N − 2) + (W − 1 + G)·(N − 1)`` (``calculateSpeculativeResourceTuple``): the window's first
column starts at the pending token itself, so it has ``N − 2`` rows of its own.

Faithful to upstream (TensorRT-LLM ``cpp/tensorrt_llm/layers/lookaheadAlgorithm.cpp`` and
``lookaheadPoolManager.cpp``, read not copied):

- one forward: the window and the guesses are one draft tree. Column ``i`` (guesses for the
  positions ``pending + i …``) hangs off the first token of column ``i − 1`` (upstream derives
  the same tree from position ids, ``posIdsToMask``), each guess hangs off the pending token;
  equal prefixes are merged (``treeEncode``). Every node sees exactly its ancestors, so any path
  is a real continuation and the verifier may accept window nodes too, as upstream's does;
- the pool: key token → the most recent ``G`` distinct continuations, a re-inserted one moving
  to the newest end; it starts with every n-gram of the prompt; the guesses are the newest ``G``;
- warm-up: only the oldest level starts filled (tokens drawn from the prompt with a seeded
  generator), one level is added per step until the window has ``N − 1`` levels, and n-grams are
  collected from then on.

Simplified, and why:

- the new level is the target's *argmax* at the column tops, also for sampled requests
  (upstream takes the sampled golden tokens there); the window only steers which drafts are
  offered, so this keeps the request's random stream for verification alone;
- a step whose draft budget cannot hold the whole window (the last tokens of a request, or a
  request asking for fewer drafts) carries only the guesses, cut to that depth, and leaves the
  window as it is;
- the warm-up draws its prompt tokens from ``random.Random(seed)`` (the request's seed, else 0).

Lossless: every node is a deterministic draft, fixed before the step's random draws. Greedy
requests follow the target's argmax down the tree (:func:`~pipeline.reference.verify.verify_greedy_tree`);
sampled ones are verified node by node with one-hot draft distributions
(:func:`~pipeline.reference.verify.verify_sampled_tree`: each child accepted with min(1, p/q),
q = 1, under the residual norm(max(0, p − q)) its rejected elder siblings left; then the
residual or the bonus token). Implements the :class:`~pipeline.reference.proposers.base.Proposer`
protocol plus ``observe`` (the step's target logits), registered as ``lookahead`` in
:data:`pipeline.reference.proposers.BUILDERS`. Reads and writes nothing on disk.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from pipeline.reference.draft_len import (
    DEFAULT_NGRAM,
    DEFAULT_VERIFICATION_SET,
    DEFAULT_WINDOW,
    check_lookahead_sizes,
    lookahead_max_draft_len,
)
from pipeline.reference.proposers.base import BuildContext, Proposal
from pipeline.reference.sequence import SeqState


class NgramPool:
    """key token → its newest ``capacity`` distinct continuations (``N − 1`` tokens), oldest first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.entries: dict[int, list[tuple[int, ...]]] = {}

    def add(self, ngram: list[int] | tuple[int, ...]) -> None:
        if self.capacity == 0 or len(ngram) < 2:
            return
        continuations = self.entries.setdefault(ngram[0], [])
        rest = tuple(ngram[1:])
        if rest in continuations:
            continuations.remove(rest)
        elif len(continuations) >= self.capacity:
            continuations.pop(0)
        continuations.append(rest)

    def add_all(self, tokens: list[int], n: int) -> None:
        for at in range(len(tokens) - n + 1):
            self.add(tokens[at : at + n])

    def guesses(self, key: int) -> list[tuple[int, ...]]:
        return list(self.entries.get(key, ()))


@dataclass
class _LookaheadState:
    pool: NgramPool
    levels: list[list[int]]  # the Jacobi window: levels[l][i], oldest level first (l = 0 … N − 2)
    tops: list[int] = field(default_factory=list)  # step rows of the column tops (row 0 = pending); [] = no window


class _TreeBuilder:
    """Draft tree nodes with equal prefixes merged: (parent row, token) → row."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self._row: dict[tuple[int, int], int] = {}

    def add(self, parent: int, token: int) -> int:
        row = self._row.get((parent, token))
        if row is None:
            self.tokens.append(token)
            self.parents.append(parent)
            row = self._row[(parent, token)] = len(self.tokens)
        return row

    def add_chain(self, parent: int, tokens) -> int:
        for token in tokens:
            parent = self.add(parent, token)
        return parent


class LookaheadDrafter:
    """Jacobi window + n-gram pool drafting (see the module docstring)."""

    def __init__(self, max_window_size: int = DEFAULT_WINDOW, max_ngram_size: int = DEFAULT_NGRAM,
                 max_verification_set_size: int = DEFAULT_VERIFICATION_SET):
        check_lookahead_sizes(max_window_size, max_ngram_size, max_verification_set_size)
        self.window = max_window_size
        self.ngram = max_ngram_size
        self.verification_set = max_verification_set_size
        self.max_draft_len = lookahead_max_draft_len(max_window_size, max_ngram_size, max_verification_set_size)

    @classmethod
    def from_spec(cls, spec: dict) -> "LookaheadDrafter":
        """From an engine.json ``proposer`` entry (``{"method": "lookahead", "max_window_size": …}``)."""
        return cls(int(spec.get("max_window_size", DEFAULT_WINDOW)), int(spec.get("max_ngram_size", DEFAULT_NGRAM)),
                   int(spec.get("max_verification_set_size", DEFAULT_VERIFICATION_SET)))

    @property
    def window_depth(self) -> int:
        """The deepest window node: column W − 1 starts at depth W − 1 and is N − 1 levels high."""
        return self.window - 1 + self.ngram - 2

    def reusable_prefix(self, prompt_len: int) -> int:
        return prompt_len - 1  # needs no target hidden states: the prefix cache works as for the baseline

    def start(self, seq: SeqState, hidden: torch.Tensor | None) -> None:
        prompt = seq.tokens
        pool = NgramPool(self.verification_set)
        pool.add_all(prompt, self.ngram)
        rng = random.Random(seq.params.seed or 0)
        oldest = [rng.choice(prompt) for _ in range(self.window)] if self.ngram > 1 else []
        seq.proposer_state = _LookaheadState(pool, [oldest] if oldest else [])

    def accept(self, seq: SeqState, hidden: torch.Tensor) -> None:
        pass  # the window learns from observe(); accepted tokens need nothing more

    def release(self, seq: SeqState) -> None:
        seq.proposer_state = None

    def propose(self, seqs: list[SeqState], num_draft_tokens: list[int]) -> list[Proposal]:
        return [self._propose_one(seq, k) if k > 0 and self.ngram > 1 else Proposal()
                for seq, k in zip(seqs, num_draft_tokens)]

    def _propose_one(self, seq: SeqState, depth: int) -> Proposal:
        """The window's columns (when ``depth`` holds them) and the guesses cut to ``depth``."""
        state = seq.proposer_state
        tree = _TreeBuilder()
        state.tops = self._window(tree, state.levels) if depth >= self.window_depth else []
        for guess in state.pool.guesses(seq.tokens[-1]):
            tree.add_chain(0, guess[:depth])
        if not tree.tokens:
            return Proposal()
        return Proposal(tree.tokens, tree.parents, None)  # draft_probs None: deterministic (one-hot) drafts

    def _window(self, tree: _TreeBuilder, levels: list[list[int]]) -> list[int]:
        """Column i = levels[0][i], levels[1][i], … at the positions pending + i, + i + 1, …;
        column 0's first token is the pending token itself (row 0). Returns each column's top row."""
        tops, first = [], 0
        for i in range(self.window):
            column = [level[i] for level in levels]
            if i == 0:
                top = tree.add_chain(0, column[1:])
            else:
                first = tree.add(first, column[0])
                top = tree.add_chain(first, column[1:])
            tops.append(top)
        return tops

    def observe(self, seq: SeqState, prop: Proposal, logits: torch.Tensor) -> None:
        """``logits [1 + len(prop.tokens), vocab]``: the step's target logits (row 0 = pending).
        The argmax at the column tops is one Jacobi iteration: the newest level; a full window
        hands its columns + that token to the pool as n-grams and drops its oldest level."""
        state = seq.proposer_state
        if not state.tops:
            return
        newest = logits[state.tops].argmax(-1).tolist()  # [W]
        if len(state.levels) == self.ngram - 1:
            for i, token in enumerate(newest):
                key = seq.tokens[-1] if i == 0 else state.levels[0][i]  # column 0 starts at the pending token
                state.pool.add([key] + [level[i] for level in state.levels[1:]] + [token])
            state.levels = state.levels[1:]
        state.levels.append(newest)
        state.tops = []


def build(spec: dict, ctx: BuildContext) -> LookaheadDrafter:
    """No checkpoint to load: the proposer is its three sizes (``ctx`` unused)."""
    return LookaheadDrafter.from_spec(spec)
