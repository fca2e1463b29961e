"""What the CPU llmapi ``tensorrt_llm`` model (:mod:`pipeline.triton_models.llmapi`) makes of its
``model.yaml`` and of a request's ``sampling_param_*`` inputs. Pure Python (no Triton stub), so the
unit tests and the model share one definition.

``model.yaml`` is the file upstream's llmapi model reads (TensorRT-LLM
``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``: every key but ``triton_config`` is an
argument of ``tensorrt_llm.LLM``). The CPU engine takes ``model``, ``max_batch_size``,
``max_seq_len`` and ``speculative_config`` from it — ``decoding_type`` picks the proposer:
``Draft_Target`` (``speculative_model`` is the draft checkpoint, ``max_draft_len`` its K),
``Eagle3`` (``speculative_model`` is the EAGLE-3 head, one-model only: ``eagle3_one_model`` false
is refused), ``NGram`` (``max_draft_len``, ``max_matching_ngram_size``, the pool switches) or
``Lookahead`` (``max_window_size``, ``max_ngram_size``, ``max_verification_set_size``; the draft
length follows from them as upstream computes it); none for the baseline. ``max_concurrency`` and
``draft_len_schedule`` become the engine's K per live batch size, as TensorRT-LLM's drafter reads
them. GPU-only arguments (KV-cache fraction, CUDA graphs, TP/PP of 1, the overlap scheduler)
are read and ignored. The settings that have no LLM argument (threads, compute dtype, quantized
weights, prefix cache, fast paths) come from the reference engine the build wrote for the arm.

The sampling ranges are those of TensorRT-LLM's ``SamplingParams`` and executor
(``tensorrt_llm/sampling_params.py``; the C++ ``SamplingConfig`` checks), named by the llmapi
input that carries them; the CPU engine's limits (one beam, no penalties) follow.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from pipeline.artefacts.engine import (
    DraftTargetProposer,
    Eagle3Proposer,
    EngineDescriptor,
    LookaheadProposer,
    NgramProposer,
    NoProposer,
)
from pipeline.artefacts.schedule import DraftLenRange
from pipeline.reference.draft_len import lookahead_max_draft_len
from pipeline.trtllm.schedule_forms import triples_from_fields

NGRAM_FIELDS = ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
LOOKAHEAD_FIELDS = ("max_window_size", "max_ngram_size", "max_verification_set_size")  # LookaheadDecodingConfig
DEFAULT_MAX_TOKENS = 32  # tensorrt_llm SamplingParams.max_tokens default


class SpecError(ValueError):
    """model.yaml asks for something the CPU engine cannot run (a model load error)."""


def _proposer(spec: dict[str, Any] | None, base: EngineDescriptor):
    if not spec:
        return NoProposer(), 0
    kind = spec.get("decoding_type")
    if kind == "Lookahead":  # its max_draft_len follows from the three sizes (calculate_speculative_resource)
        return _lookahead(spec)
    k = spec.get("max_draft_len")
    if not isinstance(k, int) or k < 1:
        raise SpecError(f"speculative_config.max_draft_len must be an integer >= 1, got {k!r}")
    if kind == "Draft_Target":
        draft = spec.get("speculative_model")
        if not draft:
            raise SpecError("speculative_config.speculative_model (the draft checkpoint) is required for Draft_Target")
        built = base.proposer if isinstance(base.proposer, DraftTargetProposer) else None
        same = built is not None and Path(built.draft_dir).resolve() == Path(draft).resolve()
        return DraftTargetProposer(draft_dir=str(Path(draft).resolve()), num_draft_tokens=k,
                                   quantization=built.quantization if same else "none",
                                   draft_int8=built.draft_int8 if same else False), k
    if kind == "Eagle3":
        return _eagle3(spec, base, k), k
    if kind == "NGram":
        fields = {name: spec[name] for name in NGRAM_FIELDS if spec.get(name) is not None}
        # NGramDecodingConfig has no lower bound on the pattern: every length down to one matches
        return NgramProposer(max_draft_len=k, min_matching_ngram_size=1, **fields), k
    raise SpecError(f"speculative_config.decoding_type {kind!r} is not available on the CPU reference engine "
                    "(Draft_Target, Eagle3, NGram or no speculative_config)")


def _lookahead(spec: dict[str, Any]) -> tuple[LookaheadProposer, int]:
    """``LookaheadDecodingConfig``: the three sizes, each a positive int (the LLM API's rule),
    upstream's defaults where absent."""
    sizes = {name: spec.get(name, LookaheadProposer.model_fields[name].default) for name in LOOKAHEAD_FIELDS}
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SpecError(f"speculative_config.{name} must be a positive integer, got {value!r}")
    try:
        proposer = LookaheadProposer(**sizes)
    except ValueError as exc:
        raise SpecError(f"speculative_config: {exc}") from None
    return proposer, lookahead_max_draft_len(*sizes.values())


def _eagle3(spec: dict[str, Any], base: EngineDescriptor, k: int) -> Eagle3Proposer:
    head = spec.get("speculative_model")
    if not head:
        raise SpecError("speculative_config.speculative_model (the EAGLE-3 head checkpoint) is required for Eagle3")
    if spec.get("eagle3_one_model") is False:
        raise SpecError("speculative_config.eagle3_one_model false (a separate draft engine) is not available on "
                        "the CPU reference engine: it runs the head inside the target's step")
    for name in ("eagle_choices", "use_dynamic_tree"):
        if spec.get(name):
            raise SpecError(f"speculative_config.{name} is not available on the CPU reference engine (EAGLE-3 "
                            "drafts a chain of max_draft_len tokens)")
    built = base.proposer if isinstance(base.proposer, Eagle3Proposer) else None
    same = built is not None and Path(built.head_dir).resolve() == Path(head).resolve()
    return Eagle3Proposer(head_dir=str(Path(head).resolve()), max_draft_len=k,
                          draft_int8=built.draft_int8 if same else False)


def engine_descriptor(args: dict[str, Any], base: EngineDescriptor) -> EngineDescriptor:
    """The engine ``model.yaml`` describes, with the built engine's CPU-only settings."""
    model = args.get("model")
    if not model:
        raise SpecError("model.yaml has no 'model' (the target checkpoint)")
    if Path(model).resolve() != Path(base.model_dir).resolve():
        raise SpecError(f"model.yaml's model {model} is not the checkpoint the CPU engine was built from "
                        f"({base.model_dir}): re-run `specdeploy build` and `specdeploy render`")
    spec = args.get("speculative_config")
    proposer, k = _proposer(spec, base)
    fields = base.model_dump(exclude={"proposer", "role", "max_draft_len", "max_batch_size", "max_seq_len",
                                      "draft_len_schedule"})
    max_batch = int(args.get("max_batch_size") or base.max_batch_size)
    return EngineDescriptor(**{**fields, "role": "speculative" if k else "baseline", "proposer": proposer,
                               "max_draft_len": k, "max_batch_size": max_batch,
                               "draft_len_schedule": _schedule(spec, k, max_batch) if k else None,
                               "max_seq_len": int(args.get("max_seq_len") or base.max_seq_len)})


def _schedule(spec: dict[str, Any], k: int, max_batch: int) -> list[DraftLenRange] | None:
    """``max_concurrency`` / ``draft_len_schedule`` as the engine's K per batch-size range, as
    TensorRT-LLM's drafter reads them (:func:`pipeline.trtllm.schedule_forms.triples_from_fields`)."""
    try:
        triples = triples_from_fields({**spec, "max_draft_len": spec.get("max_draft_len") or k}, max_batch)
    except ValueError as exc:
        raise SpecError(f"speculative_config: {exc}") from None
    if triples is None:
        return None
    return [DraftLenRange(min_concurrency=lo, max_concurrency=hi, draft_len=k) for lo, hi, k in triples]


# ----------------------------------------------------------------------------------------------
# Request inputs

Getter = Callable[[str], Any]

# (input, allowed, check): TensorRT-LLM's SamplingParams / SamplingConfig ranges
RANGES = (
    ("sampling_param_temperature", ">= 0", lambda v: v >= 0.0),
    ("sampling_param_top_k", ">= 0", lambda v: v >= 0),
    ("sampling_param_top_p", "in [0, 1]", lambda v: 0.0 <= v <= 1.0),
    ("sampling_param_max_tokens", "> 0", lambda v: v > 0),
    ("sampling_param_best_of", ">= 1", lambda v: v >= 1),
)
CPU_NEUTRAL = (("sampling_param_frequency_penalty", "frequency penalty"),
               ("sampling_param_presence_penalty", "presence penalty"))


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def check_sampling(get: Getter) -> None:
    """Raise ValueError naming the input when a value is out of range or beyond the CPU engine."""
    for name, allowed, ok in RANGES:
        value = get(name)
        if value is not None and not ok(value):  # NaN fails every comparison
            raise ValueError(f"{name} must be {allowed}, got {_show(value)}")
    best_of = get("sampling_param_best_of")
    if best_of is not None and best_of > 1:
        raise ValueError(f"sampling_param_best_of must be 1 on the CPU reference engine (no beam search), got {best_of}")
    for name, what in CPU_NEUTRAL:
        value = get(name)
        if value is not None and not (math.isfinite(value) and value == 0.0):
            raise ValueError(f"{name} {_show(value)} is not supported by the CPU reference engine: it has no "
                             f"{what} (send 0 or leave it out)")


def sampling_fields(get: Getter) -> dict[str, Any]:
    """The engine's SamplingParams fields. No temperature / top_k / top_p at all decodes greedily
    (TensorRT-LLM's default request); a temperature alone samples the whole distribution;
    temperature 0 is greedy."""
    temperature, top_k, top_p = (get(f"sampling_param_{n}") for n in ("temperature", "top_k", "top_p"))
    seed = get("sampling_param_seed")
    out: dict[str, Any] = {"seed": None if seed is None else int(seed)}
    if temperature is not None and temperature == 0.0:
        return {**out, "top_k": 1}
    if temperature is not None:
        out["temperature"] = float(temperature)
    if top_k:
        out["top_k"] = int(top_k)
    if top_p is not None and top_p > 0.0:
        out["top_p"] = float(top_p)
    if temperature is not None and "top_k" not in out and "top_p" not in out:
        out["top_p"] = 1.0  # sample from the whole distribution
    return out


FINISH_REASONS = {"length": "length", "end_id": "stop", "stop_word": "stop", "cancelled": "cancelled"}


def finish_reason(engine_reason: str | None) -> str:
    """The LLM API's ``CompletionOutput.finish_reason`` as upstream's model sends it (``str()``)."""
    return str(FINISH_REASONS.get(engine_reason)) if engine_reason else "None"
