"""Arm placement on the GPU host (``pipeline.plan.gpu_layout``): split / shared / sequential, the equal
KV capacity and the fractions that reach it, refusals naming the reason, the runtime-knob config
rules, and the memory table ``validate`` prints (co-resident arms, parameter counts)."""

from __future__ import annotations

import os

import pytest

from pipeline.config import parse_config
from pipeline.errors import ConfigError
from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import estimate_memory, params_text
from pipeline.facts.model_shapes import ModelShape, known_shape
from pipeline.plan.gpu_layout import GpuInfo, LayoutError, deployment_layout, plan_layout, validate_estimate
from pipeline.validate.preflight import run_preflight

TARGET, DRAFT = "/models/Meta-Llama-3.1-8B-Instruct", "/models/Llama-3.2-1B-Instruct"


def dt_config(hardware="h100-sxm-80gb", target_tp=1, **triton):
    return parse_config({
        "name": "layout", "hardware": hardware,
        "target": {"checkpoint": TARGET, "tp": target_tp},
        "speculation": {"method": "draft_target", "draft": {"checkpoint": DRAFT}, "num_draft_tokens": 4},
        "build": {"max_batch_size": 16, "max_input_len": 2048, "max_seq_len": 4096},
        "triton": triton,
    })


def gpus(count: int, mib: int = 81559) -> list[GpuInfo]:
    return [GpuInfo(i, mib) for i in range(count)]


def per_gpu_fraction(layout) -> dict[int, float]:
    total: dict[int, float] = {}
    arms = layout.arms.values() if layout.strategy == "shared" else [max(layout.arms.values(), key=lambda a: len(a.models))]
    for arm in arms:
        for model in arm.models:
            for gpu in model.gpus:
                total[gpu] = total.get(gpu, 0) + model.kv_cache_free_gpu_mem_fraction
    return total


def test_enough_gpus_split_the_arms():
    layout = deployment_layout(dt_config(), gpus(2))
    assert layout.strategy == "split"
    assert layout.arms["baseline"].gpus == (0,) and layout.arms["speculative"].gpus == (1,)
    assert layout.arms["baseline"].cuda_visible_devices == "0"
    assert layout.arms["speculative"].launch == "orchestrator"
    assert {m.max_tokens_in_paged_kv_cache for a in layout.arms.values() for m in a.models} == {layout.kv_tokens}


def test_one_gpu_shares_it_with_equal_capacity_and_fractions_adding_up():
    layout = deployment_layout(dt_config(), gpus(1))
    assert layout.strategy == "shared"
    tokens = {m.max_tokens_in_paged_kv_cache for a in layout.arms.values() for m in a.models}
    assert tokens == {layout.kv_tokens} and layout.kv_tokens >= 4096 + 8
    assert 0.85 < per_gpu_fraction(layout)[0] <= 0.9  # the configured total, split among the three
    assert "baseline tensorrt_llm + speculative tensorrt_llm + speculative tensorrt_llm_draft" in layout.estimate.device


def test_arms_that_do_not_fit_together_run_one_at_a_time():
    cfg = parse_config({**dt_config().model_dump(mode="json"), "hardware": "a100-40gb",
                        "target": {"checkpoint": TARGET, "dtype": "bfloat16"}})
    layout = deployment_layout(cfg, gpus(1, 40960))
    assert layout.strategy == "sequential" and layout.reason.startswith("split: needs 2 GPU(s)")
    assert "shared: the KV fraction 0.9 cannot give every model one full sequence" in layout.reason
    assert layout.arms["baseline"].models[0].max_tokens_in_paged_kv_cache == layout.kv_tokens


def test_forced_placement_is_refused_with_the_reason():
    with pytest.raises(LayoutError, match=r"split: needs 2 GPU\(s\), 1 available"):
        deployment_layout(dt_config(arm_placement="split"), gpus(1))
    with pytest.raises(LayoutError, match=r"needs 4 GPU\(s\), 2 available"):
        deployment_layout(dt_config(target_tp=4), gpus(2))


def test_unknown_shapes_need_an_explicit_capacity():
    cfg = parse_config({**dt_config().model_dump(mode="json"), "target": {"checkpoint": "/models/mystery"}})
    with pytest.raises(LayoutError, match="set triton.max_tokens_in_paged_kv_cache"):
        plan_layout(cfg, get_profile(cfg.hardware), (None, None), (0,))
    explicit = parse_config({**cfg.model_dump(mode="json"), "triton": {"max_tokens_in_paged_kv_cache": 8192}})
    layout = plan_layout(explicit, get_profile(cfg.hardware), (None, None), (0,))
    assert layout.kv_tokens == 8192
    assert [m.kv_cache_free_gpu_mem_fraction for a in layout.arms.values() for m in a.models] == [0.3, 0.3, 0.3]


def test_explicit_capacity_too_large_for_the_gpu_is_refused():
    with pytest.raises(LayoutError, match="max_tokens_in_paged_kv_cache 2000000 needs more than the KV fraction"):
        deployment_layout(dt_config(max_tokens_in_paged_kv_cache=2_000_000), gpus(1))


def test_tp4_target_and_tp1_draft_are_named_per_model():
    layout = deployment_layout(dt_config("a100-80gb", target_tp=4), gpus(8, 81920))
    spec = layout.arms["speculative"]
    assert spec.launch == "orchestrator" and spec.world_size == 1 and spec.cuda_visible_devices is None
    assert [(m.model_name, m.gpus) for m in spec.models] == [("tensorrt_llm", (4, 5, 6, 7)), ("tensorrt_llm_draft", (4,))]
    base = layout.arms["baseline"]
    assert (base.launch, base.world_size, base.cuda_visible_devices) == ("leader", 4, "0,1,2,3")


@pytest.mark.parametrize("triton,field,message", [
    ({"max_attention_window_size": 5000}, "triton.max_attention_window_size", "exceeds build.max_seq_len"),
    ({"max_tokens_in_paged_kv_cache": 100}, "triton.max_tokens_in_paged_kv_cache", "cannot hold one sequence"),
    ({"gpus": [0, 0]}, "triton.gpus", "distinct"),
    ({"arm_placement": "nowhere"}, "triton.arm_placement", "Input should be"),
])
def test_runtime_knob_config_errors_name_the_field(triton, field, message):
    with pytest.raises(ConfigError) as info:
        dt_config(**triton)
    assert any(line.strip().startswith(field) and message in line for line in info.value.lines()), info.value.lines()


def test_chunked_context_with_eagle_is_refused():
    with pytest.raises(ConfigError, match="EAGLE engines do not support chunked context"):
        parse_config({"name": "e", "target": {"checkpoint": TARGET}, "triton": {"enable_chunked_context": True},
                      "speculation": {"method": "eagle", "head_dir": "/models/eagle", "num_layers": 2}})


def test_validate_memory_table_counts_both_arms_on_a_shared_gpu():
    est, layout, problem = validate_estimate(dt_config(), get_profile("h100-sxm-80gb"), known_shape(TARGET),
                                             known_shape(DRAFT), gpus(1))
    assert problem is None and layout.strategy == "shared"
    components = {r.component for r in est.rows}
    assert {"baseline weights", "baseline KV cache", "target weights", "draft weights", "draft KV cache"} <= components
    alone = estimate_memory(dt_config(), get_profile("h100-sxm-80gb"), known_shape(TARGET), known_shape(DRAFT))
    assert est.total_gib > alone.total_gib  # the baseline's memory is on the same GPU


def test_validate_errors_when_the_arms_cannot_be_placed():
    findings = run_preflight(dt_config("a100-80gb", target_tp=4, gpus=[0]), offline=True)
    errors = [f for f in findings if f.severity == "error" and f.check == "memory-fit"]
    assert errors and "needs 4 GPU(s), 1 available" in errors[0].message


def test_parameter_counts_read_sensibly_for_tiny_models():
    tiny = ModelShape(64, 2, 4, 2, 128, 256)
    cfg = parse_config({"name": "tiny", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "/m/tiny"}})
    detail = estimate_memory(cfg, get_profile("cpu"), tiny).rows[0].detail
    assert detail.startswith(f"{params_text(tiny.total_params())} params") and "0.00 B" not in detail
    assert [params_text(n) for n in (8_030_261_248, 70_553_706_496, 350_000_000, 132_000, 512)] == \
        ["8.03 B", "70.6 B", "350 M", "132 K", "512"]


@pytest.mark.parametrize("output", [
    "0, 81559\\n1, [GPU is lost]\\n",  # the fields of a GPU nvidia-smi cannot read
    "0, 81559\\nUnable to determine the device handle for GPU0000:1B:00.0: Unknown Error\\n",  # a message, not a row
])
def test_a_gpu_nvidia_smi_cannot_read_is_named_not_a_traceback(tmp_path, monkeypatch, output):
    """Was a ValueError from float('[GPU is lost]') out of validate: now a LayoutError naming the
    row and the fix, which validate reports as its memory-fit problem."""
    from pipeline.plan.gpu_layout import GpuLostError, query_gpus

    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    smi.chmod(0o755)
    with pytest.raises(GpuLostError, match=r"nvidia-smi cannot read a GPU: .*(GPU is lost|Unknown Error).*nvidia-smi -r"):
        query_gpus(str(smi))
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    _, layout, problem = validate_estimate(dt_config(), get_profile("h100-sxm-80gb"), known_shape(TARGET),
                                           known_shape(DRAFT))
    assert layout is None and "nvidia-smi cannot read a GPU" in problem
