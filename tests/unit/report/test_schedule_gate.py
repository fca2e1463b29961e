"""The schedule gate (issue 47): a three-arm run built from the committed fixture (real raw records),
the scheduled arm's runs copied from the static arms it should equal, then broken on purpose."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.report.builder import make_report, prepare
from tests.unit.report_fixtures import copy_fixture, slow_down_speculative

# K = 3 at c = 1, off from c = 2: the threshold is 2
SCHEDULE = {"ranges": [{"min_concurrency": 1, "max_concurrency": 1, "draft_len": 3},
                       {"min_concurrency": 2, "max_concurrency": None, "draft_len": 0}], "off_from": 2}


def three_arm_run(tmp_path: Path, sources: dict[int, str]) -> Path:
    """run_small with speculation made slow at c = 2 (decode 5x: the fixture's speculation pays at both
    levels, the schedule's premise is that it stops paying at 2), plus scheduled-c<level>-r<rep> runs
    whose records are those of ``sources[level]`` (a run-key prefix such as 'speculative-k3-c1' or
    'baseline-c2') at the same repeat."""
    run_dir = slow_down_speculative(copy_fixture(tmp_path / "run"), 5.0, concurrency=2)
    runs_path = run_dir / "runs.json"
    runs = json.loads(runs_path.read_text())
    by_key = {r["key"]: r for r in runs["runs"]}
    for level, prefix in sources.items():
        for rep in range(3):
            key = f"scheduled-c{level}-r{rep}"
            src = by_key[f"{prefix}-r{rep}"]
            recs = [json.loads(line) for line in (run_dir / src["raw"]).read_text().splitlines() if line.strip()]
            for rec in recs:
                rec.update(arm="scheduled", draft_len=None)
            (run_dir / "raw" / f"{key}.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
            shutil.copy(run_dir / src["workers"], run_dir / "raw" / f"{key}.workers.json")
            runs["runs"].append({**src, "key": key, "arm": "scheduled", "draft_len": None, "raw": f"raw/{key}.jsonl",
                                 "workers": f"raw/{key}.workers.json"})
    runs_path.write_text(json.dumps(runs, indent=1))
    meta = json.loads((run_dir / "run.json").read_text())
    meta["arms"] = ["baseline", "speculative", "scheduled"]
    meta["schedule"] = SCHEDULE
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    (run_dir / "schedule.json").write_text(json.dumps(SCHEDULE))
    return run_dir


def stall(run_dir: Path, key: str, ms: float) -> None:
    """One request of run ``key`` waits ``ms`` longer for its first token (a switch that stalled it)."""
    path = run_dir / "raw" / f"{key}.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rec = next(r for r in recs if r.get("stage") == "measure" and r.get("status") == "ok")
    shift = int(ms * 1e6)
    for field in ("t_first_token", "t_first_answer", "t_last"):
        if rec.get(field):
            rec[field] += shift
    rec["chunk_times"] = [t + shift for t in rec["chunk_times"]]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")


def schedule_checks(data: dict, rule: str) -> list[dict]:
    return [c for c in data["schedule"]["checks"] if c["rule"] == rule]


@pytest.mark.budget(4)  # the module's first test pays the report's imports (scipy, ~1.2 CPU s here)
def test_a_schedule_that_follows_the_better_arm_passes(tmp_path):
    run_dir = three_arm_run(tmp_path, {1: "speculative-k3-c1", 2: "baseline-c2"})
    data, _, gate = prepare(run_dir)
    section = data["schedule"]
    assert section["thresholds"] == [2]
    assert [p["scope"] for p in section["points"]] == ["c=1", "c=2"]
    assert section["points"][0]["position"] == ["just below 2"] and section["points"][1]["position"] == ["at 2"]
    assert {p["draft_len"] for p in section["points"]} == {0, 3}
    assert not [c for c in section["checks"] if c["status"] == "fail"], section["checks"]
    assert schedule_checks(data, "schedule_boundary_stall") and schedule_checks(data, "schedule_boundary_throughput")
    assert section["verdict"] in ("GO", "INCONCLUSIVE")
    assert not [c for c in gate.checks if c.rule.startswith("schedule_") and c.status == "fail"]


def test_a_schedule_that_drafts_past_the_crossover_fails(tmp_path):
    # above the threshold speculation is slow, and the broken schedule keeps drafting: its runs there
    # are the static speculative arm's slow ones
    run_dir = three_arm_run(tmp_path, {1: "speculative-k3-c1", 2: "speculative-k3-c2"})
    data, _, gate = prepare(run_dir)
    failed = [c for c in schedule_checks(data, "schedule_not_worse") if c["status"] == "fail"]
    assert {c["scope"] for c in failed} == {"c=2"}, data["schedule"]["checks"]
    assert any("tpot_ms" in c["detail"] and "baseline" in c["detail"] for c in failed)
    assert data["schedule"]["verdict"] == "NO-GO"
    assert gate.verdict == "NO-GO" and data["verdict"] == "NO-GO"


def test_a_schedule_that_switches_with_a_stall_fails(tmp_path):
    run_dir = three_arm_run(tmp_path, {1: "speculative-k3-c1", 2: "baseline-c2"})
    stall(run_dir, "scheduled-c2-r0", 2000.0)
    data, _, _ = prepare(run_dir)
    stalls = schedule_checks(data, "schedule_boundary_stall")
    assert [c["status"] for c in stalls if c["scope"].startswith("c=2")] == ["fail"], stalls
    assert data["schedule"]["verdict"] == "NO-GO"


def test_a_two_arm_report_has_no_schedule_section(tmp_path):
    data, _, gate = prepare(copy_fixture(tmp_path / "run"))
    assert "schedule" not in data
    assert not [c for c in gate.checks if c.rule.startswith("schedule_")]


@pytest.mark.slow  # a whole report written (plots included)
def test_the_first_screen_gives_the_schedule_and_how_it_held(tmp_path):
    run_dir = three_arm_run(tmp_path, {1: "speculative-k3-c1", 2: "speculative-k3-c2"})
    report = make_report(run_dir)
    md = report.md_path.read_text()
    first_screen = md.split("## Per concurrency")[0]
    assert ("Schedule NO-GO: c 1-1 → K=3; c 2+ → off; across its thresholds (concurrency 2) it did not hold: "
            "schedule\\_not\\_worse at c=2.") in first_screen  # Markdown escapes the underscores
    section = md.split("## Per level and ramp step: baseline, static speculation, scheduled")[1].split("## ")[0]
    assert "| c=2, K=0 (at 2) | TPOT p50 (ms) |" in section and "vs baseline:" in section
    html = report.html_path.read_text()
    assert 'id="schedule"' in html and "Schedule NO-GO" in html
