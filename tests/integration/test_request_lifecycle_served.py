"""Every request ends, on a real tritonserver (issue 44): a request whose engine stalls is failed
after its bound (floor + max_tokens x per-token) with an error naming it, the server says so in
its log and on /metrics and answers the next request; a client that goes away mid-stream over
HTTP — Triton's generate_stream on ``tensorrt_llm`` and on the BLS, and the OpenAI frontend in
front of the ensemble — has its request cancelled in the engine: the engine's cancelled counter
moves and the tokens generated for it stay far below max_tokens (before the fix the BLS and the
ensemble generated all of them for nobody).

A deployment of its own (the engine worker is stopped with SIGSTOP by the stall test), served
with a short stall bound from the environment."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import psutil
import pytest
from tritonclient.utils import InferenceServerException

import tiny_deploy
from tests.polling import wait_until
from triton_clients import grpc_stream, metric_values

pytestmark = [pytest.mark.triton, pytest.mark.slow]
NAME = "tiny-request-lifecycle"
FLOOR_S, PER_TOKEN_S = 3.0, 0.05
MAX_TOKENS = 200  # the tiny deployment's max_seq_len is 256
WAIT_S = 60.0  # a bound on waiting for a counter to move, not a measurement


@pytest.fixture(scope="module")
def lifecycle(serving_workdir, tiny_models):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment
    from pipeline.triton_models.stall import FLOOR_ENV, PER_TOKEN_ENV

    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name=NAME,
                                           orchestration="engine", triton={"bls_instance_count": 1})
    saved = {k: os.environ.get(k) for k in (FLOOR_ENV, PER_TOKEN_ENV)}
    os.environ.update({FLOOR_ENV: str(FLOOR_S), PER_TOKEN_ENV: str(PER_TOKEN_S)})
    try:
        cfg = load_config(cfg_path, serving_workdir)
        render(cfg)
        server = start_deployment(cfg, "baseline")
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    yield cfg, server
    server.stop()


def _worker(server) -> psutil.Process:
    workers = [p for p in psutil.Process(server.pid).children(recursive=True)
               if "pipeline.reference.worker" in p.cmdline()]
    assert len(workers) == 1, workers  # the baseline arm: one engine model
    return workers[0]


def _llm_inputs(max_tokens: int, streaming: bool) -> dict:
    return {"input_ids": np.array([[1, 40, 41, 42]], dtype=np.int32), "input_lengths": np.array([[4]], dtype=np.int32),
            "request_output_len": np.array([[max_tokens]], dtype=np.int32), "streaming": np.array([[streaming]])}


def _counter(server, family: str, model: str = "tensorrt_llm") -> float:
    return metric_values(server.metrics_url, family).get(model, 0.0)


def _wait_for(predicate, what: str):
    return wait_until(predicate, what, WAIT_S, interval=0.2)


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "whole"])
def test_a_stalled_engine_request_fails_after_its_bound(lifecycle, streaming):
    _cfg, server = lifecycle
    url = server.grpc_url
    stalled_before = _counter(server, "specdeploy_requests_stalled_total")
    worker = _worker(server)
    worker.suspend()  # the engine takes nothing and answers nothing: a lost request, as far as the stub knows
    try:
        with pytest.raises(InferenceServerException) as info:
            grpc_stream(url, "tensorrt_llm", _llm_inputs(20, streaming), timeout=120)
    finally:
        worker.resume()
    message = str(info.value)
    assert "stalled: the engine sent no final response within 4 s (3 s + 20 tokens x 0.05 s)" in message, message
    assert "the server keeps serving" in message
    assert server.alive()
    responses = grpc_stream(url, "tensorrt_llm", _llm_inputs(3, streaming))  # the next request is answered
    assert sum(int(r["sequence_length"].reshape(-1)[0]) for r in responses) == (3 if streaming else 7)
    assert _counter(server, "specdeploy_requests_stalled_total") == stalled_before + 1
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    assert "specdeploy: tensorrt_llm: request" in log and "stalled" in log


def _read_events_then_close(host: str, port: int, path: str, body: dict, events: int = 2, before_close=None) -> int:
    """POST an SSE request, read ``events`` events, close the connection (a client that leaves);
    ``before_close`` runs just before the close."""
    data = json.dumps(body).encode()
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        received = b""
        while received.count(b"data:") < events:
            chunk = sock.recv(4096)
            assert chunk, received.decode(errors="replace")
            received += chunk
        if before_close is not None:
            before_close()
    return received.count(b"data:")


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def _assert_cancelled_in_engine(server, cancelled_before: float, tokens_before: float, output_before: float,
                                limit: float = MAX_TOKENS / 2) -> None:
    _wait_for(lambda: _counter(server, "specdeploy_requests_cancelled_total") > cancelled_before,
              "the engine's request was not cancelled")
    wasted = _counter(server, "specdeploy_cancelled_output_tokens_total") - tokens_before
    assert wasted < limit, wasted  # it stopped well before max_tokens
    assert _counter(server, "specdeploy_output_tokens_total") == output_before  # no request ran to its end


@pytest.mark.parametrize("model,body", [
    ("tensorrt_llm", {"input_ids": [1, 40, 41, 42], "input_lengths": 4, "request_output_len": MAX_TOKENS, "streaming": True}),
    ("tensorrt_llm_bls", {"text_input": "def add(a, b):", "max_tokens": MAX_TOKENS, "stream": True}),
], ids=["tensorrt_llm", "bls"])
def test_http_disconnect_mid_stream_cancels_in_the_engine(lifecycle, model, body):
    _cfg, server = lifecycle
    before = [_counter(server, f) for f in ("specdeploy_requests_cancelled_total",
                                            "specdeploy_cancelled_output_tokens_total", "specdeploy_output_tokens_total")]
    host, port = _host_port(server.http_url)
    assert _read_events_then_close(host, port, f"/v2/models/{model}/generate_stream", body) >= 2
    _assert_cancelled_in_engine(server, *before)
    assert server.alive()


def test_openai_frontend_disconnect_stops_the_ensemble_request(lifecycle):
    """Triton cancels the ensemble but not its running tensorrt_llm step: the frontend stops it."""
    from pipeline.artefacts.deployment import load_arm
    from pipeline.serve.openai_serve import start_frontend

    cfg, server = lifecycle
    assert load_arm(cfg, "baseline")[1].model_name == "ensemble"
    frontend = start_frontend(cfg, "baseline", server.grpc_url)
    worker = _worker(server)
    try:
        before = [_counter(server, f) for f in ("specdeploy_requests_cancelled_total",
                                                "specdeploy_cancelled_output_tokens_total", "specdeploy_output_tokens_total")]
        answered = _counter(server, "nv_inference_request_success")
        body = {"model": cfg.name, "prompt": "def add(a, b):", "max_tokens": MAX_TOKENS, "stream": True}
        # the tiny engine could finish all its tokens before the frontend notices the client left:
        # it is held while the frontend's stop reaches tensorrt_llm (the stub answers a stop itself)
        try:
            assert _read_events_then_close(*_host_port(frontend.url), "/v1/completions", body,
                                           before_close=worker.suspend) >= 2
            _wait_for(lambda: _counter(server, "nv_inference_request_success") > answered,
                      "the frontend's stop did not reach tensorrt_llm")
        finally:
            worker.resume()
        # the tokens made while the client read its first events (a long pipe: engine, stub,
        # ensemble, postprocessing, frontend) count too; after the close the engine was held
        _assert_cancelled_in_engine(server, *before, limit=MAX_TOKENS)
        assert frontend.alive() and server.alive()
    finally:
        frontend.stop()
