"""The target's tokenizer as preprocessing/postprocessing use it. Shared by the Triton models, the
tests and the benchmarks so every path tokenizes identically. Reads a checkpoint's tokenizer
directory; writes nothing.

Two loaders, one behaviour (upstream loads every directory with ``transformers.AutoTokenizer``,
tensorrtllm_backend@r25.05 ``all_models/inflight_batcher_llm/preprocessing/1/model.py``):

- ``tokenizer.json`` present (and no custom tokenizer code): HF ``tokenizers`` reads it directly,
  with ``tokenizer_config.json`` for the special tokens. That is the file AutoTokenizer's fast
  tokenizer loads too, without importing transformers (and torch) into every Python-backend stub.
- otherwise (e.g. a SentencePiece ``tokenizer.model`` only, as Llama-1/2 and Vicuna checkpoints
  ship): ``AutoTokenizer.from_pretrained(dir, legacy=False, padding_side="left",
  trust_remote_code=<configured>)`` as upstream does, except that custom tokenizer code runs only
  when the deployment allows it (upstream always passes ``trust_remote_code=True``).

Rules either way: ``encode(text, add_special_tokens=True)`` puts BOS first when the tokenizer asks
for it; ``end_id`` is the EOS id; ``pad_id`` is the pad id, falling back to EOS (upstream sets the
pad token to the EOS token when the tokenizer has none); decode skips special tokens."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.triton_models.fs_paths import fs_path, read_text


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


class _TokenizerFile:
    """``tokenizer.json`` through HF ``tokenizers``."""

    backend = "tokenizers"

    def __init__(self, tokenizer_dir: Path, config: dict):
        from tokenizers import Tokenizer

        # from_str, not from_file: the Rust reader refuses a stub's surrogate-escaped path (fs_paths)
        self._tok = Tokenizer.from_str(read_text(tokenizer_dir / "tokenizer.json"))
        self.bos_id = self._id_of(_token_content(config.get("bos_token")))
        self.eos_id = self._id_of(_token_content(config.get("eos_token")))
        pad = self._id_of(_token_content(config.get("pad_token")))
        self.pad_id = pad if pad is not None else self.eos_id
        self.add_bos = bool(config.get("add_bos_token", self.bos_id is not None))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.base_vocab_size = self._tok.get_vocab_size(with_added_tokens=False)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            if not ids or ids[0] != self.bos_id:
                ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


class _AutoTokenizer:
    """Any other tokenizer directory through ``transformers.AutoTokenizer``, as upstream loads it."""

    backend = "transformers"

    def __init__(self, tokenizer_dir: Path, trust_remote_code: bool):
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), legacy=False, padding_side="left",
                                                trust_remote_code=trust_remote_code)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types; say which dir failed
            hint = "" if trust_remote_code else " (custom tokenizer code runs only with target.trust_remote_code: true)"
            if "Gencode/Runtime" in str(exc):  # sentencepiece >= 0.2.3's generated code needs protobuf >= 7
                hint = (" (the installed sentencepiece was generated for a newer protobuf than the installed one: "
                        "install sentencepiece<0.2.3, or protobuf>=7 where tritonclient allows it)")
            elif "requires the protobuf library" in str(exc):  # transformers 4.x reads tokenizer.model through it
                hint = " (install protobuf: transformers 4.x needs it to read a SentencePiece tokenizer.model)"
            raise ValueError(f"cannot load the tokenizer in {tokenizer_dir} with transformers.AutoTokenizer: "
                             f"{exc}{hint}") from None
        if not tok.pad_token:
            tok.pad_token = tok.eos_token
        self._tok = tok
        self.bos_id = tok.bos_token_id
        self.eos_id = self._first_id(tok.eos_token)
        self.pad_id = self._first_id(tok.pad_token)
        self.vocab_size = len(tok.get_vocab())
        self.base_vocab_size = int(tok.vocab_size)

    def _first_id(self, token: str | None) -> int | None:
        """The id upstream uses for a special token: the first id of encoding its text."""
        ids = self._tok.encode(token, add_special_tokens=False) if token else []
        return int(ids[0]) if ids else None

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


class TextTokenizer:
    """The tokenizer in ``tokenizer_dir``; ``backend`` names the library that loaded it."""

    def __init__(self, tokenizer_dir: str | Path, trust_remote_code: bool = False):
        tokenizer_dir = fs_path(tokenizer_dir)
        if not tokenizer_dir.is_dir():
            raise FileNotFoundError(f"tokenizer directory {tokenizer_dir} does not exist")
        config = _read_json(tokenizer_dir / "tokenizer_config.json")
        if (tokenizer_dir / "tokenizer.json").is_file() and "auto_map" not in config:
            self._impl = _TokenizerFile(tokenizer_dir, config)
        else:
            self._impl = _AutoTokenizer(tokenizer_dir, trust_remote_code)
        self.backend = self._impl.backend
        self.bos_id, self.eos_id, self.pad_id = self._impl.bos_id, self._impl.eos_id, self._impl.pad_id
        self.vocab_size = self._impl.vocab_size  # with added tokens (upstream: len(tokenizer.vocab))
        self.base_vocab_size = self._impl.base_vocab_size  # without (upstream: tokenizer.vocab_size)

    @property
    def end_id(self) -> int | None:
        return self.eos_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._impl.encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._impl.decode([int(i) for i in ids], skip_special_tokens)
