"""EAGLE-3 served by a real tritonserver: ``configs/tiny-cpu-eagle3.yaml`` (the demo target and
its demo EAGLE-3 head) built by ``build`` and rendered by ``render`` into the engine/ensemble
layout; the speculative ``tensorrt_llm`` model drafts with the head on the target's captured
hidden states, so the ensemble streams several tokens per chunk, and greedy output over HTTP
``generate_stream`` and gRPC streaming equals the built baseline engine's (the baseline arm).
Acceptance reaches the perf outputs and our Prometheus counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_stops import stop_later

from triton_clients import grpc_stream, http_generate, metric_values, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu-eagle3.yaml"
MAX_TOKENS = 32
PROMPTS = ["def add(a, b):", "The quick brown", "name: tiny\nvalue: 42\nname: tiny\nvalue:"]


@pytest.fixture(scope="module")
def eagle3_cfg(serving_workdir):
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    cfg = load_config(CONFIG, serving_workdir)
    build(cfg, progress=False)
    render(cfg)
    return cfg


@pytest.fixture(scope="module")
def eagle3_server(eagle3_cfg):
    from pipeline.serve.server import start_deployment

    server = start_deployment(eagle3_cfg, "speculative")
    yield server
    stop_later(server)


def _manifest(workdir: Path, cfg) -> dict:
    return json.loads((workdir / "engines" / cfg.name / "manifest.json").read_text())


@pytest.fixture(scope="module")
def tokenizer(serving_workdir, eagle3_cfg):
    from pipeline.triton_models.tokenizer import TextTokenizer

    return TextTokenizer(Path(_manifest(serving_workdir, eagle3_cfg)["tokenizer_dir"]))


@pytest.fixture(scope="module")
def baseline_completions(serving_workdir, eagle3_cfg, tokenizer) -> dict[str, str]:
    """Greedy completions of the built baseline engine (the baseline arm's), in process."""
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine

    torch.set_num_threads(1)
    engine = load_engine(Path(_manifest(serving_workdir, eagle3_cfg)["engines"]["baseline"]))
    try:
        out = {}
        for prompt in PROMPTS:
            result = engine.generate(GenerationRequest(tokenizer.encode(prompt), MAX_TOKENS, end_id=tokenizer.end_id,
                                                       pad_id=tokenizer.pad_id, sampling=SamplingParams(top_k=1)))
            out[prompt] = tokenizer.decode(result.output_ids)
        return out
    finally:
        engine.shutdown()


def test_built_engine_carries_the_eagle3_head(serving_workdir, eagle3_cfg):
    from pipeline.render.triton_rules import parse_config_file

    manifest = _manifest(serving_workdir, eagle3_cfg)
    speculative = Path(manifest["engines"]["speculative"])
    descriptor = json.loads((speculative / "engine.json").read_text())
    assert descriptor["proposer"]["method"] == "eagle3" and descriptor["max_draft_len"] == 5
    assert (Path(descriptor["proposer"]["head_dir"]) / "config.json").is_file()
    repo = serving_workdir / "engines" / eagle3_cfg.name / "model_repo" / "speculative"
    config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    assert Path(config.parameters["gpt_model_path"].string_value).resolve() == speculative.resolve()
    assert not (repo / "tensorrt_llm_draft").exists()


def test_grpc_stream_equals_the_baseline_and_counts_acceptance(eagle3_server, baseline_completions):
    before = metric_values(eagle3_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    drafted = accepted = 0
    longest_chunk = 0
    for prompt in PROMPTS:
        responses = grpc_stream(eagle3_server.grpc_url, "ensemble", text_inputs(
            prompt, MAX_TOKENS, stream=True, top_k=1, return_num_output_tokens=True, return_perf_metrics=True))
        text = "".join(r["text_output"].reshape(-1)[0].decode() for r in responses)
        assert text == baseline_completions[prompt], prompt
        longest_chunk = max([longest_chunk] + [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses])
        last = responses[-1]
        drafted += int(last["total_draft_tokens"].reshape(-1)[0])
        accepted += int(last["total_accepted_draft_tokens"].reshape(-1)[0])
        rate = float(last["acceptance_rate"].reshape(-1)[0])
        assert 0.0 <= rate <= 1.0
    assert drafted > 0 and accepted > 0
    assert longest_chunk > 1  # accepted drafts arrive together with the step's own token
    after = metric_values(eagle3_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    assert after["tensorrt_llm"] - before.get("tensorrt_llm", 0) == accepted


def test_http_generate_stream_equals_the_baseline(eagle3_server, baseline_completions):
    for prompt in PROMPTS[:2]:
        status, events = http_generate(eagle3_server.http_url, "ensemble",
                                       {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": True, "top_k": 1},
                                       stream=True)
        assert status == 200, events
        assert len(events) > 1
        assert "".join(e["text_output"] for e in events) == baseline_completions[prompt]
