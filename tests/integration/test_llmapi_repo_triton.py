"""The rendered LLM-API repository loads in a real tritonserver: its config.pbtxt (upstream's
llmapi tensors, max_batch_size 0, decoupled) is accepted, and requests in the llmapi contract
(`text_input`, `sampling_param_max_tokens`, `streaming`) reach the model over HTTP
generate_stream and gRPC streaming. TensorRT-LLM's own model.py needs a GPU, so a stand-in with
the same tensors (tests/fixtures/llmapi_standin/model.py) takes its place at that boundary; it
reads the rendered model.yaml."""

from __future__ import annotations

import json
import queue
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]
STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "llmapi_standin" / "model.py"


def _grpc_stream(url: str, prompt: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    max_tokens = grpcclient.InferInput("sampling_param_max_tokens", [1], "INT32")
    max_tokens.set_data_from_numpy(np.array([8], dtype=np.int32))
    streaming = grpcclient.InferInput("streaming", [1], "BOOL")
    streaming.set_data_from_numpy(np.array([True]))
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", [text, max_tokens, streaming], request_id="1",
                                  enable_empty_final_response=True)
        outputs = []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            if result.get_response().outputs:
                outputs.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        return outputs
    finally:
        client.stop_stream()
        client.close()


def test_rendered_llmapi_repository_is_served_by_real_triton(llmapi_standin_server):
    server = llmapi_standin_server  # tiny_deploy.render_llmapi_standin: this layout, shared with test_llmapi_loadtest
    with urllib.request.urlopen(f"{server.http_url}/v2/models/tensorrt_llm/config", timeout=30) as response:  # noqa: S310 - loopback http URL of the server under test
        config = json.load(response)
    assert config["model_transaction_policy"]["decoupled"] is True and config["max_batch_size"] == 0
    assert [t["name"] for t in config["input"]][:2] == ["text_input", "streaming"]
    body = json.dumps({"text_input": "Hello", "sampling_param_max_tokens": 5, "streaming": True}).encode()
    request = urllib.request.Request(f"{server.http_url}/v2/models/tensorrt_llm/generate_stream", data=body)  # noqa: S310 - loopback http URL of the server under test
    with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - loopback http URL of the server under test
        events = [json.loads(line[len(b"data: "):]) for line in response.read().splitlines() if line.startswith(b"data: ")]
    texts = [e["text_output"] for e in events]  # cumulative, as upstream's CompletionOutput.text
    assert len(texts) == 2 and len(texts[-1].split()) == 5 and texts[-1].startswith(texts[0])
    grpc = _grpc_stream(f"{server.host}:{server.ports.grpc}", "Hi")
    assert len(grpc) == 3 and len(grpc[-1].split()) == 8 and grpc[-1].startswith(grpc[1])
