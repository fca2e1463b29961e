"""What the head methods (Medusa, EAGLE-1, EAGLE-3) share: the checkpoint kinds and flags of the
CPU build step, the reference route of a tree-drafting head, and the check of a head's hidden and
vocabulary sizes against the target's.

Reads nothing itself (the caller passes what validate read from the head's directory); used by
:mod:`pipeline.methods.medusa`, :mod:`pipeline.methods.eagle` and :mod:`pipeline.methods.eagle3`.
"""

from __future__ import annotations

import json
from typing import Any

from pipeline.infra.trees import choices_or_chain
from pipeline.methods.base import Checkpoint, StepFlag
from pipeline.validate.severity import ERROR

# an EAGLE or EAGLE-3 head as the CPU engine loads it (pipeline.reference.modeling / eagle3_model)
EAGLE_HEAD = Checkpoint("eagle", (("config.json",), ("model.safetensors",)))
HEAD_DIR = StepFlag("--head-dir", "head_dir", "checkpoint", EAGLE_HEAD)
CHOICES = StepFlag("--choices", "choices", "json", default="[]")  # a tree (Medusa/EAGLE choices) or a chain


def plan_tree_head(p: Any, method: Any, spec: Any, target: tuple[str, str], head: StepFlag, count: StepFlag) -> None:
    """The CPU route of a head that drafts a static tree (Medusa's heads, EAGLE-1's layers): resolve
    the head's directory (``spec.<method.head_field>``), the baseline, then the speculative engine
    with the head, its ``count`` (``spec.<count.field>``) and its tree (a chain of that many without
    ``choices``). ``p``: the planner and ``method``: the Method, as ``Method.plan_reference`` has them."""
    resolved = p.source(method.name, getattr(spec, method.head_field), head.checkpoint.kind, always_resolve=True)
    p.reference_baseline(target)
    n = getattr(spec, count.field)
    choices = choices_or_chain(spec.choices, n)
    proposer = ["--method", method.proposer, head.flag, resolved, count.flag, str(n),
                CHOICES.flag, json.dumps(choices, separators=(",", ":"))]
    p.reference_engine("speculative", target, proposer + p.draft_weights(), spec.engine_max_draft_len, [resolved])


def check_head_dims(ctx: Any, role: str, field_path: str, dims: dict[str, int | None]) -> None:
    """``ctx``: validate's CheckContext (not named here: validate.findings reads the config, which
    reads the methods' registry; naming it would close that cycle)."""
    target = ctx.shapes.get("target")
    if target is None:
        return
    for key, expected in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        if dims.get(key) is not None and dims[key] != expected:
            ctx.add(ERROR, "heads", f"{role} {key} {dims[key]} does not match the target's {expected}",
                    "use heads trained for this target", field_path)
