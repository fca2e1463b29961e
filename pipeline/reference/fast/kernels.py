"""The fast path's small ops as TorchScript functions: every projection (:func:`linear`),
every decoder layer of the batched forward (:func:`decoder_layer`), the lean one-row drafting
layer (:func:`lean_block`, :func:`lean_decode`) and whole greedy drafting chains
(:func:`eagle_greedy_chain`, :func:`lean_decode_greedy_chain`). Reads and writes nothing but the
KV rows it is handed.

Why TorchScript: a decoder layer is ~35 ops on a few rows of 256 numbers, and on this CPU each
op called from Python costs more in interpreter and dispatch overhead than in arithmetic.
Scripted, the same ATen kernels run from TorchScript's interpreter. It fuses nothing on CPU, so
:func:`decoder_layer` gives its Python function's bits (tested); it does split ``addmm`` into
``mm`` + ``add``, so the float lean functions round a little differently from their Python
versions (every drafting path calls the scripted ones, so they agree among themselves).
``torch.jit.script`` is deprecated in torch 2.x but present in the
pinned 2.13; where it fails, :func:`script` returns the Python function, which computes the same
thing more slowly (a test checks that every kernel here did compile).

The lean functions take weights as ``(weight, scale)`` pairs
(:class:`~pipeline.reference.fast.linear.RowWeight`): ``scale`` None — a float ``[in, out]`` matrix
for ``torch.mm``; else an int8 ``[out, in]`` matrix and its bfloat16 per-channel scale for
``torch._weight_int8pack_mm`` on bfloat16 activations.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Union

import torch
import torch.nn.functional as F

from pipeline.reference.int8_gemm import int8_product


def script(fn):
    """``torch.jit.script(fn)``, or ``fn`` itself (with a warning) where TorchScript cannot
    compile it: the same maths, slower (float ``addmm`` rounds a little differently)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return torch.jit.script(fn)
        except Exception as exc:  # noqa: BLE001 - e.g. a torch without TorchScript or an op it names
            failure = exc
    warnings.warn(f"pipeline.reference.fast.kernels.{fn.__name__}: TorchScript failed ({type(failure).__name__}: "
                  f"{str(failure).strip().splitlines()[0] if str(failure).strip() else ''}); running it in Python",
                  RuntimeWarning, stacklevel=2)
    return fn


@script
def row_mm(x: torch.Tensor, weight: torch.Tensor, scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``x [n, in]`` times a weight pair (see the module docstring) → ``[n, out]``."""
    if scale is None:
        return torch.mm(x, weight)
    return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), weight, scale).float()


@script
def row_addmm(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
              scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``residual + x @ W`` (float weights: ``addmm``, which TorchScript runs as ``mm`` + ``add``)."""
    if scale is None:
        return torch.addmm(residual, x, weight)
    return row_mm(x, weight, scale) + residual


@script
def inv_rms(x: torch.Tensor, inv_hidden: float, eps: float) -> torch.Tensor:
    """1 / RMS of one row ``x [1, H]`` (a 0-dim tensor): the RMSNorm factor of the lean steps."""
    norm = torch.linalg.vector_norm(x)
    return torch.rsqrt(norm * norm * inv_hidden + eps)


@script
def attend_last(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """One query row, pre-scaled ``q [heads, hd]``, over ``keys/values [L, kv_heads, hd]`` (all
    visible) → ``[1, heads*hd]``. Grouped-query heads share their KV head (HF order)."""
    heads, head_dim = q.shape[0], q.shape[1]
    q = q.reshape(kv_heads, heads // kv_heads, head_dim)  # [kv, group, hd]
    scores = torch.bmm(q, keys.permute(1, 2, 0))  # [kv, group, L]
    return torch.bmm(scores.softmax(-1), values.transpose(0, 1)).reshape(1, heads * head_dim)


@script
def lean_block(x: torch.Tensor, qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               start: int, end: int, cos: torch.Tensor, sin_signed: torch.Tensor,
               w_o: torch.Tensor, s_o: Optional[torch.Tensor], w_gate_up: torch.Tensor,
               s_gate_up: Optional[torch.Tensor], w_down: torch.Tensor, s_down: Optional[torch.Tensor],
               heads: int, kv_heads: int, inv_hidden: float, eps: float) -> torch.Tensor:
    """One decoder layer from its q/k/v rows on. ``x [1, H]`` the residual stream of the last new
    row, ``qkv [n, heads + 2kv, hd]`` the new rows' projections (q pre-scaled) at positions
    ``start … end-1``; ``keys/values [rows, kv, hd]`` the layer's cache rows (written in place),
    ``cos/sin_signed [positions, 1, hd]``; gate/up carry the post-attention norm weight → ``[1, H]``."""
    qk_heads = heads + kv_heads
    qk = qkv[:, :qk_heads]  # rotate q and k at once (rotate_half via roll and a signed sin)
    qk = qk * cos[start:end] + qk.roll(qkv.shape[-1] // 2, -1) * sin_signed[start:end]
    keys[start:end] = qk[:, heads:]
    values[start:end] = qkv[:, qk_heads:]
    attn = attend_last(qk[-1, :heads], keys[:end], values[:end], kv_heads)  # [1, heads*hd]
    h = row_addmm(x, attn, w_o, s_o)  # [1, H]
    gate_up = row_mm(h, w_gate_up, s_gate_up) * inv_rms(h, inv_hidden, eps)
    gate, up = gate_up.chunk(2, -1)
    return row_addmm(h, F.silu(gate) * up, w_down, s_down)


@script
def eagle_greedy_chain(xqkv: torch.Tensor, start: int, k: int, rows: torch.Tensor,
                       w_in: torch.Tensor, s_in: Optional[torch.Tensor], w_lm: torch.Tensor,
                       s_lm: Optional[torch.Tensor], head_dim: int, keys: torch.Tensor, values: torch.Tensor,
                       cos: torch.Tensor, sin_signed: torch.Tensor, w_o: torch.Tensor,
                       s_o: Optional[torch.Tensor], w_gate_up: torch.Tensor, s_gate_up: Optional[torch.Tensor],
                       w_down: torch.Tensor, s_down: Optional[torch.Tensor], heads: int, kv_heads: int,
                       inv_hidden: float, eps: float) -> List[int]:
    """``k`` greedy EAGLE drafts in one call. ``xqkv [n, H + QKV]``: the catch-up rows' fused
    input projection (fc output and its q/k/v), at positions ``start …``; each draft is the
    argmax of the LM head on the last predicted feature, fed back as the next (feature, token)
    pair through ``rows [vocab, H + QKV]`` and ``w_in``. Writes K/V rows up to
    ``start + n + k - 2`` (the caller checked the capacity) → the ``k`` draft tokens. The
    arguments from ``keys`` on are :func:`lean_block`'s."""
    hidden = xqkv.shape[1] - (heads + 2 * kv_heads) * head_dim
    drafts: List[int] = []
    h = xqkv[-1:, :hidden]  # replaced by each step's predicted feature
    for step in range(k):
        if step > 0:
            token = drafts[-1]
            xqkv = row_addmm(rows[token : token + 1], h, w_in, s_in)  # [1, H + QKV]
        n = xqkv.shape[0]
        qkv = xqkv[:, hidden:].reshape(n, heads + 2 * kv_heads, head_dim)
        h = lean_block(xqkv[-1:, :hidden], qkv, keys, values, start, start + n, cos, sin_signed,
                       w_o, s_o, w_gate_up, s_gate_up, w_down, s_down, heads, kv_heads, inv_hidden, eps)
        drafts.append(int(row_mm(h, w_lm, s_lm).argmax()))
        start += n
    return drafts


# how a Linear computes (``Linear.mode``) and what ``operands`` it hands :func:`linear` for it
# (TorchScript cannot read module globals: :func:`linear` spells these numbers out)
FLOAT = 0  # [weight [in, out], oneDNN-blocked weight]: one row torch.mm, more rows oneDNN (bucket_rows)
PLAIN = 1  # [weight [out, in]]: F.linear (float64; float32 where oneDNN is missing)
INT8 = 2  # [int8 weight [in, out] (or its exact float copy), float32 scale [out]]: activations quantized per row, int8_gemm
INT8_DRAFT = 3  # INT8's, + [int8 [out, in], bf16 scale]: up to DRAFT_PACK_ROWS rows _weight_int8pack_mm
DRAFT_PACK_ROWS = 8
if (FLOAT, PLAIN, INT8, INT8_DRAFT, DRAFT_PACK_ROWS) != (0, 1, 2, 3, 8):
    raise ImportError("pipeline.reference.fast.kernels: linear() spells out the mode numbers; change both")


@script
def bucket_rows(rows: int) -> int:
    """The row count the oneDNN float kernel runs ``rows`` rows at: itself up to 8 (the
    verify pass of one sequence, unpadded), a multiple of 4 up to 64 (batched verify passes,
    whose cost grows with every row), then four sizes per doubling (prompts; at most a quarter
    more rows). Why: oneDNN keeps a primitive and its buffers for every GEMM shape it has seen, in
    two caches of up to 1024 shapes each by default (ideep's, ``LRU_CACHE_CAPACITY``, and
    oneDNN's, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; capping them makes every miss build a
    primitive again), and the batched forward's row count — sequences x (draft tokens + 1), or a
    prompt's length — takes almost every value, so the engine worker's RSS grew with every new
    one (``benchmarks/bench_engine_memory.py``). Padded, only a few dozen shapes ever exist.
    Zero rows added below the real ones leave the real rows' bits unchanged (a GEMM row
    depends on its own input row only; tested)."""
    if rows <= 8:
        return rows
    step = 4
    while step * 16 < rows:
        step *= 2
    if step > 4:  # above 64 rows: four sizes per doubling
        step = 8
        while step * 8 < rows:
            step *= 2
    return (rows + step - 1) // step * step


@script
def linear(x: torch.Tensor, mode: int, operands: List[torch.Tensor], bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x [..., in] → [..., out]`` as :class:`~pipeline.reference.fast.linear.FastLinear` ``mode``
    says (the kernels and why: that class's docstring)."""
    if mode == 1:  # PLAIN
        return F.linear(x, operands[0], bias)
    flat = x.reshape(-1, x.shape[-1])
    if mode == 0 and flat.shape[0] > 1:  # FLOAT, several rows: oneDNN, rows padded to a bucket
        rows = flat.shape[0]
        padded = bucket_rows(rows)
        if padded != rows:
            flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
        no_scalars: List[Optional[Union[float, int, complex]]] = []
        y = torch.ops.mkldnn._linear_pointwise(flat, operands[1], bias, "none", no_scalars, "")[:rows]
    else:
        if mode == 0:  # FLOAT, one row
            y = torch.mm(flat, operands[0])
        elif mode == 3 and flat.shape[0] <= 8:  # INT8_DRAFT, up to DRAFT_PACK_ROWS rows
            x_bf16 = flat.to(torch.bfloat16).contiguous()
            y = torch.ops.aten._weight_int8pack_mm(x_bf16, operands[2], operands[3]).float()
        else:
            row_scale = flat.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127.0  # [M, 1]
            x_int8 = torch.round(flat / row_scale).to(torch.int8)
            y = int8_product(x_int8, operands[0]) * (row_scale * operands[1])
        if bias is not None:
            y = y + bias
    return y.reshape(list(x.shape[:-1]) + [y.shape[-1]])


@script
def decoder_layer(x: torch.Tensor, input_norm: Optional[torch.Tensor], post_norm: torch.Tensor, eps: float,
                  modes: List[int], operands: List[List[torch.Tensor]], biases: List[Optional[torch.Tensor]],
                  heads: int, kv_heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor, layer_k: torch.Tensor,
                  layer_v: torch.Tensor, slots: List[int], starts: List[int], key_len: int,
                  slot_index: Optional[torch.Tensor], rows: Optional[torch.Tensor], slot_lo: int,
                  attn_bias: Optional[torch.Tensor]) -> torch.Tensor:
    """One decoder layer of the ragged batched forward: ``x [B, T, H]`` → ``[B, T, H]``, the new
    K/V rows written into ``layer_k/layer_v [slots, rows, kv, hd]``. The projections qkv, o,
    gate_up, down are :func:`linear` ``(modes[i], operands[i], biases[i])``. The step's geometry
    (:class:`~pipeline.reference.fast.models.FastStepTensors`): one sequence — ``slots[0]``,
    ``starts[0]``; several — ``slot_index [B]``, ``rows [B, T]`` and ``slot_lo`` (≥ 0: the slots
    are ``slot_lo …`` in batch order, keys read through a view)."""
    batch, width, hidden = x.shape[0], x.shape[1], x.shape[2]
    h = x if input_norm is None else F.rms_norm(x, [hidden], input_norm, eps)
    qkv_rows = linear(h, modes[0], operands[0], biases[0]).view(batch, width, heads + 2 * kv_heads, head_dim)
    qk = qkv_rows[:, :, : heads + kv_heads]  # q and k rotated at once (HF's rotate_half)
    half = head_dim // 2
    qk = qk * cos + torch.cat([-qk[..., half:], qk[..., :half]], -1) * sin
    k, v = qk[:, :, heads:], qkv_rows[:, :, heads + kv_heads :]
    if slot_index is None or rows is None:  # one sequence
        slot, start = slots[0], starts[0]
        layer_k[slot, start : start + width] = k[0]
        layer_v[slot, start : start + width] = v[0]
        keys, values = layer_k[slot, :key_len].unsqueeze(0), layer_v[slot, :key_len].unsqueeze(0)
    elif slot_lo >= 0:  # contiguous slots: write and read through views of the pool
        pool_k, pool_v = layer_k[slot_lo : slot_lo + batch], layer_v[slot_lo : slot_lo + batch]
        pool_k[slot_index[:, None], rows] = k
        pool_v[slot_index[:, None], rows] = v
        keys, values = pool_k[:, :key_len], pool_v[:, :key_len]
    else:
        layer_k[slot_index[:, None], rows] = k
        layer_v[slot_index[:, None], rows] = v
        keys, values = layer_k[slot_index, :key_len], layer_v[slot_index, :key_len]
    attn = F.scaled_dot_product_attention(qk[:, :, :heads].transpose(1, 2), keys.transpose(1, 2),
                                          values.transpose(1, 2), attn_mask=attn_bias,
                                          enable_gqa=kv_heads != heads)  # [B, heads, T, hd]
    x = x + linear(attn.transpose(1, 2).reshape(batch, width, heads * head_dim), modes[1], operands[1], biases[1])
    h = F.rms_norm(x, [hidden], post_norm, eps)
    gate, up = linear(h, modes[2], operands[2], biases[2]).chunk(2, -1)
    return x + linear(F.silu(gate) * up, modes[3], operands[3], biases[3])


@script
def lean_decode(tokens: List[int], start: int, embed: torch.Tensor, w_qkv: List[torch.Tensor],
                s_qkv: List[Optional[torch.Tensor]], keys: List[torch.Tensor], values: List[torch.Tensor],
                cos: torch.Tensor, sin_signed: torch.Tensor, w_o: List[torch.Tensor],
                s_o: List[Optional[torch.Tensor]], w_gate_up: List[torch.Tensor],
                s_gate_up: List[Optional[torch.Tensor]], w_down: List[torch.Tensor],
                s_down: List[Optional[torch.Tensor]], heads: int, kv_heads: int, head_dim: int,
                inv_hidden: float, eps: float) -> torch.Tensor:
    """A small Llama's fused one-row step (``LeanDecodeStep``): ``tokens`` appended one at a time
    at positions ``start …``, each through every layer (``w_qkv[i]`` carries the input norm
    weight and 1/√head_dim; the norm itself is one scalar per row) → the last token's residual
    stream ``[1, H]`` after the last layer (the final norm is the caller's). Per layer ``i`` the
    K/V rows go to ``keys[i]/values[i] [rows, kv, hd]``."""
    x = embed[0:1]
    for token in tokens:
        x = embed[token : token + 1]  # [1, H]
        for i in range(len(w_qkv)):
            qkv = row_mm(x, w_qkv[i], s_qkv[i]) * inv_rms(x, inv_hidden, eps)
            qkv = qkv.view(1, heads + 2 * kv_heads, head_dim)
            x = lean_block(x, qkv, keys[i], values[i], start, start + 1, cos, sin_signed, w_o[i], s_o[i],
                           w_gate_up[i], s_gate_up[i], w_down[i], s_down[i], heads, kv_heads, inv_hidden, eps)
        start += 1
    return x


@script
def lean_decode_greedy_chain(feed: List[int], start: int, k: int, w_lm: torch.Tensor, s_lm: Optional[torch.Tensor],
                             embed: torch.Tensor, w_qkv: List[torch.Tensor], s_qkv: List[Optional[torch.Tensor]],
                             keys: List[torch.Tensor], values: List[torch.Tensor], cos: torch.Tensor,
                             sin_signed: torch.Tensor, w_o: List[torch.Tensor], s_o: List[Optional[torch.Tensor]],
                             w_gate_up: List[torch.Tensor], s_gate_up: List[Optional[torch.Tensor]],
                             w_down: List[torch.Tensor], s_down: List[Optional[torch.Tensor]], heads: int,
                             kv_heads: int, head_dim: int, inv_hidden: float, eps: float) -> List[int]:
    """``k`` greedy drafts of a small Llama in one call: ``feed`` (the tokens its cache lacks) at
    positions ``start …``, then each draft fed back; ``w_lm`` carries the final norm weight. The
    arguments from ``embed`` on are :func:`lean_decode`'s → the ``k`` draft tokens (the last one
    is not fed: ``len(feed) + k - 1`` rows written)."""
    drafts: List[int] = []
    tokens = feed
    for _ in range(k):
        x = lean_decode(tokens, start, embed, w_qkv, s_qkv, keys, values, cos, sin_signed, w_o, s_o,
                        w_gate_up, s_gate_up, w_down, s_down, heads, kv_heads, head_dim, inv_hidden, eps)
        start += len(tokens)
        drafts.append(int((row_mm(x, w_lm, s_lm) * inv_rms(x, inv_hidden, eps)).argmax()))
        tokens = [drafts[-1]]
    return drafts
