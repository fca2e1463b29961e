"""Served forecast check: for each tiny CPU config, run the whole pipeline as a user does on a
machine with no calibration yet (`specdeploy run --fresh`: it calibrates the reference engine,
then Triton, Locust, both arms interleaved over the config's concurrency levels) and read the
report's forecast section: per level the forecast (the calibration and this run's acceptance),
the measured mean-TPOT ratio, the error, the throughput ratios and the diagnostic forecast that
takes all of the baseline's time beyond the model as a serving cost per step.

Writes ``benchmarks/results/forecast-served.json`` (provenance, per config: the calibration used,
the load average around the run, and per level the report's figures plus the measured inputs the
forecast was made from, so ``tests/unit/forecast/test_forecast_served_result.py`` can recompute it).
Each config runs in a scratch workdir and calibration home: nothing in the checkout or in
``~/.cache`` changes. Usage: ``python benchmarks/bench_forecast_served.py [--only NAME]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above

CONFIGS = ("tiny-cpu-draft-target", "tiny-cpu-medusa", "tiny-cpu-eagle", "tiny-cpu-eagle3", "tiny-cpu-ngram")
TOLERANCE = 0.15
LEVEL_FIELDS = ("concurrency", "tau_measured", "draft_coverage", "forecast_tpot_ratio", "band", "measured_tpot_ratio", "tpot_statistic",
                "tpot_error", "forecast_throughput_ratio", "measured_throughput_ratio", "throughput_error",
                "forecast_baseline_tpot_ms", "baseline_beyond_model_ms", "serving_fed_back_tpot_ratio",
                "serving_fed_back_error", "worth_a_look", "measured_engine_tpot_ratio", "engine_tpot_error", "delivery_lag", "delivery_bound",
                "decoding_sequences", "forecast_speculative_tpot_ms", "measured_engine_tpot_ms")


def _measured_inputs(report: dict, concurrency: int) -> dict:
    """What the forecast of one level was made from: both arms' headline rows and cells."""
    from pipeline.report.forecast_check import primary_cells, primary_rows

    rows = [r for arm in ("baseline", "speculative") for r in primary_rows(report, arm) if r["concurrency"] == concurrency]
    cells = [c for arm in ("baseline", "speculative") for c in primary_cells(report, arm) if c["concurrency"] == concurrency]
    keep = ("arm", "concurrency", "speculation_length", "mean_acceptance_length", "tpot_ms", "output_tokens_per_s")
    return {"rows": [{k: r.get(k) for k in keep} for r in rows],
            "cells": [{"arm": c["arm"], "concurrency": c["concurrency"], "draft_len": c.get("draft_len"),
                       "tpot_ms": {"mean": c["tpot_ms"]["mean"], "p50": c["tpot_ms"]["p50"]},
                       "ttft_ms": {"mean": c["ttft_ms"]["mean"]}, "osl": {"mean": c["osl"]["mean"]},
                       "engine_tpot_ms": {"mean": (c.get("engine_tpot_ms") or {}).get("mean")},
                       "e2e_ms": {"mean": c["e2e_ms"]["mean"]},
                       "delivery_lag": c.get("delivery_lag"),
                       "acceptance": {k: (c.get("acceptance") or {}).get(k)
                                      for k in ("accepted_tokens", "decode_steps", "mean_acceptance_length")}}
                      for c in cells]}


def check_config(name: str, scratch: Path) -> dict:
    config = ROOT / "configs" / f"{name}.yaml"
    env = {**os.environ, "SPECDEPLOY_FORECAST_HOME": str(scratch / "forecast-home")}
    python = [sys.executable, "-m", "pipeline"]
    load_before = [round(x, 2) for x in os.getloadavg()]
    workdir = scratch / name
    run = subprocess.run([*python, "run", str(config), "--fresh", "--workdir", str(workdir)], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    load_after = [round(x, 2) for x in os.getloadavg()]
    reports = sorted((workdir / "reports" / name).glob("*/report.json"))
    if not reports:
        raise SystemExit(f"{name}: no report (exit {run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    report = json.loads(reports[-1].read_text(encoding="utf-8"))
    forecast = report["forecast"]
    calibration = json.loads(next((scratch / "forecast-home").glob("cpu-*.json")).read_text(encoding="utf-8"))
    levels = []
    for level in forecast.get("levels", []):
        row = {k: level.get(k) for k in LEVEL_FIELDS}
        row["within_15pct"] = level["tpot_error"] is not None and abs(level["tpot_error"]) <= TOLERANCE
        row["measured_inputs"] = _measured_inputs(report, level["concurrency"])
        levels.append(row)
        print(f"{name} c={level['concurrency']}: forecast {level['forecast_tpot_ratio']:.2f}x, measured "
              f"{level['measured_tpot_ratio']:.2f}x ({level['tpot_error'] * 100:+.0f} %); with the baseline's excess "
              f"as serving {level['serving_fed_back_tpot_ratio']:.2f}x", file=sys.stderr)
    return {"config": name, "method": report["provenance"].get("method"), "verdict": report["verdict"],
            "exit_code": run.returncode, "forecast_available": forecast.get("available"),
            "reason": forecast.get("reason"), "context_tokens": forecast.get("context_tokens"),
            "context_measured": forecast.get("context_measured"), "calibration_prompts": forecast.get("calibration_prompts"),
            "primary_draft_len": report.get("primary_draft_len"),
            "load_average_before": load_before, "load_average_after": load_after,
            "calibration": calibration["entries"], "levels": levels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", choices=CONFIGS)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "forecast-served.json")
    args = parser.parse_args()
    out = {"provenance": result_provenance(),
           "what": "per tiny config: `run --fresh` on a machine without a calibration (it calibrates first); the report's forecast section per "
                   "concurrency (the calibration and the run's measured acceptance; mean TPOT per request compared)",
           "note": "each config alone on the machine; the whole served stack (tritonserver, Python model stubs, "
                   "engine worker, Locust) shares its 2 cores",
           "tolerance": TOLERANCE, "configs": []}
    with tempfile.TemporaryDirectory(prefix="specdeploy-forecast-served-") as scratch:
        for name in args.only or CONFIGS:
            out["configs"].append(check_config(name, Path(scratch) / name))
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
