"""Every rule of the rollout gate (pipeline.report.gate) on synthetic analyses."""

from __future__ import annotations

import copy

import pytest

from pipeline.config import GateSettings
from pipeline.report.gate import EXIT_CODES, evaluate_gate


def ci(point, low, high):
    return {"point": point, "low": low, "high": high}


def comparison(level, *, tpot=(0.6, 0.55, 0.65), e2e=(0.7, 0.65, 0.75), ttft=(5.0, -10.0, 20.0),
               throughput=(1.3, 1.2, 1.4), n_ok=200, n_runs=3, equivalent=True, osl_match=True,
               err_base=0.0, err_spec=0.0, achieved=None):
    achieved = float(level) if achieved is None else achieved
    return {
        "concurrency": level, "draft_len": 4, "primary": True,
        "run_level": {"tpot_ratio": ci(*tpot), "e2e_ratio": ci(*e2e), "ttft_p95_delta_ms": ci(*ttft),
                      "throughput_ratio": ci(*throughput), "goodput_ratio": ci(1.0, 0.9, 1.1)},
        "pooled_request_level": {"tpot_ratio_of_medians": ci(*tpot), "e2e_ratio_of_medians": ci(*e2e)},
        "base_ttft_p95_ms": 100.0,
        "equivalence": {"equivalent": equivalent, "mismatched": 0 if equivalent else 3, "prompts_compared": 10},
        "output_length": {"match": osl_match, "base_mean_osl": 64.0, "spec_mean_osl": 64.0 if osl_match else 40.0,
                          "relative_gap": 0.0 if osl_match else 0.375, "prompts_compared": 10},
        "n_ok": {"base": n_ok, "spec": n_ok}, "n_runs": {"base": n_runs, "spec": n_runs},
        "error_rate": {"base": err_base, "spec": err_spec},
        "achieved_concurrency": {"base": achieved, "spec": achieved},
    }


def analysis(*comps, runs=None, acceptance=0.7, crossover=None):
    runs = runs if runs is not None else [{"key": "baseline-c1-r0", "valid": True, "server_alive": True, "accounted": True}]
    return {"runs": runs, "comparisons": list(comps), "greedy": True, "acceptance_rate": acceptance,
            "crossover_concurrency": crossover}


GOOD = analysis(comparison(1), comparison(8))


def verdict(a, **gate):
    return evaluate_gate(a, GateSettings(**gate))


def test_all_good_is_go_with_exit_code_0():
    result = verdict(GOOD)
    assert result.verdict == "GO" and result.exit_code == 0
    assert EXIT_CODES == {"GO": 0, "NO-GO": 1, "INCONCLUSIVE": 3, "NO DIFFERENCE": 0, "DIFFERENCE": 1}


def test_server_died_is_no_go_even_if_everything_else_is_great():
    dead = analysis(comparison(1), comparison(8),
                    runs=[{"key": "speculative-c8-r0", "valid": False, "server_alive": False, "accounted": True}])
    result = verdict(dead)
    assert result.verdict == "NO-GO" and result.exit_code == 1
    assert any("server died" in r for r in result.reasons)


def test_invalid_run_is_no_go():
    bad = analysis(comparison(1), runs=[{"key": "x", "valid": False, "server_alive": True, "accounted": True}])
    assert verdict(bad).verdict == "NO-GO"


def test_unaccounted_requests_are_no_go():
    bad = analysis(comparison(1), runs=[{"key": "x", "valid": True, "server_alive": True, "accounted": False}])
    assert verdict(bad).verdict == "NO-GO"


def test_errors_above_baseline_are_no_go():
    result = verdict(analysis(comparison(1, err_base=0.0, err_spec=0.05)))
    assert result.verdict == "NO-GO"
    assert any(c.rule == "errors" and c.status == "fail" for c in result.checks)


def test_equivalence_failure_is_no_go():
    result = verdict(analysis(comparison(1, equivalent=False)))
    assert result.verdict == "NO-GO"
    assert any(c.rule == "output_equivalence" and c.status == "fail" for c in result.checks)


def test_equivalence_not_required_when_sampling():
    a = analysis(comparison(1, equivalent=False))
    a["greedy"] = False
    assert verdict(a).verdict == "GO"


def test_output_length_mismatch_is_no_go():
    assert verdict(analysis(comparison(1, osl_match=False))).verdict == "NO-GO"


def test_too_few_requests_is_inconclusive():
    result = verdict(analysis(comparison(1, n_ok=5)), min_requests_per_cell=20)
    assert result.verdict == "INCONCLUSIVE" and result.exit_code == 3


def test_too_few_runs_is_inconclusive():
    assert verdict(analysis(comparison(1, n_runs=1)), min_runs=2).verdict == "INCONCLUSIVE"


def test_benefit_ci_below_threshold_is_go():
    assert verdict(analysis(comparison(1, tpot=(0.7, 0.6, 0.85), e2e=(0.8, 0.7, 0.88)))).verdict == "GO"


def test_benefit_ci_straddling_threshold_is_inconclusive():
    result = verdict(analysis(comparison(1, tpot=(0.88, 0.8, 0.95))))
    assert result.verdict == "INCONCLUSIVE"
    assert any(c.rule == "benefit_tpot_ratio" and c.status == "inconclusive" for c in result.checks)


def test_benefit_ci_entirely_above_one_is_no_go():
    result = verdict(analysis(comparison(1, tpot=(1.2, 1.1, 1.3))))
    assert result.verdict == "NO-GO"


def test_missing_ci_is_inconclusive():
    assert verdict(analysis(comparison(1, tpot=(0.5, None, None)))).verdict == "INCONCLUSIVE"


def test_ttft_guardrail():
    fail = verdict(analysis(comparison(1, ttft=(400.0, 300.0, 500.0))), ttft_p95_delta_ms_max=250, ttft_p95_delta_pct_max=50)
    assert fail.verdict == "NO-GO"
    assert any(c.rule == "guardrail_ttft_p95" and c.status == "fail" for c in fail.checks)
    straddle = verdict(analysis(comparison(1, ttft=(200.0, 100.0, 300.0))), ttft_p95_delta_ms_max=250)
    assert straddle.verdict == "INCONCLUSIVE"


def test_peak_throughput_guardrail():
    low = comparison(8, throughput=(0.7, 0.6, 0.8))
    strict = verdict(analysis(comparison(1), low), allow_cutoff_above_crossover=False)
    assert strict.verdict == "NO-GO"
    assert any(c.rule == "guardrail_peak_throughput" and c.status == "fail" for c in strict.checks)
    # with a crossover above every target level, the rollout disables speculation from there: GO + advice
    cutoff = verdict(analysis(comparison(1), low, crossover=8), target_concurrency=[1])
    assert cutoff.verdict == "GO"
    assert any("disable speculation at concurrency >= 8" in a for a in cutoff.advice)


def test_low_acceptance_warns_and_the_measured_benefit_decides():
    # issue 42: vLLM's n-gram measured TPOT 0.78x with confidence at 39.9 % acceptance and was NO-GO
    # solely for the 50 % floor; the floor is a rule of thumb, the measurement decides
    result = verdict(analysis(comparison(1), acceptance=0.3))
    assert result.verdict == "GO"
    check = next(c for c in result.checks if c.rule == "acceptance_rate")
    assert check.status == "warning" and "usually does not pay" in check.detail
    assert any("acceptance_rate" in r for r in result.reasons)  # the warning is listed with its explanation


def test_low_acceptance_is_no_go_where_the_config_makes_it_a_gate():
    result = verdict(analysis(comparison(1), acceptance=0.3), acceptance_is_gate=True)
    assert result.verdict == "NO-GO"
    assert any("turn speculation off" in a for a in result.advice)


def test_low_acceptance_without_a_measured_benefit_stays_inconclusive():
    result = verdict(analysis(comparison(1, tpot=(0.88, 0.8, 0.95)), acceptance=0.3))
    assert result.verdict == "INCONCLUSIVE"


def test_straddling_check_says_how_many_repeats_would_decide_it():
    # a paired interval with its spread: the gate estimates the repeats from the SD and the distance
    import math

    tpot = {"point": 0.8, "low": 0.6, "high": 1.05, "center": math.log(0.8), "sd": 0.1, "n_pairs": 2,
            "scale": "log", "confidence_level": 0.95}
    comp = comparison(1)
    comp["run_level"]["tpot_ratio"] = tpot
    result = verdict(analysis(comp))
    assert result.verdict == "INCONCLUSIVE"
    check = next(c for c in result.checks if c.rule == "benefit_tpot_ratio")
    # |log 0.8 - log 0.9| = 0.118; t(0.975, n-1) * 0.1 / sqrt(n) < 0.118 first at n = 6
    assert check.value["repeats_to_decide"] == 6 and "about 6 paired repeats (4 more)" in check.detail
    assert result.repeats_to_decide == 6
    assert any("about 6 paired repeats per arm (4 more)" in a for a in result.advice)


def test_achieved_concurrency_off_target_is_inconclusive():
    assert verdict(analysis(comparison(4, achieved=3.0)), target_concurrency=[4]).verdict == "INCONCLUSIVE"


def test_target_concurrency_not_measured_is_inconclusive():
    assert verdict(copy.deepcopy(GOOD), target_concurrency=[64]).verdict == "INCONCLUSIVE"


@pytest.mark.parametrize("level", [1, 8])
def test_each_target_level_is_gated(level):
    comps = {1: comparison(1), 8: comparison(8)}
    comps[level] = comparison(level, tpot=(1.3, 1.2, 1.4))
    assert verdict(analysis(*comps.values()), target_concurrency=[1, 8]).verdict == "NO-GO"


def test_saturated_client_is_inconclusive():
    runs = [{"key": "spec-c64-r0", "valid": True, "server_alive": True, "accounted": True, "client_cpu_fraction": 0.97}]
    result = verdict(analysis(comparison(1), runs=runs))
    assert result.verdict == "INCONCLUSIVE"
    assert any(c.rule == "client_saturation" for c in result.checks)


def test_open_loop_skips_achieved_concurrency():
    comp = comparison(1, achieved=7.5)
    comp["target_rate"] = 20.0
    assert verdict(analysis(comp)).verdict == "GO"


def test_failing_baseline_is_inconclusive():
    result = verdict(analysis(comparison(1, err_base=0.3, err_spec=0.3)))
    assert result.verdict == "INCONCLUSIVE"
    assert any(c.rule == "baseline_errors" for c in result.checks)
