"""The TensorRT-LLM Triton ``llmapi`` model's tensor contract, for the Locust users (pure Python:
no gevent, no Locust, no tritonclient imports).

Reads the run settings (``lt_common.RunSettings``) and the responses the model sends; writes
nothing. What upstream's model does, and where it is read (TensorRT-LLM
``triton_backend/all_models/llmapi/tensorrt_llm/1/{model.py,helpers.py}``; the facts are also in
``pipeline/trtllm/llmapi_facts.yaml`` under ``triton_llmapi.responses``):

- inputs: ``text_input`` (one prompt), ``streaming``, ``sampling_param_<name>`` for the
  ``SamplingParams`` fields it maps (temperature, top_k, top_p, max_tokens, seed, ...) and
  ``sampling_param_return_perf_metrics``, without which no perf output is sent;
- ``text_output`` is the request's ``CompletionOutput.text``: all the text generated so far, so
  each streamed response repeats the previous ones (``tensorrt_llm/executor/result.py`` keeps the
  delta as ``text_diff``, which the model does not send). :class:`CumulativeText` turns it back
  into deltas;
- no token count is sent: the count is re-tokenized from the text with the deployment's
  tokenizer (``osl_source: retokenized``), or, without a tokenizer, one token per non-empty
  response (``osl_source: chunks``);
- the perf outputs (KV-cache blocks, ``*_time_ns``, ``acceptance_rate``,
  ``total_accepted_draft_tokens``, ``total_draft_tokens``) are built with ``text_output``'s
  numpy dtype, so they arrive as strings even where ``config.pbtxt`` declares numbers:
  :func:`perf_values` reads either.
"""

from __future__ import annotations

import os
from typing import Any

MODEL_NAME = "tensorrt_llm"

# our sampling key → (input name, Triton dtype, numpy dtype name); helpers.py's mapping
SAMPLING_INPUTS = {
    "temperature": ("sampling_param_temperature", "FP32", "float32"),
    "top_k": ("sampling_param_top_k", "INT32", "int32"),
    "top_p": ("sampling_param_top_p", "FP32", "float32"),
    "seed": ("sampling_param_seed", "UINT64", "uint64"),
}
INPUT_DTYPES = {
    "text_input": ("BYTES", "object"),
    "streaming": ("BOOL", "bool"),
    "sampling_param_max_tokens": ("INT32", "int32"),
    "sampling_param_return_perf_metrics": ("BOOL", "bool"),
    "sampling_param_exclude_input_from_output": ("BOOL", "bool"),
    "return_finish_reason": ("BOOL", "bool"),
    **{name: (triton, numpy) for name, triton, numpy in SAMPLING_INPUTS.values()},
}
PERF_INT = ("total_draft_tokens", "total_accepted_draft_tokens", "kv_cache_reused_block", "kv_cache_missed_block",
            "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
            "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
PERF_FLOAT = ("acceptance_rate", "kv_cache_hit_rate")
PERF_OUTPUTS = PERF_INT + PERF_FLOAT


def llmapi_inputs(settings, prompt_text: str, prompt_index: int, max_tokens: int | None = None) -> dict[str, Any]:
    """One request in the llmapi contract, the same sampling as the ensemble's request
    (``lt_common.request_inputs``): same seed per prompt in both arms; ``max_tokens`` per request."""
    inputs: dict[str, Any] = {
        "text_input": prompt_text,
        "streaming": True,
        "sampling_param_max_tokens": int(max_tokens or settings.max_tokens),
        "sampling_param_return_perf_metrics": True,
        # the model's default is False (helpers.py), SamplingParams' True: say it, as the ensemble does
        "sampling_param_exclude_input_from_output": True,
        "return_finish_reason": True,
    }
    for key, (name, _triton, numpy) in SAMPLING_INPUTS.items():
        value = settings.sampling.get(key)
        if value is None:
            continue
        if key == "seed":
            value = int(value) + prompt_index
        inputs[name] = float(value) if numpy == "float32" else int(value)
    if inputs.get(SAMPLING_INPUTS["temperature"][0]) == 0:  # greedy as TensorRT-LLM reads it: top_k 1
        inputs[SAMPLING_INPUTS["top_k"][0]] = 1
        inputs.pop(SAMPLING_INPUTS["temperature"][0])
    inputs.update(settings.extra_inputs)
    return inputs


def input_dtype(name: str) -> tuple[str, str] | None:
    """(Triton dtype, numpy dtype name) of an llmapi input; None: not one of the contract's."""
    return INPUT_DTYPES.get(name)


def _number(value, kind):
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, str):
        value = value.strip()
        if value in ("", "None", "nan"):
            return None
    try:
        return kind(float(value)) if kind is int else kind(value)
    except (TypeError, ValueError):
        return None


def perf_values(get) -> dict[str, Any]:
    """The perf outputs present in one response; ``get(name)`` returns its first element or None."""
    out: dict[str, Any] = {}
    for name in PERF_OUTPUTS:
        value = _number(get(name), int if name in PERF_INT else float)
        if value is not None:
            out[name] = value
    return out


class CumulativeText:
    """Turns the cumulative ``text_output`` of successive streamed responses into deltas and, with
    a tokenizer, into the number of tokens each response added."""

    def __init__(self, count_tokens=None):
        self._text = ""
        self._tokens = 0
        self._count = count_tokens

    @property
    def retokenized(self) -> bool:
        return self._count is not None

    def delta(self, text: str | None) -> tuple[str, int | None]:
        """(new text, tokens it adds or None without a tokenizer) for one response's text_output."""
        text = text or ""
        # a continuation as a rule; a detokenizer revising its tail sends what differs after the
        # common prefix (the counts still come from the whole text)
        new = text[len(os.path.commonprefix([self._text, text])):]
        self._text = text
        if self._count is None:
            return new, None
        total = int(self._count(text)) if text else 0
        added, self._tokens = max(0, total - self._tokens), total
        return new, added
