"""Deployment configuration: the YAML a platform engineer writes once, as pydantic v2 models.

Reads a YAML file (``load_config``) and returns a validated :class:`DeploymentConfig`. Every
problem in the file is reported at once as ``field.path: message`` lines inside a
:class:`ConfigError`, a key written twice in one mapping included (:class:`StrictLoader`); no work
starts on an invalid file. Later stages derive every path from
the config (``engines/<name>/…``, ``reports/<name>/…``) and stamp their outputs with
:func:`config_hash` so stale inputs can be refused. Cross-field *logic* that needs no files
lives here (validators: ports, tree choices, draft lengths, hardware names); checks that read
checkpoints or depend on the GPU architecture live in ``pipeline.validate.preflight``. The field
descriptions feed ``specdeploy schema``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipeline.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
TRTLLM_VERSION_DEFAULT = "1.2.1"
ENGINE_RUNTIME_MAX_VERSION = (1, 2)  # trtllm-build and the C++ tensorrtllm backend end with 1.2.x
TrtllmRuntime = Literal["engine", "llm_api"]

QuantFormat = Literal[
    "none",  # model dtype
    "fp8",  # FP8 weights + activations (Hopper/Ada+)
    "int8_sq",  # SmoothQuant W8A8
    "int4_awq",  # W4A16 AWQ
    "w4a8_awq",  # W4A8 AWQ (Hopper+)
    "nvfp4",  # Blackwell only
    "int8_wo",  # weight-only INT8 (also the CPU reference engine's real int8 path)
    "int4_wo",  # weight-only INT4
]
KvCacheDtype = Literal["auto", "fp16", "bf16", "fp8", "int8", "fp32"]
ModelDtype = Literal["float32", "float16", "bfloat16"]


def _desc(text: str, **kwargs: Any) -> Any:
    return Field(description=text, **kwargs)


class _Strict(BaseModel):
    """Base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class CrossFieldError(ValueError):
    """Raised by model validators that know the exact field paths of their problems."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


class Quantization(_Strict):
    """Weight / activation / KV-cache quantization (ModelOpt ``quantize.py``)."""

    format: QuantFormat = _desc(
        "Weight format: none (model dtype), fp8, int8_sq, int4_awq, w4a8_awq, nvfp4, int8_wo, int4_wo. "
        "Gated by the hardware architecture (see `specdeploy validate`).",
        default="none",
    )
    kv_cache_dtype: KvCacheDtype = _desc(
        "KV-cache dtype; auto = the model dtype. fp8/int8 can silently disable paged context FMHA.",
        default="auto",
    )
    calibration_dataset: str = _desc(
        "Calibration set for quantize.py --calib_dataset (HF name or local directory).", default="cnn_dailymail"
    )
    calibration_size: Annotated[int, Field(gt=0, le=100_000)] = _desc(
        "Calibration samples (--calib_size); AWQ caps it at 32.", default=512
    )
    awq_block_size: Literal[64, 128] = _desc("AWQ group size (--awq_block_size).", default=128)


class ModelSpec(_Strict):
    """A model to serve: an HF checkpoint directory or a ``builtin:`` demo model."""

    checkpoint: str = _desc(
        "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json) or "
        "'builtin:<name>' for a demo model (tiny-target, tiny-draft)."
    )
    dtype: ModelDtype = _desc("Dtype of the unquantized parts (--dtype).", default="bfloat16")
    quantization: Quantization = _desc("Quantization settings.", default_factory=Quantization)
    tp: Annotated[int, Field(ge=1, le=64)] = _desc(
        "Tensor-parallel size (must divide the KV-head count).", default=1
    )
    pp: Annotated[int, Field(ge=1, le=64)] = _desc("Pipeline-parallel size (EAGLE needs 1).", default=1)
    trust_remote_code: bool = _desc("Allow custom model code from the checkpoint.", default=False)

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a checkpoint directory or a 'builtin:<name>' demo model")
        if value.startswith(BUILTIN_PREFIX) and not value[len(BUILTIN_PREFIX) :].strip():
            raise ValueError("'builtin:' needs a demo model name, e.g. 'builtin:tiny-target'")
        return value

    @property
    def is_builtin(self) -> bool:
        return self.checkpoint.startswith(BUILTIN_PREFIX)

    @property
    def builtin_name(self) -> str | None:
        return self.checkpoint[len(BUILTIN_PREFIX) :] if self.is_builtin else None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


TreeChoices = list[list[Annotated[int, Field(ge=0)]]]


# ----------------------------------------------------------------------------------------------
# Tree choices (Medusa / EAGLE-1 static trees): each path omits the root; every prefix present.
# The helpers live in pipeline.infra.trees; the names stay importable from here.
from pipeline.infra.trees import (  # noqa: E402, F401
    brace_choices as format_choices,
)
from pipeline.infra.trees import (  # noqa: E402
    chain_choices,
    tree_depth,
    tree_non_leaves_per_level,
    tree_problems,
)


def _check_tree(choices: TreeChoices | None) -> TreeChoices | None:
    if choices is None:
        return None
    problems = tree_problems(choices)
    if problems:
        raise ValueError("; ".join(problems))
    return choices


class NoSpeculation(_Strict):
    """Baseline only: no speculative arm."""

    method: Literal["none"] = _desc("Speculation method.", default="none")


class DraftTargetSpec(_Strict):
    """Draft-target (TensorRT-LLM ``draft_tokens_external``): a smaller model proposes K tokens."""

    method: Literal["draft_target"] = _desc("Speculation method: a draft model proposes tokens.")
    draft: ModelSpec = _desc("The draft model (must share the target's tokenizer and vocabulary).")
    num_draft_tokens: Annotated[int, Field(ge=1, le=32)] = _desc(
        "Draft tokens per verification step (K) sent with each request.", default=4
    )
    max_draft_len: Annotated[int, Field(ge=1, le=32)] | None = _desc(
        "Engine limit --max_draft_len on the target; default num_draft_tokens. Must be ≥ every K used.",
        default=None,
    )
    use_draft_logits: bool = _desc(
        "Logits-based (rejection-sampling) acceptance; needs build.gather_generation_logits.", default=False
    )
    orchestration: Literal["bls", "engine"] = _desc(
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


class _TreeDrafts:
    """Medusa and EAGLE draft a static tree (``choices``) or, by default, one chain as deep as
    the heads / EAGLE layers (``chain_depth``); the engine's draft limit defaults to its node count."""

    @property
    def chain_depth(self) -> int:
        raise NotImplementedError

    @property
    def tree(self) -> list[list[int]]:
        return self.choices if self.choices else chain_choices(self.chain_depth)

    @property
    def engine_max_draft_len(self) -> int:
        if self.max_draft_len is not None:
            return self.max_draft_len
        return len(self.tree)


class MedusaSpec(_TreeDrafts, _Strict):
    """Medusa heads on the target's last hidden state (greedy tree verification)."""

    method: Literal["medusa"] = _desc("Speculation method: Medusa heads.")
    heads_dir: str = _desc(
        "Medusa heads directory (config.json + medusa_lm_head.safetensors) or 'builtin:tiny-medusa'."
    )
    num_heads: Annotated[int, Field(ge=1, le=8)] = _desc("Medusa heads to use (--num_medusa_heads).", default=4)
    choices: TreeChoices | None = _desc(
        "medusa_choices tree as root-less paths, e.g. [[0], [1], [0, 0]]; every prefix present, "
        "depth ≤ num_heads. Default: one chain of num_heads.",
        default=None,
    )
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = _desc(
        "Engine max_draft_len (--max_medusa_token_len); default: the tree's node count.", default=None
    )

    @field_validator("choices")
    @classmethod
    def _choices_fit_heads(cls, value: TreeChoices | None, info: ValidationInfo) -> TreeChoices | None:
        value = _check_tree(value)
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


class EagleSpec(_TreeDrafts, _Strict):
    """EAGLE-1 head (static tree) on the target's features."""

    method: Literal["eagle"] = _desc("Speculation method: EAGLE-1 head.")
    head_dir: str = _desc("EAGLE head directory (config.json + model.safetensors) or 'builtin:tiny-eagle'.")
    num_layers: Annotated[int, Field(ge=1, le=8)] = _desc(
        "EAGLE draft depth (--num_eagle_layers); every tree must be exactly this deep.", default=4
    )
    choices: TreeChoices | None = _desc(
        "eagle_choices tree as root-less paths; every prefix present, depth = num_layers. "
        "Default: one chain of num_layers.",
        default=None,
    )
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = _desc(
        "Engine max_draft_len (≤ 256); default: the tree's node count.", default=None
    )
    max_non_leaves_per_layer: Annotated[int, Field(ge=1, le=64)] = _desc(
        "Non-leaf nodes allowed per tree level (--max_non_leaves_per_layer).", default=10
    )

    @field_validator("choices")
    @classmethod
    def _choices_match_layers(cls, value: TreeChoices | None, info: ValidationInfo) -> TreeChoices | None:
        value = _check_tree(value)
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


class Eagle3Spec(_Strict):
    """EAGLE-3 draft checkpoint run by the LLM API (``Eagle3DecodingConfig``); LLM-API runtime only."""

    method: Literal["eagle3"] = _desc("Speculation method: EAGLE-3 drafter (LLM-API runtime).")
    head_dir: str = _desc(
        "EAGLE-3 draft checkpoint directory (config.json + weights), e.g. a download of "
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B; becomes speculative_config.speculative_model."
    )
    max_draft_len: Annotated[int, Field(ge=1, le=32)] = _desc(
        "Draft tokens per step (speculative_config.max_draft_len).", default=3
    )
    model_mode: Literal["one_model", "two_model"] = _desc(
        "one_model: the drafter runs inside the target's forward (eagle3_one_model: true); two_model: a "
        "separate draft model engine. Two-model exists only where the version records it (1.2.x).",
        default="one_model",
    )


class NgramSpec(_Strict):
    """N-gram / prompt lookup: no draft model; the tokens that followed an earlier occurrence of
    the sequence's last n tokens are the drafts (TensorRT-LLM ``NGramDecodingConfig``; vLLM's
    ``prompt_lookup_min``/``prompt_lookup_max``). One spec for both places it runs: the CPU
    reference engine drafts them itself (pipeline/reference/proposers/ngram.py), and the
    TensorRT-LLM LLM-API runtime gets the upstream fields in ``speculative_config``;
    ``min_matching_ngram_size`` is the reference engine's only (1 on trtllm)."""

    method: Literal["ngram"] = _desc("Speculation method: n-gram (prompt-lookup) drafts, no draft model.")
    max_draft_len: Annotated[int, Field(ge=1, le=32)] = _desc(
        "Most draft tokens per step (speculative_config.max_draft_len; vLLM num_speculative_tokens); fewer "
        "when the match is near the end of the sequence.",
        default=4,
    )
    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = _desc(
        "Longest pattern (last n tokens) looked up; the longest that matches wins (vLLM prompt_lookup_max).",
        default=2,
    )
    min_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = _desc(
        "Shortest pattern that may match (vLLM prompt_lookup_min); CPU reference engine only: must be 1 on "
        "backend trtllm (TensorRT-LLM has no such field).",
        default=1,
    )
    is_keep_all: bool = _desc(
        "Keep every earlier occurrence of a pattern; false: only the first (then is_use_oldest has no effect).",
        default=True,
    )
    is_use_oldest: bool = _desc("Propose from the oldest occurrence; false: the newest.", default=True)
    is_public_pool: bool = _desc(
        "One pattern pool shared by all requests (a pattern seen in one request drafts for another); "
        "false: each request matches only its own prompt and output.",
        default=True,
    )
    orchestration: Literal["engine", "bls"] = _desc(
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


class MtpSpec(_Strict):
    """Multi-token prediction with the target's own MTP layers (``MTPDecodingConfig``): DeepSeek-family
    targets only; LLM-API runtime only."""

    method: Literal["mtp"] = _desc("Speculation method: MTP layers of a DeepSeek-family target (LLM-API runtime).")
    num_nextn_predict_layers: Annotated[int, Field(ge=1, le=8)] = _desc(
        "MTP modules used; each proposes one token (speculative_config.num_nextn_predict_layers).", default=1
    )


Speculation = Annotated[
    Union[NoSpeculation, DraftTargetSpec, MedusaSpec, EagleSpec, Eagle3Spec, NgramSpec, MtpSpec],
    Field(discriminator="method"),
]

LLM_API_METHODS = ("none", "draft_target", "eagle3", "ngram", "mtp")
ENGINE_METHODS = ("none", "draft_target", "medusa", "eagle")


class LlmApiSettings(_Strict):
    """LLM-API runtime knobs (``trtllm_runtime: llm_api``): the arguments of TensorRT-LLM's ``LLM``
    that go into the Triton llmapi ``model.yaml`` and the ``trtllm-serve`` options file."""

    cuda_graphs: bool = _desc(
        "CUDA graphs for decode batches up to build.max_batch_size (cuda_graph_config).", default=True
    )
    cuda_graph_padding: bool = _desc(
        "Pad a batch up to the next captured size (cuda_graph_config.enable_padding).", default=True
    )
    disable_overlap_scheduler: bool = _desc("Turn the PyTorch executor's overlap scheduler off.", default=False)
    modelopt_root: str | None = _desc(
        "NVIDIA Model-Optimizer checkout whose examples/llm_ptq/hf_ptq.py quantizes checkpoints for this "
        "runtime (quantization.format fp8 / int4_awq). Unset: $SPECDEPLOY_MODELOPT_ROOT, then ./Model-Optimizer "
        "under the working directory (docs/gpu-llmapi.md).",
        default=None,
    )
    extra_llm_args: dict[str, Any] = _desc(
        "More LLM arguments, merged over the generated ones; validate checks every key and type against "
        "the recorded facts of trtllm_version (pipeline/trtllm/llmapi_facts.yaml).",
        default_factory=dict,
    )
    extra_speculative_config: dict[str, Any] = _desc(
        "More speculative_config fields of the method's decoding_type, merged over the generated ones; "
        "checked like extra_llm_args.",
        default_factory=dict,
    )


class BuildLimits(_Strict):
    """Engine build limits (trtllm-build); the baseline and speculative engines share them."""

    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = _desc(
        "--max_batch_size (EAGLE ≤ 512; Triton max_batch_size ≤ this).", default=8
    )
    max_input_len: Annotated[int, Field(ge=1)] = _desc("--max_input_len: longest prompt in tokens.", default=1024)
    max_seq_len: Annotated[int, Field(ge=2)] = _desc(
        "--max_seq_len: prompt + generated tokens (speculative engines add max_draft_len).", default=2048
    )
    max_num_tokens: Annotated[int, Field(ge=1)] = _desc(
        "--max_num_tokens per engine step (raised to max_batch_size × (K+1) for speculation).", default=8192
    )
    max_beam_width: Annotated[int, Field(ge=1, le=8)] = _desc(
        "--max_beam_width; speculative decoding needs 1.", default=1
    )
    gather_generation_logits: bool = _desc(
        "--gather_generation_logits on both draft-target engines (needed for use_draft_logits).", default=False
    )
    workers: Annotated[int, Field(ge=1)] | None = _desc(
        "trtllm-build --workers; default TP×PP.", default=None
    )

    @model_validator(mode="after")
    def _lengths_consistent(self) -> "BuildLimits":
        if self.max_input_len >= self.max_seq_len:
            raise CrossFieldError(
                [
                    (
                        "build.max_input_len",
                        f"max_input_len ({self.max_input_len}) must be below max_seq_len "
                        f"({self.max_seq_len}) to leave room for generated tokens",
                    )
                ]
            )
        return self


class TritonSettings(_Strict):
    """Triton server and tensorrt_llm model parameters."""

    host: str = _desc(
        "Address the server binds and clients use. 0.0.0.0 exposes every port (inference, metrics) to "
        "the network, without authentication: only on a trusted network (docs/gpu-serving.md).",
        default="127.0.0.1",
    )
    http_port: Annotated[int, Field(ge=1, le=65535)] = _desc("HTTP port.", default=8000)
    grpc_port: Annotated[int, Field(ge=1, le=65535)] = _desc("gRPC port.", default=8001)
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = _desc("Prometheus metrics port.", default=8002)
    decoupled: bool = _desc(
        "Streaming (decoupled) tensorrt_llm model; forced false for draft-target's LLM models.", default=True
    )
    max_queue_delay_microseconds: Annotated[int, Field(ge=0)] = _desc(
        "Dynamic-batcher queue delay.", default=0
    )
    max_queue_size: Annotated[int, Field(ge=0)] = _desc("Request queue bound (0 = unbounded).", default=0)
    preprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = _desc(
        "Instances of the preprocessing model.", default=1
    )
    postprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = _desc(
        "Instances of the postprocessing model.", default=1
    )
    bls_instance_count: Annotated[int, Field(ge=1, le=64)] = _desc(
        "Instances of the tensorrt_llm_bls model.", default=1
    )
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0, le=1)] = _desc(
        "Fraction of a GPU's free memory that the KV caches on it may take together; render splits it "
        "evenly among the TensorRT-LLM models sharing that GPU (both arms, the draft).",
        default=0.9,
    )
    max_tokens_in_paged_kv_cache: Annotated[int, Field(gt=0)] | None = _desc(
        "KV-cache capacity in tokens of every tensorrt_llm model of both arms (equal capacity); "
        "unset: sized from the memory estimate so both arms get the same.",
        default=None,
    )
    max_attention_window_size: Annotated[int, Field(gt=0)] | None = _desc(
        "Tokens each generated token attends to (sliding window when below build.max_seq_len); "
        "unset: the whole sequence.",
        default=None,
    )
    enable_chunked_context: bool = _desc(
        "Split long prompts into chunks batched with generation steps (needs paged context FMHA; "
        "not with EAGLE).",
        default=False,
    )
    gpus: list[Annotated[int, Field(ge=0)]] | None = _desc(
        "GPU indexes (as nvidia-smi lists them) the deployment may use; unset: every GPU nvidia-smi "
        "lists when rendering, or the fewest the deployment needs without nvidia-smi.",
        default=None,
    )
    arm_placement: Literal["auto", "split", "shared", "sequential"] = _desc(
        "How the load test's two arms share the GPUs: split (disjoint GPUs), shared (co-resident, "
        "equal KV capacity), sequential (one at a time, restarted between runs); auto picks the first "
        "that fits in that order.",
        default="auto",
    )
    batching_strategy: Literal["inflight_fused_batching", "inflight_batching", "V1"] = _desc(
        "tensorrt_llm gpt_model_type.", default="inflight_fused_batching"
    )
    batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = _desc(
        "Batch scheduler policy.", default="guaranteed_no_evict"
    )
    enable_kv_cache_reuse: bool = _desc(
        "KV-cache block reuse (needs paged context FMHA; required by draft-target).", default=True
    )
    exclude_input_in_output: bool = _desc("Return only generated tokens.", default=False)
    container_image: str = _desc(
        "NGC image for the GPU path (build and serve in the same image).",
        default="nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3",
    )
    startup_timeout_s: Annotated[float, Field(gt=0)] = _desc("Seconds to wait for readiness.", default=180.0)
    exit_timeout_s: Annotated[float, Field(gt=0)] = _desc("Seconds to wait for a clean shutdown.", default=5.0)

    @model_validator(mode="after")
    def _distinct_ports(self) -> "TritonSettings":
        ports = {"http_port": self.http_port, "grpc_port": self.grpc_port, "metrics_port": self.metrics_port}
        seen: dict[int, str] = {}
        problems = []
        for name, port in ports.items():
            if port in seen:
                problems.append((f"triton.{name}", f"port {port} clashes with triton.{seen[port]}"))
            seen.setdefault(port, name)
        if self.gpus is not None and (not self.gpus or len(set(self.gpus)) != len(self.gpus)):
            problems.append(("triton.gpus", f"needs distinct GPU indexes, got {self.gpus}"))
        if problems:
            raise CrossFieldError(problems)
        return self


class Sampling(_Strict):
    """Sampling sent identically to both arms. top_k=1 (the default) is greedy, and so is temperature 0."""

    temperature: Annotated[float, Field(ge=0, le=10)] = _desc(
        "Sampling temperature; 0 is greedy (Triton: sent as top_k 1; OpenAI-compatible servers: temperature 0).",
        default=1.0)
    top_k: Annotated[int, Field(ge=0)] = _desc("Top-k (1 = greedy).", default=1)
    top_p: Annotated[float, Field(ge=0, le=1)] = _desc("Top-p (0 = off).", default=0.0)
    seed: Annotated[int, Field(ge=0)] = _desc("Per-request random seed base.", default=0)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0 or (self.top_k == 0 and self.top_p <= 0)


class LoadTestSettings(_Strict):
    """Load-test plan: both arms, every concurrency level, repeated runs."""

    transport: Literal["grpc", "http", "openai"] = _desc(
        "gRPC streaming, HTTP generate_stream, or an OpenAI-compatible server's streaming /v1 API.", default="grpc"
    )
    openai_api: Literal["completions", "chat"] = _desc(
        "Transport openai: /v1/completions (the prompt as text) or /v1/chat/completions (one user message).",
        default="completions",
    )
    openai_top_k: bool | None = _desc(
        "Transport openai: send sampling.top_k. Unset: greedy (top_k 1) goes as temperature 0 without top_k, any "
        "other top_k is sent; true: always sent (vLLM, SGLang, trtllm-serve take it); false: never (strict servers "
        "refuse the field; docs/openai-endpoints.md).", default=None,
    )
    fail_fast_error_rate: Annotated[float, Field(ge=0, lt=1)] | None = _desc(
        "Stop the load test before the sweep goes on when more than this fraction of the requests sent in a "
        "run's first fail_fast_window_s seconds fail (null: never stop early).", default=0.5,
    )
    fail_fast_window_s: Annotated[float, Field(gt=0)] = _desc(
        "Seconds from a run's start that fail_fast_error_rate watches.", default=10.0,
    )
    mode: Literal["closed", "open"] = _desc("Closed loop (fixed users) or open loop (request rate).", default="closed")
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = _desc(
        "Concurrency levels (closed loop), sorted, no repeats.", default_factory=lambda: [1, 2, 4, 8]
    )
    request_rate: list[Annotated[float, Field(gt=0)]] = _desc(
        "Open loop: requests/s per level.", default_factory=list
    )
    duration_s: Annotated[float, Field(gt=0)] = _desc("Measured seconds per cell.", default=20.0)
    warmup_s: Annotated[float, Field(ge=0)] = _desc("Warm-up seconds excluded from statistics.", default=2.0)
    repeats: Annotated[int, Field(ge=1, le=50)] = _desc("Runs per cell (arms interleaved).", default=3)
    max_tokens: Annotated[int, Field(ge=1)] = _desc("Tokens generated per request.", default=64)
    prompts: str = _desc(
        "Directory of <category>.jsonl prompt files, or one file.", default="loadtests/prompts"
    )
    categories: list[str] = _desc("Prompt categories to use; empty = all found.", default_factory=list)
    sampling: Sampling = _desc("Sampling parameters for both arms.", default_factory=Sampling)
    processes: Annotated[int, Field(ge=1, le=64)] = _desc("Locust worker processes.", default=1)
    stop_timeout_s: Annotated[float, Field(ge=0)] = _desc("Seconds to let in-flight requests finish.", default=30.0)
    sweep_draft_len: list[Annotated[int, Field(ge=1, le=32)]] = _desc(
        "Draft-target: num_draft_tokens values to sweep (each ≤ the engine max_draft_len).",
        default_factory=list,
    )
    seed: int = _desc("Seed for prompt order and user arrival.", default=1234)

    @field_validator("concurrency")
    @classmethod
    def _concurrency_sorted_unique(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("needs at least one concurrency level")
        if len(set(value)) != len(value):
            raise ValueError(f"concurrency levels repeat: {value}")
        return sorted(value)

    @model_validator(mode="after")
    def _open_loop_needs_rates(self) -> "LoadTestSettings":
        problems = []
        if self.mode == "open" and not self.request_rate:
            problems.append(("loadtest.request_rate", "mode 'open' needs request_rate levels (requests/s)"))
        if self.warmup_s >= self.duration_s:
            problems.append(
                ("loadtest.warmup_s", f"warmup_s ({self.warmup_s}) must be shorter than duration_s ({self.duration_s})")
            )
        if problems:
            raise CrossFieldError(problems)
        return self


class Slo(_Strict):
    """Service-level objectives both arms are held to."""

    ttft_ms: Annotated[float, Field(gt=0)] = _desc("p95 time-to-first-token bound (ms).", default=1000.0)
    tpot_ms: Annotated[float, Field(gt=0)] = _desc("p95 time-per-output-token bound (ms).", default=100.0)


class GateSettings(_Strict):
    """The rollout gate (docs/report.md). Thresholds are product settings."""

    target_concurrency: list[Annotated[int, Field(ge=1)]] = _desc(
        "Concurrency levels the verdict is decided at (must be load-test levels); empty = the lowest.",
        default_factory=list,
    )
    tpot_ratio_max: Annotated[float, Field(gt=0)] = _desc(
        "GO needs the CI upper bound of spec/base median TPOT below this.", default=0.9
    )
    e2e_ratio_max: Annotated[float, Field(gt=0)] = _desc("Same for end-to-end latency.", default=0.9)
    ttft_p95_delta_ms_max: Annotated[float, Field(ge=0)] = _desc(
        "Allowed p95 TTFT regression in ms.", default=250.0
    )
    ttft_p95_delta_pct_max: Annotated[float, Field(ge=0)] = _desc(
        "Allowed p95 TTFT regression in percent.", default=50.0
    )
    peak_throughput_ratio_min: Annotated[float, Field(gt=0)] = _desc(
        "Peak throughput of spec ÷ base must stay above this.", default=0.95
    )
    max_error_rate_delta: Annotated[float, Field(ge=0, le=1)] = _desc(
        "Allowed increase of the error rate.", default=0.001
    )
    min_requests_per_cell: Annotated[int, Field(ge=1)] = _desc(
        "Fewer requests in a cell → INCONCLUSIVE.", default=20
    )
    min_runs: Annotated[int, Field(ge=1)] = _desc("Fewer repeated runs → INCONCLUSIVE.", default=2)
    min_acceptance_rate: Annotated[float, Field(ge=0, le=1)] = _desc(
        "Acceptance rate below this is flagged.", default=0.5
    )
    require_output_equivalence: bool = _desc(
        "Greedy outputs of both arms must match (exactly on CPU).", default=True
    )
    achieved_concurrency_tolerance: Annotated[float, Field(ge=0, le=1)] = _desc(
        "Relative shortfall of achieved vs requested concurrency tolerated.", default=0.05
    )
    allow_cutoff_above_crossover: bool = _desc(
        "Peak-throughput guardrail passes when every target level is below the crossover and the "
        "rollout disables speculation from the crossover up.",
        default=True,
    )
    slo: Slo = _desc("Latency SLOs.", default_factory=Slo)
    bootstrap_resamples: Annotated[int, Field(ge=100)] = _desc("Bootstrap resamples for CIs.", default=9999)
    bootstrap_seed: int = _desc("Bootstrap seed.", default=0)
    alpha: Annotated[float, Field(gt=0, lt=1)] = _desc("Significance level (CI = 1 − alpha).", default=0.05)


class ReferenceEngineSettings(_Strict):
    """CPU reference engine knobs (backend: reference)."""

    threads: Annotated[int, Field(ge=1, le=64)] = _desc("torch threads per engine process.", default=1)
    max_batch_size: Annotated[int, Field(ge=1, le=256)] | None = _desc(
        "In-flight batch limit; default build.max_batch_size.", default=None
    )
    prefix_cache_entries: Annotated[int, Field(ge=0, le=4096)] = _desc(
        "Cached prompt prefixes (KV reuse).", default=64
    )
    compute_dtype: Literal["float32", "float64"] = _desc("Compute dtype of the reference engine.", default="float32")
    draft_weights: Literal["float", "int8"] = _desc(
        "Draft-side weights at load (draft model, Medusa heads, EAGLE head) of the speculative engine: "
        "float = as the checkpoint stores them, or int8 — weight-only, per output channel, run by a "
        "few-row int8 kernel. Cheaper draft steps on CPU; the output is unchanged (drafts only decide "
        "what is accepted), acceptance may move a little. `specdeploy bench --draft-int8` measures both. "
        "float32 compute only; with draft-target orchestration: bls the served draft engine stays float.",
        default="float",
    )
    fast_paths: bool = _desc(
        "CPU fast path of the engine: scripted kernels, fused one-row drafting steps, int8 packing "
        "for draft-side weights. The same maths as the plain path (tests keep the two equal; the "
        "output does not change), only faster; false runs the plain reference maths, for reading "
        "or checking them.",
        default=True,
    )
    cpu_pinning: Literal["auto", "off"] | list[Annotated[int, Field(ge=0)]] = _desc(
        "Serving only. auto = each engine model's decode thread (tensorrt_llm, and tensorrt_llm_draft "
        "with orchestration: bls) gets `threads` CPUs of its own, the highest allowed ones, and "
        "tritonserver, the other models and the load generator run on the rest — when at least one "
        "CPU is left for them; otherwise nothing is pinned. A list of CPU ids = the engines' CPUs "
        "(`threads` per engine model, in order); the rest run everything else. off = the OS "
        "schedules everything. The serve log names the plan.",
        default="auto",
    )

    engine_process: Literal["own", "stub"] = _desc(
        "Serving only. own = each engine model's engine runs in a worker process of its own "
        "(`python -m pipeline.reference.worker`, started and stopped by the model), so its decode "
        "loop shares no interpreter lock with the threads that send responses; stub = inside the "
        "Python-backend stub process.",
        default="own",
    )

    @field_validator("cpu_pinning", mode="before")
    @classmethod
    def _cpu_pinning_value(cls, value):
        # one message instead of one per union member
        if isinstance(value, str) and value in ("auto", "off"):
            return value
        if isinstance(value, list) and value and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value):
            return value
        raise ValueError(f"should be 'auto', 'off' or a non-empty list of CPU ids (integers ≥ 0), got {value!r}")


class DeploymentConfig(_Strict):
    """One deployment: target, speculation method, hardware, build, Triton, load test and gate."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = _desc(
        "Deployment name; outputs go to engines/NAME/ and reports/NAME/."
    )
    description: str = _desc("Free text shown in reports.", default="")
    backend: Literal["trtllm", "reference"] = _desc(
        "trtllm (GPU engines) or reference (CPU PyTorch engine, hardware 'cpu').", default="trtllm"
    )
    hardware: str = _desc(
        "Hardware profile: h100-sxm-80gb, h100-pcie-80gb, h200-141gb, a100-80gb, a100-40gb, "
        "l40s-48gb, b200-180gb or cpu.",
        default="h100-sxm-80gb",
    )
    trtllm_version: str = _desc(
        "TensorRT-LLM version the engines are built and served with (engine path: ≤ 1.2.x).",
        default=TRTLLM_VERSION_DEFAULT,
    )
    trtllm_runtime: TrtllmRuntime | None = _desc(
        "TensorRT-LLM runtime: engine (trtllm-build engines behind the C++ tensorrtllm backend, "
        "≤ 1.2.x) or llm_api (HF/ModelOpt checkpoints run by the LLM API: the Triton llmapi model or "
        "trtllm-serve, 1.2.x and later). Unset: engine up to 1.2.x, llm_api past it. With backend "
        "reference, llm_api serves the CPU engine behind the same llmapi repository layout "
        "(methods none, draft_target, ngram; docs/reference-engine.md).",
        default=None,
    )
    trtllm_root: str | None = _desc(
        "Directory holding TensorRT-LLM's examples/ (quantize.py, convert_checkpoint.py): the NGC "
        "1.2.x image's /app or a v1.2.1 checkout. --trtllm-root overrides it; unset: $SPECDEPLOY_TRTLLM_ROOT, "
        "then /app when /app/examples exists (see docs/gpu-runbook.md).",
        default=None,
    )
    target: ModelSpec = _desc("The target model.")
    speculation: Speculation = _desc(
        "Speculation method: none | draft_target | medusa | eagle (engine runtime) | eagle3 | ngram | mtp "
        "(LLM-API runtime), with per-method fields.",
        default_factory=NoSpeculation,
    )
    build: BuildLimits = _desc("Engine build limits.", default_factory=BuildLimits)
    triton: TritonSettings = _desc("Triton settings.", default_factory=TritonSettings)
    llm_api: LlmApiSettings = _desc("LLM-API runtime settings (trtllm_runtime: llm_api).",
                                    default_factory=LlmApiSettings)
    reference: ReferenceEngineSettings = _desc(
        "CPU reference engine settings.", default_factory=ReferenceEngineSettings
    )
    loadtest: LoadTestSettings = _desc("Load-test settings.", default_factory=LoadTestSettings)
    gate: GateSettings = _desc("Rollout gate thresholds.", default_factory=GateSettings)
    _source_path: Path | None = PrivateAttr(default=None)
    _workdir: Path | None = PrivateAttr(default=None)  # output root (pipeline.paths); None: the current directory

    @field_validator("trtllm_version")
    @classmethod
    def _version_shape(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            raise ValueError(f"'{value}' is not a TensorRT-LLM version like '1.2.1'")
        return value

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, value: str) -> str:
        from pipeline.validate.hardware import PROFILES  # noqa: PLC0415 - hardware has no config import

        if value not in PROFILES:
            raise ValueError(f"unknown hardware profile '{value}'; valid: {', '.join(PROFILES)}")
        return value

    @model_validator(mode="after")
    def _cross_section_rules(self) -> "DeploymentConfig":
        problems: list[tuple[str, str]] = []
        spec = self.speculation
        if self.loadtest.sweep_draft_len:
            if isinstance(spec, DraftTargetSpec):
                too_long = [k for k in self.loadtest.sweep_draft_len if k > spec.engine_max_draft_len]
                if too_long:
                    problems.append(
                        (
                            "loadtest.sweep_draft_len",
                            f"{too_long} exceed the engine max_draft_len ({spec.engine_max_draft_len}); "
                            "raise speculation.max_draft_len",
                        )
                    )
            else:
                problems.append(
                    ("loadtest.sweep_draft_len", "only draft_target sends num_draft_tokens per request")
                )
        if isinstance(spec, DraftTargetSpec) and spec.orchestration == "engine":
            if self.backend != "reference":
                problems.append(
                    (
                        "speculation.orchestration",
                        "'engine' needs backend 'reference'; the TensorRT-LLM C++ backend drafts only "
                        "through tensorrt_llm_bls (use 'bls')",
                    )
                )
            if self.loadtest.sweep_draft_len:
                problems.append(
                    (
                        "loadtest.sweep_draft_len",
                        "needs speculation.orchestration 'bls' (num_draft_tokens is a BLS input; the "
                        "ensemble has none)",
                    )
                )
        if isinstance(spec, NgramSpec) and self.backend != "reference" and spec.min_matching_ngram_size != 1:
            problems.append(("speculation.min_matching_ngram_size",
                             "must be 1 on backend trtllm: TensorRT-LLM's NGramDecodingConfig has no lower bound "
                             "on the pattern length (tensorrt_llm/llmapi/llm_args.py; its NGramPoolManager in "
                             "tensorrt_llm/_torch/speculative/ngram.py tries every length down to 1); the knob "
                             "is the CPU reference engine's (vLLM prompt_lookup_min)"))
        if self.loadtest.mode == "closed":
            missing = [c for c in self.gate.target_concurrency if c not in self.loadtest.concurrency]
            if missing:
                problems.append(
                    (
                        "gate.target_concurrency",
                        f"{missing} are not load-test concurrency levels {self.loadtest.concurrency}",
                    )
                )
        if problems:
            raise CrossFieldError(problems)
        return self

    @model_validator(mode="after")
    def _serving_knob_rules(self) -> "DeploymentConfig":
        """Runtime knobs of the tensorrt_llm model that depend on the engine limits or the method."""
        t, problems = self.triton, []
        if t.max_attention_window_size is not None and t.max_attention_window_size > self.build.max_seq_len:
            problems.append(("triton.max_attention_window_size",
                             f"{t.max_attention_window_size} exceeds build.max_seq_len ({self.build.max_seq_len})"))
        if t.max_tokens_in_paged_kv_cache is not None and t.max_tokens_in_paged_kv_cache < self.build.max_seq_len:
            problems.append(("triton.max_tokens_in_paged_kv_cache",
                             f"{t.max_tokens_in_paged_kv_cache} tokens cannot hold one sequence of "
                             f"build.max_seq_len ({self.build.max_seq_len})"))
        if t.enable_chunked_context and isinstance(self.speculation, EagleSpec):
            problems.append(("triton.enable_chunked_context",
                             "EAGLE engines do not support chunked context (upstream's CI turns it off for EAGLE: "
                             "NVIDIA/TensorRT-LLM triton_backend/ci/L0_backend_trtllm/test.sh)"))
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def method(self) -> str:
        return self.speculation.method

    @property
    def trtllm_version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.trtllm_version.split(".") if p.isdigit())

    @property
    def runtime(self) -> str:
        """``trtllm_runtime`` as set, else engine up to 1.2.x and llm_api past it."""
        if self.trtllm_runtime is not None:
            return self.trtllm_runtime
        return "llm_api" if self.trtllm_version_tuple[:2] > ENGINE_RUNTIME_MAX_VERSION else "engine"

    @property
    def uses_llm_api(self) -> bool:
        """TensorRT-LLM's LLM API runs the deployment (GPU: no engine compile, ModelOpt checkpoints)."""
        return self.backend == "trtllm" and self.runtime == "llm_api"

    @property
    def serves_llmapi(self) -> bool:
        """The arms are Triton ``llmapi`` repositories (one ``tensorrt_llm`` model, text in and out,
        ``model.yaml``): TensorRT-LLM's LLM API on GPU, or the CPU reference engine behind the same
        layout when ``backend: reference`` sets ``trtllm_runtime: llm_api`` explicitly."""
        if self.backend == "reference":
            return self.trtllm_runtime == "llm_api"
        return self.uses_llm_api

    @property
    def draft(self) -> ModelSpec | None:
        return self.speculation.draft if isinstance(self.speculation, DraftTargetSpec) else None

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @property
    def workdir(self) -> Path | None:
        """Where ``engines/`` and ``reports/`` go (``--workdir``); None: the current directory."""
        return self._workdir


def ngram_through_bls(cfg: "DeploymentConfig") -> bool:
    """n-gram drafted by tensorrt_llm_bls and verified as external drafts (orchestration: bls)."""
    spec = cfg.speculation
    return isinstance(spec, NgramSpec) and spec.orchestration == "bls"


# ----------------------------------------------------------------------------------------------
# Loading

_METHOD_TAGS = ("none", "draft_target", "medusa", "eagle", "eagle3", "ngram", "mtp")


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    """Pydantic error location → ``a.b[0].c`` (union tags dropped, they are not user fields)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _METHOD_TAGS and out.endswith("speculation"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _message(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see `specdeploy schema`)"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid":
        return f"unknown method {err.get('input', {}).get('method')!r}; valid: {', '.join(_METHOD_TAGS)}"
    if kind == "union_tag_not_found":
        return f"needs a 'method' field: one of {', '.join(_METHOD_TAGS)}"
    return msg


def format_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        original = (err.get("ctx") or {}).get("error")
        if isinstance(original, CrossFieldError):
            lines.extend(f"{path}: {msg}" for path, msg in original.problems)
            continue
        lines.append(f"{_loc_to_path(tuple(err['loc']))}: {_message(err)}")
    return lines


def parse_config(data: Any, source: str = "<config>", workdir: str | Path | None = None) -> DeploymentConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of fields, got " + type(data).__name__])
    try:
        cfg = DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None
    return with_workdir(cfg, workdir)


_MERGE_TAG = "tag:yaml.org,2002:merge"

# Appended to docs/config-reference.md by `specdeploy schema --format markdown`.
LOADING_RULES_MARKDOWN = """\
## Strict loading: what `specdeploy validate` refuses

- **Unknown fields** are errors (a typo must not fall back to a default), as are values out of
  range; every problem is listed at once as `field.path: message`.
- **Duplicate keys**, at any depth: `loadtest.concurrency: duplicate key 'concurrency' at lines 9
  and 13`. Plain YAML loaders keep the last value without a word; the whole file is refused
  instead. Anchors, aliases and merge keys (`<<: *base`) keep working: a key written in a mapping
  overrides the one merged into it, as YAML's merge type defines, and is not a duplicate.
- **The prompt set** (`loadtest.prompts`) is read exactly as `loadtest` reads it, with or without
  `--offline`. An absolute path is used as written; a relative one is looked up under the working
  directory, then the project root, then the config file's directory (the first that exists wins,
  and the error lists all three). A directory must hold `<category>.jsonl` files, or the field
  names one such file; every non-blank line is a JSON object with `id` and a text `prompt`
  (`category` defaults to the file name). Errors name the file and line; unknown
  `loadtest.categories` are errors too.
- **Checkpoint directories** (`target.checkpoint`, `speculation.draft.checkpoint`,
  `speculation.heads_dir`, `speculation.head_dir`) must exist and be directories when `validate`
  runs without `--offline`, i.e. on the build host. A relative path is relative to the working
  directory, where `plan` and `build` make it absolute; the error names both forms. The target's
  directory is also the tokenizer directory `render` hands to `preprocessing` and `postprocessing`,
  so its `tokenizer.json` is required.
- **CPU ids** in a `reference.cpu_pinning` list must be CPUs this process may run on
  (`os.sched_getaffinity`, the mask `taskset`, cgroup cpusets and `docker --cpuset-cpus` set),
  `threads` of them per engine model of each arm (a draft-target speculative arm has two), with
  at least one allowed CPU left for the server. The error names the field, the ids and the allowed
  set. The check uses the host `validate` runs on: run it where you serve. With backend `trtllm`
  the list is ignored (a warning).
"""


class DuplicateKeyError(yaml.YAMLError):
    """One or more mappings name a key twice; ``problems`` holds one ``field.path: …`` line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping naming a key twice at any depth.

    PyYAML keeps the last value of a repeated key without a word, so a config edited in two places
    would run with whichever came last. The composed node tree is checked before anything is
    constructed, which keeps every key's line number. Keys brought in by a merge key (``<<: *x``)
    are not duplicates: the mapping's own keys override them, as YAML's merge type defines."""

    def construct_document(self, node: yaml.Node) -> Any:
        problems: list[tuple[int, str]] = []  # (line of the repeat, message), reported in file order
        self._find_duplicates(node, "", problems, set())
        if problems:
            raise DuplicateKeyError([message for _, message in sorted(problems)])
        return super().construct_document(node)

    def _find_duplicates(self, node: yaml.Node, path: str, problems: list, visited: set[int]) -> None:
        if id(node) in visited:  # an alias: checked where its anchor was defined
            return
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._find_duplicates(item, f"{path}[{index}]", problems, visited)
        elif isinstance(node, yaml.MappingNode):
            self._check_mapping(node, path, problems, visited)

    def _check_mapping(self, node: yaml.MappingNode, path: str, problems: list, visited: set[int]) -> None:
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:  # merged keys belong to this mapping's own path
                self._find_duplicates(value_node, path, problems, visited)
                key: Any = "<<"
            else:
                key = self._key_of(key_node)
                self._find_duplicates(value_node, f"{path}.{key}" if path else str(key), problems, visited)
            if key in first_line:
                where = f"{path}.{key}" if path else str(key)
                problems.append((line, f"{where}: duplicate key '{key}' at lines {first_line[key]} and {line} "
                                 "(YAML would silently keep the last value; keep one)"))
            else:
                first_line[key] = line

    def _key_of(self, key_node: yaml.Node) -> Any:
        """The key as the constructor will build it (``1`` and ``0x1`` are one key), or its text."""
        if isinstance(key_node, yaml.ScalarNode):
            try:
                key = self.construct_object(key_node)
                hash(key)
                return key
            except (yaml.YAMLError, TypeError, ValueError):
                return key_node.value
        return f"<{key_node.id} key at line {key_node.start_mark.line + 1}>"  # never equal to another


def load_yaml_strict(text: str) -> Any:
    """Parse YAML text with :class:`StrictLoader` (raises :class:`DuplicateKeyError`, ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader


def load_config(path: str | Path, workdir: str | Path | None = None) -> DeploymentConfig:
    """The validated config of the YAML file ``path``; every output of it goes under ``workdir``
    (``engines/NAME/``, ``reports/NAME/``; default: the current directory, see :mod:`pipeline.paths`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [f"(file): no such config file: {path}"])
    try:
        data = load_yaml_strict(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise ConfigError(str(path), exc.problems) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(str(path), [f"(yaml){where}: {getattr(exc, 'problem', exc)}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["(file): not UTF-8 text"]) from None
    cfg = parse_config(data, str(path))
    cfg._source_path = path.resolve()
    return with_workdir(cfg, workdir)


def with_workdir(cfg: DeploymentConfig, workdir: str | Path | None) -> DeploymentConfig:
    """``cfg`` with its outputs under ``workdir`` (absolute; None keeps the current directory)."""
    cfg._workdir = None if workdir is None else Path(workdir).absolute()
    return cfg


def config_hash(cfg: DeploymentConfig) -> str:
    """Stable hash of the validated config (defaults filled) — stamps every stage output."""
    canonical = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
