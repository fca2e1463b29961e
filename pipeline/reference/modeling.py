"""The reference maths of the engine's models in plain PyTorch: a Llama forward, Medusa heads and
the EAGLE-1 head.

Loads the checkpoints :mod:`pipeline.reference.checkpoint` reads (optionally int8 weight-only,
written by :mod:`pipeline.reference.quantize`). Writes nothing except into the KV pools it is
handed.

One forward call processes a *ragged batch*: per sequence a few new tokens with explicit rotary
positions and a causal or tree mask, attending to that sequence's slot in a preallocated
:class:`~pipeline.reference.kv_cache.KVPool`. The new rows are written at ``cache.length …`` and
the length advanced; callers roll back what they reject. QKV and gate/up projections are stored
fused (one matmul each) and the step's mask is built once per forward (:class:`StepTensors`).

This module is what the engine computes. :mod:`pipeline.reference.fast` subclasses these models
with the same maths through faster CPU kernels (scripted layers, fused one-row drafting steps,
int8 packing); the engine picks one set with ``reference.fast_paths``
(:data:`PLAIN_MODELS` or ``pipeline.reference.fast.FAST_MODELS``) and tests keep the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.errors import UsageError
from pipeline.reference.checkpoint import LlamaShape, load_safetensors, parse_shape, quantize_weight, read_config
from pipeline.reference.int8_gemm import int8_product, operand
from pipeline.reference.kv_cache import KVPool, SlotCache

# ----------------------------------------------------------------------------------------------
# Linear layers: float, or int8 weight-only


class Linear:
    """y = x Wᵀ (+ b). Int8 weights (float32 compute) run an int8 × int8 product
    (:mod:`pipeline.reference.int8_gemm`: ``torch._int_mm``, or the same integers in a float GEMM
    where that is faster, bit for bit alike), with activations quantized **per row** (symmetric, absmax): a row's
    result never depends on the other rows in the batch, so verifying K+1 tokens in one pass gives
    exactly what decoding them one by one gives (speculation stays lossless under int8). Per-tensor
    activation scales (``torch.ops.quantized.linear_dynamic``) would couple the rows."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, scale: torch.Tensor | None = None):
        self.bias = bias
        self.out_features = weight.shape[0]
        self.int8 = scale is not None
        if self.int8:
            self.weight = None
            self.weight_t = weight.t().contiguous()  # int8 [in, out]
            self.gemm_weight = operand(self.weight_t)  # what this CPU multiplies fastest, exactly (int8_gemm)
            self.scale = scale.float()  # [out]
        else:
            self.weight = weight  # [out, in]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.int8:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        row_scale = flat.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127.0  # [M, 1]
        x_int8 = torch.round(flat / row_scale).to(torch.int8)
        y = int8_product(x_int8, self.gemm_weight) * (row_scale * self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(list(x.shape[:-1]) + [y.shape[-1]])

    def int8_copy(self) -> "Linear":
        """The same projection with int8 weights (runtime weight-only quantization of draft-side
        weights: drafts never change the output, only how many are accepted); itself when it is
        int8 already or not float32."""
        if self.int8 or self.weight.dtype != torch.float32:
            return self
        weight, scale = quantize_weight(self.weight)
        return type(self)(weight, self.bias, scale)


def take_linear(state: dict, names: list[str], dtype: torch.dtype, linear: type = Linear,
                bias: bool = False) -> Linear:
    """Fuse the named projections (concatenated along the output dim) into one ``linear``."""
    if all(f"{n}.weight_scale" in state for n in names):
        weight = torch.cat([state[f"{n}.weight"] for n in names], 0).contiguous()
        scale = torch.cat([state[f"{n}.weight_scale"] for n in names], 0).to(dtype)
        if dtype != torch.float32:  # int8 kernels take float32 activations only (float64 tests)
            weight, scale = (weight.to(dtype) * scale[:, None]), None
    else:
        weight, scale = torch.cat([state[f"{n}.weight"] for n in names], 0).to(dtype).contiguous(), None
    b = torch.cat([state[f"{n}.bias"] for n in names], 0).to(dtype) if bias else None
    return linear(weight, b, scale)


# ----------------------------------------------------------------------------------------------
# Rotary embeddings and one decoder layer


class Rotary:
    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        emb = torch.cat([freqs, freqs], -1)  # [max_positions, head_dim]
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] → cos, sin [B, T, 1, head_dim] (once per forward, not per layer)."""
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [..., head_dim]`` (Hugging Face's ``rotate_half`` convention)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


class DecoderLayer:
    """One Llama decoder layer over a ragged step (:class:`StepTensors`)."""

    def __init__(self, state: dict, prefix: str, shape: LlamaShape, dtype: torch.dtype,
                 input_norm: bool = True, linear: type = Linear):
        self.qkv = take_linear(state, [f"{prefix}self_attn.{p}_proj" for p in "qkv"], dtype, linear)
        self.o = take_linear(state, [f"{prefix}self_attn.o_proj"], dtype, linear)
        self.gate_up = take_linear(state, [f"{prefix}mlp.gate_proj", f"{prefix}mlp.up_proj"], dtype, linear)
        self.down = take_linear(state, [f"{prefix}mlp.down_proj"], dtype, linear)
        key = f"{prefix}input_layernorm.weight"
        self.input_norm = state[key].to(dtype) if input_norm and key in state else None
        self.post_norm = state[f"{prefix}post_attention_layernorm.weight"].to(dtype)
        self.shape = shape

    def to_int8(self) -> None:
        self.qkv, self.o = self.qkv.int8_copy(), self.o.int8_copy()
        self.gate_up, self.down = self.gate_up.int8_copy(), self.down.int8_copy()

    def __call__(self, x: torch.Tensor, layer: int, step: "StepTensors", rope: tuple) -> torch.Tensor:
        """``x [B, T, H]`` → ``[B, T, H]``; the new K/V rows go into the step's pool at ``layer``."""
        s = self.shape
        batch, width, hidden = x.shape
        heads, kv_heads = s.num_heads, s.num_kv_heads
        h = x if self.input_norm is None else F.rms_norm(x, [hidden], self.input_norm, s.rms_norm_eps)
        qkv = self.qkv(h).view(batch, width, heads + 2 * kv_heads, s.head_dim)
        qk = rotate(qkv[:, :, : heads + kv_heads], *rope)  # q and k rotated at once
        keys, values = step.write_kv(layer, qk[:, :, heads:], qkv[:, :, heads + kv_heads :])  # [B, K, kv, hd]
        attn = F.scaled_dot_product_attention(qk[:, :, :heads].transpose(1, 2), keys.transpose(1, 2),
                                              values.transpose(1, 2), attn_mask=step.attn_bias,
                                              enable_gqa=kv_heads != heads)  # [B, heads, T, hd]
        x = x + self.o(attn.transpose(1, 2).reshape(batch, width, heads * s.head_dim))
        gate, up = self.gate_up(F.rms_norm(x, [hidden], self.post_norm, s.rms_norm_eps)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


# ----------------------------------------------------------------------------------------------
# One ragged step: tensors built once, shared by every layer


@dataclass
class StepInput:
    """New tokens for one sequence in one forward: rotary positions, ``tree`` — a ``[n, n]``
    bool ancestor-or-self mask among the new tokens (None = causal) — and ``visible``, a
    ``[n, cache.length]`` bool mask over the rows already cached (None = all visible; the EAGLE
    tree uses it to hide speculative rows that are not ancestors)."""

    cache: SlotCache
    tokens: list[int]
    positions: list[int]
    tree: torch.Tensor | None = None
    visible: torch.Tensor | None = None


class StepTensors:
    """The step's token ids, positions, where its K/V rows go and which keys each row sees."""

    def __init__(self, pool: KVPool, inputs: list[StepInput]):
        self.pool = pool
        batch = len(inputs)
        width = max(len(i.tokens) for i in inputs)
        starts = [i.cache.length for i in inputs]
        self.key_len = max(starts) + width
        if self.key_len > pool.max_rows:
            raise ValueError(f"sequence longer than the KV cache ({self.key_len} > {pool.max_rows})")
        pads = [width - len(i.tokens) for i in inputs]  # ragged rows padded: token 0, last position
        self.ids = torch.tensor([list(i.tokens) + [0] * p for i, p in zip(inputs, pads)], dtype=torch.long)  # [B, T]
        self.positions = torch.tensor([list(i.positions) + [int(i.positions[-1])] * p for i, p in zip(inputs, pads)],
                                      dtype=torch.long)  # [B, T]
        self.slots = [i.cache.slot for i in inputs]
        self.starts = starts
        self.single = batch == 1
        self.mask = self._mask(inputs, starts, width)  # bool [B, 1, T, K] or None
        # the additive form, built once per forward rather than converted by every layer
        self.attn_bias = None if self.mask is None else torch.zeros(
            self.mask.shape, dtype=pool.k.dtype).masked_fill_(~self.mask, float("-inf"))

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows ``k, v [B, T, kv, hd]`` of ``layer`` at each sequence's
        ``start …`` → the keys and values the step reads ``[B, key_len, kv, hd]``."""
        slots = torch.tensor(self.slots, dtype=torch.long)[:, None]  # [B, 1]
        rows = torch.tensor(self.starts, dtype=torch.long)[:, None] + torch.arange(k.shape[1])[None, :]  # [B, T]
        layer_k, layer_v = self.pool.k[layer], self.pool.v[layer]
        layer_k[slots, rows] = k
        layer_v[slots, rows] = v
        return layer_k[slots[:, 0], : self.key_len], layer_v[slots[:, 0], : self.key_len]

    def _mask(self, inputs: list[StepInput], starts: list[int], width: int) -> torch.Tensor | None:
        if self.single and inputs[0].visible is None:
            if width == 1:
                return None  # one query sees every valid key
            if inputs[0].tree is None:  # one causal chain: row i sees keys [0, start + i]
                return torch.ones(width, self.key_len, dtype=torch.bool).tril(starts[0])[None, None]
        start = torch.tensor(starts)[:, None, None]  # [B, 1, 1]
        length = torch.tensor([len(i.tokens) for i in inputs])[:, None, None]
        row = torch.arange(width)[None, :, None]  # [1, T, 1]
        key = torch.arange(self.key_len)[None, None, :]  # [1, 1, K]
        # causal chains, built for the whole batch at once: row i sees the cached keys and the
        # new ones up to itself; a padding row (i ≥ n) the cached keys and itself only
        mask = torch.where(row < length, key <= start + row, (key < start) | (key == start + row))  # [B, T, K]
        for b, inp in enumerate(inputs):  # trees and hidden cached rows (Medusa/EAGLE trees)
            n, s = len(inp.tokens), starts[b]
            if inp.tree is not None:
                mask[b, :n, s : s + n] = inp.tree
            if inp.visible is not None:
                mask[b, :n, :s] = inp.visible
        return mask.unsqueeze(1)  # [B, 1, T, K]


def advance(inputs: list[StepInput]) -> None:
    for inp in inputs:
        inp.cache.length += len(inp.tokens)


def one_sequence(cache: SlotCache, tokens: list[int]) -> list[StepInput]:
    """``tokens`` appended to one sequence as a causal chain at positions ``cache.length …``."""
    return [StepInput(cache, tokens, list(range(cache.length, cache.length + len(tokens))))]


# ----------------------------------------------------------------------------------------------
# Models


class LlamaModel:
    """Target or draft model. ``forward`` returns hidden states after the final norm
    ``[B, T, H]``; ``logits`` applies the LM head. The drafting entry points
    (:meth:`draft_logits`, :meth:`greedy_chain`, :meth:`prepare_drafting`) are the plain forward
    here; the fast subclass runs them through fused one-row steps."""

    linear_type = Linear
    layer_type = DecoderLayer
    rotary_type = Rotary

    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.float32):
        cfg = read_config(model_dir)
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if cfg.get("model_type", "llama") != "llama" or archs[0] != "LlamaForCausalLM":
            raise UsageError(f"{model_dir}: only Llama checkpoints are supported (got {archs[0]})")
        self.shape = s = parse_shape(cfg, str(model_dir))
        self.dtype = dtype
        state = load_safetensors(model_dir)
        self.embed = state["model.embed_tokens.weight"].to(dtype)
        if "lm_head.weight_scale" in state:  # int8 LM head (also written for tied checkpoints)
            self.lm_head = take_linear(state, ["lm_head"], dtype, self.linear_type)
        elif s.tie_word_embeddings or "lm_head.weight" not in state:
            self.lm_head = self.linear_type(self.embed)
        else:
            self.lm_head = take_linear(state, ["lm_head"], dtype, self.linear_type)
        self.layers = [self.layer_type(state, f"model.layers.{i}.", s, dtype, linear=self.linear_type)
                       for i in range(s.num_layers)]
        self.norm = state["model.norm.weight"].to(dtype)
        self.rotary = self.rotary_type(s.head_dim, s.rope_theta, s.max_positions, dtype)

    def new_pool(self, slots: int, max_rows: int) -> KVPool:
        s = self.shape
        return KVPool(s.num_layers, slots, max_rows, s.num_kv_heads, s.head_dim, self.dtype)

    def forward(self, pool: KVPool, inputs: list[StepInput]) -> torch.Tensor:
        return self.forward_capture(pool, inputs, ())[0]

    def forward_capture(self, pool: KVPool, inputs: list[StepInput],
                        capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward`, and the outputs of decoder layers ``capture`` (residual stream, before
        any norm) concatenated ``[B, T, len(capture)·H]`` (None when ``capture`` is empty): the
        EAGLE-3 head's features."""
        step = StepTensors(pool, inputs)
        x = self.embed[step.ids]  # [B, T, H]
        rope = self.rotary.tables(step.positions)
        taken = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, i, step, rope)
            if i in capture:
                taken[i] = x
        advance(inputs)
        return (F.rms_norm(x, (x.shape[-1],), self.norm, self.shape.rms_norm_eps),
                torch.cat([taken[i] for i in capture], -1) if capture else None)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def draft_logits(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """Next-token logits ``[1, vocab]`` after appending ``tokens`` to one sequence (drafting)."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        return self.logits(self.forward(cache.pool, one_sequence(cache, tokens))[:, -1])

    def greedy_chain(self, cache: SlotCache, feed: list[int], num_draft_tokens: int) -> list[int] | None:
        """``num_draft_tokens`` greedy drafts after appending ``feed`` in one call where a fast
        path has one; None here (the caller drafts step by step through :meth:`draft_logits`)."""
        return None

    def prepare_drafting(self) -> None:
        """Called once on a draft model (a fast subclass builds its drafting copies here)."""

    def to_int8(self) -> None:
        self.lm_head = self.lm_head.int8_copy()
        for layer in self.layers:
            layer.to_int8()


class MedusaHeads:
    """Head i(x) = W_lm_i · (x + SiLU(W_i x + b_i)) on the target's final hidden state at t;
    head i predicts the token at t + 2 + i."""

    linear_type = Linear

    def __init__(self, heads_dir: Path, dtype: torch.dtype, num_heads: int | None = None):
        cfg = read_config(heads_dir)
        if int(cfg.get("medusa_num_layers", 1)) != 1:
            raise UsageError(f"{heads_dir}: only medusa_num_layers 1 is supported")
        available = int(cfg["medusa_num_heads"])
        self.num_heads = min(num_heads or available, available)
        state = load_safetensors(heads_dir, "medusa_lm_head.safetensors")
        self.blocks = [take_linear(state, [f"{i}.0.linear"], dtype, self.linear_type, bias=True)
                       for i in range(self.num_heads)]
        self.heads = [take_linear(state, [f"{i}.1"], dtype, self.linear_type) for i in range(self.num_heads)]

    def to_int8(self) -> None:
        self.blocks = [b.int8_copy() for b in self.blocks]
        self.heads = [h.int8_copy() for h in self.heads]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] → [B, heads, vocab]."""
        return torch.stack([head(hidden + F.silu(block(hidden))) for block, head in zip(self.blocks, self.heads)], 1)


class EagleHead:
    """EAGLE-1: h = Layer0(fc(cat([embed(x_{t+1}), f_t]))) predicts f_{t+1}; logits through the
    target's LM head. Has its own KV pool; the pair (f_t, x_{t+1}) sits at rotary position t.

    fc is split at load: fc(cat(e, f)) = (W_e·e + b) + W_f·f, the token half precomputed as a
    ``[vocab, H]`` table (``token_rows``) — one row lookup instead of half the matmul and the cat."""

    linear_type = Linear
    layer_type = DecoderLayer
    rotary_type = Rotary

    def __init__(self, head_dir: Path, target: LlamaModel, dtype: torch.dtype):
        cfg = read_config(head_dir)
        shape = parse_shape({**cfg, "num_hidden_layers": 1}, str(head_dir))
        if shape.hidden_size != target.shape.hidden_size:
            raise UsageError(f"{head_dir}: hidden_size {shape.hidden_size} != target {target.shape.hidden_size}")
        self.shape = shape
        self.dtype = dtype
        state = load_safetensors(head_dir)
        embed = state["embed_tokens.weight"].to(dtype) if "embed_tokens.weight" in state else target.embed
        fc = take_linear(state, ["fc"], dtype, self.linear_type, bias="fc.bias" in state)
        self.token_rows, self.fc_features = self._split_fc(fc, embed, shape.hidden_size)
        self.layer = self.layer_type(state, "layers.0.", shape, dtype, input_norm=False, linear=self.linear_type)
        self.lm_head = target.lm_head
        positions = max(shape.max_positions, target.shape.max_positions)
        self.rotary = self.rotary_type(shape.head_dim, shape.rope_theta, positions, dtype)

    def _split_fc(self, fc: Linear, embed: torch.Tensor, hidden: int) -> tuple[torch.Tensor, Linear]:
        """fc over cat([embed(x), f]) → (table [vocab, H] = W_e·embed + b, Linear W_f over f).
        The table is computed once in float64 (then cast), so it is deterministic and as exact as
        the dtype allows."""
        weight = fc.weight if not fc.int8 else fc.weight_t.t().float() * fc.scale[:, None]
        table = embed.double() @ weight[:, :hidden].double().t()
        if fc.bias is not None:
            table = table + fc.bias.double()
        features = self.linear_type(weight[:, hidden:].to(embed.dtype).contiguous())
        return table.to(embed.dtype).contiguous(), features

    def new_pool(self, slots: int, max_rows: int) -> KVPool:
        return KVPool(1, slots, max_rows, self.shape.num_kv_heads, self.shape.head_dim, self.dtype)

    def to_int8(self) -> None:
        self.fc_features = self.fc_features.int8_copy()
        self.layer.to_int8()
        self.lm_head = self.lm_head.int8_copy()  # a copy: the target keeps its float LM head

    def forward(self, pool: KVPool, inputs: list[StepInput], features: torch.Tensor) -> torch.Tensor:
        """features [B, T, H] (padded like the tokens) → predicted next features [B, T, H]."""
        step = StepTensors(pool, inputs)
        x = self.token_rows[step.ids] + self.fc_features(features)
        h = self.layer(x, 0, step, self.rotary.tables(step.positions))
        advance(inputs)
        return h

    def extend(self, cache: SlotCache, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """Append pairs (features[i], tokens[i]) ``[n, H]`` of one sequence at rotary positions
        ``cache.length + i`` → the predicted feature of the LAST one ``[1, H]``."""
        return self.forward(cache.pool, one_sequence(cache, tokens), features[None])[0, -1:]

    def greedy_chain(self, cache: SlotCache, tokens: list[int], features: torch.Tensor,
                     num_draft_tokens: int) -> list[int] | None:
        """:meth:`extend` on the pairs, then ``num_draft_tokens`` greedy drafts, in one call where
        a fast path has one; None here (the caller drafts step by step)."""
        return None

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head for drafting (``[1, H]`` → ``[1, vocab]``)."""
        return self.lm_head(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


@dataclass(frozen=True)
class ModelTypes:
    """The model classes an engine loads: these plain ones, or the fast subclasses."""

    llama: type = LlamaModel
    medusa: type = MedusaHeads
    eagle: type = EagleHead


PLAIN_MODELS = ModelTypes()
