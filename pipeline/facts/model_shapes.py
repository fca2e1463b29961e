"""Model shapes for preflight: hidden size, layers, heads, KV heads, intermediate size, vocabulary.

Reads a checkpoint's ``config.json`` (HF LlamaConfig keys) when the files are present; offline it
falls back to a small table of well-known example models matched by the checkpoint's directory
name (Llama-3.1-8B/70B, Llama-3.2-1B/3B, Llama-3-8B, Vicuna-7B, Qwen2.5-(Coder-)7B). Writes nothing. Parameter counts
here feed the memory-fit estimate in ``pipeline.facts.memory_fit``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"
    max_position_embeddings: int | None = None
    source: str = "config.json"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_llama(self) -> bool:
        return "llama" in self.architecture.lower()

    def layer_params(self) -> int:
        """Weights of one decoder layer (attention + gated MLP + two norms)."""
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q_and_o + k_and_v + mlp + 2 * self.hidden_size

    def body_params(self) -> int:
        """Decoder layers + final norm (the part quantization applies to)."""
        return self.num_layers * self.layer_params() + self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params()
        return self.body_params() + self.embedding_params() + lm_head


_LLAMA3_8B = ModelShape(4096, 32, 32, 8, 14336, 128256, False, max_position_embeddings=131072, source="")
KNOWN_MODELS: dict[str, ModelShape] = {
    "llama-3.1-8b": _LLAMA3_8B,
    "llama-3-8b": replace(_LLAMA3_8B, max_position_embeddings=8192),
    "llama-3.1-70b": ModelShape(8192, 80, 64, 8, 28672, 128256, False, max_position_embeddings=131072),
    "llama-3.2-1b": ModelShape(2048, 16, 32, 8, 8192, 128256, True, max_position_embeddings=131072),
    "llama-3.2-3b": ModelShape(3072, 28, 24, 8, 8192, 128256, True, max_position_embeddings=131072),
    "vicuna-7b": ModelShape(4096, 32, 32, 32, 11008, 32000, False, max_position_embeddings=2048),
    "qwen2.5-7b": ModelShape(3584, 28, 28, 4, 18944, 152064, False, "Qwen2ForCausalLM", max_position_embeddings=32768),
}
# Directory-name patterns → table key. Checked in order; "3.3-70b" shares the 3.1-70B shape.
_NAME_PATTERNS: list[tuple[str, str]] = [
    (r"llama-?3\.[13]-70b", "llama-3.1-70b"),
    (r"llama-?3-70b", "llama-3.1-70b"),
    (r"llama-?3\.1-8b", "llama-3.1-8b"),
    (r"llama-?3-8b", "llama-3-8b"),
    (r"llama-?3\.2-1b", "llama-3.2-1b"),
    (r"llama-?3\.2-3b", "llama-3.2-3b"),
    (r"vicuna-7b", "vicuna-7b"),
    (r"qwen2\.5-(coder-)?7b", "qwen2.5-7b"),
]


def known_shape(checkpoint: str) -> ModelShape | None:
    """Shape of a well-known model recognised by its checkpoint directory name, else None."""
    name = Path(checkpoint.rstrip("/")).name.lower().replace("_", "-")
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, name):
            return replace(KNOWN_MODELS[key], source=f"known model '{key}'")
    return None


def shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """Shape from an HF config.json dict; KeyError/ValueError when fields are missing or bad."""
    heads = int(config["num_attention_heads"])
    architectures = config.get("architectures") or [config.get("model_type", "unknown")]
    return ModelShape(
        hidden_size=int(config["hidden_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        intermediate_size=int(config["intermediate_size"]),
        vocab_size=int(config["vocab_size"]),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        architecture=str(architectures[0]),
        max_position_embeddings=config.get("max_position_embeddings"),
        source=source,
    )


def read_config_json(directory: Path) -> dict:
    """The parsed config.json of a checkpoint dir; OSError/ValueError when unreadable."""
    data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("config.json is not a JSON object")
    return data


def eagle_head_layers(head_dir: str) -> int:
    """Decoder layers of an EAGLE head: its config.json ``num_hidden_layers`` (EAGLE-1 heads have
    one). Plan reads this one file when it exists (elsewhere it assumes 1) and validate checks the
    head's weights against it."""
    try:
        layers = json.loads((Path(head_dir).expanduser() / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    except (OSError, ValueError, KeyError, TypeError):
        return 1
    return layers if isinstance(layers, int) and not isinstance(layers, bool) and layers >= 1 else 1
