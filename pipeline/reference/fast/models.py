"""The engine's models with the CPU fast path (``reference.fast_paths: true``, the default):
subclasses of the plain models in :mod:`pipeline.reference.modeling` with the same maths.

- every projection is a :class:`~pipeline.reference.fast.linear.FastLinear` and every decoder
  layer of the batched forward one TorchScript call
  (:func:`~pipeline.reference.fast.kernels.decoder_layer`, its Python function's bits); the
  batch is sorted by KV slot so keys are read through a view of the pool when slots are
  contiguous;
- drafting with a lone sequence runs fused one-row steps (:mod:`pipeline.reference.fast.lean`):
  a small Llama's :meth:`FastLlamaModel.draft_logits` / ``greedy_chain``, the EAGLE head's
  :meth:`FastEagleHead.extend` / ``greedy_chain`` (a whole greedy chain in one scripted call);
  where no fused copy can be made (an int8 checkpoint: no float weights to fuse) a per-layer
  one-row path (:meth:`FastDecoderLayer.decode_last`).

Why: on a 2-core CPU a decoder layer is a few dozen small ops on a few rows, and the per-op
interpreter and dispatch overhead outweighs the arithmetic. Reads and writes nothing but the KV
pools it is handed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline.reference.fast.kernels import attend_last, decoder_layer
from pipeline.reference.fast.lean import LeanDecodeStep, LeanEagleStep, claim_rows
from pipeline.reference.fast.linear import FastLinear
from pipeline.reference.kv_cache import KVPool, SlotCache
from pipeline.reference.modeling import (
    DecoderLayer,
    EagleHead,
    LlamaModel,
    MedusaHeads,
    ModelTypes,
    Rotary,
    StepInput,
    StepTensors,
    advance,
)


class FastRotary(Rotary):
    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype):
        super().__init__(head_dim, theta, max_positions, dtype)
        half = head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * sin_signed, bit for bit (negation is exact)
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], -1)

    def apply_rows(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x [n, heads, head_dim] at positions start … start+n-1 (one sequence, no gather)."""
        end = start + x.shape[0]
        half = x.shape[-1] // 2
        return x * self.cos[start:end, None] + x.roll(half, -1) * self.sin_signed[start:end, None]


class FastStepTensors(StepTensors):
    """:class:`StepTensors` plus the geometry the scripted layer takes: one sequence — its slot
    and start; several — slot and row index tensors, and ``slot_lo`` ≥ 0 when the slots are
    ``slot_lo …`` in batch order (keys read through a view instead of a gather)."""

    def __init__(self, pool: KVPool, inputs: list[StepInput]):
        super().__init__(pool, inputs)
        batch, width = self.ids.shape
        slot_index = rows = None
        slot_lo = -1
        if not self.single:
            lo = self.slots[0]
            slot_lo = lo if self.slots == list(range(lo, lo + batch)) else -1
            slot_index = torch.arange(batch) if slot_lo >= 0 else torch.tensor(self.slots, dtype=torch.long)
            rows = torch.tensor(self.starts, dtype=torch.long)[:, None] + torch.arange(width)[None, :]  # [B, T]
        self.geometry = (self.slots, self.starts, self.key_len, slot_index, rows, slot_lo, self.attn_bias)


def slot_order(inputs: list[StepInput]) -> tuple[list[StepInput], torch.Tensor | None]:
    """The batch sorted by KV slot (so :class:`FastStepTensors` can read keys through a view) and
    the index that puts rows computed in that order back in the caller's order (None: same)."""
    order = sorted(range(len(inputs)), key=lambda b: inputs[b].cache.slot)
    if order == list(range(len(inputs))):
        return inputs, None
    return [inputs[b] for b in order], torch.tensor(order).argsort()


class FastDecoderLayer(DecoderLayer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kernel_args = self._kernel_args()

    def to_int8(self) -> None:
        super().to_int8()
        self.kernel_args = self._kernel_args()

    def _kernel_args(self) -> tuple:
        """The projections and shape as :func:`~pipeline.reference.fast.kernels.decoder_layer` takes them."""
        linears = (self.qkv, self.o, self.gate_up, self.down)
        s = self.shape
        return ([lin.mode for lin in linears], [lin.operands for lin in linears], [lin.bias for lin in linears],
                s.num_heads, s.num_kv_heads, s.head_dim)

    def __call__(self, x: torch.Tensor, layer: int, step: FastStepTensors, rope: tuple) -> torch.Tensor:
        """``x [B, T, H]`` → ``[B, T, H]``: one TorchScript call, no Python between its ops."""
        return decoder_layer(x, self.input_norm, self.post_norm, self.shape.rms_norm_eps, *self.kernel_args, *rope,
                             step.pool.k[layer], step.pool.v[layer], *step.geometry)

    def decode_last(self, x: torch.Tensor, layer: int, cache: SlotCache, start: int,
                    rotary: FastRotary) -> torch.Tensor:
        """New rows ``x [n, H]`` of one sequence at positions ``start …`` (the caller claimed
        them): their K/V rows are written, attention and the MLP run for the last row only →
        ``[1, H]``. No mask or index tensors: one row per call through a multi-layer model
        (:meth:`FastLlamaModel.decode`), several for the EAGLE head's catch-up on int8 weights."""
        s = self.shape
        end = start + x.shape[0]
        h = x if self.input_norm is None else F.rms_norm(x, (x.shape[-1],), self.input_norm, s.rms_norm_eps)
        qkv = self.qkv(h).view(x.shape[0], s.num_heads + 2 * s.num_kv_heads, s.head_dim)
        qk = rotary.apply_rows(qkv[:, : s.num_heads + s.num_kv_heads], start)  # [n, heads+kv, hd]
        keys, values = cache.pool.k[layer, cache.slot], cache.pool.v[layer, cache.slot]  # [rows, kv, hd]
        keys[start:end] = qk[:, s.num_heads :]
        values[start:end] = qkv[:, s.num_heads + s.num_kv_heads :]
        q = qk[-1, : s.num_heads] * s.head_dim ** -0.5
        attn = attend_last(q, keys[:end], values[:end], s.num_kv_heads)  # [1, heads*hd]
        x = x[-1:] + self.o(attn)  # [1, H]
        gate, up = self.gate_up(F.rms_norm(x, (x.shape[-1],), self.post_norm, s.rms_norm_eps)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class FastLlamaModel(LlamaModel):
    linear_type = FastLinear
    layer_type = FastDecoderLayer
    rotary_type = FastRotary

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean: LeanDecodeStep | None = None  # drafting copies (:meth:`use_lean_decode`)

    def forward_capture(self, pool: KVPool, inputs: list[StepInput],
                        capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        ordered, restore = slot_order(inputs)
        step = FastStepTensors(pool, ordered)
        x = self.embed[step.ids]  # [B, T, H]
        rope = self.rotary.tables(step.positions)
        taken = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, i, step, rope)
            if i in capture:
                taken[i] = x
        advance(inputs)
        hidden = F.rms_norm(x, (x.shape[-1],), self.norm, self.shape.rms_norm_eps)
        aux = torch.cat([taken[i] for i in capture], -1) if capture else None
        if restore is not None:
            hidden, aux = hidden[restore], None if aux is None else aux[restore]
        return hidden, aux

    def decode(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """One sequence, its next ``tokens`` one row at a time through
        :meth:`FastDecoderLayer.decode_last` → the final hidden state of the last one ``[1, H]``."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        for token in tokens:
            position, _ = claim_rows(cache, 1)
            x = self.embed[token : token + 1]  # [1, H]
            for i, layer in enumerate(self.layers):
                x = layer.decode_last(x, i, cache, position, self.rotary)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.shape.rms_norm_eps)

    def draft_logits(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """Through :class:`LeanDecodeStep` once :meth:`use_lean_decode` made one, else :meth:`decode`."""
        if self.lean is not None:
            return self.lean(cache, tokens)
        return self.logits(self.decode(cache, tokens))

    def greedy_chain(self, cache: SlotCache, feed: list[int], num_draft_tokens: int) -> list[int] | None:
        """``num_draft_tokens`` greedy drafts after appending ``feed``, in one scripted call
        (:meth:`LeanDecodeStep.greedy_chain`); None without the fused step."""
        return self.lean.greedy_chain(cache, feed, num_draft_tokens) if self.lean is not None else None

    def prepare_drafting(self) -> None:
        self.use_lean_decode()

    def use_lean_decode(self) -> None:
        """Build the fused drafting copies (a draft model; the target never drafts). A model
        loaded from an int8 checkpoint has no float weights to fuse and keeps :meth:`decode`."""
        if self.lm_head.weight is not None and all(not layer.qkv.int8 for layer in self.layers):
            self.lean = LeanDecodeStep(self)

    def to_int8(self) -> None:
        lean = LeanDecodeStep(self, int8=True) if self.lean is not None else None  # from the float weights
        super().to_int8()
        self.lean = lean


class FastMedusaHeads(MedusaHeads):
    linear_type = FastLinear


class FastEagleHead(EagleHead):
    linear_type = FastLinear
    layer_type = FastDecoderLayer
    rotary_type = FastRotary

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lean = LeanEagleStep(self) if not (self.fc_features.int8 or self.layer.qkv.int8) else None

    def to_int8(self) -> None:
        """int8 draft-side weights: the batched path's Linears, and a :class:`LeanEagleStep`
        fused from the float weights first, then quantized (catch-up included). A head loaded
        with int8 Linears has no float weights to fuse and runs ``extend`` on its Linears."""
        lean = LeanEagleStep(self, int8=True) if self.lean is not None else None
        super().to_int8()
        self.lean = lean

    def forward(self, pool: KVPool, inputs: list[StepInput], features: torch.Tensor) -> torch.Tensor:
        ordered, restore = slot_order(inputs)
        step = FastStepTensors(pool, ordered)
        if restore is not None:
            features = features[restore.argsort()]  # into slot order
        x = self.token_rows[step.ids] + self.fc_features(features)
        h = self.layer(x, 0, step, self.rotary.tables(step.positions))
        advance(inputs)
        return h if restore is None else h[restore]

    def extend(self, cache: SlotCache, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """Only the last row runs attention, o_proj and the MLP (earlier rows only need their K/V
        rows); no mask or index tensors. Runs :class:`LeanEagleStep` where there is one."""
        if self.lean is not None:
            return self.lean(cache, tokens, features)
        start, _ = claim_rows(cache, len(tokens))
        x = self.fc_features.add_to(self.token_rows[tokens], features)  # [n, H]
        return self.layer.decode_last(x, 0, cache, start, self.rotary)

    def greedy_chain(self, cache: SlotCache, tokens: list[int], features: torch.Tensor,
                     num_draft_tokens: int) -> list[int] | None:
        """:meth:`extend` on the pairs, then ``num_draft_tokens`` greedy drafts, in one TorchScript call
        (:meth:`LeanEagleStep.greedy_chain`); None where the lean step cannot chain. The cache
        keeps the pairs' rows only, like ``extend``."""
        if self.lean is None or not self.lean.chains:
            return None
        return self.lean.greedy_chain(cache, tokens, features, num_draft_tokens)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lean.logits(hidden) if self.lean is not None else self.lm_head(hidden)


FAST_MODELS = ModelTypes(FastLlamaModel, FastMedusaHeads, FastEagleHead)
