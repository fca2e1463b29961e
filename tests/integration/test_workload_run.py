"""Issue 46's end-to-end check: `specdeploy run` of the shipped production-shaped workload config
(ShareGPT-format conversations, lognormal output lengths, Poisson arrivals, declared SLOs) reaches a
verdict, and the report's first screen gives goodput at the SLO, the data's warnings and the
achieved rates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EXIT_CODES = {"GO": 0, "NO-GO": 1, "INCONCLUSIVE": 3}


def test_a_sharegpt_lognormal_poisson_run_with_slos_reaches_a_verdict_with_goodput_first(tmp_path):
    config = ROOT / "configs" / "tiny-cpu-sharegpt.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(config), "--duration", "6s", "--repeats", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
        env={**os.environ, "SPECDEPLOY_FORECAST_HOME": str(tmp_path / "forecast")},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    reports = sorted((tmp_path / "reports" / "tiny-cpu-sharegpt").glob("*/report.json"))
    assert len(reports) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(reports[0].read_text())
    assert proc.returncode == EXIT_CODES[report["verdict"]]
    first_screen = (reports[0].parent / "report.md").read_text().split("## Per concurrency")[0]
    assert "Goodput at the SLO" in first_screen and "E2E ≤ 2000 ms" in first_screen
    records = [json.loads(line) for path in (reports[0].parent / "raw").glob("*.jsonl")
               for line in path.read_text().splitlines() if line.strip()]
    assert {r["category"] for r in records} == {"sharegpt"}
    assert len({r["max_tokens"] for r in records if r.get("max_tokens")}) > 3  # lognormal lengths per request
    assert {r["mode"] for r in records} == {"open"}
    checks = {c["rule"] for c in report["gate"]["checks"]}
    assert "achieved_rate" in checks and "guardrail_goodput" in checks
