"""The fused one-row drafting steps of the CPU fast path: :class:`LeanDecodeStep` (a small Llama
drafting one token at a time) and :class:`LeanEagleStep` (the EAGLE head), both built on
:class:`LeanBlock`. Weights are derived at load in float64 (norm weights and the attention scale
folded into the matmuls, fc and q/k/v fused), then cast and, for int8 drafting, quantized after
fusing (:class:`~pipeline.reference.fast.linear.RowWeight`); the maths runs as TorchScript
(:mod:`pipeline.reference.fast.kernels`). Same maths as the plain forward, other kernels and
summation order: drafts need not be bit-identical, they change what is accepted, never the
output (the tests bound the difference and check the engine's output is unchanged). Reads and
writes nothing but the KV rows it is handed.
"""

from __future__ import annotations

import torch

from pipeline.reference.fast.kernels import (
    eagle_greedy_chain,
    inv_rms,
    lean_block,
    lean_decode,
    lean_decode_greedy_chain,
)
from pipeline.reference.fast.linear import FastLinear, RowWeight, pair_lists
from pipeline.reference.kv_cache import SlotCache
from pipeline.reference.modeling import DecoderLayer, EagleHead, LlamaModel, Rotary


def claim_rows(cache: SlotCache, n: int) -> tuple[int, int]:
    start, end = cache.length, cache.length + n
    if end > cache.pool.max_rows:
        raise ValueError(f"sequence longer than the KV cache ({end} > {cache.pool.max_rows})")
    cache.length = end
    return start, end


class LeanBlock:
    """One decoder layer of a lean drafting step, from its q/k/v rows on: rotate q and k, write
    the new K/V rows, attend for the last row only, o_proj + residual, then the MLP with the
    post-attention RMSNorm weight folded into gate/up's rows (the norm itself is one scalar,
    applied after the matmul: ``(x·r)·W = r·(x·W)``). Shared by :class:`LeanEagleStep` and
    :class:`LeanDecodeStep`; weights derived in float64 at load, then cast (deterministic). The
    maths runs as one TorchScript call (:func:`~pipeline.reference.fast.kernels.lean_block`)."""

    def __init__(self, layer: DecoderLayer, rotary: Rotary, dtype: torch.dtype, int8: bool = False):
        s = layer.shape
        gate_up = (layer.gate_up.weight.double() * layer.post_norm.double()[None, :]).t().to(dtype)  # [H, 2I]
        self.w_o = RowWeight(layer.o.weight.t().contiguous(), int8)
        self.w_gate_up = RowWeight(gate_up.contiguous(), int8)
        self.w_down = RowWeight(layer.down.weight.t().contiguous(), int8)
        self.cos = rotary.cos[:, None, :]  # [positions, 1, hd]
        self.sin_signed = rotary.sin_signed[:, None, :]
        self.heads, self.kv_heads = s.num_heads, s.num_kv_heads
        self.inv_hidden = 1.0 / s.hidden_size
        self.eps = s.rms_norm_eps

    def weights(self) -> tuple:
        """The arguments of :func:`~pipeline.reference.fast.kernels.lean_block` after ``start, end``."""
        return (self.cos, self.sin_signed, *self.w_o.pair, *self.w_gate_up.pair, *self.w_down.pair,
                self.heads, self.kv_heads, self.inv_hidden, self.eps)

    def __call__(self, x: torch.Tensor, qkv: torch.Tensor, cache: SlotCache, layer: int,
                 start: int, end: int) -> torch.Tensor:
        """``x [1, H]`` the residual stream of the last new row, ``qkv [n, heads + 2kv, hd]`` the
        new rows' projections (q pre-scaled) at positions ``start … end-1`` → ``[1, H]``."""
        keys, values = cache.pool.k[layer, cache.slot], cache.pool.v[layer, cache.slot]  # [rows, kv, hd]
        return lean_block(x, qkv, keys, values, start, end, *self.weights())


class LeanEagleStep:
    """Fused weight copies for the EAGLE head's one-sequence drafting
    (:meth:`~pipeline.reference.fast.models.FastEagleHead.extend`; ``forward`` keeps the
    checkpoint's layout). All derived in float64 at load, then cast — deterministic:

    - ``rows [vocab, H + QKV]`` and ``w_in [H, H + QKV]``: one GEMM gives both the fc output
      x = W_e·embed(tok) + b + W_f·f and its q/k/v projection (W_qkv·x, expanded through fc),
      so fc and qkv cost one matmul; the attention scale 1/√head_dim is folded into the q rows;
    - the rest of the layer is a :class:`LeanBlock`; ``w_lm`` the LM head as ``[in, out]``;
    - ``int8``: every fused matrix quantized per output channel after fusing (:class:`RowWeight`)."""

    def __init__(self, head: EagleHead, int8: bool = False):
        s, layer = head.shape, head.layer
        dt = head.token_rows.dtype
        qkv = layer.qkv.weight.double().clone()  # [QKV, H]
        qkv[: s.num_heads * s.head_dim] *= s.head_dim ** -0.5
        w_f = head.fc_features.weight.double()  # [H, H]
        rows = head.token_rows.double()  # [vocab, H]
        self.rows = torch.cat([rows, rows @ qkv.t()], 1).to(dt).contiguous()
        w_in = torch.cat([w_f.t(), w_f.t() @ qkv.t()], 1).to(dt).contiguous()
        self.w_in = RowWeight(w_in, int8)
        self.block = LeanBlock(layer, head.rotary, dt, int8)
        lm = head.lm_head.weight
        self.w_lm = RowWeight(lm.t().contiguous(), int8) if lm is not None else None
        self.lm_head = head.lm_head
        # catch-up (several rows), float: a oneDNN-blocked copy of w_in (few rows over the
        # [in, out] layout cost far more than one; the blocked kernel barely more). int8 catches
        # up through w_in itself: no second copy to pull into the cache after a verify pass
        self.w_in_rows = FastLinear(w_in.t().contiguous()) if dt == torch.float32 and not int8 else None
        self.hidden = s.hidden_size
        self.qkv_shape = (s.num_heads + 2 * s.num_kv_heads, s.head_dim)

    def __call__(self, cache: SlotCache, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        n, hidden = len(tokens), self.hidden
        start, end = claim_rows(cache, n)
        xqkv = self._project(tokens, features)
        qkv = xqkv[:, hidden:].view(n, *self.qkv_shape)
        return self.block(xqkv[-1:, :hidden], qkv, cache, 0, start, end)

    def _project(self, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """fc and q/k/v of the pairs (features[i], tokens[i]) → ``[n, H + QKV]``."""
        if len(tokens) == 1:
            token = tokens[0]
            return self.w_in.addmm(self.rows[token : token + 1], features)
        if self.w_in_rows is not None:
            return self.w_in_rows(features) + self.rows[tokens]
        return self.w_in.addmm(self.rows[tokens], features)

    @property
    def chains(self) -> bool:
        """Whether :meth:`greedy_chain` can run (it needs the LM head as a fused copy)."""
        return self.w_lm is not None

    def greedy_chain(self, cache: SlotCache, tokens: list[int], features: torch.Tensor,
                     num_draft_tokens: int) -> list[int]:
        """Catch-up on the pairs (features[i], tokens[i]) and ``num_draft_tokens`` greedy drafts
        after them, in one TorchScript call
        (:func:`~pipeline.reference.fast.kernels.eagle_greedy_chain`): the same tokens as
        ``num_draft_tokens`` rounds of ``__call__`` + argmax of :meth:`logits`. The cache keeps
        the catch-up rows; the drafts' own rows are written past its length (scratch)."""
        n, start = len(tokens), cache.length
        if num_draft_tokens < 1:
            raise ValueError("a chain drafts at least one token")
        if start + n + num_draft_tokens - 1 > cache.pool.max_rows:  # the drafts' scratch rows must fit too
            end = start + n + num_draft_tokens - 1
            raise ValueError(f"sequence longer than the KV cache ({end} > {cache.pool.max_rows})")
        claim_rows(cache, n)
        return eagle_greedy_chain(self._project(tokens, features), start, num_draft_tokens, self.rows,
                                  *self.w_in.pair, *self.w_lm.pair, self.qkv_shape[1], cache.pool.k[0, cache.slot],
                                  cache.pool.v[0, cache.slot], *self.block.weights())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.w_lm.mm(hidden) if self.w_lm is not None else self.lm_head(hidden)


class LeanDecodeStep:
    """Fused weight copies for drafting with a small Llama
    (:meth:`~pipeline.reference.fast.models.FastLlamaModel.draft_logits`; the draft-target
    proposer's lone-sequence path). Derived in float64 at load, then cast and, with ``int8``,
    quantized per output channel after fusing (:class:`RowWeight`). Per layer the input RMSNorm
    weight is folded into the q/k/v columns and 1/√head_dim into the q rows, the rest is a
    :class:`LeanBlock`; the final norm weight is folded into the LM head. Each norm is then one
    scalar per row, applied after the matmul. Same maths as :meth:`LlamaModel.forward`, other
    kernels and summation order (drafts need not be bit-identical: they change what is accepted,
    never the output)."""

    def __init__(self, model: LlamaModel, int8: bool = False):
        s, dt = model.shape, model.dtype
        q_size = s.num_heads * s.head_dim
        self.layers: list[tuple[RowWeight, LeanBlock]] = []
        for layer in model.layers:
            qkv = layer.qkv.weight.double().clone()  # [QKV, H]
            if layer.input_norm is not None:
                qkv *= layer.input_norm.double()[None, :]
            qkv[:q_size] *= s.head_dim ** -0.5
            self.layers.append((RowWeight(qkv.t().to(dt).contiguous(), int8), LeanBlock(layer, model.rotary, dt, int8)))
        lm = model.lm_head.weight.double() * model.norm.double()[None, :]  # [vocab, H]
        self.w_lm = RowWeight(lm.t().to(dt).contiguous(), int8)
        self.embed = model.embed
        self.inv_hidden, self.eps = 1.0 / s.hidden_size, s.rms_norm_eps
        # the arguments of the scripted kernels (pipeline.reference.fast.kernels.lean_decode) around
        # the per-layer K/V rows, which depend on the sequence's cache
        blocks = [block for _, block in self.layers]
        self.before_kv = (self.embed, *pair_lists([w_qkv for w_qkv, _ in self.layers]))
        self.after_kv = (blocks[0].cos, blocks[0].sin_signed, *pair_lists([b.w_o for b in blocks]),
                         *pair_lists([b.w_gate_up for b in blocks]), *pair_lists([b.w_down for b in blocks]),
                         s.num_heads, s.num_kv_heads, s.head_dim, self.inv_hidden, self.eps)

    def _args(self, cache: SlotCache) -> tuple:
        layers = range(len(self.layers))
        return (*self.before_kv, [cache.pool.k[i, cache.slot] for i in layers],
                [cache.pool.v[i, cache.slot] for i in layers], *self.after_kv)

    def __call__(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """Append ``tokens`` one at a time → next-token logits after the last one ``[1, vocab]``."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        start, _ = claim_rows(cache, len(tokens))
        x = lean_decode(tokens, start, *self._args(cache))  # [1, H]
        return self.w_lm.mm(x) * inv_rms(x, self.inv_hidden, self.eps)

    def greedy_chain(self, cache: SlotCache, feed: list[int], num_draft_tokens: int) -> list[int]:
        """``feed`` appended, then ``num_draft_tokens`` greedy drafts, each fed back but the last —
        in one TorchScript call (:func:`~pipeline.reference.fast.kernels.lean_decode_greedy_chain`): the same
        tokens and cache rows as ``num_draft_tokens`` rounds of ``__call__`` + argmax."""
        if not feed or num_draft_tokens < 1:
            raise ValueError("a chain needs at least one token to feed and drafts at least one")
        start, _ = claim_rows(cache, len(feed) + num_draft_tokens - 1)
        return lean_decode_greedy_chain(feed, start, num_draft_tokens, *self.w_lm.pair, *self._args(cache))
