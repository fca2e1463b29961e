"""The CPU engine reports its KV capacity under TensorRT-LLM's metric names on a real tritonserver
(``nv_trt_llm_kv_cache_block_metrics``, pipeline/triton_models/engine_gauges.py), read the way the
load test reads both backends (pipeline/serve/kv_capacity.py), and it equals the planned capacity
of every KV-holding model of both arms — the figures the report's kv_capacity check compares."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def _figures(server, cfg, arm: str):
    from pipeline.artefacts.deployment import load_arm
    from pipeline.loadtest.endpoints import kv_capacity_reported
    from pipeline.serve.kv_capacity import arm_engine_models, await_reported, planned_kv_tokens

    deployment = load_arm(cfg, arm)[1]
    planned = planned_kv_tokens(cfg, deployment.placement, arm_engine_models(deployment.method, deployment.drafts))
    return planned, await_reported(lambda: kv_capacity_reported(server.metrics_url))


def test_baseline_arm_reports_the_planned_capacity(baseline_server, dt_cfg):
    planned, reported = _figures(baseline_server, dt_cfg, "baseline")
    assert planned == {"tensorrt_llm": dt_cfg.build.max_batch_size * dt_cfg.build.max_seq_len}
    assert reported == planned


def test_bls_draft_target_arm_reports_target_and_draft(dt_server, dt_cfg):
    planned, reported = _figures(dt_server, dt_cfg, "speculative")
    assert set(planned) == {"tensorrt_llm", "tensorrt_llm_draft"}
    assert reported == planned
