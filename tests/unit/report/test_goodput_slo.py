"""Goodput at the SLO: per request, TTFT, TPOT and E2E each against its bound (a bound not set is no
SLO, vLLM's --goodput rule); per run, requests/s and output tokens/s meeting all; per arm and level,
each SLO's percentile against its bound; spec/base with its paired interval; the goodput guardrail
of the gate; and the first screen's line, only when the SLOs are the user's."""

from __future__ import annotations

import json

import pytest

from pipeline.config import GateSettings
from pipeline.report import stats
from pipeline.report.gate import FAIL, PASS, UNSURE, evaluate_gate, goodput_guardrail
from pipeline.report.stats import RunData
from tests.unit.report_fixtures import copy_fixture, slow_down_speculative

MS = 1_000_000


def rec(ttft_ms: float, e2e_ms: float, osl: int, status: str = "ok", pid: int = 1, start_ms: float = 0.0) -> dict:
    t0 = int(start_ms * MS)
    return {"status": status, "t_sent": t0, "t_first_token": t0 + int(ttft_ms * MS), "t_last": t0 + int(e2e_ms * MS),
            "osl": osl, "stage": "measure", "worker_pid": pid}


def test_a_request_meets_every_bound_that_is_set():
    r = rec(ttft_ms=100, e2e_ms=1100, osl=11)  # TPOT = 1000 / 10 = 100 ms
    assert stats.meets_slo(r, 100, 100, 1100)
    assert not stats.meets_slo(r, 100, 100, 1099)  # E2E is an SLO of its own now
    assert not stats.meets_slo(r, 99, None, None) and not stats.meets_slo(r, None, 99, None)
    assert stats.meets_slo(r, None, None, None)  # no bound set: every ok request
    assert stats.meets_slo(rec(50, 60, osl=1), 100, 0.001, None)  # OSL ≤ 1: TPOT counts as 0 (vLLM)
    assert not stats.meets_slo(rec(1, 2, 5, status="error"), None, None, None)


def test_goodput_per_run_in_requests_and_output_tokens():
    # a 2 s window: 3 ok requests, one too slow end to end
    records = [rec(100, 500, 10, start_ms=0), rec(100, 900, 30, start_ms=500), rec(100, 2000, 20, start_ms=0)]
    summary = stats.run_summary(RunData(info={"key": "k"}, records=records), 200, None, 1000)
    assert summary["duration_s"] == pytest.approx(2.0)
    assert summary["goodput_rps"] == pytest.approx(2 / 2.0)
    assert summary["goodput_tokens_per_s"] == pytest.approx((10 + 30) / 2.0)
    assert summary["requests_per_s"] == pytest.approx(3 / 2.0)


def comparison(goodput: tuple) -> dict:
    point, low, high = goodput
    return {"run_level": {"goodput_ratio": {"point": point, "low": low, "high": high, "n_pairs": 3, "center": None,
                                            "sd": None, "confidence_level": 0.95}}}


@pytest.mark.parametrize(("goodput", "status"), [((1.3, 1.1, 1.5), PASS), ((0.5, 0.4, 0.6), FAIL),
                                                 ((0.95, 0.8, 1.1), UNSURE), ((None, None, None), UNSURE)])
def test_the_goodput_guardrail(goodput, status):
    gate = GateSettings(slo={"ttft_ms": 500, "tpot_ms": None, "e2e_ms": 3000})
    check = goodput_guardrail(1, comparison(goodput), gate)
    assert check.rule == "guardrail_goodput" and check.status == status
    assert "TTFT ≤ 500 ms, E2E ≤ 3000 ms" in check.detail and "TPOT" not in check.detail


def _report(tmp_path, slo: dict | None, slow: float | None = None):
    from pipeline.report.builder import prepare

    run_dir = copy_fixture(tmp_path / "run")
    if slow:
        slow_down_speculative(run_dir, slow)
    meta = json.loads((run_dir / "run.json").read_text())
    if slo is not None:
        meta["config"]["gate"]["slo"] = slo
    (run_dir / "run.json").write_text(json.dumps(meta))
    data, analysis, gate = prepare(run_dir)
    return data, analysis, gate


def _base_tpot_p99(tmp_path) -> float:
    run_dir = copy_fixture(tmp_path / "peek")
    values = [stats.tpot_ms(json.loads(line)) for path in (run_dir / "raw").glob("baseline-*.jsonl")
              for line in path.read_text().splitlines()]
    return float(sorted(v for v in values if v is not None)[int(0.99 * len([v for v in values if v]))- 1])


@pytest.mark.budget(6)  # two reports of the fixture run
def test_declared_slos_put_goodput_on_the_first_screen_and_gate_it(tmp_path):
    from pipeline.report.view.summary import decision

    # a run recorded before SLOs could be declared: its default SLOs stay off the first screen and the gate
    data, _, _ = _report(tmp_path / "old", None)
    assert not any(c["rule"] == "guardrail_goodput" for c in data["gate"]["checks"])
    assert not any(line.startswith("Goodput at the SLO") for line in decision(data)["findings"])
    # the user's SLOs, the speculative arm decoding 3× slower than a TPOT bound the baseline meets
    bound = 1.2 * _base_tpot_p99(tmp_path)
    slo = {"ttft_ms": 60000, "tpot_ms": bound, "e2e_ms": None, "percentile": 90, "declared": True}
    data, analysis, _ = _report(tmp_path / "new", slo, slow=3.0)
    line = next(line for line in decision(data)["findings"] if line.startswith("Goodput at the SLO"))
    assert f"TPOT ≤ {bound:.3g}"[:12] in line and "c=1 baseline" in line and "c=2 baseline" in line
    assert "speculative p90 TPOT" in line  # the arm over its bound at the chosen percentile is named
    comp = analysis["comparisons"][0]
    assert comp["goodput"]["base"]["slo"]["metrics"]["tpot"]["met"] is True
    assert comp["goodput"]["spec"]["slo"]["metrics"]["tpot"]["met"] is False
    assert comp["goodput"]["base"]["requests_per_s"] > comp["goodput"]["spec"]["requests_per_s"]
    assert comp["goodput"]["base"]["output_tokens_per_s"] > comp["goodput"]["spec"]["output_tokens_per_s"]
    checks = [c for c in data["gate"]["checks"] if c["rule"] == "guardrail_goodput"]
    assert checks and all(c["status"] == FAIL for c in checks)
    assert data["verdict"] == "NO-GO"


def test_goodput_guardrail_only_with_declared_slos():
    comp = {"concurrency": 1, "primary": True, **comparison((0.5, 0.4, 0.6))}
    for name in ("tpot_ratio", "e2e_ratio", "throughput_ratio"):
        comp["run_level"][name] = {"point": 0.6, "low": 0.5, "high": 0.7}
    comp["run_level"]["ttft_p95_delta_ms"] = {"point": 0.0, "low": -1.0, "high": 1.0}
    comp.update({"pooled_request_level": {}, "base_ttft_p95_ms": 100.0, "n_ok": {"base": 99, "spec": 99},
                 "n_runs": {"base": 3, "spec": 3}, "error_rate": {"base": 0.0, "spec": 0.0},
                 "equivalence": {"equivalent": True, "mismatched": 0, "prompts_compared": 5},
                 "output_length": {"match": True, "base_mean_osl": 9, "spec_mean_osl": 9, "relative_gap": 0.0,
                                   "prompts_compared": 5}, "achieved_concurrency": {"base": 1.0, "spec": 1.0}})
    analysis = {"runs": [], "comparisons": [comp], "greedy": True, "acceptance_rate": 0.8, "crossover_concurrency": None}
    undeclared = evaluate_gate(analysis, GateSettings())
    assert not any(c.rule == "guardrail_goodput" for c in undeclared.checks)
    declared = evaluate_gate(analysis, GateSettings(slo={"ttft_ms": 300}))
    assert [c.status for c in declared.checks if c.rule == "guardrail_goodput"] == [FAIL]
    assert declared.verdict == "NO-GO"
