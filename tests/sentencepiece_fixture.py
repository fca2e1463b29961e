"""A tiny SentencePiece tokenizer, trained at test time, in the layout of a Llama-1/2 or Vicuna
checkpoint that ships no ``tokenizer.json``: ``tokenizer.model`` + ``tokenizer_config.json``
(``LlamaTokenizer``, no pad token) + ``special_tokens_map.json`` + ``config.json``. Optionally a
random tiny Llama next to it, so a deployment can serve it."""

from __future__ import annotations

import io
import json
from pathlib import Path

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and verifies them in one pass.",
    "1 + 2 = 3, 2 + 3 = 5, 3 + 5 = 8, 5 + 8 = 13",
    "name: tiny\nvalue: 42\nitems: [a, b, c]\n",
] * 20
VOCAB_SIZE = 400  # 256 byte-fallback pieces + 3 specials + merges
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2


def _added(content: str) -> dict:
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False}


def train_model() -> bytes:
    """A Llama-style SentencePiece BPE model (byte fallback, no normalization, ids unk 0, bos 1,
    eos 2, no pad piece)."""
    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=VOCAB_SIZE, model_type="bpe",
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1, byte_fallback=True, character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=True,
        split_digits=True, allow_whitespace_only_pieces=True, num_threads=1, minloglevel=2,
    )
    return out.getvalue()


def model_config(vocab_size: int = VOCAB_SIZE) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID, "vocab_size": vocab_size}


def write_tokenizer_dir(out_dir: Path, with_tokenizer_config: bool = True) -> Path:
    """``tokenizer.model`` (+ the configs a Vicuna-v1.3-style checkpoint carries) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(train_model())
    (out_dir / "config.json").write_text(json.dumps(model_config(), indent=2))
    if with_tokenizer_config:
        config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                  "bos_token": _added("<s>"), "eos_token": _added("</s>"), "unk_token": _added("<unk>"),
                  "pad_token": None, "clean_up_tokenization_spaces": False, "legacy": False,
                  "model_max_length": 2048, "padding_side": "right", "sp_model_kwargs": {}}
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return out_dir


def write_checkpoint(out_dir: Path, max_positions: int = 320) -> Path:
    """The tokenizer dir plus a random 1-layer Llama (safetensors) whose vocabulary matches it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    write_tokenizer_dir(out_dir)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False, torch_dtype="float32")
    LlamaForCausalLM(config).eval().save_pretrained(out_dir, safe_serialization=True)
    return out_dir
