"""The CPU reference engine behind the Triton llmapi layout (``backend: reference`` +
``trtllm_runtime: llm_api``), built by ``build``, rendered by ``render`` and served by a real
tritonserver through ``serve``'s own start: greedy text equals target-only generation (the built
baseline engine, in process) and the engine-layout deployment's ensemble for the same method;
the wire is upstream's llmapi contract (tensor dtypes and shapes, streaming text, the error texts
of TensorRT-LLM ``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``), and the server
keeps serving after bad requests."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import yaml
from server_stops import stop_later

import tiny_deploy
from triton_clients import grpc_stream, http_generate, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MAX_TOKENS = 24
PROMPTS = ["def add(a, b):", "name: tiny\nvalue: 42\nname: tiny\nvalue:", "The quick brown"]
MODEL = "tensorrt_llm"


def _config(workdir, models, name: str, speculation: dict, llmapi: bool, decoupled: bool = True):
    return tiny_deploy.built_deployment(workdir, models, name, speculation, llmapi=llmapi, decoupled=decoupled)


def _dt(models) -> dict:
    return tiny_deploy.draft_target_spec(models)


# dt_llmapi_cfg, dt_llmapi_server: session fixtures in conftest.py, shared with test_llmapi_cpu_methods


@pytest.fixture(scope="module")
def ngram_llmapi_cfg(serving_workdir, tiny_models):
    spec = {"method": "ngram", "max_draft_len": 3, "max_matching_ngram_size": 3, "is_public_pool": False}
    return _config(serving_workdir, tiny_models, "tiny-llmapi-ngram", spec, llmapi=True, decoupled=False)


@pytest.fixture(scope="module")
def target_only(serving_workdir, dt_llmapi_cfg, tiny_models) -> dict[str, str]:
    """Greedy completions of the built baseline engine (target only), in process."""
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine
    from pipeline.triton_models.tokenizer import TextTokenizer

    torch.set_num_threads(1)
    tokenizer = TextTokenizer(tiny_models["target"])
    engine = load_engine(serving_workdir / "engines" / dt_llmapi_cfg.name / "baseline")
    try:
        out = {}
        for prompt in PROMPTS:
            result = engine.generate(GenerationRequest(tokenizer.encode(prompt), MAX_TOKENS, end_id=tokenizer.end_id,
                                                       pad_id=tokenizer.pad_id, sampling=SamplingParams(top_k=1)))
            out[prompt] = tokenizer.decode(result.output_ids)
        return out
    finally:
        engine.shutdown()


def llmapi_inputs(prompt: str | None, max_tokens: int = MAX_TOKENS, **extra) -> dict:
    """The llmapi model's inputs (max_batch_size 0: shape [1] each, as upstream's clients send)."""
    inputs = {} if prompt is None else {"text_input": np.array([prompt.encode()], dtype=np.object_)}
    inputs["sampling_param_max_tokens"] = np.array([max_tokens], dtype=np.int32)
    for name, value in extra.items():
        dtype = bool if isinstance(value, bool) else np.int32 if isinstance(value, int) else np.float32
        inputs[name] = np.array([value], dtype=dtype)
    return inputs


def _grpc_inputs(inputs: dict):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _stream(url: str, inputs: dict, request_id: str = "r1", on_first=None) -> list[dict]:
    """gRPC streaming responses of one request, {output: numpy} each (an error raises)."""
    import queue

    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(MODEL, _grpc_inputs(inputs), request_id=request_id, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: (result.as_numpy(o.name), o.datatype, list(o.shape)) for o in response.outputs})
                if on_first is not None and len(responses) == 1:
                    on_first()
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def grpc_infer(url: str, model: str, inputs: dict) -> dict:
    """Unary ModelInfer → {output: numpy}."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        result = client.infer(model, _grpc_inputs(inputs))
        return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
    finally:
        client.close()


def _text(responses: list[dict]) -> str:
    return responses[-1]["text_output"][0].reshape(-1)[0].decode()


# ----------------------------------------------------------------------------------------------


def test_rendered_repository_is_upstreams_llmapi_layout(serving_workdir, dt_llmapi_cfg):
    from pipeline.render.renderer import client_target

    root = serving_workdir / "engines" / dt_llmapi_cfg.name / "model_repo"
    for arm in ("baseline", "speculative"):
        assert sorted(p.name for p in (root / arm).iterdir()) == ["tensorrt_llm"]
        model_yaml = yaml.safe_load((root / arm / "tensorrt_llm" / "1" / "model.yaml").read_text())
        assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
        assert ("speculative_config" in model_yaml) == (arm == "speculative")
        assert (client_target(dt_llmapi_cfg, arm).model_name, client_target(dt_llmapi_cfg, arm).extra_inputs) == (MODEL, {})
    spec = yaml.safe_load((root / "speculative" / "tensorrt_llm" / "1" / "model.yaml").read_text())["speculative_config"]
    assert spec == {"decoding_type": "Draft_Target", "max_draft_len": 3,
                    "speculative_model": str(serving_workdir / "models" / "draft")}


def test_streamed_greedy_text_equals_target_only(dt_llmapi_server, target_only):
    drafted = 0
    for prompt in PROMPTS:
        responses = _stream(dt_llmapi_server.grpc_url, llmapi_inputs(prompt, streaming=True,
                                                                     sampling_param_return_perf_metrics=True))
        texts = [r["text_output"][0].reshape(-1)[0].decode() for r in responses]
        assert texts[-1] == target_only[prompt]
        assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))  # cumulative, as upstream
        drafted += int(responses[-1]["total_draft_tokens"][0][0])
    assert drafted > 0  # the draft ran inside the model


def test_wire_dtypes_and_shapes(dt_llmapi_server):
    responses = _stream(dt_llmapi_server.grpc_url, llmapi_inputs(
        PROMPTS[0], streaming=True, return_finish_reason=True, return_stop_reason=True,
        sampling_param_return_perf_metrics=True))
    last = responses[-1]
    want = {"text_output": "BYTES", "finish_reason": "BYTES", "stop_reason": "BYTES", "acceptance_rate": "FP32",
            "kv_cache_hit_rate": "FP32", "total_draft_tokens": "INT32", "total_accepted_draft_tokens": "INT32",
            "kv_cache_reused_block": "INT32", "arrival_time_ns": "INT64", "last_token_time_ns": "INT64"}
    for name, dtype in want.items():
        assert last[name][1:] == (dtype, [1]), name
    assert last["finish_reason"][0][0] == b"length" and last["stop_reason"][0][0] == b"None"
    assert all(r["finish_reason"][0][0] == b"None" for r in responses[:-1])
    accepted, drafted = int(last["total_accepted_draft_tokens"][0][0]), int(last["total_draft_tokens"][0][0])
    assert last["acceptance_rate"][0][0] == pytest.approx(accepted / drafted)


def test_http_generate_puts_the_prompt_in_front_unless_excluded(dt_llmapi_server, target_only):
    prompt = PROMPTS[1]
    status, body = http_generate(dt_llmapi_server.http_url, MODEL, {"text_input": prompt, "sampling_param_max_tokens": MAX_TOKENS})
    assert status == 200, body
    assert body["text_output"].endswith(target_only[prompt]) and body["text_output"].startswith(prompt.split("\n")[0])
    status, body = http_generate(dt_llmapi_server.http_url, MODEL, {
        "text_input": prompt, "sampling_param_max_tokens": MAX_TOKENS, "sampling_param_exclude_input_from_output": True})
    assert status == 200 and body["text_output"] == target_only[prompt]


@pytest.mark.parametrize(("inputs", "message"), [
    (llmapi_inputs(None), "Error generating request: text_input is missing from the request"),
    (llmapi_inputs(PROMPTS[0], sampling_param_top_p=1.5), "Error generating request: sampling_param_top_p must be in [0, 1], got 1.5"),
    (llmapi_inputs(PROMPTS[0], sampling_param_temperature=-1.0), "sampling_param_temperature must be >= 0, got -1"),
    (llmapi_inputs(PROMPTS[0], 0), "sampling_param_max_tokens must be > 0, got 0"),
    (llmapi_inputs(PROMPTS[0], sampling_param_frequency_penalty=0.5), "frequency penalty"),
])
def test_bad_requests_are_refused_and_the_server_keeps_serving(dt_llmapi_server, target_only, inputs, message):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="Error generating request") as caught:
        _stream(dt_llmapi_server.grpc_url, {**inputs, "streaming": np.array([True])})
    assert message in str(caught.value)
    with urllib.request.urlopen(f"{dt_llmapi_server.http_url}/v2/health/ready", timeout=30) as response:  # noqa: S310 - loopback http URL of the server under test
        assert response.status == 200
    assert _text(_stream(dt_llmapi_server.grpc_url, llmapi_inputs(PROMPTS[2], streaming=True))) == target_only[PROMPTS[2]]


def test_stop_without_request_id_is_refused(dt_llmapi_server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="A request id must be provided for request cancellation"):
        _stream(dt_llmapi_server.grpc_url, {"stop": np.array([True])}, request_id="")


def test_stop_cancels_the_request_with_that_id(dt_llmapi_server):
    import threading

    from tritonclient.utils import InferenceServerException

    long = llmapi_inputs(PROMPTS[0], 200, streaming=True, return_finish_reason=True)
    uninterrupted = _stream(dt_llmapi_server.grpc_url, long)
    assert uninterrupted[-1]["finish_reason"][0][0] == b"length"  # long enough to be stopped midway

    def attempt(n: int) -> dict:
        first, outcome = threading.Event(), {}

        def run():
            try:
                outcome["responses"] = _stream(dt_llmapi_server.grpc_url, long, request_id=f"long{n}",
                                               on_first=first.set)
            except InferenceServerException as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=run)
        thread.start()
        assert first.wait(120)
        with pytest.raises(InferenceServerException, match="Request cancelled by client"):
            _stream(dt_llmapi_server.grpc_url, {"stop": np.array([True])}, request_id=f"long{n}")
        thread.join(120)
        return outcome

    # On a loaded host the 200 tokens can all be generated before the stop's own stream is up (the
    # stop of a finished request is answered CANCELLED too, as upstream's model does): such a race
    # is visible as a stream that ended on its length, and is tried again; a stream the stop reached
    # must end with the cancellation, never with more tokens.
    for n in range(3):
        outcome = attempt(n)
        if "error" in outcome:
            assert "Request cancelled by client" in outcome["error"], outcome["error"]
            return
        assert outcome["responses"][-1]["finish_reason"][0][0] == b"length", outcome["responses"][-1]  # lost the race
    pytest.fail("the stop never reached the request in flight in 3 tries")


def test_llmapi_equals_the_engine_layout_deployment(dt_engine_server, dt_llmapi_server):
    """The same method on the engine layout (the ensemble, the draft inside the tensorrt_llm
    model's engine; the shared session server): the same greedy completions."""
    for prompt in PROMPTS:
        ensemble = grpc_stream(dt_engine_server.grpc_url, "ensemble", text_inputs(prompt, MAX_TOKENS, stream=True, top_k=1))
        expected = "".join(r["text_output"].reshape(-1)[0].decode() for r in ensemble)
        assert _text(_stream(dt_llmapi_server.grpc_url, llmapi_inputs(prompt, streaming=True))) == expected


def test_ngram_llmapi_not_decoupled_equals_target_only(ngram_llmapi_cfg, target_only):
    """decoupled: false — unary ModelInfer, one response per request; streaming is refused."""
    from tritonclient.utils import InferenceServerException

    from pipeline.serve.server import start_deployment

    server = start_deployment(ngram_llmapi_cfg, "speculative")
    try:
        config = json.loads(urllib.request.urlopen(f"{server.http_url}/v2/models/{MODEL}/config", timeout=30).read())  # noqa: S310 - loopback http URL of the server under test
        assert config["max_batch_size"] == 0 and not config["model_transaction_policy"].get("decoupled", False)
        drafted = 0
        for prompt in PROMPTS:
            result = grpc_infer(server.grpc_url, MODEL, llmapi_inputs(prompt, sampling_param_exclude_input_from_output=True))
            assert result["text_output"].shape == (1,) and result["text_output"][0].decode() == target_only[prompt]
            drafted += int(result["total_draft_tokens"][0])
        assert drafted > 0  # n-gram drafts from the request's own tokens
        with pytest.raises(InferenceServerException, match="Streaming is only supported in decoupled mode."):
            grpc_infer(server.grpc_url, MODEL, llmapi_inputs(PROMPTS[0], streaming=True))
        assert grpc_infer(server.grpc_url, MODEL, llmapi_inputs(PROMPTS[2], sampling_param_exclude_input_from_output=True))[
            "text_output"][0].decode() == target_only[PROMPTS[2]]
    finally:
        stop_later(server)
