"""Deployment configuration: the YAML a platform engineer writes once, as pydantic v2 models.

Reads a YAML file (``load_config``) and returns a validated :class:`DeploymentConfig`. Every
problem in the file is reported at once as ``field.path: message`` lines inside a
:class:`ConfigError`; no work starts on an invalid file. Later stages derive every path from
the config (``engines/<name>/…``, ``reports/<name>/…``) and stamp their outputs with
:func:`config_hash` so stale inputs can be refused. Cross-field *logic* that needs no files
lives here (validators); checks that read checkpoints or hardware live in ``pipeline.preflight``.
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
    field_validator,
    model_validator,
)

from pipeline.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
TRTLLM_VERSION_DEFAULT = "1.2.1"

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


class _Strict(BaseModel):
    """Base: unknown keys are errors (a typo must not silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class Quantization(_Strict):
    format: QuantFormat = "none"
    kv_cache_dtype: KvCacheDtype = "auto"
    calibration_dataset: str = "cnn_dailymail"
    calibration_size: Annotated[int, Field(gt=0, le=100_000)] = 512
    awq_block_size: Literal[64, 128] = 128


class ModelSpec(_Strict):
    """A model to serve: an HF checkpoint directory or a ``builtin:`` demo model."""

    checkpoint: str
    dtype: ModelDtype = "bfloat16"
    quantization: Quantization = Quantization()
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    pp: Annotated[int, Field(ge=1, le=64)] = 1
    trust_remote_code: bool = False

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


class NoSpeculation(_Strict):
    method: Literal["none"] = "none"


class DraftTargetSpec(_Strict):
    """Draft-target (TensorRT-LLM ``draft_tokens_external``): a smaller model proposes K tokens."""

    method: Literal["draft_target"]
    draft: ModelSpec
    num_draft_tokens: Annotated[int, Field(ge=1, le=32)] = 4
    max_draft_len: Annotated[int, Field(ge=1, le=32)] | None = None  # engine limit; default K
    use_draft_logits: bool = False

    @property
    def engine_max_draft_len(self) -> int:
        return self.max_draft_len if self.max_draft_len is not None else self.num_draft_tokens


class MedusaSpec(_Strict):
    method: Literal["medusa"]
    heads_dir: str
    num_heads: Annotated[int, Field(ge=1, le=8)] = 4
    choices: TreeChoices | None = None  # None = one chain of num_heads
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = None  # default: node count

    @property
    def engine_max_draft_len(self) -> int:
        if self.max_draft_len is not None:
            return self.max_draft_len
        return len(self.choices) if self.choices else self.num_heads


class EagleSpec(_Strict):
    method: Literal["eagle"]
    head_dir: str
    num_layers: Annotated[int, Field(ge=1, le=8)] = 4  # EAGLE-1 draft depth (tree depth)
    choices: TreeChoices | None = None  # None = one chain of num_layers
    max_draft_len: Annotated[int, Field(ge=1, le=256)] | None = None
    max_non_leaves_per_layer: Annotated[int, Field(ge=1, le=64)] = 10

    @property
    def engine_max_draft_len(self) -> int:
        if self.max_draft_len is not None:
            return self.max_draft_len
        return len(self.choices) if self.choices else self.num_layers


Speculation = Annotated[
    Union[NoSpeculation, DraftTargetSpec, MedusaSpec, EagleSpec],
    Field(discriminator="method"),
]


class BuildLimits(_Strict):
    max_batch_size: Annotated[int, Field(ge=1, le=4096)] = 8
    max_input_len: Annotated[int, Field(ge=1)] = 1024
    max_seq_len: Annotated[int, Field(ge=2)] = 2048
    max_num_tokens: Annotated[int, Field(ge=1)] = 8192
    max_beam_width: Annotated[int, Field(ge=1, le=8)] = 1
    gather_generation_logits: bool = False
    workers: Annotated[int, Field(ge=1)] | None = None  # trtllm-build --workers; default TP×PP

    @model_validator(mode="after")
    def _lengths_consistent(self) -> "BuildLimits":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(
                f"max_input_len ({self.max_input_len}) must be below max_seq_len "
                f"({self.max_seq_len}) to leave room for generated tokens"
            )
        return self


class TritonSettings(_Strict):
    host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=1, le=65535)] = 8000
    grpc_port: Annotated[int, Field(ge=1, le=65535)] = 8001
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 8002
    decoupled: bool = True  # streaming; forced false for draft-target's LLM models (upstream BLS)
    max_queue_delay_microseconds: Annotated[int, Field(ge=0)] = 0
    max_queue_size: Annotated[int, Field(ge=0)] = 0
    preprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = 1
    postprocessing_instance_count: Annotated[int, Field(ge=1, le=64)] = 1
    bls_instance_count: Annotated[int, Field(ge=1, le=64)] = 1
    kv_cache_free_gpu_mem_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9
    batching_strategy: Literal["inflight_fused_batching", "inflight_batching", "V1"] = (
        "inflight_fused_batching"
    )
    batch_scheduler_policy: Literal["max_utilization", "guaranteed_no_evict"] = "guaranteed_no_evict"
    enable_kv_cache_reuse: bool = True
    exclude_input_in_output: bool = False
    container_image: str = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    startup_timeout_s: Annotated[float, Field(gt=0)] = 180.0
    exit_timeout_s: Annotated[float, Field(gt=0)] = 5.0

    @model_validator(mode="after")
    def _distinct_ports(self) -> "TritonSettings":
        ports = [self.http_port, self.grpc_port, self.metrics_port]
        if len(set(ports)) != 3:
            raise ValueError(f"http_port, grpc_port and metrics_port must differ, got {ports}")
        return self


class Sampling(_Strict):
    """Sampling sent identically to both arms. top_k=1 (the default) is greedy."""

    temperature: Annotated[float, Field(gt=0, le=10)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 1
    top_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    seed: Annotated[int, Field(ge=0)] = 0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or (self.top_k == 0 and self.top_p <= 0)


class LoadTestSettings(_Strict):
    transport: Literal["grpc", "http"] = "grpc"
    mode: Literal["closed", "open"] = "closed"
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = [1, 2, 4, 8]
    request_rate: list[Annotated[float, Field(gt=0)]] = []  # open loop: requests/s per level
    duration_s: Annotated[float, Field(gt=0)] = 20.0
    warmup_s: Annotated[float, Field(ge=0)] = 2.0
    repeats: Annotated[int, Field(ge=1, le=50)] = 3
    max_tokens: Annotated[int, Field(ge=1)] = 64
    prompts: str = "loadtests/prompts"  # a directory of <category>.jsonl files, or one file
    categories: list[str] = []  # empty = every category found
    sampling: Sampling = Sampling()
    processes: Annotated[int, Field(ge=1, le=64)] = 1
    stop_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    sweep_draft_len: list[Annotated[int, Field(ge=1, le=32)]] = []
    seed: int = 1234

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
        if self.mode == "open" and not self.request_rate:
            raise ValueError("mode 'open' needs request_rate levels (requests/s)")
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"warmup_s ({self.warmup_s}) must be shorter than duration_s ({self.duration_s})")
        return self


class Slo(_Strict):
    ttft_ms: Annotated[float, Field(gt=0)] = 1000.0
    tpot_ms: Annotated[float, Field(gt=0)] = 100.0


class GateSettings(_Strict):
    """The rollout gate (load-testing.md §5.4). Thresholds are product settings."""

    target_concurrency: list[Annotated[int, Field(ge=1)]] = []  # empty = the lowest level
    tpot_ratio_max: Annotated[float, Field(gt=0)] = 0.9  # CI upper bound of spec/base median TPOT
    e2e_ratio_max: Annotated[float, Field(gt=0)] = 0.9
    ttft_p95_delta_ms_max: Annotated[float, Field(ge=0)] = 250.0
    ttft_p95_delta_pct_max: Annotated[float, Field(ge=0)] = 50.0
    peak_throughput_ratio_min: Annotated[float, Field(gt=0)] = 0.95
    max_error_rate_delta: Annotated[float, Field(ge=0, le=1)] = 0.001
    min_requests_per_cell: Annotated[int, Field(ge=1)] = 20
    min_runs: Annotated[int, Field(ge=1)] = 2
    min_acceptance_rate: Annotated[float, Field(ge=0, le=1)] = 0.5
    require_output_equivalence: bool = True
    achieved_concurrency_tolerance: Annotated[float, Field(ge=0, le=1)] = 0.05
    slo: Slo = Slo()
    bootstrap_resamples: Annotated[int, Field(ge=100)] = 9999
    bootstrap_seed: int = 0
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05


class ReferenceEngineSettings(_Strict):
    """CPU reference engine knobs (backend: reference)."""

    threads: Annotated[int, Field(ge=1, le=64)] = 1
    max_batch_size: Annotated[int, Field(ge=1, le=256)] | None = None  # default build.max_batch_size
    prefix_cache_entries: Annotated[int, Field(ge=0, le=4096)] = 64
    compute_dtype: Literal["float32", "float64"] = "float32"


class DeploymentConfig(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
    description: str = ""
    backend: Literal["trtllm", "reference"] = "trtllm"
    hardware: str = "h100-sxm-80gb"
    trtllm_version: str = TRTLLM_VERSION_DEFAULT
    # TensorRT-LLM source/examples root holding examples/…/convert_checkpoint.py (NGC container path)
    trtllm_root: str = "/app/tensorrt_llm"
    target: ModelSpec
    speculation: Speculation = NoSpeculation()
    build: BuildLimits = BuildLimits()
    triton: TritonSettings = TritonSettings()
    reference: ReferenceEngineSettings = ReferenceEngineSettings()
    loadtest: LoadTestSettings = LoadTestSettings()
    gate: GateSettings = GateSettings()
    _source_path: Path | None = PrivateAttr(default=None)

    @field_validator("trtllm_version")
    @classmethod
    def _version_shape(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            raise ValueError(f"'{value}' is not a TensorRT-LLM version like '1.2.1'")
        return value

    @property
    def method(self) -> str:
        return self.speculation.method

    @property
    def trtllm_version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.trtllm_version.split(".") if p.isdigit())

    @property
    def draft(self) -> ModelSpec | None:
        return self.speculation.draft if isinstance(self.speculation, DraftTargetSpec) else None


# ----------------------------------------------------------------------------------------------
# Loading


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    """Pydantic error location → ``a.b[0].c`` (union tags dropped, they are not user fields)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("none", "draft_target", "medusa", "eagle") and out.endswith("speculation"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def format_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see `specdeploy schema`)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{_loc_to_path(tuple(err['loc']))}: {msg}")
    return lines


def parse_config(data: Any, source: str = "<config>") -> DeploymentConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of fields, got " + type(data).__name__])
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None


def load_config(path: str | Path) -> DeploymentConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [f"(file): no such config file: {path}"])
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(str(path), [f"(yaml){where}: {getattr(exc, 'problem', exc)}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["(file): not UTF-8 text"]) from None
    cfg = parse_config(data, str(path))
    cfg._source_path = path.resolve()
    return cfg


def config_hash(cfg: DeploymentConfig) -> str:
    """Stable hash of the validated config (defaults filled) — stamps every stage output."""
    canonical = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
