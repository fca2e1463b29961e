"""The ranges TensorRT-LLM's executor enforces on a request's sampling and length inputs, and the
limits of the CPU reference engine, checked before a request reaches an engine so that a bad value
is refused with a message naming the input and the value instead of being answered. The table,
with the upstream source of every rule, is docs/request-validation.md.

Reads scalars through a getter (``name -> value or None``); raises :class:`RuleError`. Pure
Python, so the ``tensorrt_llm`` model (its own input names), the BLS (the client names it maps
onto them) and the unit tests share one definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

Getter = Callable[[str], "float | int | None"]


class RuleError(ValueError):
    """A request input outside the range TensorRT-LLM (or the CPU engine) accepts."""


@dataclass(frozen=True)
class RangeRule:
    name: str  # the tensorrt_llm input
    client_name: str | None  # the ensemble / BLS input that becomes it, if any
    allowed: str
    ok: Callable[[float], bool]  # NaN fails every comparison, as in the executor's checks


# TensorRT-LLM executor SamplingConfig::check* and Request::Impl::validate (the C++ backend maps
# the inputs in getSamplingConfigFromTensors; runtime_top_p <= 0 is dropped there, i.e. unset).
RANGE_RULES = (
    RangeRule("beam_width", "beam_width", "> 0", lambda v: v > 0),
    RangeRule("runtime_top_k", "top_k", ">= 0", lambda v: v >= 0),
    RangeRule("runtime_top_p", "top_p", "<= 1 (a value <= 0 means unset)", lambda v: v <= 1.0),
    RangeRule("runtime_top_p_min", None, "in [0, 1]", lambda v: 0.0 <= v <= 1.0),
    RangeRule("runtime_top_p_decay", None, "in (0, 1]", lambda v: 0.0 < v <= 1.0),
    RangeRule("runtime_top_p_reset_ids", None, ">= 0", lambda v: v >= 0),
    RangeRule("temperature", "temperature", ">= 0", lambda v: v >= 0.0),
    RangeRule("len_penalty", "length_penalty", ">= 0", lambda v: v >= 0.0),
    RangeRule("repetition_penalty", "repetition_penalty", "> 0", lambda v: v > 0.0),
    RangeRule("beam_search_diversity_rate", None, ">= 0", lambda v: v >= 0.0),
    RangeRule("min_tokens", "min_tokens", ">= 0", lambda v: v >= 0),
    RangeRule("num_return_sequences", "num_return_sequences", "> 0", lambda v: v > 0),
    RangeRule("request_output_len", "max_tokens", "> 0", lambda v: v > 0),
)

# What the CPU reference engine implements: temperature, top-k, top-p and seed, one beam, one
# sequence. A value that would change the output there is refused rather than ignored.
CPU_NEUTRAL = (
    ("repetition_penalty", 1.0, "repetition penalty"),
    ("presence_penalty", 0.0, "presence penalty"),
    ("frequency_penalty", 0.0, "frequency penalty"),
    ("runtime_top_p_decay", 1.0, "top-p decay"),
)


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _label(rule: RangeRule, use_client_names: bool) -> str:
    if use_client_names:
        return rule.client_name or rule.name
    if rule.client_name and rule.client_name != rule.name:
        return f"{rule.name} ({rule.client_name} on the ensemble and the BLS)"
    return rule.name


def check_ranges(get: Getter, use_client_names: bool = False) -> None:
    """Every :data:`RANGE_RULES` row whose input is present; the BLS passes its own names."""
    for rule in RANGE_RULES:
        name = rule.client_name if use_client_names else rule.name
        if name is None:
            continue
        value = get(name)
        if value is not None and not rule.ok(value):
            raise RuleError(f"{_label(rule, use_client_names)} must be {rule.allowed}, got {_show(value)}")
    beams = get("beam_width")
    sequences = get("num_return_sequences")
    if beams is not None and sequences is not None and beams > 1 and sequences > beams:
        raise RuleError(f"num_return_sequences ({sequences}) must be <= beam_width ({beams}) with beam search")


def check_end_id(end_id: int | None, vocab_size: int) -> None:
    """-1 means 'never stop on an end token' (TensorRT-LLM LlmRequest::validate)."""
    if end_id is not None and not -1 <= end_id < vocab_size:
        raise RuleError(f"end_id ({end_id}) is not within acceptable range [-1, {vocab_size})")


def check_cpu_engine(get: Getter) -> None:
    """The limits of the CPU reference engine, after the upstream ranges passed."""
    beams = get("beam_width")
    if beams is not None and beams > 1:
        raise RuleError(f"beam_width must be 1 on the CPU reference engine (no beam search), got {beams}")
    sequences = get("num_return_sequences")
    if sequences is not None and sequences > 1:
        raise RuleError(f"num_return_sequences must be 1 on the CPU reference engine, got {sequences}")
    for name, neutral, what in CPU_NEUTRAL:
        value = get(name)
        if value is not None and not (math.isfinite(value) and value == neutral):
            raise RuleError(f"{name} {_show(value)} is not supported by the CPU reference engine: it has no "
                            f"{what} (send {_show(neutral)} or leave it out)")
