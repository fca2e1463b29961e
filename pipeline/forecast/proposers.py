"""Per-method drafting cost and verify width: a registry (dict of functions), not branches.

Reads nothing, writes nothing. :data:`PLANS` turns a config's ``speculation`` section into a
:class:`DraftPlan` (draft depth K, tokens per sequence in the verify forward, chain or tree);
:data:`PROPOSER_COSTS` gives the seconds one speculative step spends drafting for B sequences.
Each entry is one method; when ``pipeline/methods/`` gives every method its own module these
functions move there unchanged (the registry's keys are the config's ``speculation.method``).

- draft-target: K sequential forwards of the draft model over B rows (the first one also
  consumes the tokens accepted last step), each a step of its own; the BLS orchestration adds a
  model round trip per step;
- Medusa: the heads (``num_heads × (H² + H + V·H)``) over B rows inside the target's step;
- EAGLE-1: the head (fc 2H→H, one decoder layer, LM head) once per tree level over that level's
  nodes; EAGLE-3: fc 3H→H + one layer + LM head, K sequential chain steps; MTP alike;
- n-gram: a host-side lookup, free against a forward; lookahead: no proposer, a wider verify
  (lookahead and verification branches ride in the target's forward).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.forecast.roofline import ModelCost


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


@dataclass
class StepContext:
    """What a proposer's cost depends on: the device, the target's cost, the draft's (draft-target),
    batch, context and the tokens accepted per step (the draft model re-reads them)."""

    device: object
    target: ModelCost
    draft: ModelCost | None
    dense_bytes: float
    vocab: int
    batch: int
    context: int
    tokens_per_step: float


def _chain(method: str, k: int, spec) -> DraftPlan:
    return DraftPlan(method, k, k + 1, orchestration=getattr(spec, "orchestration", None))


def _tree_plan(method: str, spec) -> DraftPlan:
    tree = spec.tree
    depth = max(len(path) for path in tree)
    widths = tuple(sum(1 for path in tree if len(path) == level) for level in range(1, depth + 1))
    return DraftPlan(method, depth, len(tree) + 1, tree=len(tree) > depth, level_widths=widths,
                     params={"num_heads": getattr(spec, "num_heads", None), "num_layers": getattr(spec, "num_layers", None)})


def _lookahead_plan(spec) -> DraftPlan:
    """Upstream's LookaheadDecodingConfig names: window W, n-gram N, verification set G."""
    w, n, g = spec.max_window_size, spec.max_ngram_size, spec.max_verification_set_size
    return DraftPlan("lookahead", n - 1, (w + g) * (n - 1) + 1, params={"W": w, "N": n, "G": g})


PLANS: dict[str, Callable[[object], DraftPlan]] = {
    "draft_target": lambda s: _chain("draft_target", s.num_draft_tokens, s),
    "ngram": lambda s: _chain("ngram", s.max_draft_len, s),
    "eagle3": lambda s: _chain("eagle3", s.max_draft_len, s),
    "mtp": lambda s: _chain("mtp", s.num_nextn_predict_layers, s),
    "medusa": lambda s: _tree_plan("medusa", s),
    "eagle": lambda s: _tree_plan("eagle", s),
    "lookahead": _lookahead_plan,
}


def _draft_target(ctx: StepContext, plan: DraftPlan) -> float:
    if ctx.draft is None:
        raise ValueError("draft-target needs the draft model's shapes")
    catch_up = max(1, round(ctx.tokens_per_step))
    first = ctx.device.forward(ctx.draft, ctx.batch, catch_up, ctx.context).seconds
    rest = (plan.depth - 1) * ctx.device.forward(ctx.draft, ctx.batch, 1, ctx.context).seconds
    return first + rest + ctx.device.round_trip_s(plan.orchestration)


def _medusa(ctx: StepContext, plan: DraftPlan) -> float:
    h, v = ctx.target.hidden, ctx.vocab
    heads = plan.params.get("num_heads") or plan.depth
    cost = ctx.target.scaled("medusa heads", 0, heads * (h * h + h + v * h), ctx.dense_bytes)
    return ctx.device.forward(cost, ctx.batch, 1, 0).seconds


def _eagle_head(ctx: StepContext, fc_inputs: int) -> ModelCost:
    h, v = ctx.target.hidden, ctx.vocab
    layer = (ctx.target.flops_per_token * ctx.target.tp / 2 - v * h) / max(ctx.target.layers, 1)  # one decoder layer
    return ctx.target.scaled("eagle head", 1, fc_inputs * h * h + layer + v * h, ctx.dense_bytes)


def _eagle(ctx: StepContext, plan: DraftPlan) -> float:
    head = _eagle_head(ctx, 2)
    widths = plan.level_widths or (1,) * plan.depth
    return sum(ctx.device.forward(head, ctx.batch, w, ctx.context).seconds for w in widths)


def _eagle3(ctx: StepContext, plan: DraftPlan) -> float:
    head = _eagle_head(ctx, 3)
    return plan.depth * ctx.device.forward(head, ctx.batch, 1, ctx.context).seconds


PROPOSER_COSTS: dict[str, Callable[[StepContext, DraftPlan], float]] = {
    "draft_target": _draft_target,
    "medusa": _medusa,
    "eagle": _eagle,
    "eagle3": _eagle3,
    "mtp": _eagle3,
    "ngram": lambda ctx, plan: 0.0,
    "lookahead": lambda ctx, plan: 0.0,
}


def plan_for(spec) -> DraftPlan:
    """The draft plan of a config's ``speculation`` section; KeyError for a method with none."""
    return PLANS[spec.method](spec)
