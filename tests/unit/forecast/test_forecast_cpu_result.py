"""The CPU forecast check's committed result (benchmarks/results/forecast-cpu.json): every measured
point within ±15 % of the forecast, the forecast recomputable from the calibrations the file
stores, and a broken cost term visibly breaking it. No engine runs here: the calibrations and the
measured acceptance are read from the file, the cost model is recomputed from them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.forecast.cpu import average_calibrations
from pipeline.forecast.model import bench_forecast

ROOT = Path(__file__).resolve().parents[3]
RESULT = ROOT / "benchmarks" / "results" / "forecast-cpu.json"
TOLERANCE = 0.15
METHODS = {"draft_target", "medusa", "eagle", "eagle3", "ngram"}


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads(RESULT.read_text(encoding="utf-8"))


def _recomputed(entry: dict, calibration: dict) -> list[tuple[dict, float]]:
    """(stored row, end-to-end forecast recomputed from ``calibration``) per batch of a config."""
    cfg = load_config(ROOT / "configs" / f"{entry['config']}.yaml")
    out = []
    for row in entry["rows"]:
        e2e, _ = bench_forecast(cfg, calibration, row["tau_per_verify_step"], row["draft_coverage"],
                                entry["context_tokens"], entry["prompt_tokens"], entry["max_tokens"], row["batch"])
        out.append((row, e2e))
    return out


def _calibration(entry: dict) -> dict:
    return average_calibrations(entry["calibration_before"], entry["calibration_after"])


def test_every_method_and_batch_is_within_15_percent(result):
    seen = set()
    for entry in result["configs"]:
        for row in entry["rows"]:
            seen.add((entry["method"], row["batch"]))
            assert abs(row["error"]) <= TOLERANCE, (entry["config"], row["batch"], row["error"])
            assert row["error"] == pytest.approx(row["forecast_e2e_speedup"] / row["measured_cpu_time_speedup"] - 1,
                                                 abs=2e-3)
    assert seen == {(m, b) for m in METHODS for b in (1, 8)}


def test_result_states_its_load_and_that_calibration_and_check_are_separate(result):
    prov = result["provenance"]
    assert prov["command"] and prov["commit"] and prov["machine"]["cpus"]
    assert "load" in json.dumps(prov)  # the uptime load the numbers were measured under
    assert "separate" in result["note"] and "held-out" in result["note"]
    for entry in result["configs"]:
        for side in ("calibration_before", "calibration_after"):
            assert "held-out" in entry[side]["prompts"]
            # the per-sequence term is calibrated per batch size for the config's own method
            assert set(entry[side]["spec_step_extra_s"][entry["method"]]) == {"1", "8"}


def test_the_stored_forecast_is_what_the_stored_calibrations_give(result):
    for entry in result["configs"]:
        for row, e2e in _recomputed(entry, _calibration(entry)):
            assert e2e == pytest.approx(row["forecast_e2e_speedup"], rel=0.01), (entry["config"], row["batch"])


def _errors(result: dict, breaking) -> list[float]:
    errors = []
    for entry in result["configs"]:
        calibration = breaking(copy.deepcopy(_calibration(entry)), entry["method"])
        errors += [e2e / row["measured_cpu_time_speedup"] - 1 for row, e2e in _recomputed(entry, calibration)]
    return errors


def test_a_free_proposer_breaks_the_check(result):
    def free_drafting(calibration: dict, method: str) -> dict:
        calibration["proposer_s"][method] = {b: 0.0 for b in calibration["proposer_s"][method]}
        return calibration

    assert max(abs(e) for e in _errors(result, free_drafting)) > TOLERANCE


def test_the_per_sequence_term_is_charged_and_an_inflated_one_breaks_the_check(result):
    def without(calibration: dict, method: str) -> dict:
        calibration["spec_step_extra_s"][method] = {b: 0.0 for b in calibration["spec_step_extra_s"][method]}
        return calibration

    def inflated_at_batch_8(calibration: dict, method: str) -> dict:
        table = calibration["spec_step_extra_s"][method]
        calibration["spec_step_extra_s"][method] = {b: (3 * s + 0.01 if b == "8" else s) for b, s in table.items()}
        return calibration

    # the term moves the forecast (it is charged), and a wrong one shows at batch 8
    assert _errors(result, without) != pytest.approx(_errors(result, lambda c, m: c), abs=1e-4)
    assert max(abs(e) for e in _errors(result, inflated_at_batch_8)) > TOLERANCE
