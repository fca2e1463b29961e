"""A lean Llama forward in plain PyTorch for the reference engine, plus Medusa and EAGLE heads.

Reads Hugging Face Llama checkpoints (``config.json`` + ``model.safetensors``; ``.bin`` files are
refused), Medusa heads (``medusa_lm_head.safetensors``) and EAGLE-1 heads (``model.safetensors``)
in the layouts of the project brief, optionally int8 weight-only quantized by
:mod:`pipeline.reference.quantize`. Writes nothing except into the KV pools it is handed.

One forward call processes a *ragged batch*: per sequence a few new tokens with explicit rotary
positions and a causal or tree mask, attending to that sequence's slot in a preallocated
:class:`~pipeline.reference.kv_cache.KVPool`. The new rows are written at ``cache.length …`` and
the length advanced; callers roll back what they reject. Per-layer framework overhead dominates on
CPU, so QKV and gate/up projections are fused and masks are built once per step; the EAGLE head
also has a lean one-sequence drafting path (:meth:`EagleHead.extend`, :class:`LeanEagleStep`),
whose one-row maths runs as TorchScript (:mod:`pipeline.reference.kernels`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.errors import SpecdeployError
from pipeline.reference.kernels import (
    FLOAT,
    INT8,
    INT8_DRAFT,
    PLAIN,
    attend_last,
    decoder_layer,
    eagle_greedy_chain,
    inv_rms,
    lean_block,
    lean_decode,
    lean_decode_greedy_chain,
    linear,
    row_addmm,
    row_mm,
)
from pipeline.reference.kv_cache import KVPool, SlotCache

QUANT_METHOD = "specdeploy_int8_wo"


# ----------------------------------------------------------------------------------------------
# Checkpoint reading


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
        raise SpecdeployError(f"{model_dir}: no config.json (expected a Hugging Face checkpoint directory)")
    return json.loads(path.read_text(encoding="utf-8"))


def _rope_theta(cfg: dict, where: str) -> float:
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    rope_type = params.get("rope_type", "default")
    if scaling not in (None, {}) or rope_type != "default":
        raise SpecdeployError(f"{where}: rope scaling {scaling or params} is not supported by the reference engine")
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
        raise SpecdeployError(f"{where}: hidden_act {act!r} is not supported (only silu)")
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
    from safetensors.torch import load_file

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
        raise SpecdeployError(
            f"{model_dir}: only safetensors weights are loaded (found pickle .bin/.pt files; "
            "convert them with safetensors first)"
        )
    raise SpecdeployError(f"{model_dir}: no {filename}")


# ----------------------------------------------------------------------------------------------
# Linear layers: float or real int8 weight-only


class Linear:
    """y = x Wᵀ (+ b). Float32 weights keep two extra copies: ``[in, out]`` for one row
    (``torch.mm``; measured here 26% faster target-only decode than ``F.linear``'s GEMV on the
    ``[out, in]`` weight) and a oneDNN-blocked one for several rows (faster there than either
    ``mm`` or ``F.linear``). Other dtypes (the float64 tests) use ``F.linear``. Int8 weights (float32 compute) run a real int8 GEMM, ``torch._int_mm``
    (int8 × int8 → int32), with activations quantized **per row** (symmetric, absmax) — so a
    row's result never depends on the other rows in the batch and verifying K+1 tokens in one pass
    gives exactly what decoding them one by one gives (speculation stays lossless under int8).
    Measured alternatives on this CPU: ``torch.ops.quantized.linear_dynamic`` was fast but scales
    activations per tensor (rows couple: int8 speculative output drifted from the int8 baseline);
    ``torch._weight_int8pack_mm`` was ~20× slower than float32 with float32 activations.

    ``drafting=True`` (draft-side weights only, see :func:`int8_copy`): up to
    :data:`~pipeline.reference.kernels.DRAFT_PACK_ROWS` rows run ``torch._weight_int8pack_mm``
    on bfloat16 activations instead — the fastest kernel here at a few rows (one row from a cold
    cache: ~47 µs vs 75 µs float32 and 116 µs ``_int_mm`` for a 768×256 weight), since it reads a
    quarter of float32's bytes and quantizes nothing per call. Its rounding (bf16 activations) is not the per-row
    int8 scheme above, which drafts need not keep: they change what is accepted, never the
    output. More rows (a batched draft step) keep ``_int_mm``.

    Every call is one TorchScript call, :func:`~pipeline.reference.kernels.linear`, with the
    ``mode`` and ``operands`` fixed here."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None, drafting: bool = False):
        self.bias = bias
        self.out_features = weight.shape[0]
        self.int8 = scale is not None
        self.packed = None  # drafting kernel: (int8 [out, in], bf16 scale [out])
        if self.int8:
            self.weight = None
            self.weight_t = weight.t().contiguous()  # int8 [in, out]
            self.scale = scale.float()  # [out]
            if drafting:
                self.packed = _pack_int8(weight.contiguous(), self.scale)
            self.mode, self.operands = INT8, [self.weight_t, self.scale]
            if self.packed is not None:
                self.mode, self.operands = INT8_DRAFT, [*self.operands, *self.packed]
        else:
            self.weight = weight
            blocked = _prepack_onednn(weight) if weight.dtype == torch.float32 else None
            if blocked is None:
                self.mode, self.operands = PLAIN, [weight]
            else:  # one row: torch.mm on the [in, out] copy; more: the oneDNN-blocked one
                self.mode, self.operands = FLOAT, [weight.t().contiguous(), blocked]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.mode, self.operands, self.bias)

    def add_to(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual + self(x)`` for 2-D ``x``; one fused ``addmm`` for float weights without bias
        at one row (the EAGLE draft step), else the plain sum."""
        if self.weight is not None and self.bias is None and x.shape[0] == 1:
            return torch.addmm(residual, x, self.weight.t())
        return residual + self(x)


def _prepack_onednn(weight: torch.Tensor):
    """oneDNN-blocked copy of a float32 weight. Measured here: a 5-row F.linear (MKL) costs ~3.5×
    a 1-row one, the oneDNN kernel ~1.1–1.5× — so verifying K+1 tokens stays cheap."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    except (RuntimeError, AttributeError):  # a torch without oneDNN: plain F.linear everywhere
        return None


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float → (int8 [out, in], float32 scale [out]); symmetric per output channel."""
    w = weight.float()
    scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


PACK_IN_MULTIPLE = 16  # _weight_int8pack_mm reads out of bounds (garbage, or SIGSEGV) for other in_features


def _pack_int8(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Operands of ``torch._weight_int8pack_mm`` for int8 ``weight [out, in]``, or None where
    this torch build or shape cannot run it (the caller keeps ``_int_mm``). The kernel does not
    reject what it mishandles (``in`` not a multiple of 16 gave garbage or a crash on torch
    2.13), so the shape is checked first and one random row against the dequantized product."""
    if weight.shape[1] % PACK_IN_MULTIPLE:
        return None
    packed = (weight, scale.to(torch.bfloat16))
    probe = torch.randn(1, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    try:
        got = torch.ops.aten._weight_int8pack_mm(probe, *packed).float()
    except (RuntimeError, AttributeError):
        return None
    want = probe.float() @ (weight.float() * packed[1].float()[:, None]).t()
    return packed if torch.allclose(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()) + 1e-6) else None


def int8_copy(linear: Linear) -> Linear:
    """The same projection with int8 weights and the drafting kernel (runtime weight-only
    quantization of draft-side weights: drafts never change the output, only how many are
    accepted). An int8 checkpoint's Linear gets the drafting kernel over the same weights."""
    if linear.packed is not None or (not linear.int8 and linear.weight.dtype != torch.float32):
        return linear
    if linear.int8:
        return Linear(linear.weight_t.t(), linear.bias, linear.scale, drafting=True)
    weight, scale = quantize_weight(linear.weight)
    return Linear(weight, linear.bias, scale, drafting=True)


def _take_linear(state: dict, names: list[str], dtype: torch.dtype, bias: bool = False) -> Linear:
    """Fuse the named projections (concatenated along the output dim) into one Linear."""
    if all(f"{n}.weight_scale" in state for n in names):
        weight = torch.cat([state[f"{n}.weight"] for n in names], 0).contiguous()
        scale = torch.cat([state[f"{n}.weight_scale"] for n in names], 0).to(dtype)
        if dtype != torch.float32:  # int8 kernels take float32 activations only (float64 tests)
            weight, scale = (weight.to(dtype) * scale[:, None]), None
    else:
        weight, scale = torch.cat([state[f"{n}.weight"] for n in names], 0).to(dtype).contiguous(), None
    b = torch.cat([state[f"{n}.bias"] for n in names], 0).to(dtype) if bias else None
    return Linear(weight, b, scale)


# ----------------------------------------------------------------------------------------------
# Rotary embeddings and one decoder layer


class Rotary:
    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype):
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        emb = torch.cat([freqs, freqs], -1)  # [max_positions, head_dim]
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)
        half = head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * sin_signed, bit for bit (negation is exact)
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], -1)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] → cos, sin [B, T, 1, head_dim] (once per forward, not per layer)."""
        return self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)

    def apply_rows(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x [n, heads, head_dim] at positions start … start+n-1 (one sequence, no gather)."""
        end = start + x.shape[0]
        half = x.shape[-1] // 2
        return x * self.cos[start:end, None] + x.roll(half, -1) * self.sin_signed[start:end, None]


class DecoderLayer:
    def __init__(self, state: dict, prefix: str, shape: LlamaShape, dtype: torch.dtype,
                 input_norm: bool = True):
        self.qkv = _take_linear(state, [f"{prefix}self_attn.{p}_proj" for p in "qkv"], dtype)
        self.o = _take_linear(state, [f"{prefix}self_attn.o_proj"], dtype)
        self.gate_up = _take_linear(state, [f"{prefix}mlp.gate_proj", f"{prefix}mlp.up_proj"], dtype)
        self.down = _take_linear(state, [f"{prefix}mlp.down_proj"], dtype)
        key = f"{prefix}input_layernorm.weight"
        self.input_norm = state[key].to(dtype) if input_norm and key in state else None
        self.post_norm = state[f"{prefix}post_attention_layernorm.weight"].to(dtype)
        self.shape = shape
        self.kernel_args = self._kernel_args()

    def to_int8(self) -> None:
        self.qkv, self.o = int8_copy(self.qkv), int8_copy(self.o)
        self.gate_up, self.down = int8_copy(self.gate_up), int8_copy(self.down)
        self.kernel_args = self._kernel_args()

    def _kernel_args(self) -> tuple:
        """The projections and shape as :func:`~pipeline.reference.kernels.decoder_layer` takes them."""
        linears = (self.qkv, self.o, self.gate_up, self.down)
        s = self.shape
        return ([lin.mode for lin in linears], [lin.operands for lin in linears], [lin.bias for lin in linears],
                s.num_heads, s.num_kv_heads, s.head_dim)

    def decode_last(self, x: torch.Tensor, layer: int, cache: SlotCache, start: int,
                    rotary: "Rotary") -> torch.Tensor:
        """New rows ``x [n, H]`` of one sequence at positions ``start …`` (the caller claimed
        them): their K/V rows are written, attention and the MLP run for the last row only →
        ``[1, H]``. The lean path, no mask or index tensors: one row per call through a
        multi-layer model (:meth:`LlamaModel.decode`), several for the single-layer EAGLE head's
        catch-up (:meth:`EagleHead.extend` on int8 weights)."""
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

    def __call__(self, x: torch.Tensor, layer: int, step: "StepTensors", rope: tuple) -> torch.Tensor:
        """``x [B, T, H]`` → ``[B, T, H]``: one TorchScript call (~35 ops with no Python between
        them), :func:`~pipeline.reference.kernels.decoder_layer`."""
        return decoder_layer(x, self.input_norm, self.post_norm, self.shape.rms_norm_eps, *self.kernel_args, *rope,
                             step.pool.k[layer], step.pool.v[layer], *step.geometry)


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
        self.single = batch == 1
        self.mask = self._mask(inputs, starts, width)  # bool [B, 1, T, K] or None
        # the additive form, built once per forward: a bool mask made every layer's attention
        # convert it again (measured ~0.1 ms of a 6-row verify forward of the 6-layer target)
        self.attn_bias = None if self.mask is None else torch.zeros(
            self.mask.shape, dtype=pool.k.dtype).masked_fill_(~self.mask, float("-inf"))
        slot_index = rows = None
        slot_lo = -1
        if not self.single:
            # slots lo, lo+1, … in batch order (the forward sorts the batch by slot): the keys
            # are a view of the pool; otherwise a gather copies every sequence's rows per layer
            lo = self.slots[0]
            slot_lo = lo if self.slots == list(range(lo, lo + batch)) else -1
            slot_index = torch.arange(batch) if slot_lo >= 0 else torch.tensor(self.slots, dtype=torch.long)
            rows = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(width)[None, :]  # [B, T]
        # where the new K/V rows go and which keys each row reads, as the scripted decoder layer
        # (pipeline.reference.kernels.decoder_layer) takes it after the layer's KV tensors
        self.geometry = (self.slots, starts, self.key_len, slot_index, rows, slot_lo, self.attn_bias)

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


def slot_order(inputs: list[StepInput]) -> tuple[list[StepInput], torch.Tensor | None]:
    """The batch sorted by KV slot (so :class:`StepTensors` can read keys through a view) and
    the index that puts rows computed in that order back in the caller's order (None: same)."""
    order = sorted(range(len(inputs)), key=lambda b: inputs[b].cache.slot)
    if order == list(range(len(inputs))):
        return inputs, None
    return [inputs[b] for b in order], torch.tensor(order).argsort()


def advance(inputs: list[StepInput]) -> None:
    for inp in inputs:
        inp.cache.length += len(inp.tokens)


# ----------------------------------------------------------------------------------------------
# Models


class LlamaModel:
    """Target or draft model. ``forward`` returns hidden states after the final norm
    ``[B, T, H]``; ``logits`` applies the LM head."""

    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.float32):
        cfg = read_config(model_dir)
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if cfg.get("model_type", "llama") != "llama" or archs[0] != "LlamaForCausalLM":
            raise SpecdeployError(f"{model_dir}: only Llama checkpoints are supported (got {archs[0]})")
        self.shape = s = parse_shape(cfg, str(model_dir))
        self.dtype = dtype
        state = load_safetensors(model_dir)
        self.embed = state["model.embed_tokens.weight"].to(dtype)
        if "lm_head.weight_scale" in state:  # int8 LM head (also written for tied checkpoints)
            self.lm_head = _take_linear(state, ["lm_head"], dtype)
        elif s.tie_word_embeddings or "lm_head.weight" not in state:
            self.lm_head = Linear(self.embed)
        else:
            self.lm_head = _take_linear(state, ["lm_head"], dtype)
        self.layers = [DecoderLayer(state, f"model.layers.{i}.", s, dtype) for i in range(s.num_layers)]
        self.norm = state["model.norm.weight"].to(dtype)
        self.rotary = Rotary(s.head_dim, s.rope_theta, s.max_positions, dtype)
        self.lean: LeanDecodeStep | None = None  # drafting copies (:meth:`use_lean_decode`)

    def new_pool(self, slots: int, max_rows: int) -> KVPool:
        s = self.shape
        return KVPool(s.num_layers, slots, max_rows, s.num_kv_heads, s.head_dim, self.dtype)

    def forward(self, pool: KVPool, inputs: list[StepInput]) -> torch.Tensor:
        ordered, restore = slot_order(inputs)
        step = StepTensors(pool, ordered)
        x = self.embed[step.ids]  # [B, T, H]
        rope = self.rotary.tables(step.positions)
        for i, layer in enumerate(self.layers):
            x = layer(x, i, step, rope)
        advance(inputs)
        hidden = F.rms_norm(x, (x.shape[-1],), self.norm, self.shape.rms_norm_eps)
        return hidden if restore is None else hidden[restore]

    def decode(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """One sequence, its next ``tokens`` one row at a time through the lean per-layer path
        (:meth:`DecoderLayer.decode_last`, one row at a time) → the final hidden state of the last one ``[1, H]``.
        For drafting, where per-op overhead dominates: same maths as :meth:`forward`, other
        kernels and summation order (not bit-identical, which drafts need not be)."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        for token in tokens:
            position, _ = _claim_rows(cache, 1)
            x = self.embed[token : token + 1]  # [1, H]
            for i, layer in enumerate(self.layers):
                x = layer.decode_last(x, i, cache, position, self.rotary)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.shape.rms_norm_eps)

    def draft_logits(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """Next-token logits ``[1, vocab]`` after appending ``tokens`` (drafting): through
        :class:`LeanDecodeStep` once :meth:`use_lean_decode` made one, else :meth:`decode`."""
        if self.lean is not None:
            return self.lean(cache, tokens)
        return self.logits(self.decode(cache, tokens))

    def greedy_chain(self, cache: SlotCache, feed: list[int], k: int) -> list[int] | None:
        """``k`` greedy drafts after appending ``feed``, in one scripted call
        (:meth:`LeanDecodeStep.greedy_chain`); None without the fused step (the caller drafts
        step by step through :meth:`draft_logits`)."""
        return self.lean.greedy_chain(cache, feed, k) if self.lean is not None else None

    def use_lean_decode(self) -> None:
        """Build the fused drafting copies (a draft model; the target never drafts). A model
        loaded from an int8 checkpoint has no float weights to fuse and keeps :meth:`decode`."""
        if self.lm_head.weight is not None and all(not layer.qkv.int8 for layer in self.layers):
            self.lean = LeanDecodeStep(self)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def to_int8(self) -> None:
        lean = LeanDecodeStep(self, int8=True) if self.lean is not None else None  # from the float weights
        self.lm_head = int8_copy(self.lm_head)
        for layer in self.layers:
            layer.to_int8()
        self.lean = lean


class MedusaHeads:
    """Head i(x) = W_lm_i · (x + SiLU(W_i x + b_i)) on the target's final hidden state at t;
    head i predicts the token at t + 2 + i."""

    def __init__(self, heads_dir: Path, dtype: torch.dtype, num_heads: int | None = None):
        cfg = read_config(heads_dir)
        if int(cfg.get("medusa_num_layers", 1)) != 1:
            raise SpecdeployError(f"{heads_dir}: only medusa_num_layers 1 is supported")
        available = int(cfg["medusa_num_heads"])
        self.num_heads = min(num_heads or available, available)
        state = load_safetensors(heads_dir, "medusa_lm_head.safetensors")
        self.blocks = [_take_linear(state, [f"{i}.0.linear"], dtype, bias=True) for i in range(self.num_heads)]
        self.heads = [_take_linear(state, [f"{i}.1"], dtype) for i in range(self.num_heads)]

    def to_int8(self) -> None:
        self.blocks = [int8_copy(b) for b in self.blocks]
        self.heads = [int8_copy(h) for h in self.heads]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, H] → [B, heads, vocab]."""
        return torch.stack([head(hidden + F.silu(block(hidden))) for block, head in zip(self.blocks, self.heads)], 1)


class EagleHead:
    """EAGLE-1: h = Layer0(fc(cat([embed(x_{t+1}), f_t]))) predicts f_{t+1}; logits through the
    target's LM head. Has its own KV pool; the pair (f_t, x_{t+1}) sits at rotary position t.

    fc is split at load: fc(cat(e, f)) = (W_e·e + b) + W_f·f, the token half precomputed as a
    ``[vocab, H]`` table (``token_rows``) — one row lookup instead of half the GEMV and the cat.
    :meth:`extend` is the lean one-sequence path used while drafting (see its docstring)."""

    def __init__(self, head_dir: Path, target: LlamaModel, dtype: torch.dtype):
        cfg = read_config(head_dir)
        shape = parse_shape({**cfg, "num_hidden_layers": 1}, str(head_dir))
        if shape.hidden_size != target.shape.hidden_size:
            raise SpecdeployError(f"{head_dir}: hidden_size {shape.hidden_size} != target {target.shape.hidden_size}")
        self.shape = shape
        self.dtype = dtype
        state = load_safetensors(head_dir)
        embed = state["embed_tokens.weight"].to(dtype) if "embed_tokens.weight" in state else target.embed
        fc = _take_linear(state, ["fc"], dtype, bias="fc.bias" in state)
        self.token_rows, self.fc_features = _split_fc(fc, embed, shape.hidden_size)
        self.layer = DecoderLayer(state, "layers.0.", shape, dtype, input_norm=False)
        self.lm_head = target.lm_head
        self.rotary = Rotary(shape.head_dim, shape.rope_theta, max(shape.max_positions, target.shape.max_positions), dtype)
        self.lean = LeanEagleStep(self) if not (self.fc_features.int8 or self.layer.qkv.int8) else None

    def new_pool(self, slots: int, max_rows: int) -> KVPool:
        return KVPool(1, slots, max_rows, self.shape.num_kv_heads, self.shape.head_dim, self.dtype)

    def to_int8(self) -> None:
        """int8 draft-side weights: the batched path's Linears, and a :class:`LeanEagleStep`
        fused from the float weights first, then quantized (the drafting step reads ~1.1 MB
        instead of ~5 MB, catch-up included). A head loaded with int8 Linears has no float
        weights to fuse and runs ``extend`` on its Linears."""
        lean = LeanEagleStep(self, int8=True) if self.lean is not None else None
        self.fc_features = int8_copy(self.fc_features)
        self.layer.to_int8()
        self.lm_head = int8_copy(self.lm_head)  # a copy: the target keeps its float LM head
        self.lean = lean

    def forward(self, pool: KVPool, inputs: list[StepInput], features: torch.Tensor) -> torch.Tensor:
        """features [B, T, H] (padded like the tokens) → predicted next features [B, T, H]."""
        ordered, restore = slot_order(inputs)
        step = StepTensors(pool, ordered)
        if restore is not None:
            features = features[restore.argsort()]  # into slot order
        x = self.token_rows[step.ids] + self.fc_features(features)
        h = self.layer(x, 0, step, self.rotary.tables(step.positions))
        advance(inputs)
        return h if restore is None else h[restore]

    def extend(self, cache: SlotCache, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        """The lean one-sequence path: append pairs (features[i], tokens[i]) ``[n, H]`` at rotary
        positions ``cache.length + i`` and return the predicted feature of the LAST one ``[1, H]``.

        Same maths as :meth:`forward` with a causal mask, cheaper on CPU where per-op overhead
        dominates: only the last row runs attention, o_proj and the MLP (earlier rows only need
        their K/V rows); no mask or index tensors. It runs :class:`LeanEagleStep` (its own fused
        weight copies, int8 ones after ``to_int8``); a head loaded with int8 Linears runs the
        same steps on them. Not
        bit-identical to :meth:`forward` (other kernels, other summation order), which is
        harmless: drafts only change what the target accepts, never the output."""
        if self.lean is not None:
            return self.lean(cache, tokens, features)
        start, _ = _claim_rows(cache, len(tokens))
        x = self.fc_features.add_to(self.token_rows[tokens], features)  # [n, H]
        return self.layer.decode_last(x, 0, cache, start, self.rotary)

    def greedy_chain(self, cache: SlotCache, tokens: list[int], features: torch.Tensor, k: int) -> list[int] | None:
        """:meth:`extend` on the pairs, then ``k`` greedy drafts, in one TorchScript call
        (:meth:`LeanEagleStep.greedy_chain`); None where the lean step cannot chain (the caller
        drafts step by step). The cache keeps the pairs' rows only, like ``extend``."""
        if self.lean is None or not self.lean.chains:
            return None
        return self.lean.greedy_chain(cache, tokens, features, k)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head for drafting (``[1, H]`` → ``[1, vocab]``; the lean copy when present)."""
        return self.lean.logits(hidden) if self.lean is not None else self.lm_head(hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def _split_fc(fc: Linear, embed: torch.Tensor, hidden: int) -> tuple[torch.Tensor, Linear]:
    """fc over cat([embed(x), f]) → (table [vocab, H] = W_e·embed + b, Linear W_f over f).
    The table is computed once in float64 (then cast), so it is deterministic and as exact as
    the dtype allows."""
    weight = fc.weight if not fc.int8 else fc.weight_t.t().float() * fc.scale[:, None]
    table = embed.double() @ weight[:, :hidden].double().t()
    if fc.bias is not None:
        table = table + fc.bias.double()
    features = Linear(weight[:, hidden:].to(embed.dtype).contiguous())
    return table.to(embed.dtype).contiguous(), features


def _claim_rows(cache: SlotCache, n: int) -> tuple[int, int]:
    start, end = cache.length, cache.length + n
    if end > cache.pool.max_rows:
        raise ValueError(f"sequence longer than the KV cache ({end} > {cache.pool.max_rows})")
    cache.length = end
    return start, end


class RowWeight:
    """``x @ W`` (and ``x @ W + residual``) for a few rows, ``W`` given as a float ``[in, out]``
    matrix: float runs ``torch.mm`` on it, plus the residual (a one-row matmul over that layout
    measured faster here than ``F.linear``'s ``[out, in]``); ``int8`` quantizes it per output channel and
    runs ``torch._weight_int8pack_mm`` on bfloat16 activations (a quarter of the bytes: the
    drafting kernel of :class:`Linear`), keeping the float matrix where the kernel cannot run
    and for weights that are not float32 (float64 reference runs stay exact). Both go through
    the scripted :func:`~pipeline.reference.kernels.row_mm` / ``row_addmm``, like every lean
    drafting path, so they all round alike."""

    def __init__(self, weight_in_out: torch.Tensor, int8: bool = False):
        int8 = int8 and weight_in_out.dtype == torch.float32
        self.packed = _pack_int8(*quantize_weight(weight_in_out.t())) if int8 else None
        self.weight = weight_in_out if self.packed is None else None
        # the (weight, scale) pair the scripted kernels take (pipeline.reference.kernels)
        self.pair = self.packed if self.packed is not None else (self.weight, None)

    def mm(self, x: torch.Tensor) -> torch.Tensor:
        return row_mm(x, *self.pair)

    def addmm(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return row_addmm(residual, x, *self.pair)


class LeanBlock:
    """One decoder layer of a lean drafting step, from its q/k/v rows on: rotate q and k, write
    the new K/V rows, attend for the last row only, o_proj + residual, then the MLP with the
    post-attention RMSNorm weight folded into gate/up's rows (the norm itself is one scalar,
    applied after the matmul: ``(x·r)·W = r·(x·W)``). Shared by :class:`LeanEagleStep` and
    :class:`LeanDecodeStep`; weights derived in float64 at load, then cast (deterministic). The
    maths runs as one TorchScript call (:func:`~pipeline.reference.kernels.lean_block`)."""

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
        """The arguments of :func:`~pipeline.reference.kernels.lean_block` after ``start, end``."""
        return (self.cos, self.sin_signed, *self.w_o.pair, *self.w_gate_up.pair, *self.w_down.pair,
                self.heads, self.kv_heads, self.inv_hidden, self.eps)

    def __call__(self, x: torch.Tensor, qkv: torch.Tensor, cache: SlotCache, layer: int,
                 start: int, end: int) -> torch.Tensor:
        """``x [1, H]`` the residual stream of the last new row, ``qkv [n, heads + 2kv, hd]`` the
        new rows' projections (q pre-scaled) at positions ``start … end-1`` → ``[1, H]``."""
        keys, values = cache.pool.k[layer, cache.slot], cache.pool.v[layer, cache.slot]  # [rows, kv, hd]
        return lean_block(x, qkv, keys, values, start, end, *self.weights())


class LeanEagleStep:
    """Fused weight copies for :meth:`EagleHead.extend` (drafting only; ``forward`` keeps
    the checkpoint's layout). All derived in float64 at load, then cast — deterministic:

    - ``rows [vocab, H + QKV]`` and ``w_in [H, H + QKV]``: one GEMM gives both the fc output
      x = W_e·embed(tok) + b + W_f·f and its q/k/v projection (W_qkv·x, expanded through fc),
      so fc and qkv cost one matmul; the attention scale 1/√head_dim is folded into the q rows;
    - the rest of the layer is a :class:`LeanBlock`; ``w_lm`` the LM head as ``[in, out]``;
    - ``int8``: every fused matrix quantized per output channel after fusing (:class:`RowWeight`)."""

    def __init__(self, head: "EagleHead", int8: bool = False):
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
        # catch-up (several rows), float: a oneDNN-blocked copy of w_in (a few-row matmul over
        # the [in, out] layout measured ~3x a one-row one here; the blocked kernel ~1.3x). int8
        # catches up through w_in itself: no second copy to pull into the cache after a verify
        # (in-domain, three interleaved `bench` rounds on the shipped head: 2.43x vs 2.32x for
        # the per-Linear int8 path; with a float catch-up copy the fused int8 step was no faster)
        self.w_in_rows = Linear(w_in.t().contiguous()) if dt == torch.float32 and not int8 else None
        self.hidden = s.hidden_size
        self.qkv_shape = (s.num_heads + 2 * s.num_kv_heads, s.head_dim)

    def __call__(self, cache: SlotCache, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
        n, hidden = len(tokens), self.hidden
        start, end = _claim_rows(cache, n)
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

    def greedy_chain(self, cache: SlotCache, tokens: list[int], features: torch.Tensor, k: int) -> list[int]:
        """Catch-up on the pairs (features[i], tokens[i]) and ``k`` greedy drafts after them, in
        one TorchScript call (:func:`~pipeline.reference.kernels.eagle_greedy_chain`): the same
        tokens as ``k`` rounds of ``__call__`` + argmax of :meth:`logits`. The cache keeps the
        catch-up rows; the drafts' own rows are written past its length (scratch)."""
        n, start = len(tokens), cache.length
        if k < 1:
            raise ValueError("a chain drafts at least one token")
        if start + n + k - 1 > cache.pool.max_rows:  # the drafts' scratch rows must fit too
            raise ValueError(f"sequence longer than the KV cache ({start + n + k - 1} > {cache.pool.max_rows})")
        _claim_rows(cache, n)
        return eagle_greedy_chain(self._project(tokens, features), start, k, self.rows, *self.w_in.pair,
                                  *self.w_lm.pair, self.qkv_shape[1], cache.pool.k[0, cache.slot],
                                  cache.pool.v[0, cache.slot], *self.block.weights())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.w_lm.mm(hidden) if self.w_lm is not None else self.lm_head(hidden)


class LeanDecodeStep:
    """Fused weight copies for drafting with a small Llama (:meth:`LlamaModel.draft_logits`;
    the draft-target proposer's lone-sequence path). Derived in float64 at load, then cast and,
    with ``int8``, quantized per output channel after fusing (:class:`RowWeight`). Per layer the
    input RMSNorm weight is folded into the q/k/v columns and 1/√head_dim into the q rows, the
    rest is a :class:`LeanBlock`; the final norm weight is folded into the LM head. Each norm is
    then one scalar per row, applied after the matmul. Same maths as :meth:`LlamaModel.forward`,
    other kernels and summation order (drafts need not be bit-identical: they change what is
    accepted, never the output)."""

    def __init__(self, model: "LlamaModel", int8: bool = False):
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
        # the arguments of the scripted kernels (pipeline.reference.kernels.lean_decode) around
        # the per-layer K/V rows, which depend on the sequence's cache
        blocks = [block for _, block in self.layers]
        self.before_kv = (self.embed, *_pair_lists([w_qkv for w_qkv, _ in self.layers]))
        self.after_kv = (blocks[0].cos, blocks[0].sin_signed, *_pair_lists([b.w_o for b in blocks]),
                         *_pair_lists([b.w_gate_up for b in blocks]), *_pair_lists([b.w_down for b in blocks]),
                         s.num_heads, s.num_kv_heads, s.head_dim, self.inv_hidden, self.eps)

    def _args(self, cache: SlotCache) -> tuple:
        layers = range(len(self.layers))
        return (*self.before_kv, [cache.pool.k[i, cache.slot] for i in layers],
                [cache.pool.v[i, cache.slot] for i in layers], *self.after_kv)

    def __call__(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """Append ``tokens`` one at a time → next-token logits after the last one ``[1, vocab]``."""
        if not tokens:
            raise ValueError("decode needs at least one token")
        start, _ = _claim_rows(cache, len(tokens))
        x = lean_decode(tokens, start, *self._args(cache))  # [1, H]
        return self.w_lm.mm(x) * inv_rms(x, self.inv_hidden, self.eps)

    def greedy_chain(self, cache: SlotCache, feed: list[int], k: int) -> list[int]:
        """``feed`` appended, then ``k`` greedy drafts, each fed back but the last — in one
        TorchScript call (:func:`~pipeline.reference.kernels.lean_decode_greedy_chain`): the same
        tokens and cache rows as ``k`` rounds of ``__call__`` + argmax."""
        if not feed or k < 1:
            raise ValueError("a chain needs at least one token to feed and drafts at least one")
        start, _ = _claim_rows(cache, len(feed) + k - 1)
        return lean_decode_greedy_chain(feed, start, k, *self.w_lm.pair, *self._args(cache))


def _pair_lists(weights: list[RowWeight]) -> tuple[list, list]:
    """Per-layer weights as the scripted kernels take them: the matrices, then the scales."""
    return [w.pair[0] for w in weights], [w.pair[1] for w in weights]
