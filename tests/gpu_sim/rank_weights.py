"""The bytes of one engine rank's weights, counted tensor by tensor in the layout of a TensorRT-LLM
checkpoint, for the simulated builds (``serve_tools.fake_build``) — a count independent of the
project's own estimate (``pipeline.facts.memory_fit``, parameters × bytes per weight), so that
"both arms fit" in the simulation is checked against a second reckoning, not against itself.

Layout (TL ``docs/source/architecture/checkpoint.md``: rank weights named
``transformer.layers.N.attention.qkv`` / ``attention.dense`` / ``mlp.fc`` / ``mlp.gate`` / ``mlp.proj`` /
``input_layernorm`` / ``post_layernorm``, ``transformer.vocab_embedding``, ``transformer.ln_f``,
``lm_head``; linear weights are ``(out_features, in_features)``; FP8 adds a per-tensor
``weights_scaling_factor`` and ``activation_scaling_factor`` to every linear, AWQ a
``weights_scaling_factor`` per group and a ``prequant_scaling_factor`` per input feature (NVFP4:
4-bit values with an FP8 scale per block of 16, an assumption of this file), a
quantized KV cache a ``kv_cache_scaling_factor`` per layer):

- tensor parallelism splits qkv / fc / gate by output rows and dense / proj by input columns,
  ``lm_head`` by vocabulary rows (padded to a multiple of TP); norms and the embedding (no
  ``use_parallel_embedding``) are whole on every rank;
- pipeline parallelism gives each stage its ``layers / PP`` layers, the embedding to the first and
  ``ln_f`` + ``lm_head`` to the last;
- embedding, norms and ``lm_head`` stay in the model dtype under weight quantization
  (ModelOpt's default exclusions).

Heads of the speculative engine: Medusa as TL ``examples/medusa`` converts them
(``medusa_heads.i.medusa_layers.j.linear`` [H, H] + bias, ``medusa_heads.i.lm_head`` [V, H]);
EAGLE as one draft network per EAGLE layer (``fc`` [H, 2H] + bias, one decoder layer, its own
``lm_head``) — a simulation assumption, not read from upstream's converter here, chosen to err
towards more memory. Writes nothing."""

from __future__ import annotations

import math

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _linear(out_features: int, in_features: int, dense: int, quant: str | None, group: int) -> int:
    """One linear layer's weight tensors."""
    if quant == "FP8":
        return out_features * in_features + 2 * 4
    if quant in ("W4A16_AWQ", "W4A8_AWQ"):
        packed = out_features * in_features // 2
        scales = math.ceil(in_features / group) * out_features * 2
        return packed + scales + in_features * 2
    if quant in ("W8A16", "W8A8_SQ_PER_CHANNEL"):
        return out_features * in_features + out_features * 4
    if quant == "NVFP4":  # 4-bit values, one FP8 scale per block of 16, a global scale per tensor
        return out_features * in_features // 2 + out_features * in_features // 16 + 2 * 4
    if quant in ("W4A16",):
        return out_features * in_features // 2 + out_features * 4
    return out_features * in_features * dense


def _decoder_layer(pre: dict, tp: int, dense: int, quant: str | None, group: int) -> int:
    hidden, inter = int(pre["hidden_size"]), int(pre["intermediate_size"])
    heads, kv_heads, head = int(pre["num_attention_heads"]), int(pre["num_key_value_heads"]), int(pre["head_size"])
    qkv_rows = (heads + 2 * kv_heads) * head // tp
    total = _linear(qkv_rows, hidden, dense, quant, group)
    total += _linear(hidden, heads * head // tp, dense, quant, group)  # attention.dense
    total += 2 * _linear(inter // tp, hidden, dense, quant, group)  # mlp.fc, mlp.gate
    total += _linear(hidden, inter // tp, dense, quant, group)  # mlp.proj
    total += 2 * hidden * dense  # input_layernorm, post_layernorm
    if (pre.get("quantization") or {}).get("kv_cache_quant_algo"):
        total += 4
    return total


def rank_weight_bytes(pre: dict, rank: int, heads: dict | None = None) -> int:
    """Weights held by engine rank ``rank`` of the model ``pre`` (an engine's ``pretrained_config``:
    shapes, dtype, mapping, quantization); ``heads``: ``{"medusa": (num_heads, num_layers)}`` or
    ``{"eagle": num_layers}`` for a speculative target engine."""
    mapping = pre.get("mapping", {})
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    quant_cfg = pre.get("quantization") or {}
    quant, group = quant_cfg.get("quant_algo"), int(quant_cfg.get("group_size") or 128)
    dense = DTYPE_BYTES[pre["dtype"]]
    hidden, vocab = int(pre["hidden_size"]), int(pre["vocab_size"])
    layers = int(pre["num_hidden_layers"])
    stage = rank // tp
    per_stage = -(-layers // pp)
    stage_layers = max(0, min(per_stage, layers - stage * per_stage))
    total = stage_layers * _decoder_layer(pre, tp, dense, quant, group)
    if stage == 0:
        total += vocab * hidden * dense  # transformer.vocab_embedding
    if stage == pp - 1:
        padded_vocab = -(-vocab // tp) * tp
        lm_head = padded_vocab // tp * hidden * dense
        total += hidden * dense + lm_head  # transformer.ln_f, lm_head
        for kind, value in (heads or {}).items():
            if kind == "medusa":
                num_heads, num_layers = value
                total += num_heads * (num_layers * (hidden * hidden + hidden) * dense + lm_head)
            elif kind == "eagle":
                net = (2 * hidden * hidden + hidden) * dense + _decoder_layer(pre, tp, dense, None, group) + lm_head
                total += value * net
    return total
