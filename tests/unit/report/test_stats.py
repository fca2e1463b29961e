"""Statistics on synthetic records and samples with known answers (pipeline.report.stats)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.report import comparison, stats
from pipeline.report.comparison import BootstrapSettings
from pipeline.report.stats import RunData

MS = 1_000_000


def record(t_sent=0, ttft=100, tpot=10, osl=11, tokens_per_chunk=1, status="ok", pid=1, prompt_id="p", text="x",
           stage="measure", drafted=None, accepted=None, category="c"):
    """A raw record whose first chunk carries one token and later chunks ``tokens_per_chunk``."""
    t_first = t_sent + ttft * MS
    chunks, tokens, t = [t_first], [1], t_first
    left = osl - 1
    while left > 0:
        n = min(tokens_per_chunk, left)
        t += int(n * tpot * MS)
        chunks.append(t)
        tokens.append(n)
        left -= n
    return {"t_sent": t_sent, "t_scheduled": None, "t_first_token": t_first if osl else None,
            "t_last": chunks[-1], "chunk_times": chunks, "tokens_per_chunk": tokens, "n_chunks": len(chunks),
            "osl": osl, "status": status, "worker_pid": pid, "prompt_id": prompt_id, "category": category,
            "output_sha256": text, "stage": stage, "draft_tokens": drafted, "accepted_tokens": accepted}


def test_tpot_formula_and_one_token_outputs():
    rec = record(ttft=100, tpot=10, osl=11)
    assert stats.ttft_ms(rec) == pytest.approx(100)
    assert stats.e2e_ms(rec) == pytest.approx(200)
    assert stats.tpot_ms(rec) == pytest.approx(10)  # (200 − 100) / (11 − 1)
    one = record(ttft=50, osl=1)
    assert stats.tpot_ms(one) is None  # no decode interval for a 1-token output
    assert stats.e2e_ms(one) == pytest.approx(50)
    # goodput: OSL ≤ 1 counts TPOT as 0, so only TTFT decides
    assert stats.meets_slo(one, slo_ttft_ms=60, slo_tpot_ms=1)
    assert not stats.meets_slo(one, slo_ttft_ms=40, slo_tpot_ms=1)


def test_multi_token_chunks_tpot_vs_chunk_gap():
    rec = record(ttft=100, tpot=5, osl=13, tokens_per_chunk=3)  # chunks of 3 tokens every 15 ms
    assert stats.tpot_ms(rec) == pytest.approx(5)
    assert stats.chunk_gaps_ms(rec) == pytest.approx([15, 15, 15, 15])


def test_percentiles_equal_numpy():
    rng = np.random.default_rng(3)
    values = list(rng.lognormal(3, 0.7, size=501))
    out = stats.percentiles(values + [None])
    for q in (50, 90, 95, 99):
        assert out[f"p{q}"] == np.percentile(values, q)
    assert out["mean"] == pytest.approx(np.mean(values))
    assert out["n"] == 501


def test_throughput_denominator_is_first_send_to_last_response():
    # worker 1: sends at 0 s and 1 s, each E2E 1 s (100 ms TTFT + 9 × 100 ms) → window 2 s
    recs = [record(t_sent=0, ttft=100, tpot=100, osl=10), record(t_sent=1_000 * MS, ttft=100, tpot=100, osl=10)]
    duration, windows = stats.measured_window(recs)
    assert duration == pytest.approx(2.0)
    run = RunData(info={"key": "k", "arm": "baseline", "concurrency": 1}, records=recs)
    summary = stats.run_summary(run, 1000, 1000)
    assert summary["output_tokens_per_s"] == pytest.approx(20 / 2.0)
    assert summary["requests_per_s"] == pytest.approx(1.0)
    assert summary["achieved_concurrency"] == pytest.approx(1.0)


def test_warmup_records_are_excluded_from_run_summary():
    recs = [record(t_sent=0, stage="warmup", ttft=900), record(t_sent=2_000 * MS, ttft=100)]
    summary = stats.run_summary(RunData(info={"key": "k"}, records=recs), 1000, 1000)
    assert summary["n_measured"] == 1 and summary["n_warmup"] == 1
    assert summary["median_ttft_ms"] == pytest.approx(100)


def test_bootstrap_ci_covers_a_known_shift():
    rng = np.random.default_rng(0)
    base = list(20 + rng.normal(0, 0.5, size=6))
    spec = list(14 + rng.normal(0, 0.5, size=6))  # true ratio 0.7
    ci = comparison.bootstrap_ci(spec, base, "ratio", BootstrapSettings(n_resamples=2000, seed=1))
    assert ci["low"] < 0.7 < ci["high"]
    assert ci["high"] < 0.9
    assert ci["method"] == "percentile" and ci["seed"] == 1 and ci["n_resamples"] == 2000
    again = comparison.bootstrap_ci(spec, base, "ratio", BootstrapSettings(n_resamples=2000, seed=1))
    assert again == ci  # fixed seed → reproducible


def test_bootstrap_no_shift_straddles_one_and_gate_is_inconclusive():
    from pipeline.config import GateSettings
    from pipeline.report.gate import _ratio_check

    rng = np.random.default_rng(5)
    base = list(20 + rng.normal(0, 1, size=5))
    spec = list(20 + rng.normal(0, 1, size=5))
    ci = comparison.bootstrap_ci(spec, base, "ratio", BootstrapSettings(n_resamples=2000, seed=0))
    assert ci["low"] < 1.0 < ci["high"]
    check = _ratio_check("benefit_tpot_ratio", "c=1", {**ci, "level": "run"}, GateSettings().tpot_ratio_max)
    assert check.status == "inconclusive"


def test_bootstrap_needs_two_replicates():
    ci = comparison.bootstrap_ci([1.0], [2.0], "ratio", BootstrapSettings(n_resamples=200))
    assert ci["point"] == pytest.approx(0.5) and ci["low"] is None


def test_mann_whitney_cliffs_delta():
    out = comparison.mann_whitney([1, 2, 3], [10, 11, 12])
    assert out["cliffs_delta"] == pytest.approx(-1.0) and out["effect"] == "large"
    same = comparison.mann_whitney([1, 2, 3, 4], [1, 2, 3, 4])
    assert same["cliffs_delta"] == pytest.approx(0.0) and same["effect"] == "negligible"


def _comparison(low, high, point):
    ci = {"low": low, "high": high, "point": point}
    return {"run_level": {"tpot_ratio": ci}, "pooled_request_level": {"tpot_ratio_of_medians": ci}}


def test_crossover_is_lowest_level_without_benefit():
    levels = [(1, _comparison(0.5, 0.6, 0.55)), (4, _comparison(0.8, 0.95, 0.9)), (16, _comparison(0.95, 1.1, 1.0)),
              (64, _comparison(1.1, 1.2, 1.15))]
    assert comparison.find_crossover(levels) == 16
    assert comparison.find_crossover(levels[:2]) is None


def test_output_equivalence_and_length_match():
    base = [record(prompt_id="a", text="h1"), record(prompt_id="b", text="h2")]
    same = [record(prompt_id="a", text="h1"), record(prompt_id="b", text="h2")]
    differ = [record(prompt_id="a", text="h1"), record(prompt_id="b", text="zz", osl=5)]
    assert comparison.output_equivalence(base, same)["equivalent"]
    bad = comparison.output_equivalence(base, differ)
    assert not bad["equivalent"] and bad["mismatched_ids"] == ["b"]
    assert comparison.output_length_match(base, same)["match"]
    assert not comparison.output_length_match(base, differ)["match"]


def test_acceptance_pooled_token_weighted_and_tau():
    recs = [record(osl=13, tokens_per_chunk=3, drafted=12, accepted=8),  # 5 chunks: 4 verify steps
            record(osl=13, tokens_per_chunk=3, drafted=8, accepted=0)]
    acc = stats.acceptance_summary(recs, [])
    assert acc["acceptance_rate"] == pytest.approx(8 / 20)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + 8 / 8)
    acc = stats.acceptance_summary(recs, [{"draft_tokens": 20, "accepted_tokens": 8, "verify_steps": 4}])
    assert acc["mean_acceptance_length"] == pytest.approx(3.0) and acc["tau_source"] == "prometheus"


def test_incomplete_at_stop_counted_and_accounted():
    recs = [record(), record(status="incomplete_at_stop")]
    run = RunData(info={"key": "k"}, records=recs, workers=[{"pid": 1, "sent": 2}])
    summary = stats.run_summary(run, 1000, 1000)
    assert summary["incomplete_at_stop"] == 1 and summary["accounted"]
    lost = stats.run_summary(RunData(info={"key": "k"}, records=recs, workers=[{"pid": 1, "sent": 3}]), 1000, 1000)
    assert not lost["accounted"]


def test_no_reported_value_comes_from_locust_buckets():
    import inspect

    import pipeline.report.builder
    import pipeline.report.gate

    for module in (stats, comparison, pipeline.report.builder, pipeline.report.gate):
        assert "get_response_time_percentile" not in inspect.getsource(module)


def test_achieved_concurrency_counts_warmup_overlap_and_inflight_at_stop():
    # 2 users back to back, 1 s requests, window from the first measured send (t=1 s) to the stop (t=3 s);
    # user 1's warm-up request still runs until 1.5 s and its last request is cut by the stop
    recs = []
    for user in range(2):
        for k in range(3):
            start = k * 1_000 * MS + user * 500 * MS  # user 1 runs half a request behind user 0
            recs.append(record(t_sent=start, ttft=100, tpot=100, osl=10, stage="warmup" if k == 0 else "measure"))
    inflight = record(t_sent=3_000 * MS - 10, ttft=100, tpot=100, osl=10, status="incomplete_at_stop")
    measured = [r for r in recs if r["stage"] == "measure"]
    value = stats.achieved_concurrency(recs + [inflight], {1: 3_000 * MS}, measured)
    assert value == pytest.approx(2.0, abs=0.01)
