"""The request-rule table (docs/request-validation.md) as data: refused values with the message a
client sees, values TensorRT-LLM accepts, and the accepted values grouped into few requests.
Used by tests/unit/triton_models/test_request_rule_table.py (every row) and
tests/integration/test_request_validation.py (the served rows); reads and writes nothing."""

from __future__ import annotations

import math

VOCAB = 320  # the tiny serving model's

# (tensorrt_llm input, value, what the error says)
REFUSED = [
    ("temperature", -1.0, "temperature must be >= 0, got -1"),
    ("temperature", math.nan, "temperature must be >= 0, got nan"),
    ("runtime_top_k", -1, "runtime_top_k (top_k on the ensemble and the BLS) must be >= 0, got -1"),
    ("runtime_top_p", 5.0, "runtime_top_p (top_p on the ensemble and the BLS) must be <= 1 (a value <= 0 means unset), got 5"),
    ("runtime_top_p_min", 1.5, "runtime_top_p_min must be in [0, 1], got 1.5"),
    ("runtime_top_p_decay", 0.0, "runtime_top_p_decay must be in (0, 1], got 0"),
    ("runtime_top_p_reset_ids", -2, "runtime_top_p_reset_ids must be >= 0, got -2"),
    ("repetition_penalty", 0.0, "repetition_penalty must be > 0, got 0"),
    ("len_penalty", -1.0, "len_penalty (length_penalty on the ensemble and the BLS) must be >= 0, got -1"),
    ("beam_search_diversity_rate", -0.5, "beam_search_diversity_rate must be >= 0, got -0.5"),
    ("min_tokens", -1, "min_tokens must be >= 0, got -1"),
    ("beam_width", 0, "beam_width must be > 0, got 0"),
    ("num_return_sequences", 0, "num_return_sequences must be > 0, got 0"),
    ("request_output_len", 0, "request_output_len (max_tokens on the ensemble and the BLS) must be > 0, got 0"),
    ("end_id", -2, f"end_id (-2) is not within acceptable range [-1, {VOCAB})"),
    ("end_id", 100000, f"end_id (100000) is not within acceptable range [-1, {VOCAB})"),
    # in TensorRT-LLM's range, beyond the CPU reference engine
    ("beam_width", 2, "beam_width must be 1 on the CPU reference engine (no beam search), got 2"),
    ("num_return_sequences", 2, "num_return_sequences must be 1 on the CPU reference engine, got 2"),
    ("repetition_penalty", 1.2, "repetition_penalty 1.2 is not supported by the CPU reference engine"),
    ("presence_penalty", 0.5, "presence_penalty 0.5 is not supported by the CPU reference engine"),
    ("frequency_penalty", -0.5, "frequency_penalty -0.5 is not supported by the CPU reference engine"),
    ("runtime_top_p_decay", 0.5, "runtime_top_p_decay 0.5 is not supported by the CPU reference engine"),
]
# values TensorRT-LLM accepts (boundaries included); the CPU engine answers them
ACCEPTED = [
    ("temperature", 0.0), ("runtime_top_k", 0), ("runtime_top_p", 1.0), ("runtime_top_p", 0.0),
    ("runtime_top_p", -1.0), ("runtime_top_p_min", 0.0), ("runtime_top_p_decay", 1.0),
    ("runtime_top_p_reset_ids", 0), ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0), ("len_penalty", 0.0), ("beam_search_diversity_rate", 0.0),
    ("min_tokens", 0), ("beam_width", 1), ("num_return_sequences", 1), ("end_id", -1),
    ("pad_id", 50256),  # upstream's inflight_batcher_llm_client default; the executor does not check pad_id
    ("pad_id", -7),
]


def accepted_batches() -> list[dict]:
    """ACCEPTED as few requests as possible: one value per input per request."""
    batches: list[dict] = []
    for name, value in ACCEPTED:
        batch = next((b for b in batches if name not in b), None)
        if batch is None:
            batches.append(batch := {})
        batch[name] = value
    return batches
