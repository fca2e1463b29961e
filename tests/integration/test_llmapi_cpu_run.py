"""`specdeploy run` on the CPU llmapi layout (`configs/tiny-cpu-llmapi.yaml`): one subprocess in a
fresh working directory — real build, render, two tritonservers serving the llmapi `tensorrt_llm`
model, Locust speaking the llmapi contract (`text_input` [1], `sampling_param_*`, cumulative
`text_output`), report — ends with a verdict whose requests succeeded in both arms and whose
acceptance came from the llmapi model's per-request perf outputs. Its forecast home is fresh, so the
run calibrates the forecast's CPU cost model before the load test (the full tier's
``test_run_cli`` reuses a stored calibration) and the report checks the forecast against the
measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.e2e]  # the end-to-end tier (docs/testing.md)

ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = {"GO": 0, "NO-GO": 1, "INCONCLUSIVE": 3}


def test_run_on_the_cpu_llmapi_layout_reaches_a_verdict_with_served_requests(tmp_path):
    config = ROOT / "configs" / "tiny-cpu-llmapi.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(config), "--concurrency", "1,4", "--duration", "4s",
         "--repeats", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "SPECDEPLOY_FORECAST_HOME": str(tmp_path / "forecast")},  # `run` calibrates here, not in ~/.cache
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    reports = sorted((tmp_path / "reports" / "tiny-cpu-llmapi").glob("*/report.json"))
    assert len(reports) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(reports[0].read_text())
    assert proc.returncode == EXIT_CODES[report["verdict"]]
    for raw in sorted((reports[0].parent / "raw").glob("*.jsonl")):
        records = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
        measured = [r for r in records if r.get("stage") != "warmup"]
        assert measured and all(r["status"] == "ok" for r in measured), (raw.name, measured[:1])
        assert all(r["output_text"] for r in measured)
    assert report["acceptance_rate"] is not None and 0 < report["acceptance_rate"] <= 1, report.get("acceptance_source")
    assert report["acceptance_source"] == "per-request outputs", report["acceptance_source"]
    assert report["provenance"]["forecast_calibration"]["status"] == "calibrated", report["provenance"]
    assert "calibration none stored" in proc.stdout
    assert (tmp_path / "forecast").is_dir() and list((tmp_path / "forecast").glob("cpu-*.json"))
    forecast = report["forecast"]
    assert forecast["available"], forecast.get("reason")
    assert forecast["calibration_prompts"].startswith("load-test prompts"), forecast["calibration_prompts"]
