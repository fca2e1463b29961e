"""``embedding_bias`` through ``tensorrt_llm_bls`` on a real tritonserver: a draft-target request
that sends bias words reaches ``tensorrt_llm`` with an FP32 ``embedding_bias`` (Triton refuses
any other dtype before the model runs), and one that sends none still answers as the greedy
target-only reference (the in-process checks are tests/unit/triton_models/test_bls_embedding_bias.py)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import MAX_TOKENS, PROMPTS
from triton_clients import grpc_stream, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def speculative_stream(url: str, prompt: str, **extra) -> str:
    responses = grpc_stream(url, "tensorrt_llm_bls", text_inputs(
        prompt, MAX_TOKENS, stream=True, num_draft_tokens=3, top_k=1, **extra))
    return "".join(r["text_output"][0].decode() for r in responses)


def test_bias_words_reach_the_target_as_fp32(dt_server):
    text = speculative_stream(
        dt_server.grpc_url, PROMPTS[0],
        embedding_bias_words=np.array([[b"the", b"a"]], dtype=np.object_),
        embedding_bias_weights=np.array([[0.5, -0.5]], dtype=np.float32))
    assert text  # an INT32 embedding_bias would have been an error response instead


def test_no_bias_sent_answers_as_the_reference(dt_server, reference_outputs):
    prompt = PROMPTS[1]
    assert speculative_stream(dt_server.grpc_url, prompt) == reference_outputs[prompt]["completion"]
