"""Wire conformance of ``tensorrt_llm`` (CPU) and ``tensorrt_llm_bls`` on a real tritonserver:
every output of every response has the shape and dtype upstream produces for the same request
(batch 1 and 3, streaming and not, beam 1), the set of outputs is the one upstream sends, and
upstream's client scripts' calls work unchanged.

Expected shapes are written from reading upstream (tensorrtllm_backend@r25.05):
- ``tensorrt_llm`` = ``inflight_batcher_llm/src/model_instance_state.cc`` ``fillTritonResponse``:
  ``output_ids`` [1, beams, T] INT32 with T the longest beam in this response (the whole
  sequence when not streaming, the new tokens when streaming), ``sequence_length`` [1, beams]
  INT32, ``batch_index`` [1, 1] INT32 only when the request's batch is > 1, ``sequence_index``
  only with num_return_sequences > 1, log probs / logits only when asked, the ten perf outputs
  [1, 1] (INT32 block counts and draft counts, INT64 times, FP32 acceptance_rate) only with
  return_perf_metrics; ``num_input_tokens`` / ``num_output_tokens`` [1, 1] INT32 when asked (the
  NVIDIA/TensorRT-LLM ``triton_backend`` copy of the same function). One response stream per row.
- ``tensorrt_llm_bls`` = ``all_models/inflight_batcher_llm/tensorrt_llm_bls/1/lib/triton_decoder.py``
  ``_get_response`` + ``postprocessing/1/model.py``: ``text_output`` is postprocessing's
  ``OUTPUT``, a 1-D BYTES array of one string per (row × beam) of the [1, beam, T] tokens it was
  given, so [1]; every other output is the target's, unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import MAX_TOKENS, PROMPTS
from triton_clients import grpc_infer, grpc_stream

pytestmark = [pytest.mark.triton, pytest.mark.slow]

PERF = {
    "kv_cache_alloc_new_blocks": np.int32, "kv_cache_reused_blocks": np.int32,
    "kv_cache_alloc_total_blocks": np.int32, "arrival_time_ns": np.int64,
    "first_scheduled_time_ns": np.int64, "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64, "acceptance_rate": np.float32,
    "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32,
}
END_ID = 2


def llm_expected(tokens: int, batch: int, perf: bool, counts: bool) -> dict:
    """{output: (shape, dtype)} of one ``tensorrt_llm`` response at beam 1 (fillTritonResponse)."""
    out = {"output_ids": ((1, 1, tokens), np.int32), "sequence_length": ((1, 1), np.int32)}
    if batch > 1:
        out["batch_index"] = ((1, 1), np.int32)
    if perf:
        out.update({name: ((1, 1), dtype) for name, dtype in PERF.items()})
    if counts:
        out.update({"num_input_tokens": ((1, 1), np.int32), "num_output_tokens": ((1, 1), np.int32)})
    return out


def bls_expected(llm: dict) -> dict:
    """A BLS response: postprocessing's 1-D text in place of the ids, the rest passed through."""
    out = {k: v for k, v in llm.items() if k not in ("output_ids", "sequence_length")}
    out["text_output"] = ((1,), np.object_)
    return out


def assert_wire(response: dict, expected: dict) -> None:
    assert set(response) == set(expected)
    for name, (shape, dtype) in expected.items():
        assert response[name].shape == shape, (name, response[name].shape, shape)
        assert response[name].dtype == dtype, (name, response[name].dtype, dtype)


def _prompt_ids(reference_outputs, prompt) -> list[int]:
    ref = reference_outputs[prompt]
    return ref["ids"][: len(ref["ids"]) - len(ref["generated"])]


def llm_inputs(rows: list[list[int]], streaming: bool, perf: bool = True, counts: bool = True) -> dict:
    """A ``tensorrt_llm`` request as upstream's inflight_batcher_llm_client builds one, batched:
    input_ids right-padded, one scalar per row for the rest."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = row
    column = lambda value, dtype: np.array([[value]] * len(rows), dtype=dtype)  # noqa: E731 - a one-line helper local to this test
    inputs = {
        "input_ids": ids, "input_lengths": np.array([[len(r)] for r in rows], dtype=np.int32),
        "request_output_len": column(MAX_TOKENS, np.int32), "end_id": column(END_ID, np.int32),
        "runtime_top_k": column(1, np.int32), "streaming": column(streaming, bool),
        "return_perf_metrics": column(perf, bool),
    }
    if counts:
        inputs["return_num_input_tokens"] = column(True, bool)
        inputs["return_num_output_tokens"] = column(True, bool)
    return inputs


def _by_row(responses: list[dict], batch: int) -> dict[int, list[dict]]:
    rows: dict[int, list[dict]] = {b: [] for b in range(batch)}
    for r in responses:
        rows[int(r["batch_index"][0][0]) if batch > 1 else 0].append(r)
    return rows


# -- tensorrt_llm ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_tensorrt_llm_decoupled_outputs(baseline_server, reference_outputs, batch, streaming):
    prompts = PROMPTS[:batch]
    rows = [_prompt_ids(reference_outputs, p) for p in prompts]
    responses = grpc_stream(baseline_server.grpc_url, "tensorrt_llm", llm_inputs(rows, streaming))
    for b, row_responses in _by_row(responses, batch).items():
        ref = reference_outputs[prompts[b]]
        if not streaming:
            assert len(row_responses) == 1
        tokens: list[int] = []
        for r in row_responses:
            t = int(r["sequence_length"][0][0])
            assert_wire(r, llm_expected(t, batch, perf=True, counts=True))
            tokens += r["output_ids"][0][0].tolist()
        assert tokens == (ref["generated"] if streaming else ref["ids"])  # streaming: deltas only


def test_tensorrt_llm_non_decoupled_outputs(dt_server, reference_outputs):
    """The draft-target target is not decoupled (unary ModelInfer, as the client-side loop calls it)."""
    prompt = PROMPTS[0]
    out = grpc_infer(dt_server.grpc_url, "tensorrt_llm",
                     llm_inputs([_prompt_ids(reference_outputs, prompt)], streaming=False))
    assert_wire(out, llm_expected(len(reference_outputs[prompt]["ids"]), 1, perf=True, counts=True))
    plain = grpc_infer(dt_server.grpc_url, "tensorrt_llm",
                       llm_inputs([_prompt_ids(reference_outputs, prompt)], streaming=False, perf=False, counts=False))
    assert_wire(plain, llm_expected(len(reference_outputs[prompt]["ids"]), 1, perf=False, counts=False))


# -- tensorrt_llm_bls ------------------------------------------------------------------------------


def bls_inputs(prompts: list[str], stream: bool, **extra) -> dict:
    """What upstream's end_to_end_grpc_client sends (prepare_inputs, stacked with --batch-inputs)."""
    n = len(prompts)
    inputs = {
        "text_input": np.array([[p] for p in prompts], dtype=np.object_),
        "max_tokens": np.array([[MAX_TOKENS]] * n, dtype=np.int32),
        "stream": np.array([[stream]] * n, dtype=bool),
        "beam_width": np.array([[1]] * n, dtype=np.int32),
        "temperature": np.array([[1.0]] * n, dtype=np.float32),
        "num_return_sequences": np.array([[1]] * n, dtype=np.int32),
        "exclude_input_in_output": np.array([[False]] * n, dtype=bool),
        "return_perf_metrics": np.array([[True]] * n, dtype=bool),
    }
    for name, value in extra.items():
        dtype = np.int32 if isinstance(value, int) and not isinstance(value, bool) else bool
        inputs[name] = np.array([[value]] * n, dtype=dtype)
    return inputs


def parse_like_end_to_end_client(responses: list[dict], batch: int, streaming: bool) -> list[str]:
    """end_to_end_grpc_client's response loop (r25.05): ``output[0].decode()``, ``batch_index[0][0]``."""
    texts = [""] * batch
    for result in responses:
        output = result["text_output"]
        batch_index = result.get("batch_index")
        batch_index = 0 if batch_index is None else batch_index[0][0]
        if streaming:
            texts[batch_index] += output[0].decode("utf-8")
        else:
            texts[batch_index] = output[0].decode("utf-8")
    return texts


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_bls_forward_outputs(baseline_server, reference_outputs, batch, streaming):
    prompts = PROMPTS[:batch]
    responses = grpc_stream(baseline_server.grpc_url, "tensorrt_llm_bls", bls_inputs(prompts, streaming, top_k=1))
    llm = llm_expected(0, batch, perf=True, counts=False)
    for r in responses:
        assert_wire(r, bls_expected(llm))
    if not streaming:
        assert len(responses) == batch  # one response per row
    texts = parse_like_end_to_end_client(responses, batch, streaming)
    key = "completion" if streaming else "text"
    assert texts == [reference_outputs[p][key] for p in prompts]


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streaming"])
def test_bls_speculative_outputs(dt_server, reference_outputs, streaming):
    prompt = PROMPTS[1]
    responses = grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls",
                            bls_inputs([prompt], streaming, top_k=1, num_draft_tokens=3))
    expected = bls_expected(llm_expected(0, 1, perf=True, counts=False))
    expected["draft_fallbacks"] = ((1, 1), np.int32)  # ours, with the perf outputs
    for r in responses:
        assert_wire(r, expected)
    assert len(responses) == 1 or streaming
    key = "completion" if streaming else "text"
    assert parse_like_end_to_end_client(responses, 1, streaming) == [reference_outputs[prompt][key]]


def test_bls_batch_needs_a_decoupled_target(dt_server):
    """Upstream's BLS hands a batch to the target, whose backend refuses it when not decoupled."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="Batch size > 1 requires the tensorrt_llm backend"):
        grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", bls_inputs(PROMPTS, False))
    with pytest.raises(InferenceServerException, match="speculative decoding is not supported with batch size > 1"):
        grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", bls_inputs(PROMPTS, False, num_draft_tokens=3))


# -- inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py --------------------------


def _prepare_tensor(name, array):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    tensor = grpcclient.InferInput(name, array.shape, np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _trtllm_inputs(input_ids, request_output_len, draft_tokens, pre):
    """get_trtllm_inputs (r25.05) with beam_width 1, temperature 1.0 and no penalties."""
    bad_words_ids, stop_words_ids, end_id, pad_id = pre
    inputs = [
        _prepare_tensor("input_ids", np.expand_dims(input_ids, axis=0)),
        _prepare_tensor("input_lengths", np.array([[len(input_ids)]], dtype=np.int32)),
        _prepare_tensor("request_output_len", np.array([[request_output_len]], dtype=np.int32)),
        _prepare_tensor("bad_words_list", bad_words_ids),
        _prepare_tensor("stop_words_list", stop_words_ids),
        _prepare_tensor("beam_width", np.array([[1]], dtype=np.int32)),
        _prepare_tensor("temperature", np.array([[1.0]], dtype=np.float32)),
    ]
    if draft_tokens is not None:
        inputs.append(_prepare_tensor("draft_input_ids", np.array([draft_tokens], dtype=np.int32)))
    inputs.append(_prepare_tensor("end_id", np.array([[end_id]], dtype=np.int32)))
    inputs.append(_prepare_tensor("pad_id", np.array([[pad_id]], dtype=np.int32)))
    return inputs


def _extract_trtllm_outputs(result):
    output_ids = np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1))
    sequence_length_data = result.as_numpy("sequence_length").astype(np.int32)
    assert sequence_length_data.shape[0] == 1
    assert sequence_length_data.shape[1] == 1
    return output_ids, sequence_length_data[0, 0]


def run_speculative_client(client, prompt: str, output_len: int, in_num_draft_tokens: int):
    """run_speculative_inference (r25.05), call for call, against draft ``tensorrt_llm_draft`` and
    target ``tensorrt_llm`` on one server. Returns the OUTPUT tensor of its postprocessing call."""
    pre_result = client.infer("preprocessing", [
        _prepare_tensor("QUERY", np.array([[prompt]]).astype(object)),
        _prepare_tensor("REQUEST_OUTPUT_LEN", np.ones_like([[prompt]]).astype(np.int32) * output_len)])
    prompt_input_ids = np.squeeze(pre_result.as_numpy("INPUT_ID").astype(np.int32), axis=0)
    pre = (pre_result.as_numpy("BAD_WORDS_IDS").astype(np.int32), pre_result.as_numpy("STOP_WORDS_IDS").astype(np.int32),
           pre_result.as_numpy("OUT_END_ID").astype(np.int32)[0][0], pre_result.as_numpy("OUT_PAD_ID").astype(np.int32)[0][0])
    input_ids, draft_output_ids = prompt_input_ids, None
    while True:
        num_draft_tokens = min(in_num_draft_tokens, len(prompt_input_ids) + output_len - len(input_ids) - 1)
        if num_draft_tokens > 0:
            draft_result = client.infer("tensorrt_llm_draft", _trtllm_inputs(input_ids, num_draft_tokens, None, pre))
            draft_output_ids, draft_seq_len = _extract_trtllm_outputs(draft_result)
            draft_tokens = draft_output_ids[len(input_ids):draft_seq_len]
        target_result = client.infer("tensorrt_llm", _trtllm_inputs(
            input_ids, len(draft_tokens) + 1 if num_draft_tokens > 0 else 1,
            draft_tokens if num_draft_tokens > 0 else None, pre))
        target_output_ids, _ = _extract_trtllm_outputs(target_result)
        last_input_ids, input_ids = input_ids, target_output_ids
        if (len(input_ids) >= len(prompt_input_ids) + output_len
                or (draft_output_ids is not None and np.array_equal(draft_output_ids, target_output_ids))
                or np.array_equal(last_input_ids, input_ids)):
            break
    post = client.infer("postprocessing", [
        _prepare_tensor("TOKENS_BATCH", np.expand_dims(input_ids, axis=(0, 1))),
        _prepare_tensor("SEQUENCE_LENGTH", np.array([[len(input_ids)]], dtype=np.int32))])
    return post.as_numpy("OUTPUT")


def test_e2e_grpc_speculative_decoding_client_calls(dt_server, reference_outputs):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(dt_server.grpc_url)
    try:
        outputs = {p: run_speculative_client(client, p, MAX_TOKENS, 3) for p in PROMPTS[:2]}
    finally:
        client.close()
    assert all(o.ndim == 1 for o in outputs.values())  # upstream's postprocessing: one string per batch x beam
    for prompt, output in outputs.items():
        assert output[0].decode("utf8") == reference_outputs[prompt]["text"]  # the client's last line
