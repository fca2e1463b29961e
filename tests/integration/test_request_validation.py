"""Request validation on the served CPU deployments (docs/request-validation.md) through a real
tritonserver — the table row by row is tests/unit/triton_models/test_request_rule_table.py; here one refused
row per rule function: it is refused with a message naming the input and the value, the server
stays up and the next request is answered; every value TensorRT-LLM accepts is answered (a few
inputs per request); a missing required input is an error naming it, on
``tensorrt_llm`` and ``tensorrt_llm_bls``, streaming or not."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.request_rule_table import REFUSED, VOCAB, accepted_batches
from triton_clients import grpc_infer, grpc_stream, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

PROMPT_IDS = [1, 40, 41, 42]
F32, I32 = np.float32, np.int32

# every refused row of the table (docs/request-validation.md), each on the wire: the message, and
# the server answers the next request
SERVED_REFUSED = REFUSED


def _llm_request(name: str | None = None, value=None, streaming: bool = False, **more) -> dict:
    inputs = {"input_ids": np.array([PROMPT_IDS], dtype=I32), "input_lengths": np.array([[len(PROMPT_IDS)]], dtype=I32),
              "request_output_len": np.array([[3]], dtype=I32), "streaming": np.array([[streaming]])}
    if name is not None:
        more[name] = value
    for key, val in more.items():
        inputs[key] = np.array([[val]], dtype=F32 if isinstance(val, float) else I32)
    return inputs


def _error(call) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value)


def _answered(responses: list[dict]) -> int:
    return sum(int(r["sequence_length"].reshape(-1)[0]) for r in responses)


@pytest.mark.parametrize("name,value,message", SERVED_REFUSED, ids=[f"{n}={v}" for n, v, _ in SERVED_REFUSED])
def test_tensorrt_llm_refuses_out_of_range(dt_server, name, value, message):
    url = dt_server.grpc_url
    assert message in _error(lambda: grpc_infer(url, "tensorrt_llm", _llm_request(name, value)))
    out = grpc_infer(url, "tensorrt_llm", _llm_request())  # the server is up, the next request works
    assert out["output_ids"].shape == (1, 1, len(PROMPT_IDS) + 3)


def _ids_request(ids: list[int], output_len: int, streaming: bool = False, **more) -> dict:
    inputs = {"input_ids": np.array([ids], dtype=I32), "input_lengths": np.array([[len(ids)]], dtype=I32),
              "request_output_len": np.array([[output_len]], dtype=I32), "streaming": np.array([[streaming]])}
    inputs.update({k: np.array([v], dtype=I32) for k, v in more.items()})
    return inputs


# the length rows of the table: (case, request, message); the tiny serving engines have
# max_seq_len 256 and, as the BLS's engines on GPUs (plan: max_seq_len - 1), max_input_len 255
LENGTH_ROWS = [
    ("prompt-over-max_input_len", lambda: _ids_request([40] * 256, 1),
     "Prompt length (256) exceeds maximum input length (255)."),
    ("prompt-plus-output-over-max_seq_len", lambda: _ids_request([40] * 200, 100),
     "Prompt length (200) + requested output tokens (100) exceeds the maximum sequence length (256)"),
    ("id-outside-the-vocabulary", lambda: _ids_request([1, VOCAB + 5], 3),
     f"input_ids contain ids outside the vocabulary [0, {VOCAB}): [{VOCAB + 5}]"),
    ("empty-prompt", lambda: {**_ids_request([1], 3), "input_lengths": np.array([[0]], dtype=I32)}, "input_ids is empty"),
    ("drafts-over-max_draft_len", lambda: _ids_request([1, 40, 41], 3, draft_input_ids=[40] * 9),
     "Number of draft tokens (9) is larger than maximum number of draft tokens (3)"),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
@pytest.mark.parametrize("case,make,message", LENGTH_ROWS, ids=[c for c, _, _ in LENGTH_ROWS])
def test_tensorrt_llm_refuses_lengths(dt_server, baseline_server, case, make, message, streaming):
    """The length ranges, unary (draft-target's target, as upstream's speculative client calls it)
    and streaming (the decoupled baseline): TensorRT-LLM's wording, then the next request works."""
    if streaming:
        if case == "drafts-over-max_draft_len":
            pytest.skip("the baseline engine takes no drafts; the unary case covers the row")
        url, call = baseline_server.grpc_url, lambda inputs: grpc_stream(baseline_server.grpc_url, "tensorrt_llm", inputs)
        request = {**make(), "streaming": np.array([[True]])}
    else:
        url, call = dt_server.grpc_url, lambda inputs: grpc_infer(dt_server.grpc_url, "tensorrt_llm", inputs)
        request = make()
    assert message in _error(lambda: call(request))
    answered = grpc_stream(url, "tensorrt_llm", _llm_request(streaming=streaming)) if streaming \
        else [grpc_infer(url, "tensorrt_llm", _llm_request())]
    assert answered and all(r["output_ids"].size for r in answered)


def test_tensorrt_llm_accepts_upstream_values(dt_server):
    """Every accepted value of the table answered by the engine, a few inputs per request."""
    for batch in accepted_batches():
        out = grpc_infer(dt_server.grpc_url, "tensorrt_llm", _llm_request(**batch))
        assert out["output_ids"].reshape(-1).tolist()[: len(PROMPT_IDS)] == PROMPT_IDS, batch


def test_min_p_is_no_input_of_the_triton_models(dt_server):
    """TensorRT-LLM checks min_p in [0, 1], but no Triton backend maps an input to it: Triton refuses it."""
    min_p = {"min_p": np.array([[0.5]], dtype=F32)}
    message = _error(lambda: grpc_infer(dt_server.grpc_url, "tensorrt_llm", {**_llm_request(), **min_p}))
    assert "unexpected inference input 'min_p'" in message
    message = _error(lambda: grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", {**text_inputs("hi", 2), **min_p}))
    assert "unexpected inference input 'min_p'" in message


def test_refused_while_streaming(baseline_server):
    url = baseline_server.grpc_url
    message = _error(lambda: grpc_stream(url, "tensorrt_llm", _llm_request("runtime_top_p", 5.0, streaming=True)))
    assert "runtime_top_p (top_p on the ensemble and the BLS) must be <= 1" in message
    assert _answered(grpc_stream(url, "tensorrt_llm", _llm_request(streaming=True))) == 3


TEMPERATURE = ("temperature", -1.0, "temperature must be >= 0, got -1")
TOP_P = ("top_p", 5.0, "top_p (top_p on the ensemble and the BLS) must be <= 1 (a value <= 0 means unset), got 5")


# each model streaming and not, each rule on each model
@pytest.mark.parametrize("model,stream,name,value,message", [
    ("ensemble", False, *TEMPERATURE), ("ensemble", True, *TOP_P),
    ("tensorrt_llm_bls", False, *TOP_P), ("tensorrt_llm_bls", True, *TEMPERATURE),
], ids=["ensemble-whole-temperature", "ensemble-streaming-top_p", "bls-whole-top_p", "bls-streaming-temperature"])
def test_client_models_refuse(baseline_server, model, stream, name, value, message):
    """The issue's two cases through the ensemble and the BLS: the ensemble's error comes from
    tensorrt_llm (naming both names), the BLS refuses before any model runs (its own name)."""
    url = baseline_server.grpc_url
    text = _error(lambda: grpc_stream(url, model, text_inputs("The quick brown", 4, stream=stream, **{name: value})))
    if model == "tensorrt_llm_bls":
        message = message.replace(" (top_p on the ensemble and the BLS)", "")
    assert message in text
    responses = grpc_stream(url, model, text_inputs("The quick brown", 4, stream=stream))
    assert "".join(r["text_output"].reshape(-1)[0].decode() for r in responses)


def test_bls_speculative_refuses_before_drafting(dt_server):
    text = _error(lambda: grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", text_inputs(
        "The quick brown", 4, stream=False, num_draft_tokens=3, top_p=5.0)))
    assert "top_p must be <= 1 (a value <= 0 means unset), got 5" in text
    text = _error(lambda: grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", text_inputs(
        "The quick brown", 4, stream=False, num_draft_tokens=-1)))
    assert "num_draft_tokens must be >= 0, got -1" in text


# -- missing required inputs -------------------------------------------------------------------


@pytest.mark.parametrize("missing,message", [
    ("input_ids", "input_ids is required"),
    ("input_lengths", "input_lengths"),
    ("request_output_len", "request_output_len"),
])
@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "streaming"])
def test_tensorrt_llm_missing_input(dt_server, baseline_server, missing, message, streaming):
    inputs = _llm_request(streaming=streaming)
    del inputs[missing]
    if streaming:  # decoupled tensorrt_llm, gRPC stream
        text = _error(lambda: grpc_stream(baseline_server.grpc_url, "tensorrt_llm", inputs))
        assert _answered(grpc_stream(baseline_server.grpc_url, "tensorrt_llm", _llm_request(streaming=True))) == 3
    else:
        text = _error(lambda: grpc_infer(dt_server.grpc_url, "tensorrt_llm", inputs))
        assert grpc_infer(dt_server.grpc_url, "tensorrt_llm", _llm_request())["output_ids"].size
    assert message in text


@pytest.mark.parametrize("missing", ["text_input", "max_tokens"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streaming"])
def test_bls_missing_input(baseline_server, missing, stream):
    url = baseline_server.grpc_url
    inputs = text_inputs("The quick brown", 4, stream=stream)
    del inputs[missing]
    assert missing in _error(lambda: grpc_stream(url, "tensorrt_llm_bls", inputs))
    responses = grpc_stream(url, "tensorrt_llm_bls", text_inputs("The quick brown", 4, stream=stream))
    assert "".join(r["text_output"].reshape(-1)[0].decode() for r in responses)


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_prompt_over_max_input_len_within_max_seq_len_is_refused(medusa_server, streaming):
    """The issue's case: a prompt longer than build.max_input_len (128 here) that still fits
    max_seq_len (256) with its output was answered on CPU; TensorRT-LLM refuses it."""
    url = medusa_server.grpc_url
    message = _error(lambda: grpc_stream(url, "tensorrt_llm", _ids_request([40] * 150, 3, streaming)))
    assert "Prompt length (150) exceeds maximum input length (128)." in message
    answered = grpc_stream(url, "tensorrt_llm", _ids_request([40] * 128, 3, streaming))  # the bound itself is allowed
    assert answered and all(r["output_ids"].size for r in answered)
