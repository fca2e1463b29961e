"""Draft-target with ``speculation.orchestration: engine`` on a real tritonserver: the
speculative ``tensorrt_llm`` model drafts with the draft model inside its own engine, so the
ensemble streams speculative output (several tokens per chunk) with no BLS round trips; the same
repository still serves the BLS orchestrating ``tensorrt_llm_draft`` + ``tensorrt_llm`` (now
decoupled, like a Medusa/EAGLE target, so a unary client-side loop needs ``triton.decoupled:
false``) and external ``draft_input_ids``. Greedy outputs equal the in-process reference engine's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import MAX_TOKENS, PROMPTS
from triton_clients import grpc_stream, http_generate, metric_values, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def _text(array) -> str:
    return array.reshape(-1)[0].decode()


def test_rendered_target_drafts_itself_and_is_decoupled(dt_engine_cfg, serving_workdir):
    from pipeline.render.renderer import client_target
    from pipeline.render.triton_rules import parse_config_file

    repo = serving_workdir / "engines" / dt_engine_cfg.name / "model_repo" / "speculative"
    config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    assert config.model_transaction_policy.decoupled
    assert config.parameters["gpt_model_path"].string_value.endswith("/engine/speculative")
    assert (repo / "tensorrt_llm_draft").is_dir()  # upstream's BLS flow stays available
    target = client_target(dt_engine_cfg, "speculative")
    assert (target.model_name, target.extra_inputs) == ("ensemble", {})


def test_ensemble_streams_speculative_chunks(dt_engine_server, reference_outputs):
    before = metric_values(dt_engine_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    for prompt in PROMPTS:
        responses = grpc_stream(dt_engine_server.grpc_url, "ensemble", text_inputs(
            prompt, MAX_TOKENS, stream=True, top_k=1, return_num_output_tokens=True))
        counts = [int(r["num_output_tokens"].reshape(-1)[0]) for r in responses]
        assert "".join(_text(r["text_output"]) for r in responses) == reference_outputs[prompt]["completion"]
        assert sum(counts) == len(reference_outputs[prompt]["generated"])
    assert max(counts) > 1  # accepted drafts arrive together
    after = metric_values(dt_engine_server.metrics_url, "specdeploy_spec_decode_accepted_tokens_total")
    assert after["tensorrt_llm"] > before.get("tensorrt_llm", 0)


def test_bls_orchestration_over_decoupled_target(dt_engine_server, reference_outputs):
    prompt = PROMPTS[1]
    status, body = http_generate(dt_engine_server.http_url, "tensorrt_llm_bls", {
        "text_input": prompt, "max_tokens": MAX_TOKENS, "num_draft_tokens": 3, "stream": False,
        "return_perf_metrics": True, "top_k": 1})
    assert status == 200, body
    assert body["text_output"] == reference_outputs[prompt]["text"]
    assert body["total_draft_tokens"] > 3 and body["total_accepted_draft_tokens"] > 0


def test_external_drafts_on_an_engine_that_drafts(dt_engine_server, reference_outputs):
    ids = reference_outputs[PROMPTS[0]]["ids"]
    prompt_len = len(ids) - len(reference_outputs[PROMPTS[0]]["generated"])
    context, truth = ids[:prompt_len], ids[prompt_len: prompt_len + 3]
    drafts = [truth[0], truth[1], (truth[2] + 1) % 300 or 5]  # two right, one wrong
    responses = grpc_stream(dt_engine_server.grpc_url, "tensorrt_llm", {
        "input_ids": np.array([context], dtype=np.int32), "input_lengths": np.array([[len(context)]], dtype=np.int32),
        "request_output_len": np.array([[4]], dtype=np.int32), "draft_input_ids": np.array([drafts], dtype=np.int32),
        "end_id": np.array([[2]], dtype=np.int32), "return_perf_metrics": np.array([[True]])})
    (out,) = responses
    assert out["output_ids"].reshape(-1).tolist() == context + truth  # accepted 2 + correction, one step
    assert int(out["total_accepted_draft_tokens"][0][0]) == 2 and int(out["total_draft_tokens"][0][0]) == 3
