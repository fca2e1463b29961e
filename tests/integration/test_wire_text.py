"""The text side of the served repository on the wire (real tritonserver, CPU): upstream's own
client calls (tensorrtllm_backend@r25.05, reproduced in ``upstream_clients``) run against our
deployments; every output of ``preprocessing`` / ``postprocessing`` and the ensemble's
``text_output`` has the shape and dtype upstream's model code sends (batch 1 and 3, streaming and
not, beam 1); a request missing ``text_input`` / ``max_tokens`` (or QUERY / REQUEST_OUTPUT_LEN /
TOKENS_BATCH / SEQUENCE_LENGTH called directly) gets an error naming it, and the next request
works."""

from __future__ import annotations

import numpy as np
import pytest
import upstream_clients as upstream

from conftest import MAX_TOKENS, PROMPTS
from triton_clients import StreamSession, grpc_infer, grpc_stream, http_generate, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from pipeline.triton_models.tokenizer import TextTokenizer

    return TextTokenizer(tiny_models["target"])


# -- upstream clients, unchanged calls ---------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "not-streaming"])
def test_upstream_end_to_end_grpc_client(baseline_server, reference_outputs, streaming):
    """end_to_end_grpc_client.py (default flags, ± --streaming): ``output[0].decode()`` works and
    gives the reference text (deltas when streaming, prompt included when not)."""
    texts, errors = upstream.e2e_grpc_client(baseline_server.grpc_url, PROMPTS, MAX_TOKENS, streaming)
    assert errors == []
    key = "completion" if streaming else "text"
    assert texts == [reference_outputs[p][key] for p in PROMPTS]


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "not-streaming"])
def test_upstream_end_to_end_grpc_client_batch_inputs(baseline_server, reference_outputs, streaming):
    """--batch-inputs: the three prompts in one [3, 1] request; rows come back by batch_index."""
    texts, errors = upstream.e2e_grpc_client(baseline_server.grpc_url, PROMPTS, MAX_TOKENS, streaming, batch_inputs=True)
    assert errors == []
    key = "completion" if streaming else "text"
    assert texts == [reference_outputs[p][key] for p in PROMPTS]


def test_upstream_speculative_decoding_client(dt_server, reference_outputs):
    """e2e_grpc_speculative_decoding_client.py --draft-tensorrt-llm-model-name tensorrt_llm_draft
    --num-draft-tokens 3 (our engines' max_draft_len): greedy, so the reference text."""
    for prompt in PROMPTS:
        text = upstream.speculative_client(dt_server.grpc_url, prompt, MAX_TOKENS, 3, "tensorrt_llm_draft")
        assert text == reference_outputs[prompt]["text"]


def test_upstream_speculative_decoding_client_with_word_lists(dt_server, reference_outputs):
    """--stop-words / --bad-words the model never produces: the [1, 2, L] lists travel through
    preprocessing → both LLM models and the client's own stop check, text unchanged."""
    prompt = PROMPTS[0]
    text = upstream.speculative_client(dt_server.grpc_url, prompt, MAX_TOKENS, 3, "tensorrt_llm_draft",
                                       stop_words=["\u2603"], bad_words=["\u2604"])
    assert text == reference_outputs[prompt]["text"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_upstream_end_to_end_test_ifb(dt_server, reference_outputs, protocol):
    """tools/inflight_batcher_llm/end_to_end_test.py test_functionality_ifb: the models called by
    hand (word lists [[""]]) give the ensemble's text_output, compared as the script does."""
    url = dt_server.http_url.removeprefix("http://") if protocol == "http" else dt_server.grpc_url
    for prompt in PROMPTS:
        output0, ensemble_output = upstream.ifb_functionality(url, protocol, prompt, MAX_TOKENS)
        assert output0 == ensemble_output  # the script's check, truth of a 1-element array
        assert output0.shape == ensemble_output.shape == (1,)
        assert ensemble_output[0].decode("utf-8") == reference_outputs[prompt]["text"]


# -- preprocessing: every output, batch 1 and 3 ---------------------------------------------------


def _expected_word_list(rows: list[list[str]], tokenizer) -> np.ndarray:
    """Upstream ``_to_word_list_format``: per row the ids of each non-empty word (no special
    tokens) concatenated, cumulative end offsets; padded to max(1, longest) with 0 / -1."""
    ids = [[t for w in row for t in tokenizer.encode(w, add_special_tokens=False)] for row in rows]
    ends = [list(np.cumsum([len(tokenizer.encode(w, add_special_tokens=False)) for w in row
                            if tokenizer.encode(w, add_special_tokens=False)])) for row in rows]
    width = max([1] + [len(r) for r in ids])
    return np.array([[r + [0] * (width - len(r)), e + [-1] * (width - len(e))] for r, e in zip(ids, ends)], dtype=np.int32)


def _expected_input_ids(prompts: list[str], tokenizer) -> tuple[np.ndarray, np.ndarray]:
    rows = [tokenizer.encode(p) for p in prompts]
    width = max(len(r) for r in rows)
    padded = np.array([r + [tokenizer.pad_id] * (width - len(r)) for r in rows], dtype=np.int32)
    return padded, np.array([[len(r)] for r in rows], dtype=np.int32)


def _check(outputs: dict, name: str, dtype, expected) -> None:
    value = outputs[name]
    assert value.dtype == dtype, (name, value.dtype)
    expected = np.asarray(expected)
    assert value.shape == expected.shape, (name, value.shape, expected.shape)
    np.testing.assert_array_equal(value, expected, err_msg=name)


@pytest.mark.parametrize("batch", [1, 3])
def test_preprocessing_outputs_plain(baseline_server, tokenizer, batch):
    prompts = PROMPTS[:batch]
    out = grpc_infer(baseline_server.grpc_url, "preprocessing", {
        "QUERY": np.array([[p] for p in prompts], dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.array([[MAX_TOKENS]] * batch, dtype=np.int32)})
    ids, lengths = _expected_input_ids(prompts, tokenizer)
    assert set(out) == {"INPUT_ID", "REQUEST_INPUT_LEN", "DECODER_INPUT_ID", "REQUEST_DECODER_INPUT_LEN",
                        "BAD_WORDS_IDS", "STOP_WORDS_IDS", "EMBEDDING_BIAS", "REQUEST_OUTPUT_LEN", "OUT_END_ID", "OUT_PAD_ID"}
    _check(out, "INPUT_ID", np.int32, ids)
    _check(out, "REQUEST_INPUT_LEN", np.int32, lengths)
    _check(out, "DECODER_INPUT_ID", np.int32, [[tokenizer.pad_id]] * batch)
    _check(out, "REQUEST_DECODER_INPUT_LEN", np.int32, [[1]] * batch)
    _check(out, "BAD_WORDS_IDS", np.int32, np.zeros((batch, 2, 0)))
    _check(out, "STOP_WORDS_IDS", np.int32, np.zeros((batch, 2, 0)))
    _check(out, "EMBEDDING_BIAS", np.float32, np.zeros((batch, 0)))
    _check(out, "REQUEST_OUTPUT_LEN", np.int32, [[MAX_TOKENS]] * batch)
    _check(out, "OUT_END_ID", np.int32, [[tokenizer.end_id]] * batch)
    _check(out, "OUT_PAD_ID", np.int32, [[tokenizer.pad_id]] * batch)


@pytest.mark.parametrize("batch", [1, 3])
def test_preprocessing_outputs_with_every_optional_input(baseline_server, tokenizer, batch):
    prompts = PROMPTS[:batch]
    stop_rows = [["fox", "dog"], ["add", ""], ["", ""]][:batch]
    bias_words, bias_weights = [["quick", "brown fox"]] * batch, [[-2.0, 0.5]] * batch
    out = grpc_infer(baseline_server.grpc_url, "preprocessing", {
        "QUERY": np.array([[p] for p in prompts], dtype=np.object_),
        "DECODER_QUERY": np.array([["lazy dog"]] * batch, dtype=np.object_),
        "REQUEST_OUTPUT_LEN": np.array([[5]] * batch, dtype=np.int32),
        "BAD_WORDS_DICT": np.array([[""]] * batch, dtype=np.object_),
        "STOP_WORDS_DICT": np.array(stop_rows, dtype=np.object_),
        "EMBEDDING_BIAS_WORDS": np.array(bias_words, dtype=np.object_),
        "EMBEDDING_BIAS_WEIGHTS": np.array(bias_weights, dtype=np.float32),
        "END_ID": np.array([[7]] * batch, dtype=np.int32), "PAD_ID": np.array([[9]] * batch, dtype=np.int32),
        "PROMPT_TABLE_EXTRA_ID": np.array([[42]] * batch, dtype=np.uint64)})
    ids, _ = _expected_input_ids(prompts, tokenizer)
    _check(out, "INPUT_ID", np.int32, ids)  # padded with the tokenizer's pad id, not PAD_ID
    decoder = tokenizer.encode("lazy dog")
    _check(out, "DECODER_INPUT_ID", np.int32, [decoder] * batch)
    _check(out, "REQUEST_DECODER_INPUT_LEN", np.int32, [[len(decoder)]] * batch)
    _check(out, "BAD_WORDS_IDS", np.int32, [[[0], [-1]]] * batch)  # words given but all empty: L = 1
    _check(out, "STOP_WORDS_IDS", np.int32, _expected_word_list(stop_rows, tokenizer))
    bias = np.zeros((batch, tokenizer.vocab_size), dtype=np.float32)
    for b in range(batch):
        for word, weight in zip(bias_words[b], bias_weights[b]):
            for token_id in tokenizer.encode(word):  # upstream: encode(word), special tokens included
                bias[b, token_id] += weight
    _check(out, "EMBEDDING_BIAS", np.float32, bias)
    _check(out, "OUT_END_ID", np.int32, [[7]] * batch)
    _check(out, "OUT_PAD_ID", np.int32, [[9]] * batch)
    _check(out, "OUT_PROMPT_TABLE_EXTRA_IDS", np.uint64, np.where(ids >= tokenizer.base_vocab_size, 42, 0))


# -- postprocessing: OUTPUT, batch 1 and 3, streaming chunks and whole sequences ------------------


@pytest.mark.parametrize("batch", [1, 3])
def test_postprocessing_output_whole_sequences(baseline_server, reference_outputs, tokenizer, batch):
    rows = [reference_outputs[p]["ids"] for p in PROMPTS[:batch]]
    width = max(len(r) for r in rows) + 2
    tokens = np.array([[r + [tokenizer.end_id] * (width - len(r))] for r in rows], dtype=np.int32)  # [B, 1, T]
    out = grpc_infer(baseline_server.grpc_url, "postprocessing", {
        "TOKENS_BATCH": tokens, "SEQUENCE_LENGTH": np.array([[len(r)] for r in rows], dtype=np.int32)})
    assert set(out) == {"OUTPUT"}
    _check(out, "OUTPUT", np.object_, [reference_outputs[p]["text"].encode() for p in PROMPTS[:batch]])


@pytest.mark.parametrize("batch", [1, 3])
def test_postprocessing_output_streaming_chunks(baseline_server, reference_outputs, tokenizer, batch):
    """A streamed response's chunk ([B, 1, k], possibly k = 0) decodes on its own to a [B] array."""
    for k in (2, 0):
        rows = [reference_outputs[p]["generated"][:k] for p in PROMPTS[:batch]]
        out = grpc_infer(baseline_server.grpc_url, "postprocessing", {
            "TOKENS_BATCH": np.array([[r] for r in rows], dtype=np.int32).reshape(batch, 1, k),
            "SEQUENCE_LENGTH": np.full((batch, 1), k, dtype=np.int32)})
        _check(out, "OUTPUT", np.object_, [tokenizer.decode(r).encode() for r in rows])


# -- the ensemble's text_output ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "not-streaming"])
@pytest.mark.parametrize("batch", [1, 3])
def test_ensemble_text_output_shape(baseline_server, reference_outputs, stream, batch):
    """One response per batch row and chunk (as the C++ backend answers), each text_output [1]."""
    prompts = PROMPTS[:batch]
    inputs = {"text_input": np.array([[p] for p in prompts], dtype=np.object_),
              "max_tokens": np.array([[MAX_TOKENS]] * batch, dtype=np.int32), "stream": np.array([[stream]] * batch)}
    texts = [""] * batch
    for response in grpc_stream(baseline_server.grpc_url, "ensemble", inputs):
        assert response["text_output"].shape == (1,) and response["text_output"].dtype == np.object_
        row = 0 if batch == 1 else int(response["batch_index"][0][0])
        texts[row] += response["text_output"][0].decode()
    key = "completion" if stream else "text"
    assert texts == [reference_outputs[p][key] for p in prompts]


def test_ensemble_text_output_unary_and_http(dt_server, reference_outputs):
    prompt = PROMPTS[1]
    out = grpc_infer(dt_server.grpc_url, "ensemble", text_inputs(prompt, MAX_TOKENS), outputs=["text_output"])
    assert out["text_output"].shape == (1,) and out["text_output"][0].decode() == reference_outputs[prompt]["text"]
    status, body = http_generate(dt_server.http_url, "ensemble", {"text_input": prompt, "max_tokens": MAX_TOKENS})
    assert status == 200 and body["text_output"] == reference_outputs[prompt]["text"]  # 1 element: a JSON string


# -- missing required inputs ---------------------------------------------------------------------------

ONLY_MAX_TOKENS = {"max_tokens": np.array([[4]], dtype=np.int32)}
ONLY_TEXT = {"text_input": np.array([["hi"]], dtype=np.object_)}


@pytest.mark.parametrize("inputs,missing", [(ONLY_MAX_TOKENS, "text_input"), (ONLY_TEXT, "max_tokens")],
                         ids=["no-text_input", "no-max_tokens"])
def test_ensemble_stream_without_required_input(baseline_server, reference_outputs, inputs, missing):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match=f"missing required input .*'{missing}'"):
        grpc_stream(baseline_server.grpc_url, "ensemble", {**inputs, "stream": np.array([[True]])})
    _next_request_works(baseline_server, reference_outputs)


@pytest.mark.parametrize("body,missing", [({"max_tokens": 4}, "text_input"), ({"text_input": "hi"}, "max_tokens")],
                         ids=["no-text_input", "no-max_tokens"])
def test_ensemble_http_without_required_input(baseline_server, reference_outputs, body, missing):
    status, payload = http_generate(baseline_server.http_url, "ensemble", {**body, "stream": False})
    assert status == 400 and missing in payload["error"], payload
    _next_request_works(baseline_server, reference_outputs)


def test_non_decoupled_ensemble_unary_without_text_input(dt_server, reference_outputs):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="missing required input .*'text_input'"):
        grpc_infer(dt_server.grpc_url, "ensemble", {**ONLY_MAX_TOKENS, "temperature": np.array([[1.0]], dtype=np.float32)})
    out = grpc_infer(dt_server.grpc_url, "ensemble", text_inputs(PROMPTS[0], MAX_TOKENS))
    assert out["text_output"][0].decode() == reference_outputs[PROMPTS[0]]["text"]


@pytest.mark.parametrize("inputs,missing", [
    ({"REQUEST_OUTPUT_LEN": np.array([[4]], dtype=np.int32)}, "QUERY"),
    ({"QUERY": np.array([["hi"]], dtype=np.object_)}, "REQUEST_OUTPUT_LEN"),
], ids=["no-QUERY", "no-REQUEST_OUTPUT_LEN"])
def test_preprocessing_without_required_input(baseline_server, reference_outputs, inputs, missing):
    from tritonclient.utils import InferenceServerException

    extra = {"END_ID": np.array([[2]], dtype=np.int32)}  # a second input: Triton's count check passes
    with pytest.raises(InferenceServerException, match=f"missing required input '{missing}'") as info:
        grpc_infer(baseline_server.grpc_url, "preprocessing", {**inputs, **extra})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    _next_request_works(baseline_server, reference_outputs)


@pytest.mark.parametrize("missing", ["TOKENS_BATCH", "SEQUENCE_LENGTH"])
def test_postprocessing_without_required_input(baseline_server, reference_outputs, missing):
    from tritonclient.utils import InferenceServerException

    inputs = {"TOKENS_BATCH": np.array([[[5, 6]]], dtype=np.int32), "SEQUENCE_LENGTH": np.array([[2]], dtype=np.int32)}
    del inputs[missing]
    with pytest.raises(InferenceServerException, match=missing):
        grpc_infer(baseline_server.grpc_url, "postprocessing", inputs)
    _next_request_works(baseline_server, reference_outputs)


def _next_request_works(server, reference_outputs) -> None:
    prompt = PROMPTS[0]
    session = StreamSession(server.grpc_url)
    try:
        responses = session.generate("ensemble", text_inputs(prompt, MAX_TOKENS, stream=False))
    finally:
        session.close()
    assert [r["text_output"][0].decode() for r in responses] == [reference_outputs[prompt]["text"]]
