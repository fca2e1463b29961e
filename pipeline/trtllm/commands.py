"""Per-version TensorRT-LLM command builders: argv lists for ModelOpt ``quantize.py``, the
per-model ``convert_checkpoint.py`` converters (Llama, Medusa, EAGLE) and ``trtllm-build``.

Reads nothing and writes nothing: each function returns an argv list (never a shell string).
Example paths moved from ``examples/llama/`` (≤ 0.18)
to ``examples/models/core/llama/`` (≥ 0.19); the 1.x Medusa converter takes ``--model_type`` and
``--medusa_hidden_act``; boolean plugin flags take ``enable``/``disable``; every build names its
timing cache. :data:`BUILD_FLAGS` is the allow-list every ``trtllm-build`` argv is checked against,
so a flag the pinned version does not accept is a programming error caught at plan time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ConfigError

PYTHON = "python3"  # the interpreter inside the NGC container
TRTLLM_BUILD = "trtllm-build"
SUPPORTED_RANGE = ((0, 17), (1, 2))  # inclusive major.minor bounds of the engine path

# ModelOpt --qformat → checkpoint/engine config.json quantization.quant_algo
# (TensorRT-LLM tensorrt_llm/quantization/quantize_by_modelopt.py, tensorrt_llm/quantization/mode.py QuantAlgo)
QUANT_ALGO = {
    "none": None,
    "fp8": "FP8",
    "int8_sq": "W8A8_SQ_PER_CHANNEL",
    "int4_awq": "W4A16_AWQ",
    "w4a8_awq": "W4A8_AWQ",
    "int8_wo": "W8A16",
    "int4_wo": "W4A16",
    "nvfp4": "NVFP4",
}
KV_CACHE_QUANT_ALGO = {"fp8": "FP8", "int8": "INT8"}
AWQ_MAX_CALIB_SIZE = 32

# trtllm-build flags accepted by 0.17 … 1.2.x that this project emits (tensorrt_llm/commands/build.py).
BUILD_FLAGS = frozenset(
    {
        "--checkpoint_dir", "--output_dir", "--output_timing_cache", "--gemm_plugin",
        "--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens",
        "--max_beam_width", "--use_paged_context_fmha", "--multiple_profiles", "--workers",
        "--speculative_decoding_mode", "--max_draft_len", "--gather_generation_logits",
    }
)


@dataclass(frozen=True)
class Version:
    """A TensorRT-LLM version as ``(major, minor)`` with the layout facts that depend on it."""

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> "Version":
        parts = text.split(".")
        version = cls(int(parts[0]), int(parts[1]))
        low, high = SUPPORTED_RANGE
        if not (low <= version.tuple <= high):
            raise ConfigError(
                "trtllm_version",
                [f"trtllm_version: {text} is outside the supported engine path 0.17 … 1.2.x"],
            )
        return version

    @property
    def tuple(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def llama_example_dir(self) -> str:
        return "examples/llama" if self.tuple <= (0, 18) else "examples/models/core/llama"

    @property
    def is_1x(self) -> bool:
        return self.major >= 1


def _script(root: str, relative: str) -> list[str]:
    return [PYTHON, str(Path(root) / relative)]


def _parallel_flags(tp: int, pp: int | None) -> list[str]:
    flags = ["--tp_size", str(tp)]
    if pp is not None:
        flags += ["--pp_size", str(pp)]
    return flags


def convert_llama(
    version: Version, root: str, *, model_dir: str, output_dir: str, dtype: str, tp: int, pp: int
) -> list[str]:
    """HF Llama → TRT-LLM checkpoint (unquantized)."""
    return _script(root, f"{version.llama_example_dir}/convert_checkpoint.py") + [
        "--model_dir", model_dir, "--output_dir", output_dir, "--dtype", dtype,
        *_parallel_flags(tp, pp), "--workers", str(tp * pp),
    ]


def modelopt_qformat(fmt: str) -> str:
    return "full_prec" if fmt == "none" else fmt


def quantize_modelopt(
    version: Version,
    root: str,
    *,
    model_dir: str,
    output_dir: str,
    dtype: str,
    qformat: str,
    kv_cache_dtype: str,
    calib_dataset: str,
    calib_size: int,
    awq_block_size: int,
    tp: int,
    pp: int,
    extra: list[str] | None = None,
) -> list[str]:
    """HF model → quantized TRT-LLM checkpoint with ModelOpt ``examples/quantization/quantize.py``."""
    qf = modelopt_qformat(qformat)
    argv = _script(root, "examples/quantization/quantize.py") + [
        "--model_dir", model_dir, "--output_dir", output_dir, "--dtype", dtype, "--qformat", qf,
    ]
    if kv_cache_dtype in KV_CACHE_QUANT_ALGO:
        argv += ["--kv_cache_dtype", kv_cache_dtype]
    if "awq" in qf:
        argv += ["--calib_size", str(min(calib_size, AWQ_MAX_CALIB_SIZE)), "--awq_block_size", str(awq_block_size)]
    else:
        argv += ["--calib_size", str(calib_size)]
    argv += ["--calib_dataset", calib_dataset, *_parallel_flags(tp, pp)]
    return argv + list(extra or [])


def medusa_quantize_extra(version: Version, *, heads_dir: str, num_heads: int, max_draft_len: int) -> list[str]:
    """The Medusa arguments of ModelOpt ``quantize.py`` (FP8 base, unquantized heads)."""
    return [
        "--medusa_model_dir", heads_dir, "--num_medusa_heads", str(num_heads),
        "--num_medusa_layers", "1", "--max_draft_len", str(max_draft_len),
        "--medusa_hidden_act", "silu",
    ]


def convert_medusa(
    version: Version,
    root: str,
    *,
    model_dir: str,
    heads_dir: str | None,
    output_dir: str,
    dtype: str,
    num_heads: int,
    max_draft_len: int,
    tp: int,
) -> list[str]:
    """Base + Medusa heads → one ``MedusaForCausalLM`` checkpoint (``heads_dir`` None: a
    pre-quantized ModelOpt checkpoint that already holds the heads)."""
    argv = _script(root, "examples/medusa/convert_checkpoint.py") + ["--model_dir", model_dir]
    if heads_dir is not None:
        argv += ["--medusa_model_dir", heads_dir]
    argv += [
        "--output_dir", output_dir, "--dtype", dtype, "--num_medusa_heads", str(num_heads),
        "--num_medusa_layers", "1", "--max_medusa_token_len", str(max_draft_len),
    ]
    if version.is_1x:
        argv += ["--model_type", "llama", "--medusa_hidden_act", "silu"]
    return argv + ["--tp_size", str(tp), "--workers", str(tp)]


def quantize_eagle(
    version: Version,
    root: str,
    *,
    model_dir: str,
    head_dir: str,
    output_dir: str,
    head_layers: int,
    kv_cache_dtype: str,
    calib_dataset: str,
    calib_size: int,
) -> list[str]:
    """Base + EAGLE head → one FP8 ModelOpt (HF-format) checkpoint, the only quantized EAGLE route.

    ``--eagle_num_layers`` is the number of decoder layers *in the EAGLE checkpoint* (the script
    copies ``layers.{i}.*`` for each; EAGLE-1 heads have one), not the tree depth, which goes to
    ``convert_checkpoint.py --num_eagle_layers`` (TensorRT-LLM ``examples/eagle/quantize.py``)."""
    argv = _script(root, "examples/eagle/quantize.py") + [
        "--model_dir", model_dir, "--eagle_model_dir", head_dir, "--eagle_num_layers", str(head_layers),
        "--qformat", "fp8",
    ]
    if kv_cache_dtype == "fp8":
        argv += ["--kv_cache_dtype", "fp8"]
    return argv + ["--calib_dataset", calib_dataset, "--calib_size", str(calib_size), "--output_dir", output_dir]


def convert_eagle(
    version: Version,
    root: str,
    *,
    model_dir: str,
    head_dir: str | None,
    output_dir: str,
    dtype: str,
    max_draft_len: int,
    num_layers: int,
    max_non_leaves_per_layer: int,
    tp: int,
) -> list[str]:
    """Base + EAGLE head → one ``EagleForCausalLM`` checkpoint (``head_dir`` None: a ModelOpt
    checkpoint from :func:`quantize_eagle`)."""
    argv = _script(root, "examples/eagle/convert_checkpoint.py") + ["--model_dir", model_dir]
    if head_dir is not None:
        argv += ["--eagle_model_dir", head_dir]
    return argv + [
        "--output_dir", output_dir, "--dtype", dtype, "--max_draft_len", str(max_draft_len),
        "--num_eagle_layers", str(num_layers), "--max_non_leaves_per_layer", str(max_non_leaves_per_layer),
        "--tp_size", str(tp), "--workers", str(tp),
    ]


@dataclass(frozen=True)
class BuildOptions:
    """What one ``trtllm-build`` call needs beyond its directories."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    max_beam_width: int
    workers: int
    gemm_plugin: str | None  # None: leave the GEMM plugin off (FP8 / NVFP4 weights)
    speculative_decoding_mode: str | None = None  # draft_tokens_external | medusa | eagle
    max_draft_len: int = 0
    gather_generation_logits: bool = False
    paged_context_fmha: bool = True  # False only where the KV dtype makes the builder drop it anyway


# Weight formats whose engines keep FP8 context FMHA, which FP8 paged context FMHA needs; the 1.x
# builder (tensorrt_llm/builder.py build()) switches use_paged_context_fmha off for FP8 KV with any
# other weights or below sm89, and for INT8 KV always.
FP8_CONTEXT_FMHA_FORMATS = ("fp8", "w4a8_awq", "nvfp4")


def paged_context_fmha_survives(qformat: str, kv_cache_dtype: str, sm: int) -> bool:
    """False when trtllm-build turns ``--use_paged_context_fmha enable`` off for this KV dtype."""
    if kv_cache_dtype == "int8":
        return False
    if kv_cache_dtype == "fp8":
        return qformat in FP8_CONTEXT_FMHA_FORMATS and sm >= 89
    return True


FP8_GEMM_PLUGIN_MAX_BATCH = 4


def gemm_plugin_for(qformat: str, max_batch_size: int) -> str | None:
    """``auto`` for FP16/BF16 and weight-only/AWQ; for FP8 off, except ``fp8`` at batch ≤ 4 where
    the FP8 GEMM plugin is the low-latency choice; off for NVFP4 (TensorRT-LLM performance tuning
    guide, "useful build-time flags": GEMM plugin, "FP8 GEMM Plugin for Small Batch Size")."""
    if qformat == "fp8":
        return "fp8" if max_batch_size <= FP8_GEMM_PLUGIN_MAX_BATCH else None
    return None if qformat == "nvfp4" else "auto"


def trtllm_build(
    version: Version, *, checkpoint_dir: str, output_dir: str, timing_cache: str, options: BuildOptions
) -> list[str]:
    """TRT-LLM checkpoint → engine dir (``config.json`` + ``rank*.engine``)."""
    o = options
    argv = [TRTLLM_BUILD, "--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir]
    if o.gemm_plugin is not None:
        argv += ["--gemm_plugin", o.gemm_plugin]
    argv += [
        "--max_batch_size", str(o.max_batch_size), "--max_input_len", str(o.max_input_len),
        "--max_seq_len", str(o.max_seq_len), "--max_num_tokens", str(o.max_num_tokens),
        "--max_beam_width", str(o.max_beam_width),
        "--use_paged_context_fmha", "enable" if o.paged_context_fmha else "disable", "--multiple_profiles", "enable",
    ]
    if o.speculative_decoding_mode is not None:
        argv += ["--speculative_decoding_mode", o.speculative_decoding_mode]
        if o.max_draft_len > 0:
            argv += ["--max_draft_len", str(o.max_draft_len)]
    if o.gather_generation_logits:
        argv.append("--gather_generation_logits")
    argv += ["--workers", str(o.workers), "--output_timing_cache", timing_cache]
    check_build_flags(argv)
    return argv


def check_build_flags(argv: list[str]) -> None:
    unknown = [a for a in argv[1:] if a.startswith("--") and a not in BUILD_FLAGS]
    if unknown:
        raise AssertionError(f"trtllm-build flags outside the allow-list: {unknown}")
