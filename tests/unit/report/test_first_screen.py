"""One message on the report's first screen (issue 42.5): the verdict, the recommended range and the
crossover never contradict one another; a level or prompt category where speculation is worse with
confidence is named there; the tail percentiles and acceptance per request / by draft position
are on the page and in report.json."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from pipeline.report import per_request
from pipeline.report.view.summary import decision
from tests.unit.report.test_gate import analysis, comparison
from tests.unit.report.test_rollout_range import report_data, with_tail

WORSE_TAIL = (1.18, 1.10, 1.25)


def _issue_report(**gate) -> dict:
    """The issue's report: TPOT pays at 1, 2, 4 and 8 (no crossover); at 4 E2E p95 is 1.18× baseline."""
    return report_data(analysis(with_tail(comparison(1)), with_tail(comparison(2)),
                                with_tail(comparison(4), e2e_p95=WORSE_TAIL), with_tail(comparison(8))), **gate)


def test_the_headline_does_not_say_pays_at_8_when_the_tail_fails_at_4():
    banner = decision(_issue_report())
    assert banner["verdict"] == "GO"
    # the old first screen: "... and still pays at the highest measured concurrency, 8." beside
    # "Recommended rollout: enable up to concurrency 2; at 4, E2E p95 is 1.18× baseline"
    assert "highest measured concurrency" not in banner["sentence"]
    reason = "at 4, E2E p95 is 1.18× baseline [1.10, 1.25], worse with confidence (tail guardrail)"
    assert banner["sentence"].endswith(f"and pays up to concurrency 2; {reason}.")
    assert banner["rollout"] == f"Recommended rollout: enable up to concurrency 2; {reason}."
    by_level = {int(re.match(r"Concurrency (\d+)", f).group(1)): f for f in banner["findings"] if f.startswith("Concurrency")}
    assert "outside the recommended range" in by_level[4] and "outside the recommended range" in by_level[8]
    assert "outside the recommended range" not in by_level[2]
    assert "E2E p95 1.18× [1.10, 1.25]" in by_level[4]  # the tail beside the "faster" of the same level
    assert "Worse with speculation, with 95% confidence: c=4 E2E p95 1.18× baseline [1.10, 1.25]." in banner["findings"]


def _last_paying_level(sentence: str) -> int | None:
    """The level the headline says speculation pays up to (None: it says no level qualifies)."""
    if "no measured level qualifies" in sentence or "shows no TPOT benefit" in sentence:
        return None
    if match := re.search(r"highest measured concurrency, (\d+)", sentence):
        return int(match.group(1))
    if match := re.search(r"pays up to concurrency (\d+)", sentence):
        return int(match.group(1))
    if match := re.search(r"stops paying at concurrency (\d+)", sentence):
        return int(match.group(1)) - 1  # the levels here are consecutive integers
    raise AssertionError(sentence)


@pytest.mark.parametrize("tail_at, crossover, targets", list(itertools.product(
    [None, 1, 2, 3, 4], [None, 2, 3, 4], [None, [1], [2], [1, 3]])))
def test_verdict_range_and_crossover_agree(tail_at, crossover, targets):
    """Over every place a tail can fail, the crossover can sit and the gate can look: the headline's
    last paying level is the range's, the rollout line names the same reason, and a GO never
    comes with "do not enable"."""
    comps = []
    for level in (1, 2, 3, 4):
        comp = comparison(level, tpot=(1.05, 0.98, 1.1) if crossover is not None and level >= crossover else (0.6, 0.55, 0.65))
        comps.append(with_tail(comp, e2e_p95=WORSE_TAIL if level == tail_at else (1.0, 0.9, 1.1)))
    data = report_data(analysis(*comps, crossover=crossover), **({"target_concurrency": targets} if targets else {}))
    banner = decision(data)
    window = data["rollout_range"]
    assert _last_paying_level(banner["sentence"]) == window["up_to"]
    if window["excluded"]:
        first = window["excluded"][0]["concurrency"]
        assert f"at {first}, " in banner["sentence"] and f"at {first}, " in banner["rollout"]
    if data["verdict"] == "GO":
        assert "do not enable" not in banner["rollout"]
        gated = targets or [1]
        assert all(level in window["levels"] for level in gated)
    if tail_at is not None and (crossover is None or tail_at < crossover):
        assert "tail guardrail" in banner["rollout"]  # named where the range is decided, excluded or caution
        assert f"c={tail_at} E2E p95" in next(f for f in banner["findings"] if f.startswith("Worse"))


def test_a_category_slower_with_confidence_is_named_on_the_first_screen():
    data = _issue_report()
    data["comparisons"][2]["category_slower"] = {
        "chat": {"tpot_ratio": 1.31, "p_slower": 0.002, "slower": True, "n_base": 40, "n_spec": 40},
        "code": {"tpot_ratio": 0.5, "p_slower": 0.99, "slower": False, "n_base": 40, "n_spec": 40}}
    data["comparisons"][3]["category_slower"] = {
        "chat": {"tpot_ratio": 1.2, "p_slower": 0.01, "slower": True, "n_base": 40, "n_spec": 40}}
    worse = next(f for f in decision(data)["findings"] if f.startswith("Worse"))
    assert "category chat (c=4 TPOT 1.31× (p 0.0020), c=8 TPOT 1.20× (p 0.010); request level)" in worse
    assert "category code" not in worse


def _record(category: str, tpot_ms: float, drafted: int = 0, accepted: int = 0) -> dict:
    # tpot_ms() reads (t_last - t_first_token) / (osl - 1), times in ns
    return {"status": "ok", "category": category, "t_first_token": 0, "t_last": int(tpot_ms * 1e6 * 9), "osl": 10,
            "draft_tokens": drafted, "accepted_tokens": accepted}


def test_slower_categories_is_a_one_sided_test_per_category():
    base = [_record("chat", 10 + i * 0.1) for i in range(20)] + [_record("code", 10 + i * 0.1) for i in range(20)]
    spec = [_record("chat", 13 + i * 0.1) for i in range(20)] + [_record("code", 5 + i * 0.1) for i in range(20)]
    out = per_request.slower_categories(base, spec, alpha=0.05)
    assert out["chat"]["slower"] and out["chat"]["p_slower"] < 0.001 and out["chat"]["tpot_ratio"] > 1.2
    assert not out["code"]["slower"] and out["code"]["p_slower"] > 0.99


def test_acceptance_per_request_and_by_position():
    # two kinds of request: the pooled figure leans to the long ones, the per-request median does not
    records = [_record("a", 5, drafted=100, accepted=90) for _ in range(2)] + \
              [_record("a", 5, drafted=10, accepted=2) for _ in range(8)] + [_record("a", 5)]
    dist = per_request.acceptance_per_request(records)
    assert dist["n"] == 10 and dist["p50"] == pytest.approx(0.2) and dist["p90"] == pytest.approx(0.9)
    assert sum(dist["histogram"]["counts"]) == 10 and dist["histogram"]["counts"][2] == 8
    pooled = sum(r["accepted_tokens"] for r in records) / sum(r["draft_tokens"] for r in records)
    assert pooled == pytest.approx(0.7)  # 196 of 280: what the pooled headline says for the same requests
    vllm = {"source": "vllm", "verify_steps": 100.0, "accepted_per_position": {"0": 80.0, "1": 50.0, "2": 20.0}}
    by_pos = per_request.acceptance_by_position([vllm, dict(vllm), None])
    assert by_pos["reported"] and [p["position"] for p in by_pos["positions"]] == [1, 2, 3]  # vLLM: ÷ its drafts
    assert [p["rate"] for p in by_pos["positions"]] == pytest.approx([0.8, 0.5, 0.2])
    assert per_request.acceptance_by_position([{"source": "specdeploy", "verify_steps": 5}]) == {
        "reported": False, "note": "not reported by this server", "positions": []}


@pytest.mark.slow  # reads the whole fixture report (conftest.py renders it)
def test_the_page_and_report_json_carry_tails_and_acceptance_per_request(rendered):
    data = json.loads((rendered / "report.json").read_text())
    for c in data["cells"]:
        assert {"p95", "p99"} <= set(c["tpot_ms"]) and "p99" in c["ttft_ms"] and "p99" in c["e2e_ms"]
    dist = data["acceptance_per_request"]
    assert dist["n"] > 0 and {"p10", "p50", "p90", "histogram"} <= set(dist)
    assert data["acceptance_by_position"]["note"] == "not reported by this server"  # the fixture's fake server
    md = (rendered / "report.md").read_text()
    for row in ("TTFT p99 (ms)", "TPOT p95 (ms)", "TPOT p99 (ms)", "E2E p99 (ms)"):
        assert f"| {row} |" in md
    top = md.split("## Per concurrency")[0]
    assert "accepted, pooled over tokens" in top and "per request p10" in top
    html = (rendered / "report.html").read_text()
    assert "Histogram of acceptance per request" in html and "not reported by this server" in html
    assert "TPOT p99 (ms)" in html
