"""Medusa: extra decoding heads on the target's last hidden state propose a static tree, verified
greedily by the target (TensorRT-LLM ``--speculative_decoding_mode medusa``; engine runtime only:
upstream's ``MedusaDecodingConfig`` excludes the PyTorch backend).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``medusa``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config.base import Section, TreeChoices, TreeDrafts, check_tree, described, tree_depth
from pipeline.infra.trees import brace_choices
from pipeline.methods.base import ENGINE, REFERENCE, Method
from pipeline.methods.drafting import DraftHead, DraftPlan, tree_plan
from pipeline.validate.severity import INFO, WARNING

if TYPE_CHECKING:
    from pipeline.validate.findings import CheckContext


class MedusaSpec(TreeDrafts, Section):
    """Medusa heads on the target's last hidden state (greedy tree verification)."""

    method: Literal["medusa"] = described("Speculation method: Medusa heads.")
    heads_dir: str = described(
        "Medusa heads directory (config.json + medusa_lm_head.safetensors) or 'builtin:tiny-medusa'."
    )
    num_heads: Annotated[int, Field(ge=1, le=8)] = described("Medusa heads to use (--num_medusa_heads).", default=4)
    choices: TreeChoices | None = described(
        "medusa_choices tree as root-less paths, e.g. [[0], [1], [0, 0]]; every prefix present, "
        "depth ≤ num_heads. Default: one chain of num_heads.",
        default=None,
    )
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = described(
        "Engine max_draft_len (--max_medusa_token_len); default: the tree's node count.", default=None
    )

    @field_validator("choices")
    @classmethod
    def _choices_fit_heads(cls, value: TreeChoices | None, info: ValidationInfo) -> TreeChoices | None:
        value = check_tree(value)
        heads = info.data.get("num_heads")
        if value is not None and heads is not None and tree_depth(value) > heads:
            raise ValueError(f"tree depth {tree_depth(value)} exceeds num_heads ({heads}); one head per level")
        return value

    @field_validator("max_draft_len")
    @classmethod
    def _limit_covers_tree(cls, value: int | None, info: ValidationInfo) -> int | None:
        choices = info.data.get("choices")
        if value is not None and choices and len(choices) > value:
            raise ValueError(f"the tree has {len(choices)} nodes but max_draft_len is {value}")
        return value

    @property
    def chain_depth(self) -> int:
        return self.num_heads


class MedusaMethod(Method):
    name = "medusa"
    section = MedusaSpec
    title = "Medusa"
    runtimes = frozenset({ENGINE, REFERENCE})
    proposer = "medusa"
    engine_mode = "medusa"
    triton_decoding_mode = "medusa"
    required_triton_parameters = ("medusa_choices",)
    engine_only_decoding_type = "Medusa"
    head_field, head_role = "heads_dir", "medusa heads"

    def primary_draft_len(self, spec: MedusaSpec) -> int:
        return spec.engine_max_draft_len

    def draft_head(self, spec: MedusaSpec) -> DraftHead:
        return _heads(spec.num_heads)

    def draft_plan(self, spec: MedusaSpec) -> DraftPlan:
        return tree_plan(self.name, spec)

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        """All heads over B rows inside the target's step."""
        params = _heads(plan.params.get("num_heads") or plan.depth).resident_params(ctx.target.hidden, ctx.vocab, 0)
        cost = ctx.target.scaled("medusa heads", 0, params, ctx.dense_bytes)
        return ctx.device.forward(cost, ctx.batch, 1, 0).seconds

    def triton_parameters(self, spec: MedusaSpec) -> dict[str, str]:
        return {"medusa_choices": brace_choices(spec.tree)}

    def check(self, ctx: CheckContext) -> None:
        cfg = ctx.cfg
        if cfg.backend == "trtllm" and not cfg.loadtest.sampling.greedy:
            ctx.add(WARNING, "method", "TensorRT-LLM verifies Medusa drafts greedily; sampled load tests compare "
                    "unlike arms", "set loadtest.sampling.top_k: 1", "loadtest.sampling.top_k")
        if cfg.backend == "trtllm" and cfg.target.quantization.format not in ("none", "fp8"):
            ctx.add(WARNING, "method", f"Medusa is documented for FP16/BF16 and FP8 bases, not "
                    f"{cfg.target.quantization.format}", "use target.quantization.format: fp8 or none",
                    "target.quantization.format")
        if cfg.build.max_batch_size > 16:
            ctx.add(INFO, "method", f"Medusa gains shrink with batch size (max_batch_size {cfg.build.max_batch_size})",
                    "load-test the concurrency you deploy at", "build.max_batch_size")

    def proposer_fields(self, spec: MedusaSpec) -> dict[str, Any]:
        return {"num_heads": spec.num_heads, "choices": spec.choices}  # None: the proposer's chain


def _heads(n: int) -> DraftHead:
    """n heads, each a ResBlock (H→H with bias) and its own lm_head on the target's last hidden state."""
    return DraftHead("Medusa heads", f"{n} heads × (H² + V·H)", copies=n, fc_inputs=1, fc_bias=True, decoder_layers=0)


METHOD = MedusaMethod()
