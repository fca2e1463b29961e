"""Capacity and cost at an SLO (issue 48, deliverable 1): a run's curves → replica capacity per arm
with its interval, replicas, GPUs and cost; the forecast's answer for a config with no run."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.forecast import acceptance as acc
from pipeline.forecast.model import config_inputs
from pipeline.report.capacity import (
    CapacityError,
    Demand,
    Pricing,
    Slo,
    forecast_capacity,
    measured_capacity,
    plan_fleet,
)
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"
MS = 1_000_000  # ns


def _records(n: int, ttft_ms: float, tpot_ms: float, osl: int = 11) -> list[dict]:
    out = []
    for i in range(n):
        sent = i * 10**9
        first = sent + int(ttft_ms * MS)
        out.append({"stage": "measure", "status": "ok", "t_sent": sent, "t_first_token": first,
                    "t_last": first + int(tpot_ms * MS) * (osl - 1), "osl": osl})
    return out


def make_run(tmp_path: Path, curves: dict[str, dict[int, tuple[float, float]]], slo: dict | None = None) -> Path:
    """A copy of the fixture run whose raw records and report give each (arm, concurrency) the
    TPOT (ms) and requests/s of ``curves``; every repeat alike but for ±2 % in the rate."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    listing = json.loads((run / "runs.json").read_text())
    summaries = []
    for info in listing["runs"]:
        tpot, rps = curves[info["arm"]][info["concurrency"]]
        rps *= 1 + 0.02 * (info["repeat"] - 1)
        (run / info["raw"]).write_text("".join(json.dumps(r) + "\n" for r in _records(20, 50.0, tpot)))
        summaries.append({"key": info["key"], "valid": True, "requests_per_s": rps, "output_tokens_per_s": rps * 11,
                          "target_rate": None})
    report = {"primary_draft_len": 3, "runs": summaries,
              "gate_settings": {"slo": slo or {"ttft_ms": 1000.0, "tpot_ms": 100.0}}}
    (run / "report.json").write_text(json.dumps(report))
    return run


def test_the_capacity_is_interpolated_between_the_last_level_that_meets_the_slo_and_the_first_that_does_not(tmp_path):
    run = make_run(tmp_path, {"baseline": {1: (5.0, 10.0), 2: (15.0, 16.0)},
                              "speculative": {1: (2.0, 12.0), 2: (6.0, 20.0)}})
    cap = measured_capacity(run, Slo(tpot_ms=10.0))
    base, spec = cap["arms"]["baseline"], cap["arms"]["speculative"]
    # slack 0.5 at 10 req/s, 1.5 at 16 req/s: the SLO is met up to half way, 13 req/s (± the repeats' 2 %)
    assert base["rps"] == pytest.approx(13.0, rel=0.03) and not base["lower_bound"]
    low, high = base["rps_interval"]
    assert low < base["rps"] < high
    assert spec["lower_bound"] and "at least" in spec["note"]  # every level met it: only a lower bound
    assert spec["rps"] == pytest.approx(20.0, rel=0.03)
    ratio = cap["capacity_ratio"]
    assert ratio["n_pairs"] == 3 and ratio["low"] < ratio["point"] < ratio["high"]
    assert ratio["point"] == pytest.approx(20.0 / 13.0, rel=0.03)


def test_an_arm_that_meets_the_slo_nowhere_has_no_fleet(tmp_path):
    run = make_run(tmp_path, {"baseline": {1: (50.0, 10.0), 2: (60.0, 16.0)},
                              "speculative": {1: (2.0, 12.0), 2: (6.0, 20.0)}})
    cap = measured_capacity(run, Slo(tpot_ms=10.0))
    assert cap["arms"]["baseline"]["rps"] == 0.0
    fleet = plan_fleet(cap, Demand(rate_rps=40.0), Pricing(2.0, 1))
    assert fleet["arms"]["baseline"]["gpus"] is None and "no measured load" in fleet["arms"]["baseline"]["why"]
    assert fleet["arms"]["speculative"]["gpus"] == 2


def test_replicas_gpus_and_cost_per_million_tokens_follow_their_formulas(tmp_path):
    run = make_run(tmp_path, {"baseline": {1: (5.0, 10.0), 2: (15.0, 16.0)},
                              "speculative": {1: (2.0, 12.0), 2: (6.0, 20.0)}})
    cap = measured_capacity(run, Slo(tpot_ms=10.0))
    fleet = plan_fleet(cap, Demand(rate_rps=50.0), Pricing(gpu_hour_usd=3.0, gpus_per_replica=2))
    base = fleet["arms"]["baseline"]
    replicas = math.ceil(50.0 / cap["arms"]["baseline"]["rps"])
    assert base["replicas"] == replicas and base["gpus"] == 2 * replicas
    tokens_per_hour = 50.0 * base["tokens_per_request"] * 3600
    assert base["cost_per_m_tokens_usd"] == pytest.approx(base["gpus"] * 3.0 / tokens_per_hour * 1e6, rel=1e-3)
    spec = fleet["arms"]["speculative"]
    assert fleet["speculation"]["gpus_saved"] == base["gpus"] - spec["gpus"] > 0
    assert fleet["speculation"]["cost_change"] < 0
    worst, best = base["interval"]["gpus"]
    assert worst >= base["gpus"] >= best


def test_a_daily_profile_scales_replicas_by_the_hour(tmp_path):
    run = make_run(tmp_path, {"baseline": {1: (5.0, 10.0), 2: (15.0, 16.0)},
                              "speculative": {1: (2.0, 12.0), 2: (6.0, 20.0)}})
    cap = measured_capacity(run, Slo(tpot_ms=10.0))
    hourly = tuple([5.0] * 12 + [40.0] * 12)
    fleet = plan_fleet(cap, Demand(hourly_rps=hourly), Pricing(1.0, 1))
    base = fleet["arms"]["baseline"]
    per_hour = [math.ceil(r / cap["arms"]["baseline"]["rps"]) for r in hourly]
    assert base["replicas_by_hour"] == per_hour and base["gpu_hours_per_day"] == sum(per_hour)
    assert base["static_gpus"] == max(per_hour)


def test_demand_and_profile_errors_are_clear():
    with pytest.raises(CapacityError, match="one of them"):
        Demand()
    with pytest.raises(CapacityError, match="24 hourly"):
        Demand(hourly_rps=(1.0, 2.0))


def test_a_forecast_capacity_stays_within_the_deployment_limit_and_carries_a_band():
    cfg = load_config(ROOT / "configs" / "llama31-8b-eagle3-llmapi-h100.yaml")
    inp = config_inputs(cfg, acc.from_alpha(0.7))
    cap = forecast_capacity(inp, Slo(tpot_ms=20.0))
    assert cap["source"] == "forecast"
    for arm in cap["arms"].values():
        low, high = arm["rps_interval"]
        assert low <= arm["rps"] <= high
        assert "build.max_batch_size 16" in arm["note"]
    ratio = cap["capacity_ratio"]
    assert ratio["low"] < ratio["point"] < ratio["high"]


def test_the_cli_answers_for_a_run_and_refuses_without_a_rate(tmp_path):
    run = make_run(tmp_path, {"baseline": {1: (5.0, 10.0), 2: (15.0, 16.0)},
                              "speculative": {1: (2.0, 12.0), 2: (6.0, 20.0)}})
    result = specdeploy("capacity", run, "--rate", "50", "--tpot-ms", "10", "--gpu-price", "2")
    assert result.returncode == 0, result.stderr
    assert "speculation saves" in result.stdout and "per M output tokens" in result.stdout
    missing = specdeploy("capacity", run, "--tpot-ms", "10")
    assert missing.returncode == 2 and "--rate" in missing.stderr


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "configs").glob("*.yaml")
                                          if "tiny-cpu" not in p.name and "baseline" not in p.name))
def test_every_shipped_gpu_config_gets_a_forecast_capacity(config):
    result = specdeploy("capacity", ROOT / "configs" / config, "--rate", "100", "--tpot-ms", "30",
                        "--acceptance", "0.7", "--gpu-price", "3", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["capacity"]["source"] == "forecast"
    assert all(arm["gpus"] for arm in answer["fleet"]["arms"].values())


@pytest.mark.slow
def test_a_config_with_a_capacity_section_gets_it_in_its_report_and_on_the_first_screen(tmp_path):
    from pipeline.config.sections import CapacitySettings
    from pipeline.report.builder import config_from_run, prepare
    from pipeline.report.view.summary import decision

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    cfg = config_from_run(run)
    cfg = cfg.model_copy(update={"capacity": CapacitySettings(rate_rps=30.0, gpu_hour_usd=2.0)})
    data, _, _ = prepare(run, cfg)
    section = data["capacity"]
    assert section["available"], section
    assert section["fleet"]["arms"]["speculative"]["gpus"] >= 1
    line = next(f for f in decision(data)["findings"] if f.startswith("Capacity at p95"))
    assert "30 req/s needs" in line and "with speculation" in line and "without" in line


def test_a_capacity_section_needs_one_demand():
    from pipeline.config.sections import CapacitySettings

    with pytest.raises(ValueError, match="one of them"):
        CapacitySettings(gpu_hour_usd=2.0)
    with pytest.raises(ValueError, match="24 hourly"):
        CapacitySettings(daily_profile=[1.0] * 23)
