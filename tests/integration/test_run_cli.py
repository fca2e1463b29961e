"""`specdeploy run` as a user runs it: one subprocess, a fresh working directory, the tiny EAGLE
config (real build, render, two real tritonservers, Locust at concurrency 1 and 4, report). The
exit code is the verdict, the last lines say where the report is, and nothing prints a traceback.
A calibration stored for the config on this machine (a real one, tests/fixtures/forecast) is reused,
and the report checks the forecast against the measurement, at the context the run's records
measured. A run that calibrates first (a fresh forecast home): the e2e tier's
``test_llmapi_cpu_run``; the stage order around it: ``tests/unit/run/test_run_calibration.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# weight: about 10 slow tests; by its one slow test it was scheduled last (the tail)
pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.weight(10)]

ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = {"GO": 0, "NO-GO": 1, "INCONCLUSIVE": 3}


def store_calibration(home: Path) -> None:
    """The fixture's calibration, stored under ``home`` as ``run`` looks it up on this machine."""
    from pipeline.forecast import cpu

    stored = json.loads((ROOT / "tests" / "fixtures" / "forecast" / "tiny-cpu-eagle-calibration.json").read_text())
    cpu.store(stored["calibration"], stored["key"], path=home / cpu.calibration_path().name)


def test_run_end_to_end_prints_report_and_exits_with_verdict(tmp_path, monkeypatch):
    config = ROOT / "configs" / "tiny-cpu-eagle.yaml"
    monkeypatch.setenv("SPECDEPLOY_FORECAST_HOME", str(tmp_path / "forecast"))
    store_calibration(tmp_path / "forecast")
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(config), "--concurrency", "1,4", "--duration", "3s",
         "--repeats", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    reports = sorted((tmp_path / "reports" / "tiny-cpu-eagle").glob("*/report.json"))
    assert len(reports) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(reports[0].read_text())
    assert proc.returncode == EXIT_CODES[report["verdict"]]
    assert report["verdict"] != "GO"  # one repeat is below gate.min_runs
    assert "verdict:" in proc.stdout and "report.html" in proc.stdout
    assert (reports[0].parent / "report.html").is_file()
    runs = json.loads((reports[0].parent / "runs.json").read_text())["runs"]
    assert len(runs) == 4 and all(r["server_alive"] for r in runs), [r.get("invalid_reasons") for r in runs]
    allowed = os.sched_getaffinity(0)
    if len(allowed) >= 2:  # reference.cpu_pinning auto: Locust stays off the engine's core, in both arms
        assert all(r["client_cpus"] == sorted(allowed - {max(allowed)}) for r in runs), [r["client_cpus"] for r in runs]
    assert (tmp_path / "engines" / "tiny-cpu-eagle" / "manifest.json").is_file()
    assert report["provenance"]["forecast_calibration"]["status"] == "stored", report["provenance"]
    assert "reused the stored calibration" in proc.stdout
    forecast = report["forecast"]
    assert forecast["available"], forecast.get("reason")
    assert forecast["calibration_prompts"].startswith("load-test prompts")
    assert forecast["context_source"].startswith("this run's records"), forecast["context_source"]
