"""Tokenizer compatibility between a draft model and its target.

Reads ``tokenizer.json`` (vocabulary, token → id, with added tokens) or, where a checkpoint ships
only SentencePiece (Vicuna, Llama-2 era), ``tokenizer.model`` (its pieces, in id order, parsed
with the SentencePiece protobuf schema that ``transformers`` carries, plus the added tokens of
``tokenizer_config.json``), ``tokenizer_config.json``
(bos/eos/unk/pad special tokens) and ``config.json`` (``vocab_size``) from two checkpoint
directories; writes nothing. Draft-target speculation compares token *ids*, so the two
vocabularies must be identical; :func:`compare_tokenizers` returns one human-readable problem
per mismatch, naming the first differing tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")
_SHOW = 3  # differing tokens named in a message


def load_vocab(directory: Path) -> dict[str, int]:
    """token → id of ``directory/tokenizer.json`` including added tokens (ValueError if unreadable);
    of ``tokenizer.model`` when there is no tokenizer.json."""
    path = directory / "tokenizer.json"
    if not path.is_file() and (directory / "tokenizer.model").is_file():
        return _vocab_from_sentencepiece(directory)
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415 - optional: tokenizers (the reference/serving extras; without it tokenizer.json is read as JSON)

        return dict(Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True))
    except ImportError:
        return _vocab_from_json(path)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception subclasses for bad files
        raise ValueError(f"cannot read {path}: {exc}") from None


def sentencepiece_model_proto():
    """The SentencePiece ``ModelProto`` class. ``transformers`` and the ``sentencepiece`` package each
    carry a generated module for the same ``sentencepiece_model.proto``, and protobuf refuses to
    register that file twice in one process; so take the module ``transformers`` itself picks
    (its ``import_protobuf``), which keeps our reads and AutoTokenizer's in one process working."""
    try:
        from transformers.convert_slow_tokenizer import import_protobuf  # noqa: PLC0415 - optional: transformers (the reference/serving extras; without it the sentencepiece package's proto is used)
    except ImportError:
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415 - optional: sentencepiece (the serving extra; ImportError reaches the caller when both are absent)

        return sentencepiece_model_pb2.ModelProto
    return import_protobuf().ModelProto


def _sentencepiece_pieces(path: Path) -> dict[str, int]:
    """piece → id of a SentencePiece model, read as protobuf data only (no processor is built, so a
    model file that carries just its pieces still reads)."""
    try:
        model = sentencepiece_model_proto()()
    except ImportError as exc:
        raise ValueError(f"cannot read {path}: parsing SentencePiece needs transformers or sentencepiece ({exc})") from None
    try:
        model.ParseFromString(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - protobuf raises DecodeError (an Exception subclass)
        raise ValueError(f"cannot read {path}: not a SentencePiece model ({exc})") from None
    return {piece.piece: i for i, piece in enumerate(model.pieces)}


def _same_file(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def _vocab_from_json(path: Path) -> dict[str, int]:
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model", {})
    vocab = model.get("vocab", {})
    if isinstance(vocab, list):  # Unigram: [[token, score], ...]
        result = {entry[0]: i for i, entry in enumerate(vocab)}
    else:
        result = dict(vocab)
    for added in data.get("added_tokens", []):
        result[added["content"]] = added["id"]
    return result


def _vocab_from_sentencepiece(directory: Path) -> dict[str, int]:
    result = _sentencepiece_pieces(directory / "tokenizer.model")
    cfg_path = directory / "tokenizer_config.json"
    added = json.loads(cfg_path.read_text(encoding="utf-8")).get("added_tokens_decoder", {}) if cfg_path.is_file() else {}
    for token_id, token in added.items():
        text = _token_text(token)
        if text is not None:
            result[text] = int(token_id)
    return result


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def load_special_tokens(directory: Path) -> dict[str, str]:
    """role → token text from tokenizer_config.json (and special added tokens from tokenizer.json)."""
    specials: dict[str, str] = {}
    cfg_path = directory / "tokenizer_config.json"
    if cfg_path.is_file():
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
        for role in SPECIAL_ROLES:
            text = _token_text(data.get(role))
            if text is not None:
                specials[role] = text
    tok_path = directory / "tokenizer.json"
    if tok_path.is_file():
        data = json.loads(tok_path.read_text(encoding="utf-8"))
        for added in data.get("added_tokens", []):
            if added.get("special"):
                specials[f"special[{added['id']}]"] = added["content"]
    return specials


def _first_differences(target: dict[str, int], draft: dict[str, int]) -> list[str]:
    by_id_t = {i: t for t, i in target.items()}
    by_id_d = {i: t for t, i in draft.items()}
    diffs = []
    for token_id in sorted(set(by_id_t) | set(by_id_d)):
        t_tok, d_tok = by_id_t.get(token_id), by_id_d.get(token_id)
        if t_tok != d_tok:
            diffs.append(f"id {token_id}: target {t_tok!r} vs draft {d_tok!r}")
            if len(diffs) == _SHOW:
                break
    return diffs


def _config_vocab_size(directory: Path) -> int | None:
    try:
        value = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int) else None


def compare_tokenizers(target_dir: Path, draft_dir: Path) -> list[str]:
    """Problems that make the draft's token ids meaningless to the target (empty = compatible)."""
    problems: list[str] = []
    same_spm = not (target_dir / "tokenizer.json").is_file() and not (draft_dir / "tokenizer.json").is_file() and \
        _same_file(target_dir / "tokenizer.model", draft_dir / "tokenizer.model")
    target_vocab, draft_vocab = ({}, {}) if same_spm else (load_vocab(target_dir), load_vocab(draft_dir))
    if target_vocab != draft_vocab:
        detail = "; ".join(_first_differences(target_vocab, draft_vocab))
        problems.append(
            f"vocabularies differ (target {len(target_vocab)} tokens, draft {len(draft_vocab)}); "
            f"first differences: {detail}"
        )
    t_special, d_special = load_special_tokens(target_dir), load_special_tokens(draft_dir)
    for role in sorted(set(t_special) | set(d_special)):
        if t_special.get(role) != d_special.get(role):
            problems.append(f"special token {role} differs: target {t_special.get(role)!r} vs draft {d_special.get(role)!r}")
    t_size, d_size = _config_vocab_size(target_dir), _config_vocab_size(draft_dir)
    if t_size is not None and d_size is not None and t_size != d_size:
        problems.append(f"config.json vocab_size differs: target {t_size} vs draft {d_size}")
    return problems
