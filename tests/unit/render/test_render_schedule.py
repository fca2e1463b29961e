"""`render --schedule FILE` (pipeline/render/schedule.py): the schedule goes into the speculative
arm's model.yaml as TensorRT-LLM's speculative_config fields of the configured version, the CPU
llmapi model turns them back into the engine's K per batch size, and runtimes that cannot load a
schedule are refused with the reason."""

from __future__ import annotations

import pytest
import yaml

from pipeline.artefacts.engine import EngineDescriptor
from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule, draft_len_at
from pipeline.errors import UsageError
from pipeline.render.schedule import apply_schedule, schedule_form
from pipeline.triton_models import llmapi_spec
from tests.unit.render.test_llmapi_cpu import DT, _built, cpu_cfg


def _schedule(tmp_path, *ranges, method="draft_target"):
    rs = [DraftLenRange(min_concurrency=lo, max_concurrency=hi, draft_len=k) for lo, hi, k in ranges]
    path = tmp_path / "schedule.json"
    SpeculationSchedule(name="t", run_dir=str(tmp_path), method=method, max_draft_len=max(r.draft_len for r in rs),
                        ranges=rs).write(path)
    return path


def test_schedule_reaches_the_cpu_llmapi_engine_through_model_yaml(tmp_path):
    from pipeline.render.renderer import render

    cfg = cpu_cfg(DT, workdir=tmp_path)
    _built(tmp_path, cfg)
    path = _schedule(tmp_path, (1, 2, 4), (3, 5, 2), (6, None, 0))
    form = schedule_form(cfg, path)
    out = render(cfg)
    notes = apply_schedule(cfg, form)
    model_yaml = out["speculative"][0] / "tensorrt_llm" / "1" / "model.yaml"
    args = yaml.safe_load(model_yaml.read_text())
    assert args["speculative_config"]["draft_len_schedule"] == {1: 4, 2: 4, 3: 2, 5: 2, 6: 0}
    assert args["speculative_config"]["speculative_model"] == str(tmp_path / "ckpt" / "draft")
    assert any(str(model_yaml) in n for n in notes)
    built = EngineDescriptor.load(tmp_path / "engines" / cfg.name / "speculative" / "engine.json")
    engine = llmapi_spec.engine_descriptor(args, built)
    assert [draft_len_at(engine.draft_len_schedule, b) for b in range(1, 9)] == [4, 4, 2, 2, 2, 0, 0, 0]
    baseline = yaml.safe_load((out["baseline"][0] / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert "speculative_config" not in baseline


def test_runtimes_without_a_schedule_switch_are_refused(tmp_path):
    path = _schedule(tmp_path, (1, 2, 4), (3, None, 0))
    # the reference backend's own layout renders a scheduled arm (test_render_scheduled_arm.py), except
    # where the BLS sends its own drafts (draft-target's default orchestration there)
    with pytest.raises(UsageError, match="external drafts"):
        schedule_form(cpu_cfg(DT, workdir=tmp_path, trtllm_runtime="engine"), path)
    with pytest.raises(UsageError, match="derived for ngram"):
        schedule_form(cpu_cfg(DT, workdir=tmp_path), _schedule(tmp_path, (1, None, 3), method="ngram"))
