"""Medusa heads and the EAGLE-1 head as PyTorch modules whose ``state_dict`` keys are exactly the
upstream checkpoint layouts (FasterDecoding/Medusa ``medusa_lm_head.safetensors``;
SafeAILab/EAGLE ``model.safetensors``), plus their ``config.json`` writers/readers.

Reads/writes a heads directory. Semantics (shared contract, the reference engine implements the
same): features ``f_t`` are the target's final hidden state AFTER its final RMSNorm.
Medusa head i: ``W_lm_i · (f_t + SiLU(W_i f_t + b_i))`` predicts the token at ``t+2+i``.
EAGLE: ``h_t = Layer0(fc(cat([embed(x_{t+1}), f_t], -1)))`` with causal attention over the
EAGLE layer's own sequence (rotary positions as the target's), ``h_t`` predicts ``f_{t+1}`` and
``logits = target_lm_head(h_t)`` (no extra norm). Layer 0 has no input_layernorm.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"
EAGLE_WEIGHTS = "model.safetensors"


class _ResBlock(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` heads; keys ``{i}.0.linear.weight``, ``{i}.0.linear.bias``, ``{i}.1.weight``."""

    def __init__(self, num_heads: int, hidden: int, vocab: int):
        super().__init__()
        self.heads = nn.ModuleList(
            nn.Sequential(_ResBlock(hidden), nn.Linear(hidden, vocab, bias=False)) for _ in range(num_heads)
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [batch, seq, H] → logits [num_heads, batch, seq, V]."""
        return torch.stack([head(features) for head in self.heads])

    def upstream_state_dict(self) -> dict[str, torch.Tensor]:
        return {k.removeprefix("heads."): v.detach().contiguous() for k, v in self.state_dict().items()}

    def load_upstream_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.load_state_dict({f"heads.{k}": v for k, v in state.items()})


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF Llama rotary tables for ``positions`` [seq] → cos, sin [seq, head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class _Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape  # [batch, seq, H]

        def split(t: torch.Tensor) -> torch.Tensor:  # → [batch, heads, seq, head_dim]
            return t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class Mlp(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _EagleLayer(nn.Module):
    """A Llama decoder layer without input_layernorm (EAGLE's layer 0)."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.self_attn = _Attention(hidden, heads)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)
        self.mlp = Mlp(hidden, intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(x, cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """Keys: ``fc.{weight,bias}``, ``embed_tokens.weight``, ``layers.0.…`` (upstream EAGLE-1)."""

    def __init__(self, hidden: int, heads: int, intermediate: int, vocab: int, eps: float, rope_theta: float):
        super().__init__()
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([_EagleLayer(hidden, heads, intermediate, eps)])
        self.head_dim, self.rope_theta = hidden // heads, rope_theta

    def forward(self, next_tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """next_tokens [batch, seq] (x_{t+1}), features [batch, seq, H] (f_t) → h [batch, seq, H]
        (predicted f_{t+1}), positions 0..seq-1."""
        cos, sin = rotary_cos_sin(torch.arange(next_tokens.shape[1]), self.head_dim, self.rope_theta)
        x = self.fc(torch.cat([self.embed_tokens(next_tokens), features], dim=-1))
        return self.layers[0](x, cos, sin)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def medusa_config(num_heads: int, hidden: int, vocab: int, base: str) -> dict:
    return {
        "medusa_num_heads": num_heads,
        "medusa_num_layers": 1,
        "hidden_size": hidden,
        "vocab_size": vocab,
        "base_model_name_or_path": base,
    }


def eagle_config(target_config: dict, base: str) -> dict:
    keys = (
        "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "rms_norm_eps", "rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id",
        "pad_token_id", "hidden_act",
    )
    config = {k: target_config[k] for k in keys if k in target_config}
    config.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_hidden_layers=1,
        bias=True,
        torch_dtype="float32",
        base_model_name_or_path=base,
        eagle_feature="target final hidden state after the final RMSNorm",
    )
    return config


def load_medusa(heads_dir: Path) -> MedusaHeads:
    from safetensors.torch import load_file

    config = json.loads((heads_dir / "config.json").read_text())
    heads = MedusaHeads(config["medusa_num_heads"], config["hidden_size"], config["vocab_size"])
    heads.load_upstream_state_dict(load_file(str(heads_dir / MEDUSA_WEIGHTS)))
    return heads


def load_eagle(head_dir: Path) -> EagleHead:
    from safetensors.torch import load_file

    c = json.loads((head_dir / "config.json").read_text())
    head = EagleHead(
        c["hidden_size"], c["num_attention_heads"], c["intermediate_size"], c["vocab_size"],
        c["rms_norm_eps"], c.get("rope_theta", 10000.0),
    )
    head.load_state_dict(load_file(str(head_dir / EAGLE_WEIGHTS)))
    return head
