"""Real tritonserver (pytriton wheel) on CPU serving tiny deployments: the ensemble over gRPC
streaming and HTTP generate / generate_stream, ``tensorrt_llm`` with ``input_ids`` and with
``draft_input_ids``, the draft-target BLS (non-streaming and our streaming extension), an
upstream-style client-side draft-target loop, perf metrics, our Prometheus counters, bad
requests and cancellation. Greedy outputs must equal the in-process reference engine's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import MAX_TOKENS, PROMPTS
from triton_clients import (
    client_side_speculative,
    grpc_infer,
    grpc_stream,
    http_generate,
    metric_values,
    text_inputs,
)

pytestmark = [pytest.mark.triton, pytest.mark.slow]

PERF_OUTPUTS = {
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32,
    "kv_cache_alloc_total_blocks": np.int32, "arrival_time_ns": np.int64,
    "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64, "acceptance_rate": np.float32,
    "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32,
}
GREEDY = {"top_k": 1}


def _text(array) -> str:
    return array.reshape(-1)[0].decode()


# -- baseline deployment: the control ------------------------------------------------------------


def test_baseline_ensemble_http_generate_equals_reference(baseline_server, reference_outputs):
    for prompt in PROMPTS:
        status, body = http_generate(baseline_server.http_url, "ensemble",
                                     {"text_input": prompt, "max_tokens": MAX_TOKENS, **GREEDY})
        assert status == 200, body
        assert body["text_output"] == reference_outputs[prompt]["text"]


def test_baseline_ensemble_grpc_streaming_deltas(baseline_server, reference_outputs):
    prompt = PROMPTS[0]
    responses = grpc_stream(baseline_server.grpc_url, "ensemble", text_inputs(
        prompt, MAX_TOKENS, stream=True, top_k=1, return_num_output_tokens=True, return_num_input_tokens=True))
    assert len(responses) > 1  # token by token
    text = "".join(_text(r["text_output"]) for r in responses)
    assert text == reference_outputs[prompt]["completion"]
    counts = [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses]
    assert sum(counts) == len(reference_outputs[prompt]["generated"])
    assert all(int(r["num_input_tokens"].reshape(-1)[0]) == len(reference_outputs[prompt]["ids"]) - sum(counts)
               for r in responses)


def test_baseline_http_generate_stream(baseline_server, reference_outputs):
    prompt = PROMPTS[1]
    status, events = http_generate(baseline_server.http_url, "ensemble",
                                   {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True, **GREEDY}, stream=True)
    assert status == 200
    assert len(events) > 1 and not any("error" in e for e in events)
    assert "".join(e.get("text_output", "") for e in events) == reference_outputs[prompt]["completion"]


def test_baseline_bls_streaming_forward(baseline_server, reference_outputs):
    prompt = PROMPTS[2]
    responses = grpc_stream(baseline_server.grpc_url, "tensorrt_llm_bls", text_inputs(prompt, MAX_TOKENS, stream=True, top_k=1))
    assert "".join(_text(r["text_output"]) for r in responses) == reference_outputs[prompt]["completion"]


def test_baseline_perf_metrics_without_speculation(baseline_server):
    status, body = http_generate(baseline_server.http_url, "ensemble",
                                 {"text_input": PROMPTS[0], "max_tokens": 4, "return_perf_metrics": True, **GREEDY})
    assert status == 200
    assert set(PERF_OUTPUTS) <= set(body)
    assert (body["acceptance_rate"], body["total_draft_tokens"], body["total_accepted_draft_tokens"]) == (0.0, 0, 0)
    assert body["first_token_time_ns"] >= body["arrival_time_ns"] > 0


# -- draft-target speculative deployment -------------------------------------------------------


def test_dt_bls_non_streaming_equals_reference(dt_server, reference_outputs):
    before = metric_values(dt_server.metrics_url, "specdeploy_spec_decode_draft_tokens_total")
    for prompt in PROMPTS:
        status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", {
            "text_input": prompt, "max_tokens": MAX_TOKENS, "num_draft_tokens": 3, "stream": False,
            "return_perf_metrics": True, **GREEDY})
        assert status == 200, body
        assert body["text_output"] == reference_outputs[prompt]["text"]  # prompt included
        assert 0.0 <= body["acceptance_rate"] <= 1.0
        assert body["total_draft_tokens"] > 3  # whole generation, not only the last round
        assert body["total_accepted_draft_tokens"] <= body["total_draft_tokens"]
    after = metric_values(dt_server.metrics_url, "specdeploy_spec_decode_draft_tokens_total")
    accepted = metric_values(dt_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    assert after["tensorrt_llm_bls"] > before.get("tensorrt_llm_bls", 0)
    assert after["tensorrt_llm"] > before.get("tensorrt_llm", 0)
    assert accepted["tensorrt_llm_bls"] > 0  # the draft is a lightly perturbed target
    # the engine model counts every accepted token at its draft position, and every drafted one
    per_pos = metric_values(dt_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_per_pos_total")
    drafted_per_pos = metric_values(dt_server.metrics_url, "specdeploy_spec_decode_draft_tokens_per_pos_total")
    assert per_pos["tensorrt_llm"] == accepted["tensorrt_llm"] > 0
    assert drafted_per_pos["tensorrt_llm"] == after["tensorrt_llm"]
    assert "tensorrt_llm_bls" not in per_pos  # the BLS only relays: counting there would double the positions


def test_dt_bls_streaming_emits_rounds(dt_server, reference_outputs):
    prompt = PROMPTS[0]
    responses = grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", text_inputs(
        prompt, MAX_TOKENS, stream=True, num_draft_tokens=3, top_k=1, return_num_output_tokens=True,
        return_perf_metrics=True))
    counts = [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses]
    assert "".join(_text(r["text_output"]) for r in responses) == reference_outputs[prompt]["completion"]
    assert sum(counts) == len(reference_outputs[prompt]["generated"])
    assert max(counts) > 1  # accepted drafts arrive together
    assert len(responses) < sum(counts)
    assert responses[-1]["total_draft_tokens"].reshape(-1)[0] > 0


def test_dt_bls_non_speculative_forward(dt_server, reference_outputs):
    prompt = PROMPTS[1]
    status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls",
                                 {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": False, **GREEDY})
    assert status == 200 and body["text_output"] == reference_outputs[prompt]["text"]


def test_dt_ensemble_grpc_stream_api_single_response(dt_server, reference_outputs):
    prompt = PROMPTS[2]
    responses = grpc_stream(dt_server.grpc_url, "ensemble", text_inputs(prompt, MAX_TOKENS, stream=False, top_k=1))
    assert len(responses) == 1
    assert _text(responses[0]["text_output"]) == reference_outputs[prompt]["text"]


def test_tensorrt_llm_with_input_ids(dt_server, reference_outputs):
    ids = reference_outputs[PROMPTS[0]]["ids"]
    prompt_len = len(ids) - len(reference_outputs[PROMPTS[0]]["generated"])
    out = grpc_infer(dt_server.grpc_url, "tensorrt_llm", {
        "input_ids": np.array([ids[:prompt_len]], dtype=np.int32),
        "input_lengths": np.array([[prompt_len]], dtype=np.int32),
        "request_output_len": np.array([[MAX_TOKENS]], dtype=np.int32),
        "end_id": np.array([[2]], dtype=np.int32), "runtime_top_k": np.array([[1]], dtype=np.int32)})
    assert out["output_ids"].shape == (1, 1, len(ids))  # prompt included, no padding at beam 1
    assert out["sequence_length"].tolist() == [[len(ids)]]
    assert out["output_ids"].reshape(-1).tolist() == ids


def test_tensorrt_llm_with_draft_input_ids(dt_server, reference_outputs):
    ids = reference_outputs[PROMPTS[0]]["ids"]
    prompt_len = len(ids) - len(reference_outputs[PROMPTS[0]]["generated"])
    context = ids[:prompt_len]
    truth = ids[prompt_len: prompt_len + 3]
    drafts = [truth[0], truth[1], (truth[2] + 1) % 300 or 5]  # two right, one wrong
    out = grpc_infer(dt_server.grpc_url, "tensorrt_llm", {
        "input_ids": np.array([context], dtype=np.int32), "input_lengths": np.array([[len(context)]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32), "draft_input_ids": np.array([drafts], dtype=np.int32),
        "end_id": np.array([[2]], dtype=np.int32), "return_perf_metrics": np.array([[True]])})
    assert out["output_ids"].reshape(-1).tolist() == context + truth  # accepted 2 + correction
    assert int(out["total_accepted_draft_tokens"][0][0]) == 2
    assert int(out["total_draft_tokens"][0][0]) == 3
    for name, dtype in PERF_OUTPUTS.items():
        assert out[name].dtype == dtype and out[name].shape == (1, 1), name


def test_client_side_speculative_loop(dt_server, reference_outputs):
    for prompt in PROMPTS[:2]:
        text = client_side_speculative(dt_server.grpc_url, prompt, MAX_TOKENS, 3)
        assert text == reference_outputs[prompt]["text"]


# -- Medusa speculative deployment (decoupled) -------------------------------------------------


def test_medusa_streaming_and_generate(medusa_server, reference_outputs):
    prompt = PROMPTS[0]
    responses = grpc_stream(medusa_server.grpc_url, "ensemble", text_inputs(
        prompt, MAX_TOKENS, stream=True, top_k=1, return_perf_metrics=True))
    assert "".join(_text(r["text_output"]) for r in responses) == reference_outputs[prompt]["completion"]
    last = responses[-1]
    assert set(PERF_OUTPUTS) <= set(last)
    assert int(last["total_draft_tokens"][0][0]) > 0  # heads drafted every step
    status, body = http_generate(medusa_server.http_url, "ensemble",
                                 {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": False, **GREEDY})
    assert status == 200 and body["text_output"] == reference_outputs[prompt]["text"]


def test_grpc_stream_cancel_stops_generation(medusa_server):
    """gRPC stream cancel on tensorrt_llm (as upstream's inflight_batcher_llm_client does) ends the
    request early: the engine reports it as cancelled, not finished by length."""
    import time

    cancelled = "specdeploy_requests_cancelled_total"
    inputs = {"input_ids": np.array([[1, 40, 41, 42]], dtype=np.int32), "input_lengths": np.array([[4]], dtype=np.int32),
              "request_output_len": np.array([[240]], dtype=np.int32), "streaming": np.array([[True]])}
    for _attempt in range(3):  # the tiny model is fast: retry if a run finished before the cancel landed
        before = metric_values(medusa_server.metrics_url, cancelled).get("tensorrt_llm", 0)
        responses = grpc_stream(medusa_server.grpc_url, "tensorrt_llm", inputs, cancel_after=1)
        assert len(responses) == 1
        deadline = time.monotonic() + 30  # the counter moves once the engine has dropped the request
        while time.monotonic() < deadline:
            if metric_values(medusa_server.metrics_url, cancelled).get("tensorrt_llm", 0) > before:
                break
            time.sleep(0.1)
        else:
            continue
        break
    else:
        pytest.fail("the cancelled stream never ended as cancelled")
    status, body = http_generate(medusa_server.http_url, "ensemble", {"text_input": "ok", "max_tokens": 2})
    assert status == 200 and body["text_output"].startswith("ok")


# -- bad requests: clear errors, the next good request succeeds ---------------------------------

BAD_HTTP = [
    ("tensorrt_llm_bls", {"text_input": "", "max_tokens": 4, "stream": False}, "text_input is empty"),
    ("ensemble", {"text_input": "hi", "max_tokens": 0}, "max_tokens must be > 0"),
    ("ensemble", {"text_input": "hi", "max_tokens": 100000}, "maximum sequence length"),
    ("tensorrt_llm_bls", {"text_input": "hi", "max_tokens": 10, "num_draft_tokens": 9, "stream": False},
     "Number of draft tokens (9) is larger than maximum number of draft tokens (3)"),
]


@pytest.mark.parametrize("model,body,message", BAD_HTTP, ids=["empty", "max_tokens_0", "too_long", "draft_too_long"])
def test_bad_http_requests(dt_server, model, body, message):
    status, payload = http_generate(dt_server.http_url, model, body)
    assert status >= 400, payload
    assert message in payload.get("error", ""), payload
    status, payload = http_generate(dt_server.http_url, model, {"text_input": "hi", "max_tokens": 2, "stream": False})
    assert status == 200 and payload["text_output"]


def _grpc_error(url, model, inputs) -> str:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        grpc_infer(url, model, inputs)
    return str(info.value)


def test_bad_grpc_requests(dt_server):
    url = dt_server.grpc_url
    assert "not valid UTF-8" in _grpc_error(url, "ensemble", {
        "text_input": np.array([[b"\xff\xfe bad"]], dtype=np.object_), "max_tokens": np.array([[4]], dtype=np.int32)})
    message = _grpc_error(url, "ensemble", {
        "text_input": np.array([["hi"]], dtype=np.object_), "max_tokens": np.array([[4.0]], dtype=np.float32)})
    assert "data-type" in message or "datatype" in message.lower()
    assert "unexpected inference input" in _grpc_error(url, "ensemble", {
        **text_inputs("hi", 4), "no_such_input": np.array([[1]], dtype=np.int32)})
    assert "Streaming is only supported if model is deployed using decoupled mode." in _grpc_error(url, "tensorrt_llm", {
        "input_ids": np.array([[1, 5, 6]], dtype=np.int32), "input_lengths": np.array([[3]], dtype=np.int32),
        "request_output_len": np.array([[2]], dtype=np.int32), "streaming": np.array([[True]])})
    out = grpc_infer(url, "ensemble", text_inputs("hi", 2))
    assert _text(out["text_output"]).startswith("hi")


def test_end_id_stops_and_is_excluded_streaming(baseline_server, reference_outputs):
    """A stop token that the reference would produce as its 6th token: generation ends there, the
    end token is not in the output, and the (possibly empty) last chunk still decodes."""
    from pipeline.triton_models.tokenizer import TextTokenizer

    prompt = PROMPTS[0]
    generated = reference_outputs[prompt]["generated"]
    cut = next(i for i in range(5, len(generated)) if generated[i] not in generated[:i])
    tokenizer_dir = baseline_server.repo.parent.parent / "engine" / "baseline"
    import json

    tokenizer = TextTokenizer(json.loads((tokenizer_dir / "engine.json").read_text())["model_dir"])
    for stream in (True, False):
        responses = grpc_stream(baseline_server.grpc_url, "ensemble", text_inputs(
            prompt, MAX_TOKENS, stream=stream, top_k=1, end_id=int(generated[cut]), return_num_output_tokens=True))
        text = "".join(_text(r["text_output"]) for r in responses)
        expected = tokenizer.decode(generated[:cut])
        assert text == (expected if stream else tokenizer.decode(reference_outputs[prompt]["ids"][:len(reference_outputs[prompt]["ids"]) - len(generated) + cut]))  # noqa: E501 - one expression compared whole
        assert sum(int(r["num_output_tokens"].reshape(-1)[0]) for r in responses) == cut


def test_stop_input_cancels_request_with_same_id(medusa_server):
    """Upstream's `stop` request (dummy input_ids, stop=true, same request id) ends the in-flight
    request early; the stop request itself gets one empty final response."""
    import threading

    long_inputs = {"input_ids": np.array([[1, 40, 41, 42]], dtype=np.int32), "input_lengths": np.array([[4]], dtype=np.int32),
                   "request_output_len": np.array([[240]], dtype=np.int32), "streaming": np.array([[True]])}
    stop_inputs = {"input_ids": np.array([[1]], dtype=np.int32), "input_lengths": np.array([[0]], dtype=np.int32),
                   "request_output_len": np.array([[0]], dtype=np.int32), "stop": np.array([[True]])}
    for attempt in range(3):
        request_id = f"stop-me-{attempt}"
        stop_replies = []
        sender = threading.Thread(target=lambda: stop_replies.append(  # noqa: B023 - the thread is joined inside this iteration
            grpc_stream(medusa_server.grpc_url, "tensorrt_llm", stop_inputs, request_id=request_id)))  # noqa: B023 - the thread is joined inside this iteration
        responses = grpc_stream(medusa_server.grpc_url, "tensorrt_llm", long_inputs, request_id=request_id,
                                on_response=sender.start)
        sender.join(timeout=30)
        assert stop_replies == [[]]  # one empty final response
        generated = sum(int(r["sequence_length"].reshape(-1)[0]) for r in responses)
        if generated < 240:
            return
    pytest.fail("the stop request never ended the in-flight request early")


def test_dt_bls_concurrent_requests(dt_server, reference_outputs):
    """Several speculative BLS requests at once (streaming and not): each gets its own greedy
    output, equal to the reference; the BLS does not serialize or mix them."""
    from concurrent.futures import ThreadPoolExecutor

    def non_streaming(prompt):
        status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", {
            "text_input": prompt, "max_tokens": MAX_TOKENS, "num_draft_tokens": 3, "stream": False, **GREEDY})
        assert status == 200, body
        return body["text_output"]

    def streaming(prompt):
        responses = grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls",
                                text_inputs(prompt, MAX_TOKENS, stream=True, num_draft_tokens=3, top_k=1))
        return "".join(_text(r["text_output"]) for r in responses)

    with ThreadPoolExecutor(max_workers=6) as pool:
        plain = {p: pool.submit(non_streaming, p) for p in PROMPTS}
        streamed = {p: pool.submit(streaming, p) for p in PROMPTS}
        for prompt in PROMPTS:
            assert plain[prompt].result(timeout=120) == reference_outputs[prompt]["text"]
            assert streamed[prompt].result(timeout=120) == reference_outputs[prompt]["completion"]


def test_batch_of_two_on_decoupled_deployment(medusa_server, reference_outputs):
    """Batch > 1 (docs/triton-contract.md): one request with two prompts streams each row's responses
    tagged with batch_index; each row equals its own single-prompt reference."""
    prompts = PROMPTS[:2]
    inputs = {"text_input": np.array([[p] for p in prompts], dtype=np.object_),
              "max_tokens": np.array([[MAX_TOKENS]] * 2, dtype=np.int32),
              "stream": np.array([[True]] * 2), "top_k": np.array([[1]] * 2, dtype=np.int32)}
    responses = grpc_stream(medusa_server.grpc_url, "ensemble", inputs)
    texts = {0: "", 1: ""}
    for r in responses:
        texts[int(r["batch_index"].reshape(-1)[0])] += _text(r["text_output"])
    assert texts == {b: reference_outputs[p]["completion"] for b, p in enumerate(prompts)}


def test_batch_of_two_needs_decoupled(dt_server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="Batch size > 1 requires the tensorrt_llm backend"):
        grpc_infer(dt_server.grpc_url, "tensorrt_llm", {
            "input_ids": np.array([[1, 5, 6], [1, 7, 8]], dtype=np.int32), "input_lengths": np.array([[3], [3]], dtype=np.int32),
            "request_output_len": np.array([[2], [2]], dtype=np.int32)})
