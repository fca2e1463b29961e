"""The n-gram settings of ``tensorrt_llm_bls``, as ``config.pbtxt`` parameters: ``render`` writes
them from the config's ``speculation`` block (:meth:`NgramSettings.parameters`) and the BLS reads
them back at start-up (:func:`ngram_settings`). Imports nothing of Triton, so render can use it
outside the server. Reads and writes no files."""

from __future__ import annotations

from dataclasses import asdict, dataclass

METHOD_PARAM = "speculative_method"
PREFIX = "ngram_"


@dataclass(frozen=True)
class NgramSettings:
    max_draft_len: int = 4
    max_matching_ngram_size: int = 2
    min_matching_ngram_size: int = 1
    is_keep_all: bool = True
    is_use_oldest: bool = True

    def __post_init__(self):
        if self.max_draft_len < 1:
            raise ValueError(f"{PREFIX}max_draft_len must be >= 1, got {self.max_draft_len}")
        if not 1 <= self.min_matching_ngram_size <= self.max_matching_ngram_size:
            raise ValueError(f"need 1 <= {PREFIX}min_matching_ngram_size ({self.min_matching_ngram_size}) <= "
                             f"{PREFIX}max_matching_ngram_size ({self.max_matching_ngram_size})")

    def parameters(self) -> dict[str, str]:
        """The BLS ``config.pbtxt`` parameters carrying these settings."""
        return {METHOD_PARAM: "ngram", **{PREFIX + k: _text(v) for k, v in asdict(self).items()}}


def _text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _param(model_config: dict, key: str) -> str:
    value = model_config.get("parameters", {}).get(key, {}).get("string_value", "")
    return "" if value.startswith("${") else value


def ngram_settings(model_config: dict) -> NgramSettings | None:
    """The settings of a BLS model config (Triton's parsed ``model_config``); None when the BLS
    does not draft n-grams. A parameter left out takes the default above."""
    if _param(model_config, METHOD_PARAM) != "ngram":
        return None
    values: dict = {}
    for name, default in asdict(NgramSettings()).items():
        raw = _param(model_config, PREFIX + name)
        if raw:
            values[name] = raw.strip().lower() in ("true", "1", "yes") if isinstance(default, bool) else int(raw)
    return NgramSettings(**values)
