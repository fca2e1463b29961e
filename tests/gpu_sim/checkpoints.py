"""Hugging Face checkpoint directories shaped like the downloads the shipped GPU configs name.

Writes, under a directory of the test's choosing: ``config.json`` with the real models' values,
weight files in the format each repository ships (sharded ``model-*.safetensors`` + index for
Llama 3.x, sharded ``pytorch_model-*.bin`` + index for ``lmsys/vicuna-7b-v1.3``,
``medusa_lm_head.pt`` for ``FasterDecoding/medusa-vicuna-7b-v1.3`` — whose config.json says
``medusa_num_heads: 2`` for a file holding five heads — and ``pytorch_model.bin`` for
``yuhuili/EAGLE-Vicuna-7B-v1.3``), and the tokenizer each ships (``tokenizer.json`` for Llama 3.x,
SentencePiece ``tokenizer.model`` only for Vicuna). Tensors have their real shapes but no data
(stride-0 views of one element), so the files are tiny; every pickled file is plain tensors, as
``torch.load(weights_only=True)`` requires.
"""

from __future__ import annotations

import json
from pathlib import Path

LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128009}
LLAMA32_1B = {**LLAMA31_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "tie_word_embeddings": True, "head_dim": 64}
LLAMA31_70B = {**LLAMA31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
               "num_attention_heads": 64}
VICUNA_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000,
             "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "torch_dtype": "float16",
             "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
EAGLE_VICUNA_7B = {**VICUNA_7B, "num_hidden_layers": 1}
MEDUSA_VICUNA_7B = {"medusa_num_heads": 2, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}


def _shaped(*shape: int):
    import torch

    return torch.zeros((), dtype=torch.float16).expand(*shape)


def _save_pickle(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    import torch

    torch.save({name: _shaped(*shape) for name, shape in shapes.items()}, str(path))


def _save_safetensors(path: Path, names: list[str]) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    save_file({name: np.zeros(1, np.float16) for name in names}, str(path))


def _write_shards(directory: Path, fmt: str, shards: int) -> None:
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
    stem, suffix = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    if shards == 1:  # small models ship one file and no index
        save = _save_safetensors if fmt == "safetensors" else lambda p, n: _save_pickle(p, {k: (1,) for k in n})
        save(directory / f"{stem}.{suffix}", names)
        return
    files = [f"{stem}-{i:05d}-of-{shards:05d}.{suffix}" for i in range(1, shards + 1)]
    weight_map = {name: files[min(i, shards - 1)] for i, name in enumerate(names)}
    for file in files:
        part = [n for n, f in weight_map.items() if f == file]
        if fmt == "safetensors":
            _save_safetensors(directory / file, part)
        else:
            _save_pickle(directory / file, {n: (1,) for n in part})
    index = f"{stem}.{suffix}.index.json"
    (directory / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _tokenizer_json(directory: Path) -> None:
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    vocab = {tok: i for i, tok in enumerate(["<unk>", "a", "b", "ab", "h", "i", "hi"])}
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=[("a", "b"), ("h", "i")], unk_token="<unk>"))
    tokenizer.add_special_tokens(["<|begin_of_text|>", "<|eot_id|>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}))


def _tokenizer_model(directory: Path) -> None:
    from pipeline.validate.tokenizer_compat import sentencepiece_model_proto

    model = sentencepiece_model_proto()()
    for piece, kind in (("<unk>", 2), ("<s>", 3), ("</s>", 3), ("▁hi", 1), ("▁a", 1), ("b", 1)):
        model.pieces.add(piece=piece, score=0.0, type=kind)
    (directory / "tokenizer.model").write_bytes(model.SerializeToString())
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                                 "unk_token": "<unk>", "legacy": False}))


def write_model(directory: Path, config: dict, *, weights: str = "safetensors", tokenizer: str = "json",
                shards: int = 2) -> Path:
    """An HF model dir: config.json, sharded weights + index (``weights``: safetensors | bin) and
    the tokenizer (``tokenizer``: json | spm | none)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    _write_shards(directory, weights, shards)
    if tokenizer == "json":
        _tokenizer_json(directory)
    elif tokenizer == "spm":
        _tokenizer_model(directory)
    return directory


def write_medusa_heads(directory: Path, *, heads: int = 5, config: dict = MEDUSA_VICUNA_7B,
                       hidden: int = 4096, vocab: int = 32000) -> Path:
    """FasterDecoding's layout: ``{h}.0.linear.{weight,bias}`` and ``{h}.1.weight`` per head."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    shapes: dict[str, tuple[int, ...]] = {}
    for h in range(heads):
        shapes.update({f"{h}.0.linear.weight": (hidden, hidden), f"{h}.0.linear.bias": (hidden,),
                       f"{h}.1.weight": (vocab, hidden)})
    _save_pickle(directory / "medusa_lm_head.pt", shapes)
    return directory


def write_eagle_head(directory: Path, *, layers: int = 1, fc_bias: bool = True, config: dict = EAGLE_VICUNA_7B,
                     weights: str = "bin") -> Path:
    """EAGLE-1 layout: ``embed_tokens``, ``layers.{i}.*`` (no input norm on layer 0), ``fc``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (vocab, hidden), "fc.weight": (hidden, 2 * hidden)}
    if fc_bias:
        shapes["fc.bias"] = (hidden,)
    for i in range(layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"layers.{i}.self_attn.{proj}.weight"] = (hidden, hidden)
        for proj, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)), ("down_proj", (hidden, inter))):
            shapes[f"layers.{i}.mlp.{proj}.weight"] = shape
        shapes[f"layers.{i}.post_attention_layernorm.weight"] = (hidden,)
    if weights == "bin":
        _save_pickle(directory / "pytorch_model.bin", shapes)
    else:
        _save_safetensors(directory / "model.safetensors", list(shapes))
    return directory


# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one decoder layer predicting into a 32000-token draft
# vocabulary mapped back onto the target's 128256 (config.json as the repository ships it)
EAGLE3_LLAMA31_8B = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 1, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "vocab_size": 128256, "draft_vocab_size": 32000,
                     "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
                     "tie_word_embeddings": False}
# Qwen/Qwen2.5-Coder-7B-Instruct
QWEN25_CODER_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                   "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                   "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16",
                   "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645}


def write_eagle3_head(directory: Path, config: dict = EAGLE3_LLAMA31_8B) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    _save_safetensors(directory / "model.safetensors", ["midlayer.self_attn.q_proj.weight", "fc.weight",
                                                        "d2t", "t2d", "lm_head.weight"])
    return directory


# what each /models/<name> of the shipped GPU configs is, as its repository ships it
MODELS = {
    "Meta-Llama-3.1-8B-Instruct": lambda d: write_model(d, LLAMA31_8B, shards=4),
    "Llama-3.2-1B-Instruct": lambda d: write_model(d, LLAMA32_1B, shards=1),
    "Meta-Llama-3.1-70B-Instruct": lambda d: write_model(d, LLAMA31_70B, shards=30),
    "vicuna-7b-v1.3": lambda d: write_model(d, VICUNA_7B, weights="bin", tokenizer="spm"),
    "medusa-vicuna-7b-v1.3": lambda d: write_medusa_heads(d),
    "EAGLE-Vicuna-7B-v1.3": lambda d: write_eagle_head(d),
    "EAGLE3-LLaMA3.1-Instruct-8B": lambda d: write_eagle3_head(d),
    "Qwen2.5-Coder-7B-Instruct": lambda d: write_model(d, QWEN25_CODER_7B, shards=4),
}


def localise(node, models: Path):
    """``node`` (a loaded config) with every ``/models/<name>`` pointing at a simulated download
    under ``models`` (written on first use)."""
    if isinstance(node, dict):
        return {k: localise(v, models) for k, v in node.items()}
    if isinstance(node, list):
        return [localise(v, models) for v in node]
    if isinstance(node, str) and node.startswith("/models/"):
        name = node.removeprefix("/models/")
        if not (models / name).exists():
            MODELS[name](models / name)
        return str(models / name)
    return node
