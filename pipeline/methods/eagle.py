"""EAGLE-1: a one-layer head on the target's features drafts a static tree (TensorRT-LLM
``--speculative_decoding_mode eagle``; engine runtime only: on the PyTorch backend upstream's
``EagleDecodingConfig`` runs EAGLE-3 drafters only).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``eagle``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config_base import (
    ModelSpec,
    Section,
    TreeChoices,
    TreeDrafts,
    check_tree,
    described,
    tree_depth,
    tree_non_leaves_per_level,
)
from pipeline.errors import ConfigError
from pipeline.facts.model_shapes import eagle_head_layers
from pipeline.infra.trees import brace_choices
from pipeline.methods.base import ENGINE, REFERENCE, Method, StepFlag
from pipeline.methods.drafting import DraftHead, DraftPlan, head_cost, tree_plan
from pipeline.methods.heads import CHOICES, HEAD_DIR, check_head_dims, plan_tree_head
from pipeline.trtllm import commands as tc
from pipeline.trtllm.commands import KV_CACHE_QUANT_ALGO
from pipeline.validate.severity import ERROR, INFO

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.methods.base import CheckContext, DeploymentConfig



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


NUM_LAYERS = StepFlag("--num-layers", "num_layers")  # the CPU build step's flag of the draft depth


class EagleMethod(Method):
    name = "eagle"
    vllm_method = "eagle"  # the schedule's vLLM form (pipeline/schedule/forms.py)
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

    step_flags = (HEAD_DIR, NUM_LAYERS, CHOICES)

    def plan_reference(self, p: Any, spec: EagleSpec, target: tuple[str, str]) -> None:
        plan_tree_head(p, self, spec, target, HEAD_DIR, NUM_LAYERS)

    def plan_trtllm(self, p: Any, spec: EagleSpec, v: Any, target_ckpt: str, tokenizer: str) -> None:
        _check_build_limits(p.cfg)
        spec_ckpt = _trtllm_checkpoint(p, v, spec, tokenizer)
        p.trtllm_baseline(v, target_ckpt)
        p.trtllm_engine(v, "speculative", spec_ckpt, p.cfg.target, mode=self.engine_mode, k=spec.engine_max_draft_len,
                        logits=p.cfg.build.gather_generation_logits, architecture="EagleForCausalLM",
                        num_eagle_layers=spec.num_layers)

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

    def quantizes_with_head(self, cfg: DeploymentConfig) -> bool:
        return fp8_route(cfg.target)

    def head_weights(self, cfg: DeploymentConfig) -> tuple[str, tuple[str, ...], str]:
        if cfg.backend != "trtllm":
            return "weights", ("model.safetensors",), ""
        if fp8_route(cfg.target):
            return "weights", ("pytorch_model.bin",), "examples/eagle/quantize.py loads exactly pytorch_model.bin from the EAGLE dir"
        return "weights", ("*.safetensors", "pytorch_model*.bin", "*.pth"), ""  # the converter's ModelWeightsLoader

    def check_head(self, ctx: CheckContext, head_cfg: dict, tensors: Callable[[], tuple[dict, Path] | None],
                   directory: Path) -> None:
        read = tensors()
        if read is not None:
            _check_fc_and_layers(ctx, head_cfg, *read, directory)

    def proposer_fields(self, spec: EagleSpec) -> dict[str, Any]:
        return {"num_layers": spec.num_layers, "choices": spec.choices}  # None: the proposer's chain


def _check_fc_and_layers(ctx: CheckContext, head_cfg: dict, shapes: dict, weights: Path, directory: Path) -> None:
    field_path = "speculation.head_dir"
    check_head_dims(ctx, "EAGLE head", field_path, {k: head_cfg.get(k) for k in ("hidden_size", "vocab_size")})
    quantized = ctx.cfg.backend == "trtllm" and fp8_route(ctx.cfg.target)
    missing = [k for k in ("fc.weight", "fc.bias") if k not in shapes]
    if quantized and missing == ["fc.bias"]:
        ctx.add(INFO, "heads", "EAGLE head has no fc.bias; examples/eagle/quantize.py uses zeros for it", "", field_path)
    elif missing:
        ctx.add(ERROR, "heads", f"EAGLE head lacks {missing} in {weights.name} (convert_checkpoint.py fails with "
                "KeyError, NVIDIA/TensorRT-LLM#2588)", "use an EAGLE-1 checkpoint whose fc layer has a bias "
                "(the verified one is yuhuili/EAGLE-Vicuna-7B-v1.3), or the FP8 route, which tolerates its absence",
                field_path)
    if quantized:
        _check_eagle_layers(ctx, shapes, weights, directory, field_path)


def _check_eagle_layers(ctx: CheckContext, shapes: dict, weights: Path, directory: Path, field_path: str) -> None:
    """quantize.py copies layers.{i}.* for i < --eagle_num_layers (the head's num_hidden_layers)."""
    layers = eagle_head_layers(str(directory))
    absent = [i for i in range(layers) if f"layers.{i}.self_attn.q_proj.weight" not in shapes]
    if absent:
        ctx.add(ERROR, "heads", f"EAGLE head config.json has num_hidden_layers {layers} but {weights.name} lacks "
                f"layers {absent} (examples/eagle/quantize.py --eagle_num_layers {layers} reads each)",
                "use the head's original config.json and weights", field_path)


def _trtllm_checkpoint(p: Any, v: tc.Version, spec: EagleSpec, base: str) -> str:
    cfg, q = p.cfg, p.cfg.target.quantization
    head = p.source("eagle", spec.head_dir, "eagle", always_resolve=False)
    out = p.path("checkpoints", "speculative-trtllm")
    common = dict(output_dir=out, dtype=cfg.target.dtype, max_draft_len=spec.engine_max_draft_len, num_layers=spec.num_layers,
                  max_non_leaves_per_layer=spec.max_non_leaves_per_layer, tp=cfg.target.tp)
    expect = p.checkpoint_expectation("speculative", cfg.target, architecture="EagleForCausalLM", num_eagle_layers=spec.num_layers)
    if q.format == "none" and q.kv_cache_dtype not in tc.KV_CACHE_QUANT_ALGO:
        argv = tc.convert_eagle(v, p.trtllm_root, model_dir=base, head_dir=head, **common)
        p.add_step("convert-speculative", argv, [base, head], [out], kind="convert", expect_checkpoint=expect)
        return out
    if q.format != "fp8" or q.kv_cache_dtype == "int8":
        raise ConfigError("config", ["target.quantization: quantized EAGLE is FP8 only (format fp8, kv_cache_dtype fp8 or auto)"])
    quantized = p.path("checkpoints", "speculative-fp8-modelopt")
    argv = tc.quantize_eagle(v, p.trtllm_root, model_dir=base, head_dir=head, output_dir=quantized,
                             head_layers=eagle_head_layers(head), kv_cache_dtype=q.kv_cache_dtype,
                             calib_dataset=q.calibration_dataset, calib_size=q.calibration_size)
    p.add_step("quantize-speculative", argv, [base, head], [quantized], kind="quantize")
    argv = tc.convert_eagle(v, p.trtllm_root, model_dir=quantized, head_dir=None, **common)
    p.add_step("convert-speculative", argv, [quantized], [out], kind="convert", expect_checkpoint=expect)
    return out


def _check_build_limits(cfg: DeploymentConfig) -> None:
    """The planner's own refusal (validate reports the same as findings)."""
    problems = []
    if cfg.target.pp != 1:
        problems.append(f"target.pp: EAGLE needs pp 1, got {cfg.target.pp}")
    if cfg.build.max_batch_size > EAGLE_MAX_BATCH_SIZE:
        problems.append(f"build.max_batch_size: EAGLE allows at most {EAGLE_MAX_BATCH_SIZE}, got {cfg.build.max_batch_size}")
    if problems:
        raise ConfigError("config", problems)


METHOD = EagleMethod()
