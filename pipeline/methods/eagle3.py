"""EAGLE-3: a draft checkpoint run by the LLM API (``Eagle3DecodingConfig``), one-model or
two-model; on the CPU reference engine a chain drafted by the EAGLE-3 proposer.

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``eagle3``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from pipeline.config_base import Section, described
from pipeline.methods.base import LLM_API, REFERENCE, Method, StepFlag
from pipeline.methods.drafting import DraftHead, DraftPlan, chain_plan, head_cost
from pipeline.methods.heads import HEAD_DIR
from pipeline.trtllm.llmapi_facts import facts_for
from pipeline.validate.severity import ERROR

if TYPE_CHECKING:
    from pipeline.methods.base import CheckContext, DeploymentConfig


class Eagle3Spec(Section):
    """EAGLE-3 draft checkpoint run by the LLM API (``Eagle3DecodingConfig``); LLM-API runtime only."""

    method: Literal["eagle3"] = described("Speculation method: EAGLE-3 drafter (LLM-API runtime).")
    head_dir: str = described(
        "EAGLE-3 draft checkpoint directory (config.json + weights), e.g. a download of "
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B; becomes speculative_config.speculative_model."
    )
    max_draft_len: Annotated[int, Field(ge=1, le=32)] = described(
        "Draft tokens per step (speculative_config.max_draft_len).", default=3
    )
    model_mode: Literal["one_model", "two_model"] = described(
        "one_model: the drafter runs inside the target's forward (eagle3_one_model: true); two_model: a "
        "separate draft model engine. Two-model exists only where the version records it (1.2.x).",
        default="one_model",
    )


# fc over three fused target layers (no bias), one decoder layer, its own lm_head
EAGLE3_HEAD = DraftHead("EAGLE-3 head", "fc (3H→H) + 1 layer + lm_head", copies=1, fc_inputs=3, fc_bias=False,
                        decoder_layers=1, kv_name="EAGLE-3 KV cache")


def chain_head_seconds(ctx: Any, plan: DraftPlan) -> float:
    """K sequential chain steps of the EAGLE-3 head."""
    head = head_cost(ctx, EAGLE3_HEAD, "eagle head")
    return plan.depth * ctx.device.forward(head, ctx.batch, 1, ctx.context).seconds


DRAFT_LEN = StepFlag("--num-draft-tokens", "max_draft_len")  # the CPU build step's flag of the chain's length


class Eagle3Method(Method):
    name = "eagle3"
    vllm_method = "eagle3"  # the schedule's vLLM form (pipeline/schedule/forms.py)
    section = Eagle3Spec
    title = "EAGLE-3"
    runtimes = frozenset({LLM_API, REFERENCE})
    proposer = "eagle3"
    llmapi_decoding_type = "Eagle3"
    head_field, head_role = "head_dir", "EAGLE-3 head"
    step_flags = (HEAD_DIR, DRAFT_LEN)

    def plan_reference(self, p: Any, spec: Eagle3Spec, target: tuple[str, str]) -> None:
        head = p.source("eagle", spec.head_dir, HEAD_DIR.checkpoint.kind, always_resolve=True)
        p.reference_baseline(target)
        # a chain; model_mode is the LLM API's (one engine either way here)
        proposer = ["--method", self.proposer, HEAD_DIR.flag, head, DRAFT_LEN.flag, str(spec.max_draft_len)]
        p.reference_engine("speculative", target, proposer + p.draft_weights(), spec.max_draft_len, [head])

    def draft_head(self, spec: Eagle3Spec | None) -> DraftHead:
        return EAGLE3_HEAD

    def draft_plan(self, spec: Eagle3Spec) -> DraftPlan:
        return chain_plan(self.name, spec.max_draft_len, spec)

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        return chain_head_seconds(ctx, plan)

    def head_weights(self, cfg: DeploymentConfig) -> tuple[str, tuple[str, ...], str]:
        if cfg.backend == "trtllm":  # the LLM API's EAGLE-3 drafter loads an HF-style checkpoint
            return "weights", ("*.safetensors", "pytorch_model*.bin"), ""
        return "weights", ("model.safetensors",), ""

    def check_head(self, ctx: CheckContext, head_cfg: dict, tensors: Any, directory: Any) -> None:
        """An EAGLE-3 head predicts into the target's vocabulary from its hidden states: both sizes
        must match the target (a smaller ``draft_vocab_size`` is the head's own and maps back)."""
        target = ctx.shapes.get("target")  # config.json alone: the LLM API reads the weights itself
        if target is None:
            return
        for key, expected in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
            value = head_cfg.get(key)
            if value is not None and value != expected:
                ctx.add(ERROR, "heads", f"EAGLE-3 head {key} {value} does not match the target's {expected}",
                        "use the EAGLE-3 checkpoint trained for this target", "speculation.head_dir")

    def check_llm_api(self, ctx: CheckContext, facts: Any) -> None:
        if ctx.cfg.speculation.model_mode not in facts.eagle3_modes:
            ctx.add(ERROR, "method", f"TensorRT-LLM {facts.line} runs EAGLE-3 as {' / '.join(facts.eagle3_modes)} "
                    f"only (Eagle3DecodingConfig has no eagle3_one_model field; {facts.citation()})",
                    "set speculation.model_mode: one_model", "speculation.model_mode")

    def check_cpu_llmapi_layout(self, ctx: CheckContext) -> None:
        if ctx.cfg.speculation.model_mode != "one_model":
            ctx.add(ERROR, "method", "the CPU reference engine runs the EAGLE-3 head inside the target's step "
                    "(one-model); it has no separate draft engine", "set speculation.model_mode: one_model",
                    "speculation.model_mode")

    def speculative_config(self, cfg: DeploymentConfig, spec: Eagle3Spec, engines: dict[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {"max_draft_len": spec.max_draft_len, "speculative_model": engines["draft"]}
        if _has_one_model_flag(cfg):  # versions without it run one-model only (validate refuses two_model)
            out["eagle3_one_model"] = spec.model_mode == "one_model"
        return out

    def llmapi_draft_dir(self, spec: Eagle3Spec) -> str:
        return spec.head_dir

    def proposer_fields(self, spec: Eagle3Spec) -> dict[str, Any]:
        return {"max_draft_len": spec.max_draft_len}


def _has_one_model_flag(cfg: DeploymentConfig) -> bool:
    facts = facts_for(cfg.trtllm_version)
    eagle3 = facts.decoding_type("Eagle3") if facts else None
    return bool(eagle3 and "eagle3_one_model" in eagle3["fields"])


METHOD = Eagle3Method()
