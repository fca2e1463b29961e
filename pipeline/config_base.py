"""The building blocks every config section shares: strict pydantic models, described fields,
cross-field errors, quantization and one model (:class:`ModelSpec`), tree choices.

Reads and writes nothing. Imported by the config sections (:mod:`pipeline.config.sections`), the
speculation methods' sections (``pipeline/methods/<name>.py``) and :mod:`pipeline.config.deployment`;
it imports no other part of the project but ``pipeline.errors``-free helpers (``pipeline.infra.trees``).
It sits outside the config package so that a method module imports it without loading the config,
which reads the methods' registry (:data:`pipeline.methods.METHODS`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.infra.trees import brace_choices as format_choices  # noqa: F401 - public name of the config
from pipeline.infra.trees import chain_choices, tree_depth, tree_non_leaves_per_level, tree_problems  # noqa: F401 - public names of the config

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


def described(text: str, **kwargs: Any) -> Any:
    return Field(description=text, **kwargs)


class Section(BaseModel):
    """Base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class CrossFieldError(ValueError):
    """Raised by model validators that know the exact field paths of their problems."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{path}: {msg}" for path, msg in problems))


class Quantization(Section):
    """Weight / activation / KV-cache quantization (ModelOpt ``quantize.py``)."""

    format: QuantFormat = described(
        "Weight format: none (model dtype), fp8, int8_sq, int4_awq, w4a8_awq, nvfp4, int8_wo, int4_wo. "
        "Gated by the hardware architecture (see `specdeploy validate`).",
        default="none",
    )
    kv_cache_dtype: KvCacheDtype = described(
        "KV-cache dtype; auto = the model dtype. fp8/int8 can silently disable paged context FMHA.",
        default="auto",
    )
    calibration_dataset: str = described(
        "Calibration set for quantize.py --calib_dataset (HF name or local directory).", default="cnn_dailymail"
    )
    calibration_size: Annotated[int, Field(gt=0, le=100_000)] = described(
        "Calibration samples (--calib_size); AWQ caps it at 32.", default=512
    )
    awq_block_size: Literal[64, 128] = described("AWQ group size (--awq_block_size).", default=128)


class ModelSpec(Section):
    """A model to serve: an HF checkpoint directory or a ``builtin:`` demo model."""

    checkpoint: str = described(
        "Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json) or "
        "'builtin:<name>' for a demo model (tiny-target, tiny-draft)."
    )
    dtype: ModelDtype = described("Dtype of the unquantized parts (--dtype).", default="bfloat16")
    quantization: Quantization = described("Quantization settings.", default_factory=Quantization)
    tp: Annotated[int, Field(ge=1, le=64)] = described(
        "Tensor-parallel size (must divide the KV-head count).", default=1
    )
    pp: Annotated[int, Field(ge=1, le=64)] = described("Pipeline-parallel size (EAGLE needs 1).", default=1)
    trust_remote_code: bool = described("Allow custom model code from the checkpoint.", default=False)

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
    def world_size(self) -> int:
        return self.tp * self.pp



TreeChoices = list[list[Annotated[int, Field(ge=0)]]]


def check_tree(choices: TreeChoices | None) -> TreeChoices | None:
    if choices is None:
        return None
    problems = tree_problems(choices)
    if problems:
        raise ValueError("; ".join(problems))
    return choices
class TreeDrafts:
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
