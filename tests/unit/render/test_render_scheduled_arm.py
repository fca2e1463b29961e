"""`render --schedule FILE` on the reference backend's own layout (ensemble): a third repository,
``model_repo/scheduled/``, the speculative arm's models on a copy of the speculative engine whose
descriptor carries the schedule as ``draft_len_schedule``, with its deployment descriptor (arm
``scheduled``); the A/B arms are left as they were, and the engine that repository serves drafts
nothing above the threshold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline.artefacts.deployment import load_arm
from pipeline.artefacts.engine import EngineDescriptor, MedusaProposer
from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule, draft_len_at
from pipeline.config import config_hash
from pipeline.errors import UsageError
from pipeline.paths import model_repo_dir
from pipeline.reference.engine import load_engine
from pipeline.render.schedule import apply_schedule, schedule_form
from pipeline.render.triton_rules import config_param, parse_config_file
from tests.reference_fixtures import one_thread, random_prompts, shared_checkpoints
from tests.unit.reference.test_engine_draft_len_schedule import _drive
from tests.unit.render.test_llmapi_cpu import DT, cpu_cfg

MEDUSA = {"method": "medusa", "heads_dir": "builtin:tiny-medusa", "num_heads": 3}
ENSEMBLE = {"trtllm_runtime": "engine"}  # the reference backend's own Triton model, not the llmapi layout


def _schedule(tmp_path: Path, *ranges, method: str = "medusa") -> Path:
    rs = [DraftLenRange(min_concurrency=lo, max_concurrency=hi, draft_len=k) for lo, hi, k in ranges]
    path = tmp_path / "schedule.json"
    SpeculationSchedule(name="t", run_dir=str(tmp_path), method=method, max_draft_len=max(r.draft_len for r in rs),
                        ranges=rs).write(path)
    return path


def _built(tmp_path: Path, cfg, ckpt: dict) -> None:
    """The manifest and engine descriptors ``build`` writes, on the shared random checkpoints."""
    root = tmp_path / "engines" / cfg.name
    descriptors = {
        "baseline": EngineDescriptor(role="baseline", model_dir=str(ckpt["target"]), compute_dtype="float64"),
        "speculative": EngineDescriptor(role="speculative", model_dir=str(ckpt["target"]), compute_dtype="float64",
                                        proposer=MedusaProposer(heads_dir=str(ckpt["medusa"]), num_heads=3),
                                        max_draft_len=3),
    }
    for role, descriptor in descriptors.items():
        descriptor.write(root / role / "engine.json")
    manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
                "backend": "reference", "engines": {role: str(root / role) for role in descriptors},
                "tokenizer_dir": str(ckpt["target"]), "created": "t"}
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def ckpt():
    one_thread()
    return shared_checkpoints()


@pytest.fixture()
def rendered(tmp_path, ckpt):
    from pipeline.render.renderer import render

    cfg = cpu_cfg(MEDUSA, workdir=tmp_path, **ENSEMBLE)
    _built(tmp_path, cfg, ckpt)
    path = _schedule(tmp_path, (1, 1, 3), (2, None, 0))
    render(cfg)
    notes = apply_schedule(cfg, schedule_form(cfg, path))
    return cfg, path, notes


def test_the_scheduled_arm_is_rendered_with_the_schedule_in_its_engine(rendered):
    from pipeline.loadtest.runner import default_arms

    cfg, path, notes = rendered
    assert default_arms(cfg) == ("baseline", "speculative", "scheduled")  # `loadtest CONFIG` measures the three
    repo, descriptor = load_arm(cfg, "scheduled")
    assert repo == model_repo_dir(cfg, "scheduled") and any("--variant scheduled" in n for n in notes)
    assert descriptor.arm == "scheduled" and descriptor.drafts == "engine" and descriptor.model_name == "ensemble"
    assert descriptor.draft_len_schedule == [{"min_concurrency": 1, "max_concurrency": 1, "draft_len": 3},
                                             {"min_concurrency": 2, "max_concurrency": None, "draft_len": 0}]
    assert descriptor.schedule_path == str(path.resolve())
    engine_dir = Path(config_param(parse_config_file(repo / "tensorrt_llm" / "config.pbtxt"), "gpt_model_path"))
    scheduled = EngineDescriptor.load(engine_dir / "engine.json")
    speculative = EngineDescriptor.load(Path(load_arm(cfg, "speculative")[0].parent.parent / "speculative" / "engine.json"))
    assert [draft_len_at(scheduled.draft_len_schedule, b) for b in range(1, 6)] == [3, 0, 0, 0, 0]
    assert scheduled.proposer == speculative.proposer and scheduled.model_dir == speculative.model_dir
    # the A/B arms are untouched: static speculation stays static
    assert speculative.draft_len_schedule is None and load_arm(cfg, "speculative")[1].draft_len_schedule is None


def test_the_served_engine_drafts_nothing_above_the_threshold(rendered):
    cfg, _, _ = rendered
    repo, _ = load_arm(cfg, "scheduled")
    engine = load_engine(Path(config_param(parse_config_file(repo / "tensorrt_llm" / "config.pbtxt"), "gpt_model_path")))
    try:
        with torch.inference_mode():
            _, log = _drive(engine, random_prompts(3, seed=11))
    finally:
        engine.shutdown()
    crowded = [s for s in log if s["batch"] >= 2]
    alone = [s for s in log if s["batch"] == 1]
    assert crowded and alone
    assert all(d == 0 for s in crowded for d in s["drafted"]), crowded
    assert sum(s["drafted"][0] for s in alone) > 0, alone


def test_a_bls_that_sends_its_own_drafts_is_refused_with_the_reason(tmp_path):
    from pipeline.loadtest.runner import default_arms

    cfg = cpu_cfg({**DT, "orchestration": "bls"}, workdir=tmp_path, **ENSEMBLE)
    assert default_arms(cfg) is None  # nothing rendered: the A/B arms
    with pytest.raises(UsageError, match="external drafts"):
        schedule_form(cfg, _schedule(tmp_path, (1, 2, 4), (3, None, 0), method="draft_target"))
