"""CPU pinning plans (pure), the hand-over to engine stubs through the environment, real
affinity of a spawned child and of the reference engine's decode thread, and the config field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from pipeline.infra.cpu_pinning import ENV_VAR, CpuPlan, decoding_models, engine_cpus_from_env, plan_pinning, spawn_on

ONE_ENGINE = ["ensemble", "preprocessing", "postprocessing", "tensorrt_llm"]
BLS = ["preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls", "tensorrt_llm_draft"]


def test_auto_gives_the_engine_the_highest_cpu_and_the_server_the_rest():
    plan, reason = plan_pinning("auto", ONE_ENGINE, 1, {0, 1})
    assert plan == CpuPlan({"tensorrt_llm": (1,)}, (0,)) and reason == "pinned"


def test_auto_one_core_per_engine_model_when_there_are_enough():
    plan, _ = plan_pinning("auto", BLS, 1, range(4))
    assert plan == CpuPlan({"tensorrt_llm": (2,), "tensorrt_llm_draft": (3,)}, (0, 1))
    plan, _ = plan_pinning("auto", ONE_ENGINE, 2, [5, 1, 3, 7])  # threads per engine; ids need not be dense
    assert plan == CpuPlan({"tensorrt_llm": (5, 7)}, (1, 3))


def test_an_idle_draft_engine_is_not_pinned_nor_does_it_unpin_its_arm():
    """Draft-target drafting in the engine: the speculative repository keeps tensorrt_llm_draft for
    BLS calls, but the arm decodes with one engine (the descriptor's engine_models = 1), so it is
    pinned exactly like its baseline; the idle draft engine stays on the server's CPUs."""
    engine_arm, _ = plan_pinning("auto", BLS, 1, {0, 1}, most_engines=1)
    baseline, _ = plan_pinning("auto", ONE_ENGINE, 1, {0, 1}, most_engines=1)
    assert engine_arm == baseline == CpuPlan({"tensorrt_llm": (1,)}, (0,))
    assert decoding_models(BLS) == ["tensorrt_llm", "tensorrt_llm_draft"]
    assert decoding_models(reversed(BLS), 1) == ["tensorrt_llm"]  # the target's engine, whatever the listing order
    assert decoding_models(["ensemble"], 2) == []


@pytest.mark.parametrize("models, threads, cpus, most", [
    (BLS, 1, {0, 1}, 0),  # two engines and the server on two cores
    (ONE_ENGINE, 2, {0, 1}, 0),  # two threads leave nothing for the server
    (ONE_ENGINE, 1, {0}, 0),
    (ONE_ENGINE, 1, {0, 1}, 2),  # the baseline arm of a BLS deployment: both arms alike
])
def test_auto_leaves_everything_unpinned_without_a_spare_cpu(models, threads, cpus, most):
    plan, reason = plan_pinning("auto", models, threads, cpus, most)
    assert plan is None and "needs one more for the server" in reason


def test_off_and_repositories_without_an_engine_are_not_pinned():
    assert plan_pinning("off", ONE_ENGINE, 1, range(8)) == (None, "reference.cpu_pinning is off")
    plan, reason = plan_pinning("auto", ["ensemble", "preprocessing"], 1, range(8))
    assert plan is None and "no reference engine model" in reason


def test_an_explicit_cpu_list_is_used_in_order_and_checked():
    plan, _ = plan_pinning([0], ONE_ENGINE, 1, {0, 1})
    assert plan == CpuPlan({"tensorrt_llm": (0,)}, (1,))
    plan, _ = plan_pinning([3, 1], BLS, 1, range(4))
    assert plan == CpuPlan({"tensorrt_llm": (3,), "tensorrt_llm_draft": (1,)}, (0, 2))
    with pytest.raises(ValueError, match=r"CPU\(s\) \[9\] are not allowed"):
        plan_pinning([9], ONE_ENGINE, 1, {0, 1})
    with pytest.raises(ValueError, match="need 2"):
        plan_pinning([1], BLS, 1, range(4))
    with pytest.raises(ValueError, match="leave one for the server"):
        plan_pinning([0, 1], ONE_ENGINE, 1, {0, 1})


def test_the_plan_reaches_each_engine_model_through_the_environment():
    plan = CpuPlan({"tensorrt_llm": (3,), "tensorrt_llm_draft": (2,)}, (0, 1))
    env = plan.env()
    assert json.loads(env[ENV_VAR]) == {"tensorrt_llm": [3], "tensorrt_llm_draft": [2]}
    assert engine_cpus_from_env("tensorrt_llm", env) == (3,)
    assert engine_cpus_from_env("tensorrt_llm_draft", env) == (2,)
    assert engine_cpus_from_env("preprocessing", env) is None
    assert engine_cpus_from_env("tensorrt_llm", {}) is None
    assert engine_cpus_from_env("tensorrt_llm", {ENV_VAR: "not json"}) is None
    assert "tensorrt_llm → [3]" in plan.describe() and "→ [0, 1]" in plan.describe()


def test_spawn_on_starts_the_child_on_the_cpus_and_restores_the_caller():
    before = os.sched_getaffinity(0)
    cpu = max(before)
    with spawn_on([cpu]):
        out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                             capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [cpu]
    assert os.sched_getaffinity(0) == before
    with spawn_on(None):  # no plan: nothing changes
        assert os.sched_getaffinity(0) == before


def test_the_engine_decode_thread_pins_itself():
    from pipeline.reference.api import GenerationRequest
    from pipeline.reference.engine import create_engine
    from tests.reference_fixtures import one_thread, shared_checkpoints

    one_thread()
    before = os.sched_getaffinity(0)
    cpu = max(before)
    engine = create_engine(shared_checkpoints()["target"], cpus=(cpu,))
    try:
        assert len(engine.generate(GenerationRequest([1, 2, 3], 4)).output_ids) == 4
        decode = next(t for t in threading.enumerate() if t.name == "reference-engine" and t is engine._thread)
        assert os.sched_getaffinity(decode.native_id) == {cpu}
        assert os.sched_getaffinity(0) == before  # only that thread
    finally:
        engine.shutdown()


@pytest.mark.parametrize("value, ok", [("auto", True), ("off", True), ([0, 2], True), ("sometimes", False), ([-1], False)])
def test_config_field(value, ok):
    from pipeline.config import DeploymentConfig
    from pipeline.errors import ConfigError

    data = {"name": "x", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "builtin:tiny-target"},
            "reference": {"cpu_pinning": value}}
    if ok:
        assert DeploymentConfig.model_validate(data).reference.cpu_pinning == value
    else:
        from pydantic import ValidationError

        with pytest.raises((ValidationError, ConfigError)) as info:
            DeploymentConfig.model_validate(data)
        assert "cpu_pinning" in str(info.value)
