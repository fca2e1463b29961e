"""Reading the checkpoints the reference engine loads: a Hugging Face Llama's ``config.json``
(shape, rotary base, special ids, whether it is int8 weight-only) and safetensors weights (one
file or an index of shards; pickled ``.bin``/``.pt`` files are refused, never unpickled). Also the
per-output-channel int8 quantization both :mod:`pipeline.reference.quantize` (on disk) and the
runtime draft-side ``to_int8`` (in memory) apply. Reads the checkpoint directory; writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.errors import UsageError

QUANT_METHOD = "specdeploy_int8_wo"


@dataclass(frozen=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_id: int | None
    quantized: bool


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UsageError(f"{model_dir}: no config.json (expected a Hugging Face checkpoint directory)")
    return json.loads(path.read_text(encoding="utf-8"))


def _rope_theta(cfg: dict, where: str) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    rope_type = params.get("rope_type", "default")
    if scaling not in (None, {}) or rope_type != "default":
        raise UsageError(f"{where}: rope scaling {scaling or params} is not supported by the reference engine")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _first_id(value) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def parse_shape(cfg: dict, where: str) -> LlamaShape:
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"{where}: hidden_act {act!r} is not supported (only silu)")
    return LlamaShape(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg.get("num_hidden_layers", 1)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, where),
        max_positions=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        bos_token_id=_first_id(cfg.get("bos_token_id")),
        eos_token_id=_first_id(cfg.get("eos_token_id")),
        quantized=(cfg.get("quantization_config") or {}).get("quant_method") == QUANT_METHOD,
    )


def load_safetensors(model_dir: Path, filename: str = "model.safetensors") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # noqa: PLC0415 - start-up: safetensors (loaded when a checkpoint's tensors are read)

    model_dir = Path(model_dir)
    path = model_dir / filename
    index = model_dir / f"{filename}.index.json"
    if path.is_file():
        return load_file(str(path))
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(model_dir / shard)))
        return state
    if any(model_dir.glob("*.bin")) or any(model_dir.glob("*.pt")):
        raise UsageError(
            f"{model_dir}: only safetensors weights are loaded (found pickle .bin/.pt files; "
            "convert them with safetensors first)"
        )
    raise UsageError(f"{model_dir}: no {filename}")


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float → (int8 [out, in], float32 scale [out]); symmetric per output channel."""
    w = weight.float()
    scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale
