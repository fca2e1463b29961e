"""``validate`` on n-gram through the BLS (``speculation.orchestration: bls``): a valid engine-
runtime deployment passes, and each rule fails its own case with the field path named
(pipeline/validate/method_rules.py ``_check_ngram_bls``; the runtime rule in
pipeline/trtllm/llmapi_checks.py)."""

from __future__ import annotations

import copy

import pytest

from pipeline.config import parse_config
from pipeline.validate.preflight import errors_of, run_preflight

VALID = {
    "name": "ngram-bls", "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": "1.2.1",
    "trtllm_runtime": "engine",
    "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct", "dtype": "bfloat16"},
    "speculation": {"method": "ngram", "orchestration": "bls", "max_draft_len": 4, "is_public_pool": False},
    "build": {"max_batch_size": 8, "max_input_len": 2048, "max_seq_len": 4096, "max_num_tokens": 8192},
    "triton": {"enable_kv_cache_reuse": True},
}


def _errors(changes: dict) -> list:
    data = copy.deepcopy(VALID)
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return errors_of(run_preflight(parse_config(data), offline=True))


def test_valid_engine_runtime_deployment_passes():
    assert _errors({}) == []


def test_cpu_reference_bls_flow_passes():
    data = {"name": "cpu", "backend": "reference", "hardware": "cpu",
            "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
            "speculation": {"method": "ngram", "orchestration": "bls", "max_draft_len": 3, "is_public_pool": False},
            "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256, "max_num_tokens": 512}}
    assert errors_of(run_preflight(parse_config(data), offline=True)) == []


CASES = [
    ({"trtllm_version": "1.4.0", "trtllm_runtime": "llm_api"}, "speculation.orchestration", "no tensorrt_llm_bls"),
    ({"speculation.is_public_pool": True}, "speculation.is_public_pool", "one n-gram pool per request"),
    ({"triton.enable_kv_cache_reuse": False}, "triton.enable_kv_cache_reuse", "KV-cache block reuse"),
    ({"build.max_num_tokens": 2048}, "build.max_num_tokens", "longest n-gram target context"),
    ({"speculation.orchestration": "engine"}, "speculation.orchestration", "no n-gram decoding mode"),
    ({"target.quantization": {"format": "none", "kv_cache_dtype": "fp8"}}, "target.quantization.kv_cache_dtype",
     "n-gram through the BLS needs it"),
]


@pytest.mark.parametrize("changes,field,words", CASES,
                         ids=["llm-api", "public-pool", "kv-reuse", "max-num-tokens", "in-engine", "fp8-kv"])
def test_each_rule_names_its_field(changes, field, words):
    found = [f for f in _errors(changes) if f.field == field]
    assert found, [f.line() for f in _errors(changes)]
    assert any(words in f.message for f in found), [f.message for f in found]
