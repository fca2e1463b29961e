"""The forecast's band covers every input it rests on (issue 48, deliverable 2): a simulation of
inputs drawn inside their ranges stays inside it (and falls outside the old efficiency-only band:
the negative control); the crossover and best K carry intervals; nothing is forecast beyond what
the deployment can run; a regime where the model is known to miss is flagged."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.forecast import acceptance as acc
from pipeline.forecast import uncertainty
from pipeline.forecast.model import Band, config_inputs, crossover, forecast, speedup_at, speedup_of, step_times

ROOT = Path(__file__).resolve().parents[3]
DRAFT_CFG = ROOT / "configs" / "llama31-8b-draft1b-fp8-h100.yaml"
EAGLE3_CFG = ROOT / "configs" / "llama31-8b-eagle3-llmapi-h100.yaml"


@pytest.fixture(scope="module")
def draft_inputs():
    return config_inputs(load_config(DRAFT_CFG), acc.from_alpha(0.7))


def _old_band(inp, batch):
    """The band before issue 48: acceptance edges × the efficiency band only."""
    values = []
    for edge in ("low", "high"):
        tau = inp.acceptance.tau_at(inp.plan.depth, edge, inp.plan.tree, batch)
        for factor in (1 - inp.band, 1 + inp.band):
            base, spec = step_times(inp, batch, inp.plan, tau, inp.device.scaled(factor))
            values.append(base / spec)
    return min(values), max(values)


def test_the_per_step_overhead_the_issue_names_stays_inside_the_band(draft_inputs):
    """0.25 / 0.5 / 1.0 ms of per-step overhead move the c=1 speedup from 1.21× to 0.99×: with a
    measured τ the old band (efficiency only, about ±7 %) left them out, the new one holds all three."""
    measured = acc.Acceptance("a run's τ", tau=2.77, tau_low=2.77, tau_high=2.77, at_depth=draft_inputs.plan.depth)
    inp = replace(draft_inputs, acceptance=measured)
    band = Band.of(inp)
    low, high = band.at(1)
    old_low, old_high = _old_band(inp, 1)
    speedups = [speedup_at(replace(inp, device=inp.device.with_overhead(ms)), 1) for ms in (0.25, 0.5, 1.0)]
    assert all(low <= s <= high for s in speedups), (low, high, speedups)
    assert not all(old_low <= s <= old_high for s in speedups), (old_low, old_high, speedups)  # negative control


def _draw(inp, rng):
    """One set of inputs drawn inside every range the band claims to cover (acceptance: its α band)."""
    moved = inp
    for r in uncertainty.input_ranges(inp):
        moved = uncertainty._moved(moved, r.name, rng.uniform(r.low, r.high))
    a = inp.acceptance
    alpha = rng.uniform(a.alpha_low, a.alpha_high)
    return replace(moved, acceptance=acc.from_alpha(alpha, band=0.0))


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_inputs_drawn_inside_their_ranges_stay_inside_the_band_and_escape_the_old_one(draft_inputs, batch):
    """Simulation: 150 draws of every input inside its range. The band is a box over those ranges,
    so every draw's speedup lies inside it; the efficiency-only band (the negative control) misses
    most of them."""
    rng = random.Random(48)
    inp = draft_inputs
    band = Band.of(inp)
    low, high = uncertainty.speedup_range(speedup_of(batch), band.corners)
    old_low, old_high = _old_band(inp, batch)
    values = [speedup_at(_draw(inp, rng), batch) for _ in range(150)]
    inside = sum(low - 1e-9 <= v <= high + 1e-9 for v in values)
    inside_old = sum(old_low <= v <= old_high for v in values)
    assert inside == len(values)
    assert inside_old < 0.6 * len(values), inside_old


def test_the_model_error_widens_the_band_by_its_recorded_range(draft_inputs):
    band = Band.of(draft_inputs)
    assert band.error is not None and band.error.points >= 10
    assert band.error.low < 0 < band.error.high
    corners_only = uncertainty.speedup_range(speedup_of(1), band.corners)
    low, high = band.at(1)
    assert low == pytest.approx(min(corners_only) / (1 + band.error.high), rel=0.05)
    assert low < min(corners_only) and high > max(corners_only)


def test_the_crossover_has_an_interval_that_holds_the_crossovers_of_the_overheads_it_covers(draft_inputs):
    fc = forecast(draft_inputs, [1, 8])
    cross = fc["crossover"]
    assert cross["earliest"] is not None and cross["earliest"] <= cross["point"]
    for ms in (0.25, 1.0):
        moved = crossover(replace(draft_inputs, device=draft_inputs.device.with_overhead(ms)))
        assert moved is None or cross["earliest"] <= moved
        assert moved is None or cross["latest"] is None or moved <= cross["latest"]


def test_best_k_carries_the_range_of_k_that_is_best_somewhere_in_the_band(draft_inputs):
    row = forecast(draft_inputs, [1])["levels"][0]
    low, high = row["best"]["draft_len_range"]
    assert low <= row["best"]["draft_len"] <= high and low < high


def test_no_crossover_or_level_is_forecast_beyond_max_batch_size():
    """A config whose engines take 16 sequences gets no crossover of 48 or 256: the search stops at
    its limit and says which limit; a level beyond it is refused, naming the limit."""
    cfg = load_config(EAGLE3_CFG)
    assert cfg.build.max_batch_size == 16
    inp = config_inputs(cfg, acc.from_alpha(0.7))
    fc = forecast(inp, [1, 16, 32])
    assert fc["limit"]["sequences"] == 16 and "build.max_batch_size" in fc["limit"]["set_by"]
    assert fc["crossover"]["searched_up_to"] == 16
    assert fc["crossover"]["point"] is None or fc["crossover"]["point"] <= 16
    refused = fc["levels"][2]
    assert refused["concurrency"] == 32 and "build.max_batch_size" in refused["refused"] and "speedup" not in refused


def test_the_kv_capacity_limits_the_concurrency_when_it_is_the_smaller():
    cfg = load_config(EAGLE3_CFG)
    cfg = cfg.model_copy(update={"build": cfg.build.model_copy(update={"max_batch_size": 100000})})
    inp = config_inputs(cfg, acc.from_alpha(0.7))
    assert "KV capacity" in inp.limit.name and inp.limit.sequences < 100000


def test_an_h100_forecast_at_batch_16_and_beyond_says_the_model_is_known_to_miss_there():
    inp = config_inputs(load_config(EAGLE3_CFG), acc.from_alpha(0.7))
    fc = forecast(inp, [8, 16])
    at8, at16 = fc["levels"]
    assert not any("known miss" in w for w in at8["warnings"])
    assert any("known miss" in w and "eagle3-llama31-8b-sglang-h100-batch" in w for w in at16["warnings"])
    assert any("no published case" in w for w in fc["warnings"])  # nothing the model reproduces runs on an H100
    plain = uncertainty.with_model_error(*uncertainty.speedup_range(speedup_of(16), Band.of(inp).corners),
                                         Band.of(inp).error)
    assert at16["band"][0] < round(plain[0], 3)  # widened by the miss
