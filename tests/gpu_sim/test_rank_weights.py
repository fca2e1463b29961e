"""The simulated engines' weight sizes (``rank_weights``), counted tensor by tensor in the
TensorRT-LLM checkpoint layout, against figures published for the real checkpoints — not against
the project's own estimate (``memory_fit``), which the simulation is meant to check."""

from __future__ import annotations

import pytest
from rank_weights import rank_weight_bytes

LLAMA31_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_size": 128, "vocab_size": 128256, "dtype": "bfloat16"}
LLAMA31_70B = {**LLAMA31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
               "num_attention_heads": 64}
VICUNA_7B = {**LLAMA31_8B, "intermediate_size": 11008, "num_key_value_heads": 32, "vocab_size": 32000, "dtype": "float16"}


def _engine(model: dict, tp: int = 1, pp: int = 1, quant: str | None = None, group: int = 128) -> dict:
    return {**model, "mapping": {"tp_size": tp, "pp_size": pp}, "quantization": {"quant_algo": quant, "group_size": group}}


# Parameter counts the model publishers list (Hugging Face model pages: 8.03B, 70.6B, 6.74B; the
# exact figures are the safetensors index's total_size / 2 bytes); the engine keeps its own lm_head.
@pytest.mark.parametrize(("model", "params"), [(LLAMA31_8B, 8_030_261_248), (LLAMA31_70B, 70_553_706_496),
                                               (VICUNA_7B, 6_738_415_616)], ids=["llama31-8b", "llama31-70b", "vicuna-7b"])
def test_unquantized_tp1_engine_holds_the_published_parameter_count(model, params):
    assert rank_weight_bytes(_engine(model), 0) == 2 * params


def test_tensor_parallel_ranks_split_the_linears_and_each_keep_the_embedding_and_norms():
    whole = rank_weight_bytes(_engine(LLAMA31_70B), 0)
    ranks = [rank_weight_bytes(_engine(LLAMA31_70B, tp=4), r) for r in range(4)]
    replicated = 128256 * 8192 * 2 + (80 * 2 + 1) * 8192 * 2  # the embedding and every norm
    assert len(set(ranks)) == 1
    assert sum(ranks) == whole + 3 * replicated  # everything else split four ways


def test_pipeline_stages_hold_their_layers_and_the_ends():
    first, last = (rank_weight_bytes(_engine(LLAMA31_8B, pp=2), r) for r in range(2))
    assert first + last == rank_weight_bytes(_engine(LLAMA31_8B), 0)
    assert first - last == 128256 * 4096 * 2 - (4096 * 2 + 128256 * 4096 * 2)  # embedding vs ln_f + lm_head


def test_quantized_linears_shrink_and_keep_their_scales():
    dense = rank_weight_bytes(_engine(LLAMA31_8B), 0)
    fp8 = rank_weight_bytes(_engine(LLAMA31_8B, quant="FP8"), 0)
    awq = rank_weight_bytes(_engine(LLAMA31_8B, quant="W4A16_AWQ"), 0)
    awq64 = rank_weight_bytes(_engine(LLAMA31_8B, quant="W4A16_AWQ", group=64), 0)
    embed_and_head = 2 * 128256 * 4096 * 2
    assert fp8 - embed_and_head > (dense - embed_and_head) / 2  # 1 byte per weight + per-tensor scales
    assert (dense - embed_and_head) / 4 < awq - embed_and_head < (dense - embed_and_head) / 3.5
    assert awq64 > awq  # twice the group scales
