"""The third arm on the CPU default: `render --schedule` renders the scheduled arm beside baseline
and static speculation, and one load test serves all three in real tritonservers and runs the same
closed-loop ramp across the schedule's threshold on each (users 1, 2, 3, 2, 1 around a switch-off
at 2), interleaved; run.json records the arms, the ramp and the schedule (copied into RUN_DIR), each
record its ramp step, and the scheduled arm's greedy outputs equal the baseline's (the schedule
changes K, never the tokens). The report of a three-arm run is written (it must not crash)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from pipeline.artefacts.deployment import ALL_ARMS
from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule
from pipeline.loadtest.runner import run_loadtest
from pipeline.render.schedule import apply_schedule, schedule_form

pytestmark = [pytest.mark.triton, pytest.mark.slow]


def test_three_arms_cross_the_threshold_in_one_load_test(tmp_path, medusa_cfg):

    schedule = tmp_path / "schedule.json"
    ranges = [DraftLenRange(min_concurrency=1, max_concurrency=1, draft_len=3), DraftLenRange(min_concurrency=2, draft_len=0)]
    SpeculationSchedule(name=medusa_cfg.name, run_dir=str(tmp_path), method=medusa_cfg.method, max_draft_len=3,
                        ranges=ranges).write(schedule)
    cfg = medusa_cfg  # the config the session rendered: the servers' descriptors carry its hash
    apply_schedule(cfg, schedule_form(cfg, schedule))
    run_dir = run_loadtest(cfg, out_dir=tmp_path / "run", repeats=1, progress=False, report=True,
                           arms=ALL_ARMS, crossing=True, crossing_step_s=1)
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
        assert records and all(rec["status"] == "ok" for rec in records)
        assert {rec["ramp_step"] for rec in records} <= set(range(5))
        for rec in records:
            outputs[r["arm"]][rec["prompt_id"]] = rec["output_sha256"]
    shared = set(outputs["scheduled"]) & set(outputs["baseline"])
    assert shared and all(outputs["scheduled"][p] == outputs["baseline"][p] for p in shared)
    assert (run_dir / "report.json").is_file()
