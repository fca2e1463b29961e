"""Each arm's KV capacity, planned vs reported by the backend (pipeline/serve/kv_capacity.py) and the
report's check on it (pipeline/report/kv_capacity_check.py): within the tolerance the run stands;
beyond it the arms are not comparable, a GO becomes INCONCLUSIVE and the reason gives both figures."""

from __future__ import annotations

import types

from pipeline.loadtest.endpoints import kv_capacity_from_text
from pipeline.report.gate import GO, INCONCLUSIVE, NO_GO, NOT_CHECKED, PASS, UNSURE, Check, GateResult
from pipeline.report.kv_capacity_check import TOLERANCE_TOKENS, kv_capacity_check, with_kv_capacity_check
from pipeline.serve.kv_capacity import arm_engine_models, await_reported, planned_kv_tokens

# what the TensorRT-LLM backend exports (tensorrtllm_backend custom_metrics_reporter.cc: family
# nv_trt_llm_kv_cache_block_metrics, label kv_cache_block_type, model/version labels from Triton)
METRICS = """# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"}} 32
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} {blocks}
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} 0
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="free",model="tensorrt_llm",version="1"}} {blocks}
"""


def _meta(planned: dict, reported: dict | None) -> dict:
    return {"endpoints": {arm: {"kv_cache_tokens_planned": planned, "kv_cache_tokens_reported": reported}
                          for arm in ("baseline", "speculative")}}


def test_reported_capacity_is_max_blocks_times_tokens_per_block():
    assert kv_capacity_from_text(METRICS.format(blocks=512)) == {"tensorrt_llm": 512 * 32}


def test_within_tolerance_passes():
    check = kv_capacity_check(_meta({"tensorrt_llm": 16384}, {"tensorrt_llm": 16384 - 32}))
    assert check.status == PASS


def test_beyond_tolerance_makes_a_go_inconclusive_with_both_figures():
    planned, reported = 16384, kv_capacity_from_text(METRICS.format(blocks=300))["tensorrt_llm"]
    assert planned - reported > TOLERANCE_TOKENS
    meta = _meta({"tensorrt_llm": planned}, {"tensorrt_llm": reported})
    check = kv_capacity_check(meta)
    assert check.status == UNSURE
    assert f"planned {planned}, backend reported {reported} tokens" in check.detail
    assert "not comparable" in check.detail
    go = GateResult(GO, [Check("x", "run", PASS, "fine")])
    gated = with_kv_capacity_check(go, meta)
    assert gated.verdict == INCONCLUSIVE and gated.exit_code == 3
    assert any("kv_capacity" in reason and str(reported) in reason for reason in gated.reasons)
    assert with_kv_capacity_check(GateResult(NO_GO, []), meta).verdict == NO_GO


def test_nothing_to_compare_is_not_checked_and_leaves_the_verdict():
    meta = _meta({"tensorrt_llm": 16384}, None)
    assert kv_capacity_check(meta).status == NOT_CHECKED
    assert with_kv_capacity_check(GateResult(GO, []), meta).verdict == GO
    assert kv_capacity_check({}).status == NOT_CHECKED


def test_planned_capacity_comes_from_the_placement_or_the_cpu_build():
    placement = {"models": [{"model_name": "tensorrt_llm", "max_tokens_in_paged_kv_cache": 24576},
                            {"model_name": "tensorrt_llm_draft", "max_tokens_in_paged_kv_cache": 24576}]}
    gpu = types.SimpleNamespace(backend="trtllm", build=types.SimpleNamespace(max_batch_size=8, max_seq_len=4096))
    assert planned_kv_tokens(gpu, placement, ("tensorrt_llm",)) == {"tensorrt_llm": 24576, "tensorrt_llm_draft": 24576}
    assert planned_kv_tokens(gpu, None, ("tensorrt_llm",)) is None  # left to the KV fraction: nothing planned
    cpu = types.SimpleNamespace(backend="reference", build=types.SimpleNamespace(max_batch_size=4, max_seq_len=96))
    models = arm_engine_models("draft_target", "bls")
    assert planned_kv_tokens(cpu, None, models) == {"tensorrt_llm": 384, "tensorrt_llm_draft": 384}
    assert arm_engine_models("draft_target", "none") == ("tensorrt_llm",)


def test_start_up_read_waits_for_the_first_nonzero_reading():
    readings = iter([{"tensorrt_llm": 0}, {"tensorrt_llm": 0}, {"tensorrt_llm": 384}])
    assert await_reported(lambda: next(readings), wait_s=600) == {"tensorrt_llm": 384}
    assert await_reported(lambda: None, wait_s=600) is None  # no such metric: nothing to wait for
    assert await_reported(lambda: {"tensorrt_llm": 0}, wait_s=0) == {"tensorrt_llm": 0}
