"""Per-method drafting cost and verify width, as the methods give them.

Reads nothing, writes nothing. Each method's module (:mod:`pipeline.methods`) owns its draft plan
(``Method.draft_plan``: draft depth K, tokens per sequence in the verify forward, chain or tree)
and its proposer's cost (``Method.draft_seconds``: the seconds one speculative step spends drafting
for B sequences); :data:`PLANS` and :data:`PROPOSER_COSTS` are views of those hooks keyed by the
config's ``speculation.method``, for the methods that have something to forecast. The drafting
heads' weights are the same :class:`~pipeline.methods.base.DraftHead` the memory estimate counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.forecast.roofline import ModelCost
from pipeline.methods import METHODS, Method
from pipeline.methods.drafting import DraftPlan

__all__ = ["PLANS", "PROPOSER_COSTS", "DraftPlan", "StepContext", "plan_for"]


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


_FORECAST = [m for m in METHODS.values() if type(m).draft_plan is not Method.draft_plan]  # those that plan drafts
PLANS: dict[str, Callable[[object], DraftPlan]] = {m.name: m.draft_plan for m in _FORECAST}
PROPOSER_COSTS: dict[str, Callable[[StepContext, DraftPlan], float]] = {m.name: m.draft_seconds for m in _FORECAST}


def plan_for(spec) -> DraftPlan:
    """The draft plan of a config's ``speculation`` section; KeyError for a method with none."""
    return PLANS[spec.method](spec)
