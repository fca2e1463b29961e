"""Draft-target: a smaller draft model proposes K tokens, the target verifies them
(TensorRT-LLM ``draft_tokens_external``; the LLM API's ``Draft_Target`` decoding config).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``draft_target``. On the engine
runtime ``tensorrt_llm_bls`` runs the rounds (two engine models, num_draft_tokens per request); on
the CPU reference engine ``orchestration: engine`` drafts inside the target's engine instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config_base import ModelSpec, Section, described
from pipeline.methods.base import ENGINE, LLAMA, LLM_API, REFERENCE, Method, StepFlag
from pipeline.methods.drafting import DraftPlan, chain_plan
from pipeline.validate.severity import ERROR, INFO, WARNING

if TYPE_CHECKING:
    from pipeline.methods.base import CheckContext, DeploymentConfig


class DraftTargetSpec(Section):
    """Draft-target (TensorRT-LLM ``draft_tokens_external``): a smaller model proposes K tokens."""

    method: Literal["draft_target"] = described("Speculation method: a draft model proposes tokens.")
    draft: ModelSpec = described("The draft model (must share the target's tokenizer and vocabulary).")
    num_draft_tokens: Annotated[int, Field(ge=1, le=32)] = described(
        "Draft tokens per verification step (K) sent with each request.", default=4
    )
    max_draft_len: Annotated[int, Field(ge=1, le=32)] | None = described(
        "Engine limit --max_draft_len on the target; default num_draft_tokens. Must be ≥ every K used.",
        default=None,
    )
    use_draft_logits: bool = described(
        "Logits-based (rejection-sampling) acceptance; needs build.gather_generation_logits.", default=False
    )
    orchestration: Literal["bls", "engine"] = described(
        "Who runs the draft each round. 'bls': tensorrt_llm_bls calls tensorrt_llm_draft, then "
        "tensorrt_llm with draft_input_ids (upstream's Triton flow; two model calls per round; "
        "clients call tensorrt_llm_bls with num_draft_tokens). 'engine' (backend reference only): "
        "the tensorrt_llm model drafts with the draft model inside its own engine, as TensorRT-LLM's "
        "PyTorch-backend two-model draft/target does in its executor; clients call the ensemble, and "
        "the BLS flow stays available in the same repository.",
        default="bls",
    )

    @field_validator("max_draft_len")
    @classmethod
    def _limit_covers_k(cls, value: int | None, info: ValidationInfo) -> int | None:
        k = info.data.get("num_draft_tokens")
        if value is not None and k is not None and value < k:
            raise ValueError(
                f"max_draft_len ({value}) is below num_draft_tokens ({k}); the target engine would "
                f"refuse the requests (raise max_draft_len to ≥ {k})"
            )
        return value

    @property
    def engine_max_draft_len(self) -> int:
        return self.max_draft_len if self.max_draft_len is not None else self.num_draft_tokens


class DraftTargetMethod(Method):
    name = "draft_target"
    vllm_method = "draft_model"  # the schedule's vLLM form (pipeline/schedule/forms.py)
    section = DraftTargetSpec
    title = "draft-target"
    runtimes = frozenset({ENGINE, LLM_API, REFERENCE})
    proposer = "draft_target"
    engine_mode = "draft_tokens_external"
    llmapi_decoding_type = "Draft_Target"
    draft_model = True
    per_request_draft_len = True
    min_engine_version = None
    step_flags = (StepFlag("--draft-dir", "draft_dir", "checkpoint", LLAMA), StepFlag("--draft-quantization", "quantization", "str"),
                  StepFlag("--num-draft-tokens", "num_draft_tokens"))

    def plan_reference(self, p: Any, spec: DraftTargetSpec, target: tuple[str, str]) -> None:
        draft = p.reference_model("draft", spec.draft, "speculation.draft")
        p.reference_baseline(target)
        k = spec.engine_max_draft_len
        p.reference_baseline(target, "target", k)
        p.reference_baseline(draft, "draft")
        proposer = ["--method", "draft_target", "--draft-dir", draft[0], "--draft-quantization", draft[1],
                    "--num-draft-tokens", str(spec.num_draft_tokens)]
        p.reference_engine("speculative", target, proposer + p.draft_weights(), k, [draft[0]])

    def plan_trtllm(self, p: Any, spec: DraftTargetSpec, v: Any, target_ckpt: str, tokenizer: str) -> None:
        _, draft_ckpt = p.trtllm_checkpoint(v, "draft", spec.draft)
        p.trtllm_baseline(v, target_ckpt)
        k, logits = spec.engine_max_draft_len, spec.use_draft_logits
        p.trtllm_engine(v, "target", target_ckpt, p.cfg.target, mode=self.engine_mode, k=k, logits=logits)
        p.trtllm_engine(v, "draft", draft_ckpt, spec.draft, logits=logits)

    def resends_context(self, spec: DraftTargetSpec) -> bool:
        return True

    def draft_plan(self, spec: DraftTargetSpec) -> DraftPlan:
        return chain_plan(self.name, spec.num_draft_tokens, spec)

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        """K sequential forwards of the draft model over B rows (the first also consumes the tokens
        accepted last step), each a step of its own; the BLS orchestration adds a round trip per step."""
        if ctx.draft is None:
            raise ValueError("draft-target needs the draft model's shapes")
        catch_up = max(1, round(ctx.tokens_per_step))
        first = ctx.device.forward(ctx.draft, ctx.batch, catch_up, ctx.context).seconds
        rest = (plan.depth - 1) * ctx.device.forward(ctx.draft, ctx.batch, 1, ctx.context).seconds
        return first + rest + ctx.device.round_trip_s(plan.orchestration)

    def uses_draft_logits(self, spec: DraftTargetSpec) -> bool:
        return spec.use_draft_logits

    def primary_draft_len(self, spec: DraftTargetSpec) -> int:
        return spec.num_draft_tokens

    def renders_bls(self, spec: DraftTargetSpec) -> bool:
        return True  # with orchestration engine the BLS flow stays in the repository beside the ensemble

    def bls_orchestrated(self, spec: DraftTargetSpec) -> bool:
        return spec.orchestration == "bls"

    def paged_fmha_needed_by(self, cfg: DeploymentConfig) -> str | None:
        return "draft-target needs it on both engines (KV-cache reuse)"

    def config_problems(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        spec, problems = cfg.speculation, []
        too_long = [k for k in cfg.loadtest.sweep_draft_len if k > spec.engine_max_draft_len]
        if too_long:
            problems.append(("loadtest.sweep_draft_len", f"{too_long} exceed the engine max_draft_len "
                             f"({spec.engine_max_draft_len}); raise speculation.max_draft_len"))
        if spec.orchestration == "engine":
            if cfg.backend != "reference":
                problems.append(("speculation.orchestration", "'engine' needs backend 'reference'; the TensorRT-LLM "
                                 "C++ backend drafts only through tensorrt_llm_bls (use 'bls')"))
            if cfg.loadtest.sweep_draft_len:
                problems.append(("loadtest.sweep_draft_len", "needs speculation.orchestration 'bls' (num_draft_tokens "
                                 "is a BLS input; the ensemble has none)"))
        return problems

    def check(self, ctx: CheckContext) -> None:
        cfg, spec = ctx.cfg, ctx.cfg.speculation
        if spec.use_draft_logits and not cfg.build.gather_generation_logits:
            ctx.add(ERROR, "method", "use_draft_logits needs generation logits from both engines",
                    "set build.gather_generation_logits: true", "build.gather_generation_logits")
        if cfg.build.gather_generation_logits and not spec.use_draft_logits:
            ctx.add(WARNING, "method", "gather_generation_logits without use_draft_logits costs memory for nothing",
                    "set build.gather_generation_logits: false or speculation.use_draft_logits: true",
                    "build.gather_generation_logits")
        if cfg.runs_llm_api:
            return  # no BLS and no engines: the LLM API drafts inside its executor
        if cfg.backend == "trtllm" and not cfg.triton.enable_kv_cache_reuse:
            ctx.add(ERROR, "method", "the draft-target target engine requires KV-cache reuse at runtime",
                    "set triton.enable_kv_cache_reuse: true", "triton.enable_kv_cache_reuse")
        if cfg.backend == "trtllm" and ctx.profile.sm < 89 and ctx.profile.is_gpu:
            ctx.add(INFO, "method", "draft-target through the Triton BLS has known problems on A100 and at TP4 "
                    "(NVIDIA/TensorRT-LLM#2684, #2709)", "smoke-test each engine alone through the ensemble first",
                    "hardware")
        if cfg.backend == "trtllm":
            check_bls_context_lengths(ctx)

    def proposer_fields(self, spec: DraftTargetSpec) -> dict[str, Any]:
        return {"num_draft_tokens": spec.num_draft_tokens}

    def check_llm_api(self, ctx: CheckContext, facts: Any) -> None:
        if ctx.cfg.speculation.use_draft_logits:
            ctx.add(ERROR, "method", "use_draft_logits is an engine-runtime (fast logits) setting; "
                    "DraftTargetDecodingConfig has no such field", "set speculation.use_draft_logits: false",
                    "speculation.use_draft_logits")
        if ctx.cfg.loadtest.sweep_draft_len:
            ctx.add(ERROR, "method", "the LLM API fixes the draft length per server (speculative_config.max_draft_len); "
                    "there is no per-request num_draft_tokens to sweep", "remove loadtest.sweep_draft_len, or render "
                    "one config per draft length", "loadtest.sweep_draft_len")

    def check_cpu_llmapi_layout(self, ctx: CheckContext) -> None:
        spec = ctx.cfg.speculation
        if "orchestration" in spec.model_fields_set and spec.orchestration != "engine":
            ctx.add(ERROR, "method", "the llmapi layout has no tensorrt_llm_bls: the draft runs inside the "
                    "tensorrt_llm model, as the LLM API's executor drafts", "remove speculation.orchestration",
                    "speculation.orchestration")

    def speculative_config(self, cfg: DeploymentConfig, spec: DraftTargetSpec, engines: dict[str, str]) -> dict[str, Any]:
        return {"max_draft_len": spec.engine_max_draft_len, "speculative_model": engines["draft"]}


def check_bls_context_lengths(ctx: CheckContext, what: str = "draft-target") -> None:
    """The BLS sends the whole context (prompt + accepted tokens) to both engines every round, so
    the plan builds them with max_input_len = max_seq_len − 1; one engine step must then hold such
    an input unless chunked context splits it (the executor refuses it otherwise)."""
    b = ctx.cfg.build
    longest = b.max_seq_len - 1
    ctx.add(INFO, "build", f"{what} engines are built with max_input_len {longest} (max_seq_len − 1), not "
            f"{b.max_input_len}: every draft and verify call re-sends the whole context", "", "build.max_input_len")
    chunked = bool(getattr(ctx.cfg.triton, "enable_chunked_context", False))
    if b.max_num_tokens < longest and not chunked:
        ctx.add(ERROR, "build", f"max_num_tokens ({b.max_num_tokens}) is below the longest {what} context "
                f"({longest} = max_seq_len − 1): a request whose prompt plus generated tokens passes "
                f"{b.max_num_tokens} fails mid-generation", f"raise build.max_num_tokens to ≥ {longest}",
                "build.max_num_tokens")


METHOD = DraftTargetMethod()
