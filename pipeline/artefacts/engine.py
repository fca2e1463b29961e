"""The reference engine descriptor, ``<engine_dir>/engine.json``: the reference (CPU) backend's
counterpart of a TensorRT-LLM engine directory. Written by ``specdeploy build``
(``pipeline.build.reference_step engine``), read by ``pipeline.reference.engine.load_engine`` and
``create_engine``. Every default of the descriptor lives here, once."""

from __future__ import annotations

import os
from typing import Annotated, Literal, Union

from pydantic import BeforeValidator, Field, model_serializer, model_validator

from pipeline.artefacts.base import Artefact, Strict
from pipeline.artefacts.names import ENGINE_DESCRIPTOR, ENGINE_FORMAT  # noqa: F401 - ENGINE_DESCRIPTOR re-exported
from pipeline.artefacts.schedule import DraftLenRange, check_ranges
from pipeline.reference.draft_len import check_lookahead_sizes  # torch-free: upstream's legality rule, once

Role = Literal["baseline", "target", "draft", "speculative"]
Quantization = Literal["none", "int8_wo"]
Choices = list[list[Annotated[int, Field(ge=0)]]]
# a directory: given as a str or a Path, recorded as a str
Dir = Annotated[str, BeforeValidator(lambda v: os.fspath(v) if isinstance(v, os.PathLike) else v)]


class NoProposer(Strict):
    """No proposer: the target decodes alone (baseline, draft, and the external-draft target)."""

    method: Literal["none"] = "none"


class _DraftSide(Strict):
    draft_int8: bool = Field(False, description="Quantize the draft-side weights to int8 at load (outputs unchanged).")

    @model_serializer(mode="wrap")
    def _only_when_set(self, handler):
        """``draft_int8`` is written only when on, as the build step always wrote it."""
        data = handler(self)
        if not data.get("draft_int8"):
            data.pop("draft_int8", None)
        return data


class DraftTargetProposer(_DraftSide):
    """A separate draft model proposes ``num_draft_tokens`` per step inside the engine."""

    method: Literal["draft_target"] = "draft_target"
    draft_dir: Dir = Field(description="HF Llama checkpoint of the draft (absolute path).")
    quantization: Quantization = "none"
    num_draft_tokens: int = Field(4, ge=1)


class MedusaProposer(_DraftSide):
    """Medusa heads on the target; trees serve greedy requests, sampled ones get the chain."""

    method: Literal["medusa"] = "medusa"
    heads_dir: Dir
    num_heads: int | None = Field(None, ge=1, description="Heads used (None: all the checkpoint has).")
    choices: Choices | None = None


class EagleProposer(_DraftSide):
    """An EAGLE head; draft depth is the deepest choice, or ``num_layers`` without a tree."""

    method: Literal["eagle"] = "eagle"
    head_dir: Dir
    num_layers: int = Field(4, ge=1, description="Draft depth (TensorRT-LLM's --num_eagle_layers).")
    choices: Choices | None = None


class Eagle3Proposer(_DraftSide):
    """An EAGLE-3 head on the target's captured hidden states (the layers its config names); a
    chain of ``max_draft_len`` drafts (pipeline.reference.proposers.eagle3)."""

    method: Literal["eagle3"] = "eagle3"
    head_dir: Dir
    max_draft_len: int = Field(3, ge=1, description="Draft tokens per step (speculative_config.max_draft_len).")


class NgramProposer(Strict):
    """N-gram (prompt-lookup) drafts read from the sequence's own tokens: no checkpoint, no draft
    weights (pipeline.reference.proposers.ngram; TensorRT-LLM NGramDecodingConfig's fields)."""

    method: Literal["ngram"] = "ngram"
    max_draft_len: int = Field(4, ge=1, description="Most draft tokens per step.")
    max_matching_ngram_size: int = Field(2, ge=1, description="Longest pattern looked up (the longest match wins).")
    min_matching_ngram_size: int = Field(1, ge=1, description="Shortest pattern that may match.")
    is_keep_all: bool = Field(True, description="Keep every earlier occurrence (false: only the first).")
    is_use_oldest: bool = Field(True, description="Propose from the oldest occurrence (false: the newest).")
    is_public_pool: bool = Field(True, description="One pool for all requests (false: one per request).")

    @model_validator(mode="after")
    def _min_below_max(self):
        if self.min_matching_ngram_size > self.max_matching_ngram_size:
            raise ValueError(f"min_matching_ngram_size ({self.min_matching_ngram_size}) exceeds "
                             f"max_matching_ngram_size ({self.max_matching_ngram_size})")
        return self


class LookaheadProposer(Strict):
    """Lookahead decoding: a Jacobi window and an n-gram pool, no checkpoint
    (pipeline.reference.proposers.lookahead; TensorRT-LLM LookaheadDecodingConfig's fields,
    defaults and legality rules)."""

    method: Literal["lookahead"] = "lookahead"
    max_window_size: int = Field(4, ge=1, description="W: Jacobi window columns (n-grams made per step).")
    max_ngram_size: int = Field(3, ge=1, description="N: tokens per n-gram (a guess drafts N - 1).")
    max_verification_set_size: int = Field(4, ge=0, description="G: pooled n-grams verified per step.")

    @model_validator(mode="after")
    def _legal(self):
        check_lookahead_sizes(self.max_window_size, self.max_ngram_size, self.max_verification_set_size)
        return self


ProposerSpec = Annotated[Union[NoProposer, DraftTargetProposer, MedusaProposer, EagleProposer, Eagle3Proposer,
                                       NgramProposer, LookaheadProposer],
                         Field(discriminator="method")]


class EngineDescriptor(Artefact):
    """A reference engine: which checkpoint, which role, which proposer, and its limits."""

    SCHEMA = ENGINE_FORMAT
    VERSION = 1
    FILE = "engines/NAME/engine/<role>/engine.json"
    WRITER = "specdeploy build"
    LEGACY_FORMAT = True

    format: str = Field("", description="The schema tag again, as engine.json carried it before `schema`.")
    role: Role = Field("baseline", description=(
        "baseline: target only (the A/B control); target: verifies external draft_input_ids; "
        "draft: the draft model as a plain generator; speculative: target plus an internal proposer."))
    model_dir: Dir = Field(description="HF Llama checkpoint (config.json, weights, tokenizer).")
    quantization: Quantization = Field("none", description="int8_wo: model_dir holds the quantized weights.")
    proposer: ProposerSpec = Field(default_factory=NoProposer)
    max_draft_len: int = Field(0, ge=0, description="0 for baseline/draft; K for target; node count for trees.")
    max_batch_size: int = Field(8, ge=1)
    max_seq_len: int = Field(512, ge=1)
    max_input_len: int | None = Field(None, ge=1)
    compute_dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    threads: int = Field(1, ge=1)
    prefix_cache_entries: int = Field(64, ge=0)
    fast_paths: bool = Field(True, description=(
        "Run the CPU fast path's models (scripted kernels, fused steps, int8 packing) instead of the "
        "plain ones: the same maths, bit for bit where the tests compare them."))
    draft_len_schedule: list[DraftLenRange] | None = Field(None, description=(
        "K per live batch size range (a speculation schedule's ranges, pipeline/artefacts/schedule.py): each step "
        "drafts the K of the range holding the batch, 0 = a plain target step; None: every step drafts fully."))
    config_hash: str | None = Field(None, description="The deployment config's hash (the manifest records it too).")

    @model_validator(mode="after")
    def _schedule_ranges(self):
        if self.draft_len_schedule is not None:
            check_ranges(self.draft_len_schedule)
        return self
    name: str = ""


def default(field: str):
    """The default of one descriptor field (the build step's flags take theirs from here)."""
    return EngineDescriptor.model_fields[field].get_default(call_default_factory=True)


def proposer_default(model: type[Strict], field: str):
    return model.model_fields[field].get_default(call_default_factory=True)
