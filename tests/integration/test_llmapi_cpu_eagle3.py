"""EAGLE-3 on the CPU llmapi layout (``backend: reference`` + ``trtllm_runtime: llm_api``): the
demo target and EAGLE-3 head of ``configs/tiny-cpu-eagle3.yaml`` built, rendered (``model.yaml``
carries ``speculative_config`` with ``decoding_type: Eagle3``, ``max_draft_len`` and
``speculative_model`` the head) and served by a real tritonserver; greedy streamed text equals
target-only generation (the built baseline engine, in process) and the head's drafts are accepted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from server_stops import stop_later

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu-eagle3.yaml"
MAX_TOKENS = 24
PROMPTS = ["def add(a, b):", "The quick brown"]


@pytest.fixture(scope="module")
def cfg(serving_workdir):
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    data = yaml.safe_load(CONFIG.read_text())
    data.update(name="tiny-llmapi-eagle3", trtllm_version="1.2.1", trtllm_runtime="llm_api")
    path = serving_workdir / "tiny-llmapi-eagle3.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path, serving_workdir)
    build(cfg, progress=False)
    render(cfg)
    return cfg


def _manifest(workdir: Path, cfg) -> dict:
    return json.loads((workdir / "engines" / cfg.name / "manifest.json").read_text())


@pytest.fixture(scope="module")
def target_only(serving_workdir, cfg) -> dict[str, str]:
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine
    from pipeline.triton_models.tokenizer import TextTokenizer

    torch.set_num_threads(1)
    manifest = _manifest(serving_workdir, cfg)
    tokenizer = TextTokenizer(Path(manifest["tokenizer_dir"]))
    engine = load_engine(Path(manifest["engines"]["baseline"]))
    try:
        return {p: tokenizer.decode(engine.generate(GenerationRequest(
            tokenizer.encode(p), MAX_TOKENS, end_id=tokenizer.end_id, pad_id=tokenizer.pad_id,
            sampling=SamplingParams(top_k=1))).output_ids) for p in PROMPTS}
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def server(cfg):
    from pipeline.serve.server import start_deployment

    running = start_deployment(cfg, "speculative")
    yield running
    stop_later(running)


def _stream(url: str, inputs: dict) -> list[dict]:
    """gRPC streaming responses of one request, {output: numpy} each (an error raises)."""
    import queue

    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("tensorrt_llm", tensors, enable_empty_final_response=True)
        responses = []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                raise error
            response = result.get_response()
            if response.outputs:
                responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def test_model_yaml_names_the_eagle3_head(serving_workdir, cfg):
    manifest = _manifest(serving_workdir, cfg)
    head = json.loads((Path(manifest["engines"]["speculative"]) / "engine.json").read_text())["proposer"]["head_dir"]
    model_yaml = serving_workdir / "engines" / cfg.name / "model_repo" / "speculative" / "tensorrt_llm" / "1" / "model.yaml"
    spec = yaml.safe_load(model_yaml.read_text())["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["max_draft_len"] == 5
    assert Path(spec["speculative_model"]).resolve() == Path(head).resolve()


def test_greedy_stream_equals_target_only_and_drafts_are_accepted(server, target_only):
    for prompt in PROMPTS:
        inputs = {"text_input": np.array([prompt.encode()], dtype=np.object_),
                  "sampling_param_max_tokens": np.array([MAX_TOKENS], dtype=np.int32),
                  "sampling_param_top_k": np.array([1], dtype=np.int32),
                  "streaming": np.array([True], dtype=bool)}
        responses = _stream(server.grpc_url, inputs)
        # each streamed response carries the text so far, as upstream's llmapi model sends it
        assert responses[-1]["text_output"].reshape(-1)[0].decode() == target_only[prompt], prompt
        assert 1 < len(responses) < MAX_TOKENS  # streamed; accepted drafts arrive with the step's own token
