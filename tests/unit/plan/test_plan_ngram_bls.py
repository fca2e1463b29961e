"""The build plan of n-gram through the BLS (``speculation.orchestration: bls``): the target alone,
built for external drafts (TensorRT-LLM's V1 n-gram workflow, NVIDIA/TensorRT-LLM
examples/ngram/README.md: ``--speculative_decoding_mode draft_tokens_external``, ``--max_draft_len``,
paged context FMHA), beside the usual separate baseline; and the CPU reference engine's target."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.config import parse_config
from pipeline.plan.planner import make_plan
from pipeline.trtllm.layout import ENV_VAR

NGRAM_BLS = {
    "name": "ngram-bls-h100", "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": "1.2.1",
    "trtllm_runtime": "engine",
    "target": {"checkpoint": "/models/Llama-3.1-8B-Instruct", "dtype": "bfloat16"},
    "speculation": {"method": "ngram", "orchestration": "bls", "max_draft_len": 5, "max_matching_ngram_size": 3,
                    "is_public_pool": False},
    "build": {"max_batch_size": 8, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 8192},
    "triton": {"enable_kv_cache_reuse": True},
}


def _plan(data: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    return make_plan(parse_config(data, workdir=tmp_path), trtllm_root="/app")


def test_trtllm_target_is_built_for_external_drafts_exact_argv(tmp_path, monkeypatch):
    plan = _plan(NGRAM_BLS, tmp_path, monkeypatch)
    root = plan.root
    assert [s.name for s in plan.steps] == ["convert-target", "build-baseline", "build-target"]
    assert set(plan.engines) == {"baseline", "target"}
    common = ["--checkpoint_dir", f"{root}/checkpoints/target-trtllm"]
    limits = ["--gemm_plugin", "auto", "--max_batch_size", "8", "--max_input_len", "4095", "--max_seq_len", "4096",
              "--max_num_tokens", "8192", "--max_beam_width", "1", "--use_paged_context_fmha", "enable",
              "--multiple_profiles", "enable"]
    assert plan.step("build-target").argv == [
        "trtllm-build", *common, "--output_dir", f"{root}/target", *limits,
        "--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "5",
        "--workers", "1", "--output_timing_cache", f"{root}/timing_cache/target.cache"]
    assert plan.step("build-baseline").argv == [
        "trtllm-build", *common, "--output_dir", f"{root}/baseline", *limits,
        "--workers", "1", "--output_timing_cache", f"{root}/timing_cache/baseline.cache"]
    expect = plan.step("build-target").expect
    assert expect.speculative_decoding_mode == "draft_tokens_external" and expect.max_draft_len == 5
    assert expect.paged_context_fmha and expect.max_input_len == 4095
    assert plan.max_draft_len == 5 and plan.num_draft_tokens is None


def test_in_engine_ngram_on_the_reference_backend_is_unchanged(tmp_path, monkeypatch):
    data = {"name": "cpu-ngram", "backend": "reference", "hardware": "cpu",
            "target": {"checkpoint": "/models/tiny", "dtype": "float32"},
            "speculation": {"method": "ngram", "max_draft_len": 3, "is_public_pool": False},
            "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256, "max_num_tokens": 512}}
    plan = _plan(data, tmp_path, monkeypatch)
    assert set(plan.engines) == {"baseline", "speculative"}
    argv = plan.step("engine-speculative").argv
    assert argv[argv.index("--method") + 1] == "ngram"


def test_reference_bls_target_verifies_external_drafts_exact_argv(tmp_path, monkeypatch):
    data = {"name": "cpu-ngram-bls", "backend": "reference", "hardware": "cpu",
            "target": {"checkpoint": "/models/tiny", "dtype": "float32"},
            "speculation": {"method": "ngram", "orchestration": "bls", "max_draft_len": 3, "is_public_pool": False},
            "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256, "max_num_tokens": 512}}
    plan = _plan(data, tmp_path, monkeypatch)
    root = plan.root
    assert [s.name for s in plan.steps] == ["resolve-target", "engine-baseline", "engine-target"]
    assert plan.step("engine-target").argv == [
        sys.executable, "-m", "pipeline.build.reference_step", "engine", "--out", f"{root}/target", "--role", "target",
        "--model-dir", f"{root}/checkpoints/target-hf", "--quantization", "none", "--method", "none",
        # the BLS re-sends the whole context each round: max_seq_len - 1, as the GPU engines
        "--max-draft-len", "3", "--max-batch-size", "4", "--max-seq-len", "256", "--max-input-len", "255",
        "--compute-dtype", "float32", "--threads", "1", "--prefix-cache-entries", "64", "--name", "cpu-ngram-bls"]
