"""Medusa: extra decoding heads on the target's last hidden state propose a static tree, verified
greedily by the target (TensorRT-LLM ``--speculative_decoding_mode medusa``; engine runtime only:
upstream's ``MedusaDecodingConfig`` excludes the PyTorch backend).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``medusa``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config_base import Section, TreeChoices, TreeDrafts, check_tree, described, tree_depth
from pipeline.errors import ConfigError
from pipeline.infra.trees import brace_choices
from pipeline.methods.base import ENGINE, REFERENCE, Checkpoint, Method, StepFlag
from pipeline.methods.drafting import DraftHead, DraftPlan, tree_plan
from pipeline.methods.heads import CHOICES, check_head_dims, plan_tree_head
from pipeline.trtllm import commands as tc
from pipeline.validate.severity import ERROR, INFO, WARNING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.methods.base import CheckContext, DeploymentConfig



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


# the heads as the CPU engine loads them (pipeline.reference.modeling.MedusaHeads), and the build step's flags
MEDUSA_HEADS = Checkpoint("medusa", (("config.json",), ("medusa_lm_head.safetensors",)))
HEADS_DIR = StepFlag("--heads-dir", "heads_dir", "checkpoint", MEDUSA_HEADS)
NUM_HEADS = StepFlag("--num-heads", "num_heads")


class MedusaMethod(Method):
    name = "medusa"
    vllm_method = "medusa"  # the schedule's vLLM form (pipeline/schedule/forms.py)
    section = MedusaSpec
    title = "Medusa"
    runtimes = frozenset({ENGINE, REFERENCE})
    proposer = "medusa"
    engine_mode = "medusa"
    triton_decoding_mode = "medusa"
    required_triton_parameters = ("medusa_choices",)
    engine_only_decoding_type = "Medusa"
    head_field, head_role = "heads_dir", "medusa heads"

    step_flags = (HEADS_DIR, NUM_HEADS, CHOICES)

    def plan_reference(self, p: Any, spec: MedusaSpec, target: tuple[str, str]) -> None:
        plan_tree_head(p, self, spec, target, HEADS_DIR, NUM_HEADS)

    def plan_trtllm(self, p: Any, spec: MedusaSpec, v: Any, target_ckpt: str, tokenizer: str) -> None:
        spec_ckpt = _trtllm_checkpoint(p, v, spec, tokenizer)
        p.trtllm_baseline(v, target_ckpt)
        p.trtllm_engine(v, "speculative", spec_ckpt, p.cfg.target, mode=self.engine_mode, k=spec.engine_max_draft_len,
                        logits=p.cfg.build.gather_generation_logits, architecture="MedusaForCausalLM",
                        num_medusa_heads=spec.num_heads)

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

    def head_weights(self, cfg: DeploymentConfig) -> tuple[str, tuple[str, ...], str]:
        if cfg.backend == "trtllm":  # tensorrt_llm/models/medusa/weight.py load_medusa_hf tries .pt, then .safetensors
            return "weights", ("medusa_lm_head.pt", "medusa_lm_head.safetensors"), ""
        return "weights", ("medusa_lm_head.safetensors",), ""

    def check_head(self, ctx: CheckContext, head_cfg: dict, tensors: Callable[[], tuple[dict, Path] | None],
                   directory: Path) -> None:
        read = tensors()
        if read is not None:
            _check_heads_in_weights(ctx, ctx.cfg.speculation, head_cfg, *read)

    def proposer_fields(self, spec: MedusaSpec) -> dict[str, Any]:
        return {"num_heads": spec.num_heads, "choices": spec.choices}  # None: the proposer's chain


def _check_heads_in_weights(ctx: CheckContext, spec: MedusaSpec, head_cfg: dict, shapes: dict, weights: Path) -> None:
    """Heads are counted in the weights: FasterDecoding's config.json says medusa_num_heads 2 for
    files holding more, and upstream builds with the explicit --num_medusa_heads."""
    field_path = "speculation.heads_dir"
    in_weights = 0
    while f"{in_weights}.1.weight" in shapes:
        in_weights += 1
    lm_head = shapes.get("0.1.weight")
    dims = {"vocab_size": lm_head[0], "hidden_size": lm_head[1]} if lm_head and len(lm_head) == 2 else {}
    check_head_dims(ctx, "medusa heads", field_path, {**{k: head_cfg.get(k) for k in ("hidden_size", "vocab_size")}, **dims})
    if spec.num_heads > in_weights:
        missing = [f"{i}.1.weight" for i in range(in_weights, spec.num_heads)]
        ctx.add(ERROR, "heads", f"num_heads {spec.num_heads} but {weights.name} holds {in_weights} heads "
                f"(missing {', '.join(missing)})", f"set speculation.num_heads ≤ {in_weights}", "speculation.num_heads")
    declared = head_cfg.get("medusa_num_heads")
    if isinstance(declared, int) and declared != in_weights:
        ctx.add(INFO, "heads", f"medusa heads: config.json says medusa_num_heads {declared}, {weights.name} holds "
                f"{in_weights}; the build passes --num_medusa_heads {spec.num_heads} explicitly", "", field_path)


def _heads(n: int) -> DraftHead:
    """n heads, each a ResBlock (H→H with bias) and its own lm_head on the target's last hidden state."""
    return DraftHead("Medusa heads", f"{n} heads × (H² + V·H)", copies=n, fc_inputs=1, fc_bias=True, decoder_layers=0)


def _trtllm_checkpoint(p: Any, v: tc.Version, spec: MedusaSpec, base: str) -> str:
    cfg, q = p.cfg, p.cfg.target.quantization
    heads = p.source("medusa", spec.heads_dir, "medusa", always_resolve=False)
    out = p.path("checkpoints", "speculative-trtllm")
    k = spec.engine_max_draft_len
    if q.format == "none" and q.kv_cache_dtype not in tc.KV_CACHE_QUANT_ALGO:
        argv = tc.convert_medusa(v, p.trtllm_root, model_dir=base, heads_dir=heads, output_dir=out, dtype=cfg.target.dtype,
                                 num_heads=spec.num_heads, max_draft_len=k, tp=cfg.target.tp)
        kind = "convert"
    elif q.format in ("none", "fp8"):
        extra = tc.medusa_quantize_extra(v, heads_dir=heads, num_heads=spec.num_heads, max_draft_len=k)
        argv = tc.quantize_modelopt(
            v, p.trtllm_root, model_dir=base, output_dir=out, dtype=cfg.target.dtype, qformat=q.format,
            kv_cache_dtype=q.kv_cache_dtype, calib_dataset=q.calibration_dataset, calib_size=q.calibration_size,
            awq_block_size=q.awq_block_size, tp=cfg.target.tp, pp=cfg.target.pp, extra=extra,
        )
        kind = "quantize"
    else:
        raise ConfigError("config", [f"target.quantization.format: Medusa supports none or fp8, not '{q.format}'"])
    expect = p.checkpoint_expectation("speculative", cfg.target, architecture="MedusaForCausalLM", num_medusa_heads=spec.num_heads)
    p.add_step(f"{kind}-speculative", argv, [base, heads], [out], kind=kind, expect_checkpoint=expect)
    return out


METHOD = MedusaMethod()
