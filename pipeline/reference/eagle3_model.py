"""The EAGLE-3 head in the reference engine's maths (plain PyTorch over a KV pool, like
:class:`pipeline.reference.modeling.EagleHead`).

Reads an EAGLE-3 checkpoint (``config.json`` + ``model.safetensors``: ``fc``, ``midlayer.*``
or ``layers.0.*``, ``norm``, ``lm_head``, optional ``d2t``; the layout of upstream EAGLE-3
checkpoints, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B). Writes nothing except into its KV pool.

One row is the pair (g_t, x_{t+1}) at rotary position t: ``g`` is ``fc(cat(target hidden states
after the capture layers))`` for a real position, or the head's own previous output for a draft
step. The layer (TensorRT-LLM ``modeling_speculative.py`` Eagle3DecoderLayer): q/k/v over
``cat(input_layernorm(embed(x)), hidden_norm(g))``, residual ``g``; output ``o`` pre-norm;
logits ``lm_head(norm(o))`` over the draft vocabulary, scattered into the target's
(``d + d2t[d]``; other ids -inf). The head is the same in the plain and fast engines; the target's
captured hidden states come from either path's forward (tests keep the two equal).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.errors import UsageError
from pipeline.reference.checkpoint import load_safetensors, parse_shape, read_config
from pipeline.reference.kv_cache import KVPool
from pipeline.reference.modeling import (
    DecoderLayer,
    Linear,
    LlamaModel,
    Rotary,
    StepInput,
    StepTensors,
    advance,
    rotate,
    take_linear,
)


def capture_layers(cfg: dict, target_layers: int) -> tuple[int, ...]:
    """The checkpoint's ``eagle_config.eagle_aux_hidden_state_layer_ids`` (0-based decoder layers
    whose outputs are captured), else TensorRT-LLM's default (1, L//2 - 1, L - 4)."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
        or cfg.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        if target_layers <= 5:
            raise UsageError("EAGLE-3 head: no eagle_aux_hidden_state_layer_ids and the target has too few "
                             "layers for the default capture (TensorRT-LLM needs more than 5)")
        ids = [1, target_layers // 2 - 1, target_layers - 4]
    layers = tuple(int(i) for i in ids)
    if any(not 0 <= i < target_layers for i in layers):
        raise UsageError(f"EAGLE-3 head: capture layers {list(layers)} outside the target's 0..{target_layers - 1}")
    return layers


class Eagle3Layer(DecoderLayer):
    """The EAGLE-3 decoder layer: attention input ``[2H]``, residual the ``g`` stream."""

    def __init__(self, state: dict, prefix: str, shape, dtype: torch.dtype, linear: type = Linear):
        super().__init__(state, prefix, shape, dtype, input_norm=False, linear=linear)
        self.embed_norm = state[f"{prefix}input_layernorm.weight"].to(dtype)
        self.hidden_norm = state[f"{prefix}hidden_norm.weight"].to(dtype)

    def __call__(self, embeds: torch.Tensor, g: torch.Tensor, step: StepTensors, rope: tuple) -> torch.Tensor:
        s = self.shape
        batch, width, hidden = g.shape
        heads, kv_heads = s.num_heads, s.num_kv_heads
        h = torch.cat([F.rms_norm(embeds, [hidden], self.embed_norm, s.rms_norm_eps),
                       F.rms_norm(g, [hidden], self.hidden_norm, s.rms_norm_eps)], -1)
        qkv = self.qkv(h).view(batch, width, heads + 2 * kv_heads, s.head_dim)
        qk = rotate(qkv[:, :, : heads + kv_heads], *rope)
        keys, values = step.write_kv(0, qk[:, :, heads:], qkv[:, :, heads + kv_heads :])
        attn = F.scaled_dot_product_attention(qk[:, :, :heads].transpose(1, 2), keys.transpose(1, 2),
                                              values.transpose(1, 2), attn_mask=step.attn_bias,
                                              enable_gqa=kv_heads != heads)
        x = g + self.o(attn.transpose(1, 2).reshape(batch, width, heads * s.head_dim))
        gate, up = self.gate_up(F.rms_norm(x, [hidden], self.post_norm, s.rms_norm_eps)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class Eagle3Head:
    linear_type = Linear

    def __init__(self, head_dir: Path, target: LlamaModel, dtype: torch.dtype):
        cfg = read_config(head_dir)
        shape = parse_shape({**cfg, "num_hidden_layers": 1}, str(head_dir))
        hidden = target.shape.hidden_size
        if shape.hidden_size != hidden or int(cfg.get("target_hidden_size", hidden)) != hidden:
            raise UsageError(f"{head_dir}: hidden_size {shape.hidden_size} != target {hidden}")
        if int(cfg.get("vocab_size", target.shape.vocab_size)) != target.shape.vocab_size:
            raise UsageError(f"{head_dir}: vocab_size {cfg.get('vocab_size')} != target {target.shape.vocab_size}")
        self.shape, self.dtype = shape, dtype
        self.capture = capture_layers(cfg, target.shape.num_layers)
        state = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
                 for k, v in load_safetensors(head_dir).items()}  # both upstream namings
        self.fc = take_linear(state, ["fc"], dtype, self.linear_type, bias="fc.bias" in state)
        if self.fc.weight.shape[1] != len(self.capture) * hidden:
            raise UsageError(f"{head_dir}: fc takes {self.fc.weight.shape[1]} inputs, "
                             f"{len(self.capture)} captured layers × {hidden} expected")
        self.embed = state["embed_tokens.weight"].to(dtype) if "embed_tokens.weight" in state else target.embed
        self.layer = Eagle3Layer(state, "midlayer.", shape, dtype, self.linear_type)
        self.norm = state["norm.weight"].to(dtype)
        self.lm_head = self.linear_type(state["lm_head.weight"].to(dtype)) if "lm_head.weight" in state \
            else target.lm_head
        draft_vocab = self.lm_head.out_features
        d2t = state.get("d2t")
        self.target_ids = torch.arange(draft_vocab) + (d2t.long() if d2t is not None else 0)  # [draft_vocab]
        self.vocab_size = target.shape.vocab_size
        if int(self.target_ids.max()) >= self.vocab_size:
            raise UsageError(f"{head_dir}: d2t maps draft ids beyond the target vocabulary")
        self.rotary = Rotary(shape.head_dim, shape.rope_theta, max(shape.max_positions, target.shape.max_positions), dtype)

    def new_pool(self, slots: int, max_rows: int) -> KVPool:
        return KVPool(1, slots, max_rows, self.shape.num_kv_heads, self.shape.head_dim, self.dtype)

    def to_int8(self) -> None:
        self.fc = self.fc.int8_copy()
        self.layer.to_int8()
        self.lm_head = self.lm_head.int8_copy()  # a copy when shared: the target keeps its float head

    def fuse(self, captured: torch.Tensor) -> torch.Tensor:
        """The target's captured hidden states ``[..., n·H]`` → ``g [..., H]``."""
        return self.fc(captured)

    def forward(self, pool: KVPool, inputs: list[StepInput], g: torch.Tensor) -> torch.Tensor:
        """g [B, T, H] (padded like the tokens) → the layer's outputs o [B, T, H] (pre-norm)."""
        step = StepTensors(pool, inputs)
        o = self.layer(self.embed[step.ids], g, step, self.rotary.tables(step.positions))
        advance(inputs)
        return o

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        """o [B, H] → logits over the TARGET vocabulary [B, vocab] (-inf outside the draft vocab)."""
        draft = self.lm_head(F.rms_norm(o, (o.shape[-1],), self.norm, self.shape.rms_norm_eps))
        full = torch.full((o.shape[0], self.vocab_size), float("-inf"), dtype=draft.dtype)
        full[:, self.target_ids] = draft
        return full

