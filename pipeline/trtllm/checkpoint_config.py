"""Check a TensorRT-LLM checkpoint (``config.json`` + ``rank*.safetensors``) before ``trtllm-build``.

``quantize.py`` and the ``convert_checkpoint.py`` scripts write the checkpoint that the engine
build reads; its ``quantization`` block decides the engine's weight and KV-cache formats. A
checkpoint whose ``kv_cache_quant_algo`` differs from the plan (ModelOpt exports have been seen to
carry FP8 KV on an INT4-AWQ checkpoint) would build an engine with another KV dtype, and with
``--use_paged_context_fmha`` silently switched off; checking here stops the build before it spends
the time. Reads the directory; writes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import BuildError
from pipeline.trtllm.engine_config import read_config_json


@dataclass(frozen=True)
class ExpectedCheckpoint:
    """What the plan asked the quantize / convert step for; attached to that step."""

    role: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    tp: int
    pp: int
    architecture: str | None = None  # MedusaForCausalLM / EagleForCausalLM when it matters
    num_medusa_heads: int | None = None
    num_eagle_layers: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quant_problems(config: dict, exp: ExpectedCheckpoint) -> list[str]:
    quant = config.get("quantization") or {}
    problems = []
    if quant.get("quant_algo") != exp.quant_algo:
        problems.append(f"quantization.quant_algo is {quant.get('quant_algo')!r}, the plan expects {exp.quant_algo!r}")
    if quant.get("kv_cache_quant_algo") != exp.kv_cache_quant_algo:
        problems.append(
            f"quantization.kv_cache_quant_algo is {quant.get('kv_cache_quant_algo')!r}, the plan expects "
            f"{exp.kv_cache_quant_algo!r} (the engine would get that KV-cache dtype; re-run the step with the "
            "configured kv_cache_dtype, or set quantization.kv_cache_dtype to match)"
        )
    return problems


def _layout_problems(directory: Path, config: dict, exp: ExpectedCheckpoint) -> list[str]:
    mapping = config.get("mapping") or {}
    tp, pp = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
    problems = []
    if (tp, pp) != (exp.tp, exp.pp):
        problems.append(f"mapping is tp={tp} pp={pp}, the plan expects tp={exp.tp} pp={exp.pp}")
    found = sorted(p.name for p in directory.glob("rank*.safetensors"))
    wanted = [f"rank{r}.safetensors" for r in range(exp.tp * exp.pp)]
    if found != wanted:
        problems.append(f"weight files {found} do not match tp×pp = {exp.tp * exp.pp} (expected {wanted})")
    return problems


def _model_problems(config: dict, exp: ExpectedCheckpoint) -> list[str]:
    problems = []
    if exp.architecture and config.get("architecture") != exp.architecture:
        problems.append(f"architecture is {config.get('architecture')!r}, the plan expects {exp.architecture}")
    for key, wanted in (("num_medusa_heads", exp.num_medusa_heads), ("num_eagle_layers", exp.num_eagle_layers)):
        if wanted is not None and config.get(key) != wanted:
            problems.append(f"{key} is {config.get(key)!r}, the plan expects {wanted}")
    return problems


def checkpoint_problems(directory: Path, exp: ExpectedCheckpoint) -> list[str]:
    """Every way the checkpoint in ``directory`` differs from ``exp`` (empty: it matches)."""
    config, problems = read_config_json(Path(directory) / "config.json")
    if config is None:
        return problems
    return _quant_problems(config, exp) + _layout_problems(Path(directory), config, exp) + _model_problems(config, exp)


def validate_checkpoint_dir(directory: Path, exp: ExpectedCheckpoint, step: str = "") -> None:
    """Raise :class:`BuildError` naming every mismatch, before any engine is built from it."""
    problems = checkpoint_problems(directory, exp)
    if problems:
        where = f"step {step}: " if step else ""
        raise BuildError(
            f"{where}the {exp.role} checkpoint does not match the plan, so trtllm-build was not started:\n  "
            + "\n  ".join(problems)
        )
