"""The recommended rollout range (pipeline.report.rollout_range) holds every check the gate applies
at a gated level: a level below the crossover that fails one is left out and named with the
check, in report.json and in the banner; the verdict itself is the gate's, unchanged."""

from __future__ import annotations

import json

import pytest

from pipeline.config import GateSettings
from pipeline.report.gate import evaluate_gate
from pipeline.report.rollout_range import rollout_range
from pipeline.report.view.summary import decision, rollout
from tests.unit.report.test_gate import analysis, ci, comparison
from tests.unit.report_fixtures import copy_fixture, worsen_tail


def with_tail(comp: dict, e2e_p95=(1.0, 0.9, 1.1)) -> dict:
    comp["run_level"]["e2e_p95_ratio"] = ci(*e2e_p95)
    return comp


def issue_analysis() -> dict:
    """The issue's run: TPOT pays at every level (no crossover), but at 8 E2E p95 is worse."""
    return analysis(with_tail(comparison(1)), with_tail(comparison(2)), with_tail(comparison(4)),
                    with_tail(comparison(8), e2e_p95=(1.29, 1.24, 1.35)))


def report_data(a: dict, **gate) -> dict:
    """What decision() reads of report.json, built as builder.build_report_data does."""
    settings = GateSettings(**gate)
    result = evaluate_gate(a, settings)
    return {"verdict": result.verdict, "exit_code": result.exit_code, "gate": result.as_dict(),
            "crossover_concurrency": a["crossover_concurrency"], "comparisons": a["comparisons"],
            "rollout_range": rollout_range(a, settings), "advice": [], "cells": [], "acceptance_rate": 0.7,
            "gate_settings": settings.model_dump(mode="json"), "greedy": True}


def test_a_level_whose_tail_is_worse_with_confidence_is_left_out_and_named():
    data = report_data(issue_analysis())
    window = data["rollout_range"]
    assert window["levels"] == [1, 2, 4] and window["up_to"] == 4
    assert [e["concurrency"] for e in window["excluded"]] == [8]
    assert [c["rule"] for c in window["excluded"][0]["checks"]] == ["tail_e2e_p95"]
    banner = decision(data)
    assert data["verdict"] == "GO"  # the gate checks c=1 (the default target): unchanged
    assert banner["rollout"] == ("Recommended rollout: enable up to concurrency 4; at 8, E2E p95 is 1.29× baseline "
                                 "[1.24, 1.35], worse with confidence (tail guardrail).")
    # the headline is worded from the same range: it does not say "still pays at 8"
    assert banner["sentence"].endswith("and pays up to concurrency 4; at 8, E2E p95 is 1.29× baseline [1.24, 1.35], "
                                       "worse with confidence (tail guardrail).")
    # what the old code said on the same records
    assert "up to 8" not in banner["rollout"]


def test_the_range_stops_at_the_first_failing_level_even_if_a_higher_one_passes():
    a = analysis(with_tail(comparison(1)), with_tail(comparison(2), e2e_p95=(1.2, 1.1, 1.3)),
                 with_tail(comparison(4)))
    window = rollout_range(a, GateSettings())
    assert window["levels"] == [1] and window["up_to"] == 1
    assert rollout(report_data(a)).startswith("enable up to concurrency 1; at 2, E2E p95 is 1.20× baseline [1.10, 1.30]")


def test_every_gate_check_of_a_gated_level_applies():
    """Errors above the baseline's, a median E2E that is slower with confidence, a TTFT p95 over
    the guardrail: each leaves its level out, named with the rule."""
    cases = {"errors": dict(err_spec=0.2), "benefit_e2e_ratio": dict(e2e=(1.2, 1.1, 1.3)),
             "guardrail_ttft_p95": dict(ttft=(500.0, 400.0, 600.0)), "output_equivalence": dict(equivalent=False)}
    for rule, bad in cases.items():
        a = analysis(with_tail(comparison(1)), with_tail(comparison(4, **bad)))
        window = rollout_range(a, GateSettings())
        assert window["levels"] == [1], rule
        assert rule in [c["rule"] for c in window["excluded"][0]["checks"]], rule
        assert f"at 4, {'E2E is 1.20× baseline' if rule == 'benefit_e2e_ratio' else rule}" in rollout(report_data(a))


def test_inconclusive_checks_do_not_shrink_the_range_and_the_crossover_still_bounds_it():
    straddling = dict(tpot=(0.9, 0.7, 1.05), n_runs=1)  # straddles and too few runs: inconclusive, not failed
    a = analysis(with_tail(comparison(1)), with_tail(comparison(2, **straddling)), with_tail(comparison(4)),
                 crossover=4)
    window = rollout_range(a, GateSettings())
    assert window["levels"] == [1, 2] and window["excluded"] == []
    assert rollout(report_data(a)) == "enable up to concurrency 2, disable from 4"


def test_a_gated_level_whose_tail_is_worse_stays_in_the_range_with_a_caution():
    """GO at the gated level never comes with "do not enable": the tail there is named beside the
    range (the old code emptied the range under a GO)."""
    a = analysis(with_tail(comparison(1), e2e_p95=(1.5, 1.3, 1.7)), with_tail(comparison(2)))
    window = rollout_range(a, GateSettings())
    assert window["up_to"] == 2 and window["excluded"] == [] and [c["concurrency"] for c in window["cautions"]] == [1]
    banner = decision(report_data(a))
    assert banner["verdict"] == "GO" and "do not enable" not in banner["rollout"]
    assert ("1.67× faster per user (TPOT 0.60× baseline [0.55, 0.65], 95% CI), though its E2E p95 is 1.50× baseline "
            "[1.30, 1.70], worse with confidence (tail guardrail), and still pays") in banner["sentence"]
    assert ("caution at 1 (gated), E2E p95 is 1.50× baseline [1.30, 1.70], worse with confidence (tail guardrail)"
            in banner["rollout"])
    assert "Worse with speculation, with 95% confidence: c=1 E2E p95 1.50× baseline [1.30, 1.70]." in banner["findings"]


def test_target_concurrency_gates_the_excluded_level():
    """With gate.target_concurrency the user gates the level themselves: a failed check there is a NO-GO."""
    a = analysis(with_tail(comparison(1)), with_tail(comparison(8, e2e=(1.2, 1.1, 1.3))))
    assert evaluate_gate(a, GateSettings()).verdict == "GO"
    assert evaluate_gate(a, GateSettings(target_concurrency=[8])).verdict == "NO-GO"


@pytest.mark.slow  # over the quick tier's CPU budget (renders a whole report)
def test_report_json_carries_the_range(tmp_path):
    from pipeline.report.builder import make_report

    # the fixture's speculative tail at c=1 made worse (its slowest fifth decodes 4x slower): E2E p95
    # at c=1 is worse with confidence; the gate (c=1 by default, no tail check) says GO, so c=1
    # stays in the range with the tail named as a caution (the old range was empty: "do not
    # enable" under a GO)
    run = worsen_tail(copy_fixture(tmp_path / "run"), 4.0, concurrency=1, share=0.2)
    report = make_report(run)
    data = json.loads(report.json_path.read_text())
    window = data["rollout_range"]
    assert set(window) >= {"levels", "up_to", "crossover", "excluded", "measured"}
    assert window["measured"] == [1, 2] and window["crossover"] is None
    assert data["verdict"] == "GO"
    assert window["levels"] == [1, 2] and window["excluded"] == []
    assert window["cautions"][0]["concurrency"] == 1 and window["cautions"][0]["checks"][0]["rule"] == "tail_e2e_p95"
    assert "caution at 1 (gated), E2E p95 is" in report.md_path.read_text()
