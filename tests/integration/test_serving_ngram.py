"""N-gram speculation served by a real tritonserver: a tiny deployment built by ``build`` (the
plan's engine step writes the n-gram proposer; no draft checkpoint) and rendered by ``render``;
the speculative ``tensorrt_llm`` model drafts from the request's own tokens, so the ensemble
streams several tokens per chunk, and greedy output equals the in-process baseline engine's.
Acceptance reaches the perf outputs and our Prometheus counters."""

from __future__ import annotations

import pytest

from triton_clients import grpc_stream, http_generate, metric_values, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

MAX_TOKENS = 32
# the second repeats its own opening, so the proposer has something to copy from the start
PROMPTS = ["def add(a, b):", "name: tiny\nvalue: 42\nname: tiny\nvalue:", "The quick brown"]


@pytest.fixture(scope="module")
def baseline_completions(serving_workdir, ngram_cfg, tiny_models) -> dict[str, dict[str, str]]:
    """Greedy output of the built baseline engine, in process: the completion, and the whole
    text (prompt + completion decoded together, what a non-streaming request returns)."""
    import torch

    from pipeline.reference.api import GenerationRequest, SamplingParams
    from pipeline.reference.engine import load_engine
    from pipeline.triton_models.tokenizer import TextTokenizer

    torch.set_num_threads(1)
    tokenizer = TextTokenizer(tiny_models["target"])
    engine = load_engine(serving_workdir / "engines" / ngram_cfg.name / "baseline")
    try:
        out = {}
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            result = engine.generate(GenerationRequest(ids, MAX_TOKENS, end_id=tokenizer.end_id,
                                                       pad_id=tokenizer.pad_id, sampling=SamplingParams(top_k=1)))
            out[prompt] = {"completion": tokenizer.decode(result.output_ids),
                           "text": tokenizer.decode(ids + result.output_ids)}
        return out
    finally:
        engine.shutdown()


def test_built_engine_carries_the_ngram_proposer(serving_workdir, ngram_cfg):
    import json

    from pipeline.render.renderer import client_target
    from pipeline.render.triton_rules import parse_config_file

    root = serving_workdir / "engines" / ngram_cfg.name
    descriptor = json.loads((root / "speculative" / "engine.json").read_text())
    assert descriptor["proposer"]["method"] == "ngram" and descriptor["max_draft_len"] == 3
    config = parse_config_file(root / "model_repo" / "speculative" / "tensorrt_llm" / "config.pbtxt")
    assert config.parameters["gpt_model_path"].string_value.endswith(f"/{ngram_cfg.name}/speculative")
    assert not (root / "model_repo" / "speculative" / "tensorrt_llm_draft").exists()
    target = client_target(ngram_cfg, "speculative")
    assert (target.model_name, target.extra_inputs) == ("ensemble", {})


def test_ensemble_streams_ngram_drafts_and_equals_the_baseline(ngram_server, baseline_completions):
    before = metric_values(ngram_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    drafted = accepted = 0
    longest_chunk = 0
    for prompt in PROMPTS:
        responses = grpc_stream(ngram_server.grpc_url, "ensemble", text_inputs(
            prompt, MAX_TOKENS, stream=True, top_k=1, return_num_output_tokens=True, return_perf_metrics=True))
        assert "".join(r["text_output"].reshape(-1)[0].decode() for r in responses) == baseline_completions[prompt]["completion"]
        longest_chunk = max([longest_chunk] + [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses])
        drafted += int(responses[-1]["total_draft_tokens"][0][0])
        accepted += int(responses[-1]["total_accepted_draft_tokens"][0][0])
    assert drafted > 0 and accepted > 0
    assert longest_chunk > 1  # accepted drafts arrive together with the step's own token
    after = metric_values(ngram_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    assert after["tensorrt_llm"] - before.get("tensorrt_llm", 0) == accepted


def test_http_generate_equals_the_baseline(ngram_server, baseline_completions):
    prompt = PROMPTS[1]
    status, body = http_generate(ngram_server.http_url, "ensemble",
                                 {"text_input": prompt, "max_tokens": MAX_TOKENS, "stream": False, "top_k": 1})
    assert status == 200, body
    assert body["text_output"] == baseline_completions[prompt]["text"]
