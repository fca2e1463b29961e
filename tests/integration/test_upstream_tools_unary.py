"""Upstream's own test and benchmark tools against a deployment rendered with
``triton.decoupled: false`` (real tritonserver, CPU reference engine, Medusa speculative arm), as
upstream's CI runs them against non-decoupled repositories. The calls are written anew from
tensorrtllm_backend@r25.05 (the last tag that ships ``tools/``; later ones carry them inside
TensorRT-LLM's ``triton_backend/tools``):

- ``tools/inflight_batcher_llm/end_to_end_test.py``: ``test_functionality_ifb`` (preprocessing →
  tensorrt_llm → postprocessing by hand vs one ensemble call; with ``--test-bls`` also
  ``tensorrt_llm_bls``) and ``test_performance`` (``create_inputs`` → ``async_infer`` on the
  ensemble), every call unary (``client.infer`` / ``client.async_infer``);
- ``tools/inflight_batcher_llm/benchmark_core_model.py`` without ``--decoupled`` (its default):
  ``tensorrt_llm`` called with ``input_ids`` INT32 [1, L], ``input_lengths`` / ``request_output_len`` /
  ``pad_id`` / ``end_id`` INT32 [1, 1], ``async_infer`` over HTTP (the script's default protocol) or
  gRPC with a callback.

The same unary call against the default (decoupled) deployment is refused by Triton itself: that is
why docs/triton-contract.md tells users of these tools to set ``triton.decoupled: false``."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import upstream_clients as upstream
from server_stops import stop_later

import tiny_deploy
from conftest import MAX_TOKENS, PROMPTS

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(scope="module")
def unary_server(serving_workdir, tiny_models):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment

    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "medusa", name="tiny-medusa-unary",
                                           decoupled=False)
    cfg = load_config(cfg_path, serving_workdir)
    render(cfg)
    server = start_deployment(cfg, "speculative")
    yield server
    stop_later(server)


def _module(protocol: str):
    return upstream._client_module(protocol)


def _url(server, protocol: str) -> str:
    return server.http_url.removeprefix("http://") if protocol == "http" else server.grpc_url


def _text_request(module, prompt: str, output_len: int) -> list:
    """``create_inputs`` (not llmapi) / the ensemble and BLS inputs of ``test_functionality_ifb``."""
    query = np.array([[prompt]]).astype(object)
    empty_words = np.array([[""]], dtype=object)
    return [upstream.tensor(module, "text_input", query),
            upstream.tensor(module, "max_tokens", np.ones_like(query).astype(np.int32) * output_len),
            upstream.tensor(module, "bad_words", empty_words),
            upstream.tensor(module, "stop_words", empty_words)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_end_to_end_test_functionality_ifb_and_bls(unary_server, reference_outputs, protocol):
    """By hand equals the ensemble (the script's ``assert output0 == ensemble_output``), and
    ``--test-bls``: the BLS's text_output equals it too; greedy, so the reference text."""
    module = _module(protocol)
    for prompt in PROMPTS:
        output0, ensemble_output = upstream.ifb_functionality(_url(unary_server, protocol), protocol, prompt, MAX_TOKENS)
        assert output0 == ensemble_output
        assert ensemble_output[0].decode("utf-8") == reference_outputs[prompt]["text"]
        client = module.InferenceServerClient(_url(unary_server, protocol))
        try:
            bls = client.infer("tensorrt_llm_bls", _text_request(module, prompt, MAX_TOKENS),
                               outputs=[module.InferRequestedOutput("text_output")], request_id="0")
        finally:
            client.close()
        assert output0 == bls.as_numpy("text_output")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_end_to_end_test_performance_async_infer(unary_server, reference_outputs, protocol):
    """``test_performance``: every prompt sent at once with ``async_infer`` on the ensemble,
    results collected as the script does (HTTP ``get_result()``, gRPC callbacks)."""
    module = _module(protocol)
    client = module.InferenceServerClient(_url(unary_server, protocol), **({"concurrency": len(PROMPTS)}
                                                                          if protocol == "http" else {}))
    outputs = [module.InferRequestedOutput("text_output")]
    try:
        if protocol == "http":
            pending = [client.async_infer("ensemble", _text_request(module, p, MAX_TOKENS), outputs=outputs,
                                          request_id=str(i)) for i, p in enumerate(PROMPTS)]
            results = {str(i): r.get_result() for i, r in enumerate(pending)}
        else:
            done: queue.Queue = queue.Queue()
            for i, prompt in enumerate(PROMPTS):
                client.async_infer("ensemble", _text_request(module, prompt, MAX_TOKENS), outputs=outputs,
                                   callback=lambda result, error: done.put((result, error)), request_id=str(i))
            results = {}
            for _ in PROMPTS:
                result, error = done.get(timeout=600)
                assert error is None, error
                results[result.get_response().id] = result
    finally:
        client.close()
    for i, prompt in enumerate(PROMPTS):
        assert results[str(i)].as_numpy("text_output")[0].decode("utf-8") == reference_outputs[prompt]["text"]


def _core_model_inputs(module, ids: list[int], output_len: int, pad_id: int, end_id: int) -> list:
    """benchmark_core_model.py ``test_performance``'s tensors for one request (dataset workload)."""
    return [upstream.tensor(module, "input_ids", np.array([ids], np.int32)),
            upstream.tensor(module, "input_lengths", np.array([[len(ids)]], np.int32)),
            upstream.tensor(module, "request_output_len", np.ones_like([[1]]).astype(np.int32) * output_len),
            upstream.tensor(module, "pad_id", np.array([[pad_id]], dtype=np.int32)),
            upstream.tensor(module, "end_id", np.array([[end_id]], dtype=np.int32))]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_benchmark_core_model_unary(unary_server, reference_outputs, tiny_models, protocol):
    """Not --decoupled: ``async_infer`` straight to ``tensorrt_llm`` with token ids; output_ids
    INT32 [1, 1, T] holding prompt + greedy completion, sequence_length [1, 1]."""
    from pipeline.triton_models.tokenizer import TextTokenizer

    tokenizer = TextTokenizer(tiny_models["target"])
    module = _module(protocol)
    client = module.InferenceServerClient(_url(unary_server, protocol), **({"concurrency": len(PROMPTS)}
                                                                          if protocol == "http" else {}))
    requests = [_core_model_inputs(module, tokenizer.encode(p), MAX_TOKENS, tokenizer.pad_id, tokenizer.end_id)
                for p in PROMPTS]
    try:
        client.infer("tensorrt_llm", requests[0], request_id="warmup")  # the script's warm-up call
        if protocol == "http":
            results = [r.get_result() for r in [client.async_infer("tensorrt_llm", inputs, request_id=str(i))
                                                for i, inputs in enumerate(requests)]]
        else:
            done: queue.Queue = queue.Queue()
            for i, inputs in enumerate(requests):
                client.async_infer("tensorrt_llm", inputs, callback=lambda result, error: done.put((result, error)),
                                   request_id=str(i))
            by_id = {}
            for _ in requests:
                result, error = done.get(timeout=600)
                assert error is None, error
                by_id[result.get_response().id] = result
            results = [by_id[str(i)] for i in range(len(requests))]
    finally:
        client.close()
    for prompt, result in zip(PROMPTS, results):
        output_ids, lengths = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
        assert output_ids.dtype == np.int32 and output_ids.ndim == 3 and output_ids.shape[:2] == (1, 1)
        assert lengths.shape == (1, 1)
        assert output_ids[0, 0, : int(lengths[0, 0])].tolist() == reference_outputs[prompt]["ids"]


def test_the_same_unary_call_is_refused_by_a_decoupled_deployment(medusa_server):
    """The default (decoupled) repository: Triton refuses a unary ModelInfer, so these tools need
    ``triton.decoupled: false`` (benchmark_core_model.py's ``--decoupled`` uses the stream instead)."""
    from tritonclient.utils import InferenceServerException

    module = _module("grpc")
    client = module.InferenceServerClient(medusa_server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="decoupled"):
            client.infer("tensorrt_llm", _core_model_inputs(module, [1, 5, 6], 4, 0, 2))
        for model in ("ensemble", "tensorrt_llm_bls"):
            with pytest.raises(InferenceServerException, match="decoupled"):
                client.infer(model, _text_request(module, PROMPTS[0], 4))
    finally:
        client.close()
