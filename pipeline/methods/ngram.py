"""N-gram (prompt lookup): no draft model; the tokens that followed an earlier occurrence of the
last n tokens are the drafts. The CPU reference engine and the LLM API (``NGramDecodingConfig``)
draft in the engine; on the engine runtime ``tensorrt_llm_bls`` looks them up and sends them to a
``draft_tokens_external`` target (TensorRT-LLM's V1 n-gram workflow, examples/ngram).

Reads and writes nothing; registered in :mod:`pipeline.methods` as ``ngram``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from pipeline.config_base import Section, described
from pipeline.methods.base import ENGINE, LLM_API, REFERENCE, Method, StepFlag
from pipeline.methods.draft_target import check_bls_context_lengths
from pipeline.methods.drafting import DraftPlan, chain_plan
from pipeline.validate.severity import ERROR

if TYPE_CHECKING:
    from pipeline.methods.base import CheckContext, DeploymentConfig

NGRAM_POOL_SWITCHES = ("is_keep_all", "is_use_oldest", "is_public_pool")


class NgramSpec(Section):
    """N-gram / prompt lookup: no draft model; the tokens that followed an earlier occurrence of
    the sequence's last n tokens are the drafts (TensorRT-LLM ``NGramDecodingConfig``; vLLM's
    ``prompt_lookup_min``/``prompt_lookup_max``). One spec for both places it runs: the CPU
    reference engine drafts them itself (pipeline/reference/proposers/ngram.py), and the
    TensorRT-LLM LLM-API runtime gets the upstream fields in ``speculative_config``;
    ``min_matching_ngram_size`` is the reference engine's only (1 on trtllm)."""

    method: Literal["ngram"] = described("Speculation method: n-gram (prompt-lookup) drafts, no draft model.")
    max_draft_len: Annotated[int, Field(ge=1, le=32)] = described(
        "Most draft tokens per step (speculative_config.max_draft_len; vLLM num_speculative_tokens); fewer "
        "when the match is near the end of the sequence.",
        default=4,
    )
    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = described(
        "Longest pattern (last n tokens) looked up; the longest that matches wins (vLLM prompt_lookup_max).",
        default=2,
    )
    min_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = described(
        "Shortest pattern that may match (vLLM prompt_lookup_min); CPU reference engine only: must be 1 on "
        "backend trtllm (TensorRT-LLM has no such field).",
        default=1,
    )
    is_keep_all: bool = described(
        "Keep every earlier occurrence of a pattern; false: only the first (then is_use_oldest has no effect).",
        default=True,
    )
    is_use_oldest: bool = described("Propose from the oldest occurrence; false: the newest.", default=True)
    is_public_pool: bool = described(
        "One pattern pool shared by all requests (a pattern seen in one request drafts for another); "
        "false: each request matches only its own prompt and output.",
        default=True,
    )
    orchestration: Literal["engine", "bls"] = described(
        "Who drafts. 'engine': the engine itself (the CPU reference engine's proposer; the LLM API's "
        "speculative_config). 'bls': tensorrt_llm_bls looks the n-grams up and sends them as "
        "draft_input_ids to a target built with --speculative_decoding_mode draft_tokens_external "
        "(TensorRT-LLM's V1 n-gram workflow, examples/ngram); required on the engine runtime, which "
        "has no n-gram decoding mode; clients call tensorrt_llm_bls with num_draft_tokens.",
        default="engine",
    )

    @field_validator("min_matching_ngram_size")
    @classmethod
    def _min_below_max(cls, value: int, info: ValidationInfo) -> int:
        top = info.data.get("max_matching_ngram_size")
        if top is not None and value > top:
            raise ValueError(f"min_matching_ngram_size ({value}) exceeds max_matching_ngram_size ({top})")
        return value

    @property
    def engine_max_draft_len(self) -> int:
        return self.max_draft_len


def ngram_through_bls(cfg: DeploymentConfig) -> bool:
    """n-gram drafted by tensorrt_llm_bls and verified as external drafts (orchestration: bls)."""
    spec = cfg.speculation
    return isinstance(spec, NgramSpec) and spec.orchestration == "bls"


POOL_SWITCHES = ("is_keep_all", "is_use_oldest", "is_public_pool")  # n-gram pool switches (true/false)


class NgramMethod(Method):
    name = "ngram"
    vllm_method = "ngram"  # the schedule's vLLM form (pipeline/schedule/forms.py)
    section = NgramSpec
    title = "n-gram"
    runtimes = frozenset({ENGINE, LLM_API, REFERENCE})  # ENGINE: through the BLS only
    proposer = "ngram"
    engine_mode = "draft_tokens_external"  # the target of the BLS flow
    llmapi_decoding_type = "NGram"
    # the CPU build step's flags ngram_args writes (a flag left out: the engine descriptor's default)
    step_flags = (StepFlag("--num-draft-tokens", "max_draft_len"),
                  *(StepFlag(f"--{knob.replace('_', '-')}", knob) for knob in ("max_matching_ngram_size", "min_matching_ngram_size")),
                  *(StepFlag(f"--{knob.replace('_', '-')}", knob, "bool") for knob in POOL_SWITCHES))

    def plan_reference(self, p: Any, spec: NgramSpec, target: tuple[str, str]) -> None:
        p.reference_baseline(target)
        if spec.orchestration == "bls":  # the BLS drafts: a target that verifies external drafts, as draft-target's
            p.reference_baseline(target, "target", spec.max_draft_len)
        else:
            p.reference_engine("speculative", target, ngram_args(spec), spec.max_draft_len, [])

    def plan_trtllm(self, p: Any, spec: NgramSpec, v: Any, target_ckpt: str, tokenizer: str) -> None:
        p.trtllm_baseline(v, target_ckpt)
        if spec.orchestration == "bls":
            # TensorRT-LLM's V1 n-gram workflow (examples/ngram/README.md): the target alone, built for
            # external drafts; the drafts come from the BLS's lookup
            p.trtllm_engine(v, "target", target_ckpt, p.cfg.target, mode=self.engine_mode, k=spec.max_draft_len)

    def resends_context(self, spec: NgramSpec) -> bool:
        return spec.orchestration == "bls"

    def draft_plan(self, spec: NgramSpec) -> DraftPlan:
        return chain_plan(self.name, spec.max_draft_len, spec)  # drafting: a host-side lookup (the default 0 s)

    def primary_draft_len(self, spec: NgramSpec) -> int:
        return spec.engine_max_draft_len

    def renders_bls(self, spec: NgramSpec) -> bool:
        return spec.orchestration == "bls"

    def bls_orchestrated(self, spec: NgramSpec) -> bool:
        return spec.orchestration == "bls"

    def paged_fmha_needed_by(self, cfg: DeploymentConfig) -> str | None:
        if cfg.speculation.orchestration == "bls":
            return "n-gram through the BLS needs it on the target engine (KV-cache reuse of the re-sent context)"
        return None

    def config_problems(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        if cfg.backend != "reference" and cfg.speculation.min_matching_ngram_size != 1:
            return [("speculation.min_matching_ngram_size",
                     "must be 1 on backend trtllm: TensorRT-LLM's NGramDecodingConfig has no lower bound "
                     "on the pattern length (tensorrt_llm/llmapi/llm_args.py; its NGramPoolManager in "
                     "tensorrt_llm/_torch/speculative/ngram.py tries every length down to 1); the knob "
                     "is the CPU reference engine's (vLLM prompt_lookup_min)")]
        return []

    def check(self, ctx: CheckContext) -> None:
        """n-gram drafted by the BLS and verified as external drafts (TensorRT-LLM's V1 n-gram
        workflow, NVIDIA/TensorRT-LLM examples/ngram/README.md: draft_tokens_external target, KV-cache
        block reuse, no beam search)."""
        cfg, spec = ctx.cfg, ctx.cfg.speculation
        if spec.orchestration != "bls":
            return
        if cfg.runs_llm_api:
            ctx.add(ERROR, "method", "orchestration 'bls' sends drafts to a trtllm-build engine; the LLM-API runtime "
                    "has no tensorrt_llm_bls and drafts n-grams in its executor (speculative_config)",
                    "set speculation.orchestration: engine, or trtllm_runtime: engine (TensorRT-LLM ≤ 1.2.x)",
                    "speculation.orchestration")
            return
        if spec.is_public_pool:
            ctx.add(ERROR, "method", "the BLS keeps one n-gram pool per request (its instances are separate "
                    "processes, and upstream's V1 pool is per request: examples/ngram/run_dtm_ngram.py); a shared "
                    "pool is the in-engine method's", "set speculation.is_public_pool: false (or orchestration: "
                    "engine on the CPU reference engine)", "speculation.is_public_pool")
        if cfg.backend == "trtllm" and not cfg.triton.enable_kv_cache_reuse:
            ctx.add(ERROR, "method", "the external-draft target re-reads the whole context every round and needs "
                    "KV-cache block reuse at runtime (examples/ngram/README.md: --kv_cache_enable_block_reuse)",
                    "set triton.enable_kv_cache_reuse: true", "triton.enable_kv_cache_reuse")
        if cfg.backend == "trtllm":
            check_bls_context_lengths(ctx, "n-gram target")

    def check_cpu_llmapi_layout(self, ctx: CheckContext) -> None:
        if ctx.cfg.speculation.min_matching_ngram_size != 1:
            ctx.add(ERROR, "method", "NGramDecodingConfig has no min_matching_ngram_size (tensorrt_llm/llmapi/"
                    "llm_args.py), so model.yaml cannot carry it and the CPU llmapi model matches down to one token",
                    "remove speculation.min_matching_ngram_size", "speculation.min_matching_ngram_size")

    def check_engine_runtime(self, ctx: CheckContext) -> None:
        if ctx.cfg.speculation.orchestration != "bls":
            ctx.add(ERROR, "method", "the engine runtime has no n-gram decoding mode; n-gram runs there only as "
                    "external drafts from tensorrt_llm_bls (draft_tokens_external, docs/ngram.md)",
                    "set speculation.orchestration: bls, or trtllm_runtime: llm_api (TensorRT-LLM ≥ 1.2)",
                    "speculation.orchestration")

    def proposer_fields(self, spec: NgramSpec) -> dict[str, Any]:
        return spec.model_dump(exclude={"method", "orchestration"})

    def speculative_config(self, cfg: DeploymentConfig, spec: NgramSpec, engines: dict[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {"max_draft_len": spec.max_draft_len, "max_matching_ngram_size": spec.max_matching_ngram_size}
        # the pool switches as written (unset: upstream's default, which equals ours)
        out.update({k: getattr(spec, k) for k in NGRAM_POOL_SWITCHES if k in spec.model_fields_set})
        return out


def ngram_args(spec: NgramSpec) -> list[str]:
    """build_step arguments of the n-gram proposer (no checkpoint: the engine drafts from the tokens)."""
    flags = [(f"--{knob.replace('_', '-')}", "true" if getattr(spec, knob) else "false") for knob in POOL_SWITCHES]
    return ["--method", "ngram", "--num-draft-tokens", str(spec.max_draft_len),
            "--max-matching-ngram-size", str(spec.max_matching_ngram_size),
            "--min-matching-ngram-size", str(spec.min_matching_ngram_size), *[a for pair in flags for a in pair]]


METHOD = NgramMethod()
