"""The report's intervals keep their 95 % and the gate's false-GO rate stays ≤ 5 %, at fixed repeats
and with `repeats: auto`'s optional stopping — and the same checks fail on the method the report
used before issue 42 (negative controls). Simulation: tests/unit/interval_simulation.py (A/A and
A/B with known effects, 2/3/5/10 repeat pairs, run-level log-normal noise CV 5–30 %, slow drift);
the full tables: benchmarks/bench_intervals.py → benchmarks/results/intervals.json."""

from __future__ import annotations

import pytest

from tests.unit.interval_simulation import (
    CVS,
    N_PAIRS,
    auto_rates,
    coverage,
    gate_rates,
    new_interval,
    old_bootstrap,
)

MIN_COVERAGE = 0.93  # a nominal 95 % interval, within simulation error
MAX_FALSE_GO = 0.05


def undercovered(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["coverage"] < MIN_COVERAGE]


@pytest.mark.slow  # a few seconds of vectorised simulation (4000 trials x 48 settings)
def test_the_reports_interval_holds_95_percent_at_2_to_10_repeats():
    rows = coverage(new_interval)
    assert {(r["n"], r["cv"]) for r in rows} == {(n, cv) for n in N_PAIRS for cv in CVS}
    assert undercovered(rows) == []


@pytest.mark.slow
def test_the_same_check_fails_on_the_old_bootstrap():
    # negative control: the unpaired percentile bootstrap of mean(spec)/mean(base) the report used
    rows = coverage(old_bootstrap, trials=1000, n_pairs=(2, 3), cvs=(0.05, 0.3), effects=(1.0,))
    assert undercovered(rows) == rows  # every one of these settings misses
    assert min(r["coverage"] for r in rows) < 0.75  # at 2 runs per arm it covers about 2 times in 3


@pytest.mark.slow
@pytest.mark.parametrize("n", N_PAIRS)
def test_gate_false_go_at_most_5_percent(n):
    # a GO is false when the true TPOT/E2E ratio is not below tpot_ratio_max (0.9): at 0.9 and at 1 (A/A)
    for cv in (0.05, 0.3):
        for effect in (1.0, 0.9):
            assert gate_rates(n, cv, effect, trials=400)["go"] <= MAX_FALSE_GO, (n, cv, effect)
    assert gate_rates(n, 0.3, 1.0, trials=400)["no_go"] <= 0.08  # A/A "speculation is slower": rare


@pytest.mark.slow
def test_gate_false_go_fails_on_the_old_bootstrap():
    assert gate_rates(2, 0.05, 0.9, trials=400, method="old")["go"] > MAX_FALSE_GO
    assert gate_rates(2, 0.3, 1.0, trials=400, method="old")["no_go"] > 0.2  # the A/A NO-GOs


@pytest.mark.slow
def test_gate_decides_a_clear_benefit():
    # power, so the intervals are not merely wide: speculation at half the TPOT, CV 10 %, is a GO at
    # 5 repeats (at 3 the t quantile with 2 df, 4.3, leaves about one run in ten undecided)
    assert gate_rates(5, 0.1, 0.5, trials=200)["go"] >= 0.95


@pytest.mark.slow
def test_auto_repeats_false_go_with_stopping_at_most_5_percent():
    for cv in (0.05, 0.3):
        for effect in (1.0, 0.9):
            assert auto_rates(cv, effect, trials=300)["go"] <= MAX_FALSE_GO, (cv, effect)
    clear = auto_rates(0.1, 0.5, trials=200)
    assert clear["go"] >= 0.95 and clear["median_repeats"] < clear["max_repeats"]  # it stops when decided


@pytest.mark.slow
def test_stopping_without_alpha_spending_breaks_the_bound():
    # negative control for the stopping rule: every look at 95 % (no spending) lets false GOs through
    assert auto_rates(0.05, 0.9, trials=400, spend=False)["go"] > MAX_FALSE_GO
