"""The demo models' byte-level BPE tokenizer (Hugging Face ``tokenizers``).

Trains a ~1024-token byte-level BPE on the generated corpus (deterministic: one thread, fixed
input order) and writes the files a Hugging Face / TensorRT-LLM toolchain reads from a checkpoint
directory: ``tokenizer.json``, ``tokenizer_config.json`` (``PreTrainedTokenizerFast``) and
``special_tokens_map.json``. Encoding prepends ``<s>``; byte-level decoding round-trips any text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = [PAD, BOS, EOS]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MODEL_MAX_LENGTH = 512


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (same input → same vocab)."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    for token, token_id in zip(SPECIAL_TOKENS, (PAD_ID, BOS_ID, EOS_ID)):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token} got id {tokenizer.token_to_id(token)}, expected {token_id}")
    return tokenizer


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2, sort_keys=True) + "\n")


def load_tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
