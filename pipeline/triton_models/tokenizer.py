"""The target's tokenizer as preprocessing/postprocessing use it: ``tokenizer.json`` (HF
``tokenizers``) plus ``tokenizer_config.json`` for the special tokens. Shared by the Triton models,
the tests and the benchmarks so every path tokenizes identically.

Rules (contract §2.2/§2.4): ``encode(text, add_special_tokens=True)`` puts BOS first (added here
when the tokenizer's own post-processor does not and the config asks for it); ``end_id`` is the
EOS id; ``pad_id`` is the pad id, falling back to EOS; decode skips special tokens."""

from __future__ import annotations

import json
from pathlib import Path


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class TextTokenizer:
    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer  # noqa: PLC0415

        tokenizer_dir = Path(tokenizer_dir)
        tokenizer_file = tokenizer_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {tokenizer_dir}")
        self._tok = Tokenizer.from_file(str(tokenizer_file))
        config_file = tokenizer_dir / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        self.bos_id = self._id_of(_token_content(config.get("bos_token")))
        self.eos_id = self._id_of(_token_content(config.get("eos_token")))
        pad = self._id_of(_token_content(config.get("pad_token")))
        self.pad_id = pad if pad is not None else self.eos_id
        self.add_bos = bool(config.get("add_bos_token", self.bos_id is not None))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def end_id(self) -> int | None:
        return self.eos_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
