"""One rule says whether a load test is finished and where it resumes (issue 45):
:func:`pipeline.loadtest.resume.is_finished` / ``missing_cells``, which ``loadtest --resume`` measures
and by which ``specdeploy run`` reuses or resumes (``previous_runs``). ``run`` used to reuse by a
rule of its own (every planned run recorded with the server alive), so a reported run with an invalid
cell, or a cell whose records were cut short, was reused by ``run`` while ``loadtest --resume`` would
measure that cell again; and a finished ``--arm baseline`` run without a report was picked for ``run``
to resume, which ``run`` refuses (other arms)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.config import DeploymentConfig, config_hash, with_workdir
from pipeline.loadtest.resume import PreviousRuns, is_finished, kept_results, missing_cells, previous_runs

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "run_small"


@pytest.fixture
def run(tmp_path):
    """The committed fixture run (12 whole cells), where `run` looks for it, with a report."""
    meta = json.loads((FIXTURE / "run.json").read_text())
    cfg = with_workdir(DeploymentConfig.model_validate(meta["config"]), tmp_path)
    meta["config_hash"] = config_hash(cfg)
    run_dir = tmp_path / "reports" / cfg.name / "20260101T000000Z"
    shutil.copytree(FIXTURE, run_dir)
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "report.json").write_text("{}")
    return cfg, run_dir, meta


def edit_runs(run_dir: Path, edit) -> None:
    path = run_dir / "runs.json"
    runs = json.loads(path.read_text())
    runs["runs"] = edit(runs["runs"])
    path.write_text(json.dumps(runs))


def missing(run_dir: Path, meta: dict) -> list[str]:
    """Where ``loadtest --resume`` starts: the plan's cells not kept."""
    return [s.key for s in missing_cells(meta, {r["key"] for r in kept_results(run_dir)})]


def test_a_finished_and_reported_run_is_reused_and_has_nothing_to_resume(run):
    cfg, run_dir, meta = run
    assert is_finished(run_dir, meta) and missing(run_dir, meta) == []
    assert previous_runs(cfg) == PreviousRuns(reuse=run_dir)


def test_a_reported_run_with_an_invalid_cell_is_resumed_at_that_cell(run):
    cfg, run_dir, meta = run
    last = json.loads((run_dir / "runs.json").read_text())["runs"][-1]["key"]
    edit_runs(run_dir, lambda runs: runs[:-1] + [{**runs[-1], "valid": False, "invalid_reasons": ["locust exited with 2"]}])
    assert not is_finished(run_dir, meta) and missing(run_dir, meta) == [last]
    assert previous_runs(cfg) == PreviousRuns(resume=run_dir)  # never reused while a cell is to measure


def test_a_reported_run_with_a_cut_cell_is_resumed_at_that_cell(run):
    cfg, run_dir, meta = run
    first = json.loads((run_dir / "runs.json").read_text())["runs"][0]
    raw = run_dir / first["raw"]
    raw.write_text("".join(raw.read_text().splitlines(keepends=True)[:-1]))  # a record short
    assert missing(run_dir, meta) == [first["key"]]
    assert previous_runs(cfg) == PreviousRuns(resume=run_dir)


def test_a_run_of_one_arm_is_not_one_run_picks_up(run):
    """``loadtest --arm baseline`` measured the baseline alone: finished by its own plan, but not what
    ``run`` measures, so ``run`` neither resumes nor reuses it."""
    cfg, run_dir, meta = run
    meta["arms"] = ["baseline"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    edit_runs(run_dir, lambda runs: [r for r in runs if r["arm"] == "baseline"])
    (run_dir / "report.json").unlink()
    assert is_finished(run_dir, meta)
    assert previous_runs(cfg) == PreviousRuns()


def test_run_resumes_the_newest_and_falls_back_on_the_newest_finished(run):
    cfg, finished, meta = run
    newer = finished.with_name("20260102T000000Z")
    shutil.copytree(finished, newer)
    (newer / "report.json").unlink()
    edit_runs(newer, lambda runs: runs[:5])  # killed after five cells
    assert missing(newer, meta)[:1] == ["speculative-k3-c1-r1"]
    assert previous_runs(cfg) == PreviousRuns(resume=newer, reuse=finished)
