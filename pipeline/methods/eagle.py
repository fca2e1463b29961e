"""EAGLE-1: a one-layer head on the target's features drafts a static tree (TensorRT-LLM
``--speculative_decoding_mode eagle``; engine runtime only: on the PyTorch backend upstream's
``EagleDecodingConfig`` runs EAGLE-3 drafters only).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``eagle``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config.base import (
    ModelSpec,
    Section,
    TreeChoices,
    TreeDrafts,
    check_tree,
    described,
    tree_depth,
    tree_non_leaves_per_level,
)
from pipeline.infra.trees import brace_choices
from pipeline.methods.base import ENGINE, REFERENCE, Method
from pipeline.methods.drafting import DraftHead, DraftPlan, head_cost, tree_plan
from pipeline.trtllm.commands import KV_CACHE_QUANT_ALGO
from pipeline.validate.severity import ERROR

if TYPE_CHECKING:
    from pipeline.config import DeploymentConfig
    from pipeline.validate.findings import CheckContext


class EagleSpec(TreeDrafts, Section):
    """EAGLE-1 head (static tree) on the target's features."""

    method: Literal["eagle"] = described("Speculation method: EAGLE-1 head.")
    head_dir: str = described("EAGLE head directory (config.json + model.safetensors) or 'builtin:tiny-eagle'.")
    num_layers: Annotated[int, Field(ge=1, le=8)] = described(
        "EAGLE draft depth (--num_eagle_layers); every tree must be exactly this deep.", default=4
    )
    choices: TreeChoices | None = described(
        "eagle_choices tree as root-less paths; every prefix present, depth = num_layers. "
        "Default: one chain of num_layers.",
        default=None,
    )
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = described(
        "Engine max_draft_len (≤ 256); default: the tree's node count.", default=None
    )
    max_non_leaves_per_layer: Annotated[int, Field(ge=1, le=64)] = described(
        "Non-leaf nodes allowed per tree level (--max_non_leaves_per_layer).", default=10
    )

    @field_validator("choices")
    @classmethod
    def _choices_match_layers(cls, value: TreeChoices | None, info: ValidationInfo) -> TreeChoices | None:
        value = check_tree(value)
        layers = info.data.get("num_layers")
        if value is not None and layers is not None and tree_depth(value) != layers:
            raise ValueError(
                f"tree depth {tree_depth(value)} must equal num_layers ({layers}); a mismatch fails "
                "at inference (NVIDIA/TensorRT-LLM#2673)"
            )
        return value

    @field_validator("max_draft_len")
    @classmethod
    def _limit_covers_tree(cls, value: int | None, info: ValidationInfo) -> int | None:
        choices = info.data.get("choices")
        if value is not None and choices and len(choices) > value:
            raise ValueError(f"the tree has {len(choices)} nodes but max_draft_len is {value}")
        return value

    @field_validator("max_non_leaves_per_layer")
    @classmethod
    def _non_leaves_fit(cls, value: int, info: ValidationInfo) -> int:
        choices = info.data.get("choices")
        if choices:
            per_level = tree_non_leaves_per_level(choices)
            if max(per_level) > value:
                raise ValueError(
                    f"the tree has {max(per_level)} non-leaf nodes on one level but "
                    f"max_non_leaves_per_layer is {value}"
                )
        return value

    @property
    def chain_depth(self) -> int:
        return self.num_layers


EAGLE_MAX_BATCH_SIZE = 512


def fp8_route(target: ModelSpec) -> bool:
    """A quantized target takes EAGLE's FP8 route: examples/eagle/quantize.py (base + head in one
    ModelOpt checkpoint), then convert_checkpoint.py without the head directory."""
    q = target.quantization
    return q.format != "none" or q.kv_cache_dtype in KV_CACHE_QUANT_ALGO


class EagleMethod(Method):
    name = "eagle"
    section = EagleSpec
    title = "EAGLE"
    runtimes = frozenset({ENGINE, REFERENCE})
    proposer = "eagle"
    engine_mode = "eagle"
    triton_decoding_mode = "eagle"
    required_triton_parameters = ("eagle_choices",)
    engine_only_decoding_type = "Eagle"
    head_field, head_role = "head_dir", "EAGLE head"
    min_engine_version = (0, 15)

    def primary_draft_len(self, spec: EagleSpec) -> int:
        return spec.engine_max_draft_len

    def memory_draft_len(self, spec: EagleSpec) -> tuple[int, int]:
        return spec.engine_max_draft_len + spec.num_layers, spec.engine_max_draft_len  # + the EAGLE layers' KV

    def draft_head(self, spec: EagleSpec | None) -> DraftHead:
        # one EagleNet per level, each a full copy: embedding, fc (2H→H, bias), one layer, lm_head
        layers = spec.num_layers if spec is not None else 1
        return DraftHead("EAGLE head", f"{layers} EagleNets × (embed + fc + 1 layer + lm_head)",
                         copies=layers, fc_inputs=2, fc_bias=True, decoder_layers=1, embedding=True,
                         kv_name="EAGLE KV cache")

    def draft_plan(self, spec: EagleSpec) -> DraftPlan:
        return tree_plan(self.name, spec)

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        """One EagleNet per tree level, over that level's nodes."""
        head = head_cost(ctx, self.draft_head(None), "eagle head")  # one copy: the same whatever num_layers
        widths = plan.level_widths or (1,) * plan.depth
        return sum(ctx.device.forward(head, ctx.batch, w, ctx.context).seconds for w in widths)

    def paged_fmha_needed_by(self, cfg: DeploymentConfig) -> str | None:
        return ("EAGLE needs it: the builder turns it back on and the attention plugin then refuses this KV dtype "
                "at the first context step")

    def triton_parameters(self, spec: EagleSpec) -> dict[str, str]:
        return {"eagle_choices": brace_choices(spec.tree)}

    def config_problems(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        if cfg.triton.enable_chunked_context:
            return [("triton.enable_chunked_context",
                     "EAGLE engines do not support chunked context (upstream's CI turns it off for EAGLE: "
                     "NVIDIA/TensorRT-LLM triton_backend/ci/L0_backend_trtllm/test.sh)")]
        return []

    def check(self, ctx: CheckContext) -> None:
        cfg = ctx.cfg
        if cfg.build.max_batch_size > EAGLE_MAX_BATCH_SIZE:
            ctx.add(ERROR, "method", f"EAGLE engines allow max_batch_size ≤ {EAGLE_MAX_BATCH_SIZE} (configured "
                    f"{cfg.build.max_batch_size})", f"set build.max_batch_size: {EAGLE_MAX_BATCH_SIZE} or less",
                    "build.max_batch_size")
        if cfg.target.pp != 1:
            ctx.add(ERROR, "method", "EAGLE does not support pipeline parallelism", "set target.pp: 1 (use tp)",
                    "target.pp")
        if cfg.backend == "trtllm" and cfg.target.quantization.format not in ("none", "fp8"):
            ctx.add(ERROR, "method", f"quantized EAGLE is FP8 only (configured {cfg.target.quantization.format})",
                    "use target.quantization.format: fp8 or none", "target.quantization.format")

    def check_shapes(self, ctx: CheckContext) -> None:
        target = ctx.shapes.get("target")
        if target is not None and not target.is_llama:
            ctx.add(ERROR, "method", f"EAGLE in TensorRT-LLM needs a LLaMA-architecture base, got {target.architecture}",
                    "use a LLaMA-family target or another method", "target.checkpoint")

    def proposer_fields(self, spec: EagleSpec) -> dict[str, Any]:
        return {"num_layers": spec.num_layers, "choices": spec.choices}  # None: the proposer's chain


METHOD = EagleMethod()
