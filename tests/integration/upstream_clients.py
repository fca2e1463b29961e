"""The exact calls upstream's Triton clients for ``inflight_batcher_llm`` make, written anew (not
copied) from reading them at tensorrtllm_backend@r25.05, so the tests can run them against our
served CPU deployments without fetching or vendoring upstream code:

- ``inflight_batcher_llm/client/end_to_end_grpc_client.py`` with its default flags (and
  ``--streaming``, ``--batch-inputs``): gRPC stream API even without streaming, requested output
  ``text_output`` (+ ``batch_index``), text read as ``output[0].decode("utf-8")``;
- ``inflight_batcher_llm/client/e2e_grpc_speculative_decoding_client.py``: unary calls to
  preprocessing, the draft and target ``tensorrt_llm`` models and postprocessing;
- ``tools/inflight_batcher_llm/end_to_end_test.py`` ``test_functionality_ifb``: preprocessing →
  tensorrt_llm → postprocessing by hand, compared with one ensemble call (HTTP or gRPC).

Like upstream, a server error does not raise here: it is returned, so tests can assert on it."""

from __future__ import annotations

import queue

import numpy as np


def _grpc():
    import tritonclient.grpc as grpcclient

    return grpcclient


def _client_module(protocol: str):
    if protocol == "http":
        import tritonclient.http as httpclient

        return httpclient
    return _grpc()


def tensor(module, name: str, array: np.ndarray):
    """InferInput with the array's own shape and Triton dtype (upstream ``prepare_tensor``)."""
    from tritonclient.utils import np_to_triton_dtype

    t = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    t.set_data_from_numpy(array)
    return t


# -- end_to_end_grpc_client.py ---------------------------------------------------------------------


def e2e_inputs(prompt: str, output_len: int, streaming: bool) -> dict[str, np.ndarray]:
    """``prepare_inputs`` with the script's defaults: beam 1, temperature 1.0, no word lists, no
    end/pad id, ``exclude_input_in_output`` False (sent, since the default is not None)."""
    return {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.ones((1, 1), dtype=np.int32) * output_len,
        "stream": np.array([[streaming]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
    }


def e2e_grpc_client(url: str, prompts: list[str], output_len: int, streaming: bool,
                    batch_inputs: bool = False, model: str = "ensemble") -> tuple[list[str], list]:
    """(one text per prompt, server errors) as ``run_inference`` builds them."""
    grpcclient = _grpc()
    per_prompt = [e2e_inputs(p, output_len, streaming) for p in prompts]
    if batch_inputs:
        requests = [[tensor(grpcclient, k, np.concatenate([d[k] for d in per_prompt], axis=0)) for k in per_prompt[0]]]
    else:
        requests = [[tensor(grpcclient, k, v) for k, v in d.items()] for d in per_prompt]
    outputs = [grpcclient.InferRequestedOutput("text_output")]
    if batch_inputs:
        outputs.append(grpcclient.InferRequestedOutput("batch_index"))
    texts, errors = [], []
    client = grpcclient.InferenceServerClient(url)
    try:
        for inputs in requests:
            results: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: results.put(error or result))  # noqa: B023 - the stream is stopped inside this iteration
            client.async_stream_infer(model, inputs, outputs=outputs, request_id="")
            client.stop_stream()  # returns once the server has closed the stream
            batch_text = [""] * inputs[0].shape()[0]
            while not results.empty():
                _read_e2e_result(results.get(), streaming, batch_text, errors)
            texts.extend(batch_text)
    finally:
        client.close()
    return texts, errors


def _read_e2e_result(result, streaming: bool, batch_text: list[str], errors: list) -> None:
    from tritonclient.utils import InferenceServerException

    if isinstance(result, InferenceServerException):
        errors.append(result)
        return
    output = result.as_numpy("text_output")
    batch_index = result.as_numpy("batch_index")
    row = 0 if batch_index is None else batch_index[0][0]
    if streaming:
        batch_text[row] += output[0].decode("utf-8")
    else:
        batch_text[row] = output[0].decode("utf-8")


# -- e2e_grpc_speculative_decoding_client.py ------------------------------------------------------


def _llm_inputs(grpcclient, context, request_output_len, draft, pre) -> list:
    inputs = [
        tensor(grpcclient, "input_ids", np.expand_dims(context, axis=0)),
        tensor(grpcclient, "input_lengths", np.array([[len(context)]], dtype=np.int32)),
        tensor(grpcclient, "request_output_len", np.array([[request_output_len]], dtype=np.int32)),
        tensor(grpcclient, "bad_words_list", pre["bad_words_ids"]),
        tensor(grpcclient, "stop_words_list", pre["stop_words_ids"]),
        tensor(grpcclient, "beam_width", np.array([[1]], dtype=np.int32)),
        tensor(grpcclient, "temperature", np.array([[1.0]], dtype=np.float32)),
        tensor(grpcclient, "end_id", np.array([[pre["end_id"]]], dtype=np.int32)),
        tensor(grpcclient, "pad_id", np.array([[pre["pad_id"]]], dtype=np.int32)),
    ]
    if draft is not None:
        inputs.append(tensor(grpcclient, "draft_input_ids", np.array([draft], dtype=np.int32)))
    return inputs


def _llm_output(result) -> tuple[np.ndarray, int]:
    output_ids = np.squeeze(result.as_numpy("output_ids").astype(np.int32), axis=(0, 1))
    sequence_length = result.as_numpy("sequence_length").astype(np.int32)
    assert sequence_length.shape[0] == 1 and sequence_length.shape[1] == 1
    return output_ids, int(sequence_length[0, 0])


def preprocess_like_speculative_client(client, prompt: str, output_len: int, stop_words=(), bad_words=()) -> dict:
    grpcclient = _grpc()
    inputs = [tensor(grpcclient, "QUERY", np.array([[prompt]]).astype(object)),
              tensor(grpcclient, "REQUEST_OUTPUT_LEN", np.ones((1, 1), dtype=np.int32) * output_len)]
    if bad_words:
        inputs.append(tensor(grpcclient, "BAD_WORDS_DICT", np.array([list(bad_words)], dtype=object)))
    if stop_words:
        inputs.append(tensor(grpcclient, "STOP_WORDS_DICT", np.array([list(stop_words)], dtype=object)))
    result = client.infer("preprocessing", inputs)
    return {
        "input_ids": np.squeeze(result.as_numpy("INPUT_ID").astype(np.int32), axis=0),
        "bad_words_ids": result.as_numpy("BAD_WORDS_IDS").astype(np.int32),
        "stop_words_ids": result.as_numpy("STOP_WORDS_IDS").astype(np.int32),
        "end_id": result.as_numpy("OUT_END_ID").astype(np.int32)[0][0],
        "pad_id": result.as_numpy("OUT_PAD_ID").astype(np.int32)[0][0],
    }


def speculative_client(url: str, prompt: str, output_len: int, num_draft_tokens: int, draft_model: str,
                       target_model: str = "tensorrt_llm", stop_words=(), bad_words=()) -> str:
    """``run_speculative_inference``: the final text, read as ``OUTPUT[0].decode("utf8")``."""
    grpcclient = _grpc()
    client = grpcclient.InferenceServerClient(url)
    try:
        pre = preprocess_like_speculative_client(client, prompt, output_len, stop_words, bad_words)
        prompt_ids = context = pre["input_ids"]
        draft_out = None
        while True:
            k = min(num_draft_tokens, len(prompt_ids) + output_len - len(context) - 1)
            drafts = None
            if k > 0:
                draft_out, draft_len = _llm_output(client.infer(draft_model, _llm_inputs(grpcclient, context, k, None, pre)))
                drafts = draft_out[len(context):draft_len]
            request_len = len(drafts) + 1 if k > 0 else 1
            target_out, _ = _llm_output(client.infer(target_model, _llm_inputs(grpcclient, context, request_len, drafts, pre)))
            previous, context = context, target_out
            if (len(context) >= len(prompt_ids) + output_len
                    or (draft_out is not None and np.array_equal(draft_out, target_out))
                    or np.array_equal(previous, context) or _ends_with_stop_word(context, pre["stop_words_ids"][0])):
                break
        post = client.infer("postprocessing", [
            tensor(grpcclient, "TOKENS_BATCH", np.expand_dims(context, axis=(0, 1))),
            tensor(grpcclient, "SEQUENCE_LENGTH", np.array([[len(context)]], dtype=np.int32))])
        return post.as_numpy("OUTPUT")[0].decode("utf8")
    finally:
        client.close()


def _ends_with_stop_word(ids: np.ndarray, word_rows: np.ndarray) -> bool:
    """Upstream's check, row by row of the [2, L] word list."""
    return any(np.array_equal(ids[-len(row):], row) for row in word_rows)


# -- tools/inflight_batcher_llm/end_to_end_test.py ------------------------------------------------


def ifb_functionality(url: str, protocol: str, prompt: str, output_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``test_functionality_ifb`` for one prompt: (postprocessing OUTPUT, ensemble text_output);
    the script then asserts ``output0 == ensemble_output``."""
    module = _client_module(protocol)
    client = module.InferenceServerClient(url)
    try:
        query = np.array([[prompt]]).astype(object)
        length = np.ones((1, 1), dtype=np.int32) * output_len
        empty_words = np.array([[""]], dtype=object)
        pre = client.infer("preprocessing", [
            tensor(module, "QUERY", query), tensor(module, "BAD_WORDS_DICT", empty_words),
            tensor(module, "STOP_WORDS_DICT", empty_words), tensor(module, "REQUEST_OUTPUT_LEN", length)], request_id="0")
        llm = client.infer("tensorrt_llm", [
            tensor(module, "input_ids", pre.as_numpy("INPUT_ID")),
            tensor(module, "decoder_input_ids", pre.as_numpy("DECODER_INPUT_ID")),
            tensor(module, "input_lengths", pre.as_numpy("REQUEST_INPUT_LEN")),
            tensor(module, "request_output_len", pre.as_numpy("REQUEST_OUTPUT_LEN")),
            tensor(module, "end_id", pre.as_numpy("OUT_END_ID")),
            tensor(module, "pad_id", pre.as_numpy("OUT_PAD_ID"))], request_id="0")
        post = client.infer("postprocessing", [
            tensor(module, "TOKENS_BATCH", llm.as_numpy("output_ids").astype(np.int32)),
            tensor(module, "SEQUENCE_LENGTH", llm.as_numpy("sequence_length"))], request_id="0")
        ensemble = client.infer("ensemble", [
            tensor(module, "text_input", query), tensor(module, "max_tokens", length),
            tensor(module, "bad_words", empty_words), tensor(module, "stop_words", empty_words)],
            outputs=[module.InferRequestedOutput("text_output")], request_id="0")
        return post.as_numpy("OUTPUT"), ensemble.as_numpy("text_output")
    finally:
        client.close()
