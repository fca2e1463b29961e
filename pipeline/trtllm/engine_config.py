"""Post-build validation of a TensorRT-LLM engine directory (``config.json`` + ``rank*.engine``).

``trtllm-build`` silently adjusts settings (TensorRT-LLM ``tensorrt_llm/builder.py`` ``build()``): FP8/INT8 KV cache switches paged
context FMHA off, ``max_draft_len`` falls back to the checkpoint, quantization follows the
checkpoint, … This module reads the built ``config.json`` and compares it with what the plan asked
for (:class:`ExpectedEngine`), returning one line per mismatch (:func:`engine_problems`) or raising
a :class:`BuildError` that names each one (:func:`validate_engine_dir`). Reads only; writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import BuildError

# build_config.speculative_decoding_mode is an integer bit flag (SpeculativeDecodingMode in
# tensorrt_llm/models/modeling_utils.py); names are accepted too.
SPEC_MODE_BITS = {
    "none": 1,
    "draft_tokens_external": 2,
    "medusa": 4,
    "lookahead_decoding": 8,
    "explicit_draft_tokens": 16,
    "eagle": 32,
}


@dataclass(frozen=True)
class ExpectedEngine:
    """What the plan asked ``trtllm-build`` for; attached to each build step."""

    role: str  # baseline | target | draft | speculative
    speculative_decoding_mode: str  # a key of SPEC_MODE_BITS
    max_draft_len: int  # 0 = no draft tokens
    paged_context_fmha: bool  # required on
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    tp: int
    pp: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int  # as requested; the builder may add the draft length
    gather_generation_logits: bool
    version: str
    architecture: str | None = None  # MedusaForCausalLM / EagleForCausalLM when it matters
    num_medusa_heads: int | None = None
    num_eagle_layers: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ExpectedEngine":
        return cls(**data)


def _mode_name(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        names = [name for name, bit in SPEC_MODE_BITS.items() if bit == value]
        return names[0] if names else None
    if isinstance(value, str):
        key = value.strip().lower().removeprefix("speculativedecodingmode.")
        return key if key in SPEC_MODE_BITS else None
    return None


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() in ("enable", "true", "1")
    return bool(value)


def _version_matches(engine_version: Any, wanted: str) -> bool:
    if not isinstance(engine_version, str):
        return False
    got = engine_version.split(".")
    return got[: len(wanted.split("."))] == wanted.split(".")


def _format_problems(data: Any) -> list[str]:
    if not isinstance(data, dict):
        return ["config.json is not a JSON object"]
    if "builder_config" in data and "version" not in data:
        return ["old-format engine (builder_config, no version): rebuild it with the pinned TensorRT-LLM"]
    missing = [key for key in ("version", "pretrained_config", "build_config") if not isinstance(data.get(key), (str, dict))]
    return [f"config.json lacks '{key}'" for key in missing]


def _mode_problems(build: dict, pretrained: dict, exp: ExpectedEngine) -> list[str]:
    problems = []
    raw_mode = build.get("speculative_decoding_mode", 1)
    mode = _mode_name(raw_mode)
    if mode != exp.speculative_decoding_mode:
        problems.append(
            f"build_config.speculative_decoding_mode is {raw_mode!r} ({mode or 'unknown'}), "
            f"expected {exp.speculative_decoding_mode} ({SPEC_MODE_BITS[exp.speculative_decoding_mode]})"
        )
    draft_len = build.get("max_draft_len", 0) or 0
    if exp.max_draft_len > 0 and draft_len < exp.max_draft_len:
        problems.append(f"build_config.max_draft_len is {draft_len}, expected at least {exp.max_draft_len}")
    if exp.max_draft_len == 0 and draft_len:
        problems.append(f"build_config.max_draft_len is {draft_len}, expected 0 (no speculation on the {exp.role} engine)")
    if exp.speculative_decoding_mode == "eagle" and draft_len > 256:
        problems.append(f"build_config.max_draft_len is {draft_len}, EAGLE allows at most 256")
    if _as_bool(build.get("gather_context_logits", False)) and draft_len > 0:
        problems.append("build_config.gather_context_logits is on with max_draft_len > 0")
    if exp.architecture and pretrained.get("architecture") != exp.architecture:
        problems.append(f"pretrained_config.architecture is {pretrained.get('architecture')!r}, expected {exp.architecture}")
    if exp.num_medusa_heads is not None and pretrained.get("num_medusa_heads") != exp.num_medusa_heads:
        problems.append(f"pretrained_config.num_medusa_heads is {pretrained.get('num_medusa_heads')!r}, expected {exp.num_medusa_heads}")
    if exp.num_eagle_layers is not None and pretrained.get("num_eagle_layers") != exp.num_eagle_layers:
        problems.append(f"pretrained_config.num_eagle_layers is {pretrained.get('num_eagle_layers')!r}, expected {exp.num_eagle_layers}")
    if exp.speculative_decoding_mode == "eagle" and pretrained.get("max_non_leaves_per_layer") is None:
        problems.append("pretrained_config.max_non_leaves_per_layer is missing (EAGLE)")
    return problems


def _plugin_problems(build: dict, exp: ExpectedEngine) -> list[str]:
    plugins = build.get("plugin_config") or {}
    if exp.paged_context_fmha and not _as_bool(plugins.get("use_paged_context_fmha", False)):
        return [
            "plugin_config.use_paged_context_fmha is off, but the "
            f"{exp.role} engine needs it (the builder switches it off for FP8 KV without FP8 "
            "context FMHA and for INT8 KV; change kv_cache_dtype)"
        ]
    return []


def _quant_problems(pretrained: dict, exp: ExpectedEngine) -> list[str]:
    quant = pretrained.get("quantization") or {}
    problems = []
    if quant.get("quant_algo") != exp.quant_algo:
        problems.append(f"pretrained_config.quantization.quant_algo is {quant.get('quant_algo')!r}, expected {exp.quant_algo!r}")
    if quant.get("kv_cache_quant_algo") != exp.kv_cache_quant_algo:
        problems.append(
            f"pretrained_config.quantization.kv_cache_quant_algo is {quant.get('kv_cache_quant_algo')!r}, "
            f"expected {exp.kv_cache_quant_algo!r}"
        )
    return problems


def _shape_problems(build: dict, exp: ExpectedEngine) -> list[str]:
    problems = []
    if build.get("max_batch_size") != exp.max_batch_size:
        problems.append(f"build_config.max_batch_size is {build.get('max_batch_size')!r}, expected {exp.max_batch_size}")
    seq = build.get("max_seq_len")
    if not isinstance(seq, int) or seq < exp.max_seq_len:
        problems.append(f"build_config.max_seq_len is {seq!r}, expected at least {exp.max_seq_len}")
    inp = build.get("max_input_len")
    if inp != exp.max_input_len:
        problems.append(f"build_config.max_input_len is {inp!r}, expected {exp.max_input_len}")
    if exp.max_draft_len > 0:
        tokens = build.get("max_num_tokens")
        need = exp.max_batch_size * (exp.max_draft_len + 1)
        if isinstance(tokens, int) and tokens < need:
            problems.append(f"build_config.max_num_tokens is {tokens}, below max_batch_size × (max_draft_len + 1) = {need}")
    if _as_bool(build.get("gather_generation_logits", False)) != exp.gather_generation_logits:
        want = "on" if exp.gather_generation_logits else "off"
        problems.append(f"build_config.gather_generation_logits is {build.get('gather_generation_logits')!r}, expected {want}")
    return problems


def _rank_problems(engine_dir: Path, pretrained: dict, exp: ExpectedEngine) -> list[str]:
    mapping = pretrained.get("mapping") or {}
    problems = []
    tp, pp = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
    if (tp, pp) != (exp.tp, exp.pp):
        problems.append(f"pretrained_config.mapping is tp={tp} pp={pp}, expected tp={exp.tp} pp={exp.pp}")
    world = exp.tp * exp.pp
    found = sorted(p.name for p in engine_dir.glob("rank*.engine"))
    wanted = [f"rank{r}.engine" for r in range(world)]
    if found != wanted:
        missing = sorted(set(wanted) - set(found))
        extra = sorted(set(found) - set(wanted))
        problems.append(
            f"rank files {found} do not match tp×pp = {world}"
            + (f" (missing {', '.join(missing)})" if missing else "")
            + (f" (unexpected {', '.join(extra)})" if extra else "")
        )
    return problems


def read_config_json(path: Path) -> tuple[dict | None, list[str]]:
    """A TensorRT-LLM ``config.json`` (checkpoint or engine) as a dict, or None and the problem."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, [f"{path} is missing"]
    except (OSError, ValueError) as exc:
        return None, [f"{path} is not readable JSON: {exc}"]
    if not isinstance(data, dict):
        return None, [f"{path} is not a JSON object"]
    return data, []


def engine_problems(engine_dir: Path, exp: ExpectedEngine) -> list[str]:
    """Every way the engine in ``engine_dir`` differs from ``exp`` (empty list: it matches)."""
    data, problems = read_config_json(Path(engine_dir) / "config.json")
    if data is None:
        return problems
    problems = _format_problems(data)
    if problems:
        return problems
    build, pretrained = data["build_config"], data["pretrained_config"]
    if not _version_matches(data["version"], exp.version):
        problems.append(f"version is {data['version']!r}, expected TensorRT-LLM {exp.version} (build and serve in the same image)")
    problems += _mode_problems(build, pretrained, exp)
    problems += _plugin_problems(build, exp)
    problems += _quant_problems(pretrained, exp)
    problems += _shape_problems(build, exp)
    problems += _rank_problems(Path(engine_dir), pretrained, exp)
    return problems


def validate_engine_dir(engine_dir: Path, exp: ExpectedEngine, step: str = "") -> None:
    """Raise :class:`BuildError` naming every mismatch between the built engine and the plan."""
    problems = engine_problems(engine_dir, exp)
    if problems:
        where = f"step {step}: " if step else ""
        raise BuildError(
            f"{where}the {exp.role} engine does not match the plan (the builder changed a setting):\n  "
            + "\n  ".join(problems)
        )


def _read_config(engine_dir: Path) -> dict:
    try:
        return json.loads((Path(engine_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def draft_target_pair_problems(target_dir: Path, draft_dir: Path) -> list[str]:
    """Cross-engine rules of a draft-target pair: equal vocab_size, equal max_batch_size,
    gather_generation_logits on both or neither, and no speculative mode on the draft."""
    target, draft = _read_config(target_dir), _read_config(draft_dir)
    problems = []
    tp, dp = target.get("pretrained_config", {}), draft.get("pretrained_config", {})
    tb, db = target.get("build_config", {}), draft.get("build_config", {})
    if tp.get("vocab_size") != dp.get("vocab_size"):
        problems.append(f"vocab_size differs: target {tp.get('vocab_size')!r}, draft {dp.get('vocab_size')!r} (same tokenizer needed)")
    if tb.get("max_batch_size") != db.get("max_batch_size"):
        problems.append(f"max_batch_size differs: target {tb.get('max_batch_size')!r}, draft {db.get('max_batch_size')!r}")
    if _as_bool(tb.get("gather_generation_logits", False)) != _as_bool(db.get("gather_generation_logits", False)):
        problems.append("gather_generation_logits must be on both engines or on neither")
    if _mode_name(db.get("speculative_decoding_mode", 1)) != "none":
        problems.append(f"the draft engine has speculative_decoding_mode {db.get('speculative_decoding_mode')!r}, expected none")
    return problems
