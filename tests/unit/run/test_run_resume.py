"""`specdeploy run` reuses a finished load test of the same config and nothing else
(:func:`pipeline.loadtest.resume.previous_runs`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.config import DeploymentConfig, config_hash, with_workdir
from pipeline.loadtest.resume import previous_runs

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "run_small"


@pytest.fixture
def finished_run(tmp_path):
    """The committed fixture run, placed where `run` looks (WORKDIR/reports/NAME/RUN), with a report."""
    meta = json.loads((FIXTURE / "run.json").read_text())
    cfg = with_workdir(DeploymentConfig.model_validate(meta["config"]), tmp_path)
    meta["config_hash"] = config_hash(cfg)
    run_dir = tmp_path / "reports" / cfg.name / "20260101T000000Z"
    shutil.copytree(FIXTURE, run_dir)
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "report.json").write_text("{}")
    return cfg, run_dir


def test_finished_run_of_same_config_is_reused(finished_run):
    cfg, run_dir = finished_run
    assert previous_runs(cfg).reuse.resolve() == run_dir.resolve()


def test_other_config_is_not_reused(finished_run):
    cfg, _ = finished_run
    other = cfg.model_copy(update={"loadtest": cfg.loadtest.model_copy(update={"max_tokens": 7})})
    assert previous_runs(other).reuse is None


def test_run_without_report_is_not_reused(finished_run):
    cfg, run_dir = finished_run
    (run_dir / "report.json").unlink()
    assert previous_runs(cfg).reuse is None


def test_run_whose_server_died_is_not_reused(finished_run):
    cfg, run_dir = finished_run
    runs = json.loads((run_dir / "runs.json").read_text())
    runs["runs"][-1]["server_alive"] = False
    (run_dir / "runs.json").write_text(json.dumps(runs))
    assert previous_runs(cfg).reuse is None


def test_interrupted_run_is_not_reused(finished_run):
    cfg, run_dir = finished_run
    runs = json.loads((run_dir / "runs.json").read_text())
    runs["runs"] = runs["runs"][:-1]
    (run_dir / "runs.json").write_text(json.dumps(runs))
    assert previous_runs(cfg).reuse is None
