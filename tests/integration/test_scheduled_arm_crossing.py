"""The third arm on the CPU default: `render --schedule` renders the scheduled arm beside baseline
and static speculation, and one load test serves all three in real tritonservers and runs the same
closed-loop ramp across the schedule's threshold on each (users 1, 2, 3, 2, 1 around a switch-off
at 2), interleaved; run.json records the arms, the ramp and the schedule (copied into RUN_DIR), each
record its ramp step, and the scheduled arm's greedy outputs equal the baseline's (the schedule
changes K, never the tokens). The report of a three-arm run is written (it must not crash)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from pipeline.artefacts.deployment import ALL_ARMS
from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule
from pipeline.loadtest.runner import run_loadtest
from pipeline.render.schedule import apply_schedule, schedule_form

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.e2e]  # a whole three-arm load test: the e2e tier
ROOT = Path(__file__).resolve().parents[2]


def _deployment(tmp_path: Path):
    """configs/tiny-cpu-schedule.yaml (the demo models and prompts), built and rendered, with short
    steps: the session servers cannot be shared here, since the load test serves the three arms of
    one rendered deployment itself."""
    from pipeline.build.builder import build
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    data = yaml.safe_load((ROOT / "configs" / "tiny-cpu-schedule.yaml").read_text())
    data["loadtest"].update({"warmup_s": 0.5, "duration_s": 2, "max_tokens": 16})
    (tmp_path / "sched.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "sched.yaml", workdir=tmp_path)
    build(cfg, progress=False)
    render(cfg)
    return cfg


def test_three_arms_cross_the_threshold_in_one_load_test(tmp_path):
    cfg = _deployment(tmp_path)
    schedule = tmp_path / "schedule.json"
    ranges = [DraftLenRange(min_concurrency=1, max_concurrency=1, draft_len=3), DraftLenRange(min_concurrency=2, draft_len=0)]
    SpeculationSchedule(name=cfg.name, run_dir=str(tmp_path), method=cfg.method, max_draft_len=3,
                        ranges=ranges).write(schedule)
    apply_schedule(cfg, schedule_form(cfg, schedule))
    run_dir = run_loadtest(cfg, out_dir=tmp_path / "run", repeats=1, progress=False, report=True,
                           arms=ALL_ARMS, crossing=True)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["arms"] == list(ALL_ARMS)
    assert [s["users"] for s in meta["config"]["loadtest"]["ramp"]] == [1, 2, 3, 2, 1]
    assert meta["crossing"]["thresholds"] == [2]
    assert meta["schedule"]["ranges"] == json.loads(schedule.read_text())["ranges"]
    assert json.loads((run_dir / "schedule.json").read_text())["ranges"] == meta["schedule"]["ranges"]
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert {r["arm"] for r in runs} == set(ALL_ARMS) and all(r["valid"] for r in runs), runs
    assert "scheduled-ramp-r0" in {r["key"] for r in runs}
    outputs = defaultdict(dict)
    for r in runs:
        records = [json.loads(line) for line in (run_dir / r["raw"]).read_text().splitlines() if line.strip()]
        assert records and all(rec["status"] in ("ok", "incomplete_at_stop") for rec in records), \
            [rec["error"] for rec in records if rec["status"] != "ok"][:3]
        assert {rec["ramp_step"] for rec in records} <= set(range(5))
        for rec in (rec for rec in records if rec["status"] == "ok"):
            outputs[r["arm"]][rec["prompt_id"]] = rec["output_sha256"]
    shared = set(outputs["scheduled"]) & set(outputs["baseline"])
    assert shared and all(outputs["scheduled"][p] == outputs["baseline"][p] for p in shared)
    assert (run_dir / "report.json").is_file()
