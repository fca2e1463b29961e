"""N-gram through the BLS served by a real tritonserver: a tiny deployment with
``speculation.orchestration: bls`` built by ``build`` (a target engine that verifies external
drafts, no proposer, no draft model) and rendered by ``render`` (the BLS carries the ``ngram_*``
parameters). ``tensorrt_llm_bls`` looks the n-grams up in the request's own prompt and output and
sends them as ``draft_input_ids``, the path the engine runtime takes on GPUs. Greedy output equals
the in-process baseline engine's, streamed and not; acceptance reaches the perf outputs and the
Prometheus counters; a draft length above the target's limit is refused with upstream's text."""

from __future__ import annotations

import pytest
import yaml
from server_stops import stop_later

from triton_clients import grpc_stream, http_generate, metric_values, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MAX_TOKENS = 32
K = 3
# the second repeats its own opening, so the lookup has something to copy from the start
PROMPTS = ["def add(a, b):", "name: tiny\nvalue: 42\nname: tiny\nvalue:", "The quick brown"]


@pytest.fixture(scope="module")
def ngram_bls_cfg(serving_workdir, tiny_models):
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    data = {
        "name": "tiny-ngram-bls", "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(tiny_models["target"]), "dtype": "float32"},
        "speculation": {"method": "ngram", "orchestration": "bls", "max_draft_len": K,
                        "max_matching_ngram_size": 3, "is_public_pool": False},
        "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
        "triton": {"startup_timeout_s": 240, "bls_instance_count": 2},
    }
    path = serving_workdir / "tiny-ngram-bls.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cfg = load_config(path, serving_workdir)
    build(cfg, progress=False)
    render(cfg)
    return cfg


@pytest.fixture(scope="module")
def ngram_bls_server(serving_workdir, ngram_bls_cfg):
    from pipeline.serve.server import start_deployment

    server = start_deployment(ngram_bls_cfg, "speculative")
    yield server
    stop_later(server)


@pytest.fixture(scope="module")
def baseline_completions(serving_workdir, ngram_bls_cfg, tiny_models) -> dict[str, dict[str, str]]:
    """Greedy output of the built baseline engine, in process (completion, and prompt + completion)."""
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine
    from pipeline.triton_models.tokenizer import TextTokenizer

    torch.set_num_threads(1)
    tokenizer = TextTokenizer(tiny_models["target"])
    engine = load_engine(serving_workdir / "engines" / ngram_bls_cfg.name / "baseline")
    try:
        out = {}
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            result = engine.generate(GenerationRequest(ids, MAX_TOKENS, end_id=tokenizer.end_id,
                                                       pad_id=tokenizer.pad_id, sampling=SamplingParams(top_k=1)))
            out[prompt] = {"completion": tokenizer.decode(result.output_ids),
                           "text": tokenizer.decode(ids + result.output_ids), "generated": result.output_ids}
        return out
    finally:
        engine.shutdown()


def test_repository_is_the_external_draft_flow(serving_workdir, ngram_bls_cfg):
    import json

    from pipeline.render.renderer import client_target
    from pipeline.render.triton_rules import parse_config_file

    root = serving_workdir / "engines" / ngram_bls_cfg.name
    descriptor = json.loads((root / "target" / "engine.json").read_text())
    assert descriptor["role"] == "target" and descriptor["proposer"]["method"] == "none"
    assert descriptor["max_draft_len"] == K
    repo = root / "model_repo" / "speculative"
    assert not (repo / "tensorrt_llm_draft").exists()
    bls = parse_config_file(repo / "tensorrt_llm_bls" / "config.pbtxt").parameters
    assert bls["speculative_method"].string_value == "ngram"
    assert bls["ngram_max_draft_len"].string_value == str(K)
    assert bls["ngram_max_matching_ngram_size"].string_value == "3"
    target = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    assert target.parameters["gpt_model_path"].string_value.endswith(f"/{ngram_bls_cfg.name}/target")
    assert target.parameters["enable_kv_cache_reuse"].string_value == "True"
    assert (client_target(ngram_bls_cfg, "speculative").model_name,
            client_target(ngram_bls_cfg, "speculative").extra_inputs) == ("tensorrt_llm_bls", {"num_draft_tokens": K})
    assert client_target(ngram_bls_cfg, "baseline").model_name == "tensorrt_llm_bls"


def test_bls_non_streaming_equals_the_baseline(ngram_bls_server, baseline_completions):
    url = ngram_bls_server.metrics_url
    before = metric_values(url, "specdeploy_spec_decode_accepted_tokens_total")
    drafted = accepted = 0
    for prompt in PROMPTS:
        status, body = http_generate(ngram_bls_server.http_url, "tensorrt_llm_bls", {
            "text_input": prompt, "max_tokens": MAX_TOKENS, "num_draft_tokens": K, "stream": False,
            "return_perf_metrics": True, "top_k": 1})
        assert status == 200, body
        assert body["text_output"] == baseline_completions[prompt]["text"]  # prompt included, as upstream
        assert body["total_accepted_draft_tokens"] <= body["total_draft_tokens"]
        drafted += body["total_draft_tokens"]
        accepted += body["total_accepted_draft_tokens"]
    assert drafted > 0 and accepted > 0
    after = metric_values(url, "specdeploy_spec_decode_accepted_tokens_total")
    assert after["tensorrt_llm_bls"] - before.get("tensorrt_llm_bls", 0) == accepted


def test_bls_streams_rounds_equal_to_the_baseline(ngram_bls_server, baseline_completions):
    prompt = PROMPTS[1]
    responses = grpc_stream(ngram_bls_server.grpc_url, "tensorrt_llm_bls", text_inputs(
        prompt, MAX_TOKENS, stream=True, num_draft_tokens=K, top_k=1, return_num_output_tokens=True,
        return_perf_metrics=True))
    counts = [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses]
    assert "".join(r["text_output"].reshape(-1)[0].decode() for r in responses) == baseline_completions[prompt]["completion"]
    assert sum(counts) == len(baseline_completions[prompt]["generated"])
    assert max(counts) > 1  # accepted drafts arrive together with the round's own token
    assert responses[-1]["total_accepted_draft_tokens"].reshape(-1)[0] > 0


def test_draft_len_above_the_target_limit_is_refused(ngram_bls_server):
    status, body = http_generate(ngram_bls_server.http_url, "tensorrt_llm_bls", {
        "text_input": "hi", "max_tokens": 8, "num_draft_tokens": K + 2, "stream": False})
    assert status >= 400
    assert f"Number of draft tokens ({K + 2}) is larger than maximum number of draft tokens ({K})" in str(body)
