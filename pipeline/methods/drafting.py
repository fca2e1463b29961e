"""What the memory estimate and the forecast ask a method: the head it drafts with, its draft plan
(how deep it drafts, how wide the target verifies) and the seconds one speculative step spends
drafting.

Reads and writes nothing. :class:`DraftPlan` is the plan a method's ``draft_plan`` hook returns;
the cost hooks (``Method.draft_seconds``) receive the forecast's step context (the device, the
target's cost, the draft model's, batch, context, tokens accepted per step), read here by
attribute only, so this package stays beneath the forecast. The helpers are the shapes the
methods share: a chain, a static tree, a head priced from its :class:`DraftHead`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DraftHead:
    """The drafting head a method adds to the target's engine, counted once for memory and forecast.

    ``copies`` is how many times the engine holds it: upstream's EAGLE-1 engine is
    ``num_eagle_layers`` EagleNets, each its own drafter (embedding, fc, decoder layer) and
    ``lm_head``, and its checkpoint conversion copies the head's weights into every one of them
    (NVIDIA/TensorRT-LLM ``tensorrt_llm/models/eagle/model.py`` ``EagleForCausalLM``,
    ``examples/eagle/convert_checkpoint.py`` ``eagle_nets.{idx}`` with ``preprocess=copy``).
    """

    name: str  # the memory estimate's row
    detail: str  # how that row is counted
    copies: int  # copies the engine holds (EAGLE-1: one per level; Medusa: one per head)
    fc_inputs: int  # the fc's input width in hidden sizes (Medusa's ResBlock: 1)
    fc_bias: bool
    decoder_layers: int  # decoder layers per copy
    embedding: bool = False  # its own token embedding per copy (a lookup: resident, never multiplied)
    kv_name: str | None = None  # the KV cache its decoder layer keeps (None: no decoder layer)

    def forward_params(self, hidden: int, vocab: int, layer: int) -> int:
        """Weights one copy multiplies per token: fc, decoder layers, lm_head (``layer``: one decoder layer's)."""
        return self.fc_inputs * hidden * hidden + (hidden if self.fc_bias else 0) + self.decoder_layers * layer + vocab * hidden

    def resident_params(self, hidden: int, vocab: int, layer: int) -> int:
        """Weights the engine holds for the head: every copy, its embedding included."""
        return self.copies * (self.forward_params(hidden, vocab, layer) + (vocab * hidden if self.embedding else 0))


@dataclass(frozen=True)
class DraftPlan:
    method: str
    depth: int  # K: drafts along one path
    verify_width: int  # tokens per sequence in the target's verify forward (root + drafted nodes)
    tree: bool = False
    level_widths: tuple[int, ...] = ()  # nodes per tree level (EAGLE-1 drafts level by level)
    orchestration: str | None = None
    params: dict = field(default_factory=dict)

    def with_depth(self, k: int) -> DraftPlan:
        """The same chain plan at draft length ``k`` (the K sweep; trees keep their shape)."""
        if self.tree:
            return self
        return DraftPlan(self.method, k, k + 1, False, (), self.orchestration, self.params)


def chain_plan(method: str, k: int, spec: Any) -> DraftPlan:
    """K drafts in a row, verified as K + 1 tokens."""
    return DraftPlan(method, k, k + 1, orchestration=getattr(spec, "orchestration", None))


def tree_plan(method: str, spec: Any) -> DraftPlan:
    """A static tree (Medusa, EAGLE-1): depth, node count and nodes per level of ``spec.tree``."""
    tree = spec.tree
    depth = max(len(path) for path in tree)
    widths = tuple(sum(1 for path in tree if len(path) == level) for level in range(1, depth + 1))
    return DraftPlan(method, depth, len(tree) + 1, tree=len(tree) > depth, level_widths=widths,
                     params={"num_heads": getattr(spec, "num_heads", None), "num_layers": getattr(spec, "num_layers", None)})


def target_layer_params(ctx: Any) -> float:
    """One decoder layer's weights, from the target's cost (its FLOPs per token less the LM head)."""
    t = ctx.target
    return (t.flops_per_token * t.tp / 2 - ctx.vocab * t.hidden) / max(t.layers, 1)


def head_cost(ctx: Any, head: DraftHead, name: str) -> Any:
    """The cost of one forward of one copy of ``head`` on the target's shapes (a ModelCost)."""
    params = head.forward_params(ctx.target.hidden, ctx.vocab, target_layer_params(ctx) if head.decoder_layers else 0)
    return ctx.target.scaled(name, head.decoder_layers, params, ctx.dense_bytes)
