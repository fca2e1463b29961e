"""`specdeploy run` on a CPU config calibrates the forecast's cost model after the build and before
the load test when this machine has none for the config, reuses a stored one, makes a new one on
``--recalibrate``, and goes on when calibrating fails — the report then says why it has no
forecast. The stages are fakes that record their order; ``calibrate`` is a fast fake (the
microbenchmarks are what ``test_calibration_prompts`` and the bench check cover)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pipeline.config import load_config, with_workdir
from pipeline.forecast import cpu
from pipeline.report.forecast_check import safe_forecast_section
from pipeline.run import STAGES, run_pipeline, stages_of

ROOT = Path(__file__).resolve().parents[3]
MEDUSA = ROOT / "configs" / "tiny-cpu-medusa.yaml"
GPU = ROOT / "configs" / "llama31-8b-draft1b-fp8-h100.yaml"


@pytest.fixture
def stages(monkeypatch, tmp_path):
    """Every stage of `run` replaced by a recorder; ``calls`` lists them in order. The fake load test
    writes a minimal run.json; ``fail`` makes ``calibrate`` raise."""
    import pipeline.run as run  # run names each stage at module level: replace them where run reads them

    monkeypatch.setenv("SPECDEPLOY_FORECAST_HOME", str(tmp_path / "forecast"))
    state = SimpleNamespace(calls=[], fail=None, run_dir=tmp_path / "reports" / "run")

    def calibrate(target_dir, draft_dir=None, threads=1, proposer=None, prompt_groups=None, **kw):
        state.calls.append("calibrate")
        if state.fail:
            raise state.fail
        return {"schema": cpu.CALIBRATION_SCHEMA, "created": "2026-01-01T00:00:00Z", "prompts": "calibrate's own",
                "prompt_groups": prompt_groups}

    def run_loadtest(cfg, **kw):
        state.calls.append("loadtest")
        state.run_dir.mkdir(parents=True, exist_ok=True)
        (state.run_dir / "run.json").write_text(json.dumps({"run_id": "r", "config_hash": "h"}))
        return state.run_dir

    def make_report(run_dir, cfg=None):
        state.calls.append("report")
        gate = SimpleNamespace(verdict="GO", exit_code=0, reasons=[])
        return SimpleNamespace(verdict="GO", exit_code=0, gate=gate, html_path=run_dir / "report.html",
                               json_path=run_dir / "report.json")

    def record(name, value):
        def fake(*args, **kw):
            state.calls.append(name)
            return value
        return fake

    monkeypatch.setattr(cpu, "calibrate", calibrate)
    monkeypatch.setattr(run, "run_preflight", record("validate", []))
    monkeypatch.setattr(run, "build", record("build", {"steps": []}))
    monkeypatch.setattr(run, "render", record("render", {}))
    monkeypatch.setattr(run, "run_loadtest", run_loadtest)
    monkeypatch.setattr(run, "make_report", make_report)
    return state


def _run(cfg, **kw) -> str:
    out = io.StringIO()
    run_pipeline(cfg, new_run=True, console=Console(file=out, width=200), **kw)
    return out.getvalue()


def _recorded(state) -> dict:
    return json.loads((state.run_dir / "run.json").read_text())["forecast_calibration"]


def test_run_calibrates_after_the_build_and_before_the_load_test_when_none_is_stored(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    output = _run(cfg)
    assert stages.calls == ["validate", "build", "render", "calibrate", "loadtest", "report"]
    assert "[4/6] calibrate" in output and "calibration none stored" in output
    entry = cpu.stored_device(key=cpu.calibration_key(cfg)).calibration  # stored under the config's key
    assert entry["prompts"].startswith("load-test prompts")
    assert len(entry["prompt_groups"]) == 5  # the load test's five categories, not synthetic ids
    outcome = _recorded(stages)
    assert outcome["status"] == "calibrated" and outcome["key"] == cpu.calibration_key(cfg)


def test_run_reuses_a_stored_calibration_and_recalibrates_when_asked(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    cpu.store({"schema": cpu.CALIBRATION_SCHEMA, "created": "earlier", "prompts": "p"}, cpu.calibration_key(cfg))
    output = _run(cfg)
    assert "calibrate" not in stages.calls
    assert "reused the stored calibration of earlier" in output
    assert _recorded(stages)["status"] == "stored"
    stages.calls.clear()
    output = _run(cfg, recalibrate=True)
    assert stages.calls.count("calibrate") == 1 and "calibration asked for (--recalibrate)" in output
    assert cpu.stored_device(key=cpu.calibration_key(cfg)).calibration["created"] != "earlier"


def test_a_calibration_of_another_config_is_not_reused(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    cpu.store({"schema": cpu.CALIBRATION_SCHEMA, "created": "earlier"},
              cpu.calibration_key(load_config(ROOT / "configs" / "tiny-cpu-eagle.yaml")))
    _run(cfg)
    assert stages.calls.count("calibrate") == 1


def test_a_calibration_made_by_an_older_method_is_not_reused(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    cpu.store({"schema": "specdeploy-cpu-calibration/1", "created": "earlier"}, cpu.calibration_key(cfg))
    _run(cfg)
    assert stages.calls.count("calibrate") == 1
    assert cpu.stored_device(key=cpu.calibration_key(cfg)).calibration["schema"] == cpu.CALIBRATION_SCHEMA


def test_a_calibration_made_under_another_torch_is_made_again(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    machine = {**cpu._identity(), "torch": "2.0.0"}
    cpu.store({"schema": cpu.CALIBRATION_SCHEMA, "created": "earlier", "machine": machine}, cpu.calibration_key(cfg))
    output = _run(cfg)
    assert stages.calls.count("calibrate") == 1
    assert "stale (made under torch 2.0.0" in output
    # the same versions: reused
    stages.calls.clear()
    cpu.store({"schema": cpu.CALIBRATION_SCHEMA, "created": "earlier", "machine": cpu._identity()}, cpu.calibration_key(cfg))
    _run(cfg)
    assert "calibrate" not in stages.calls


def test_a_failed_calibration_does_not_fail_the_run_and_the_report_says_why(stages, tmp_path):
    cfg = with_workdir(load_config(MEDUSA), tmp_path)
    stages.fail = RuntimeError("engine would not start")
    output = _run(cfg)
    assert stages.calls[-2:] == ["loadtest", "report"]  # the run went on
    assert "calibration failed (RuntimeError: engine would not start)" in output
    outcome = _recorded(stages)
    assert outcome["status"] == "failed" and "engine would not start" in outcome["reason"]
    # the report's forecast section, from run.json's record in the report's provenance
    rows = {"primary_draft_len": 5, "provenance": {"forecast_calibration": outcome},
            "rows": [{"arm": "baseline", "concurrency": 1, "tpot_ms": 10.0, "output_tokens_per_s": 100.0},
                     {"arm": "speculative", "concurrency": 1, "speculation_length": 5, "mean_acceptance_length": 3.0,
                      "tpot_ms": 5.0, "output_tokens_per_s": 200.0}]}
    section = safe_forecast_section(rows, cfg)
    assert section["available"] is False
    assert "calibration `specdeploy run` made before the load test failed" in section["reason"]
    assert "engine would not start" in section["reason"]


def test_a_gpu_config_has_no_calibrate_stage(stages, tmp_path):
    cfg = with_workdir(load_config(GPU), tmp_path)
    assert stages_of(cfg) == STAGES and "calibrate" not in STAGES
    output = _run(cfg)
    assert stages.calls == ["validate", "build", "render", "loadtest", "report"]
    assert "[4/5] loadtest" in output
    assert "forecast_calibration" not in json.loads((stages.run_dir / "run.json").read_text())
