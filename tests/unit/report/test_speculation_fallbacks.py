"""Speculation fallbacks from the load tester's records to the gate: a record carries the BLS's
``draft_fallbacks`` perf output, a run summary adds them up, and the gate treats any fallback as a
failed check (NO-GO), never as a speedup."""

from __future__ import annotations

import lt_common
from pipeline.config import GateSettings
from pipeline.report.gate import evaluate_gate
from pipeline.report.stats import RunData, run_summary

MS = 1_000_000


def _settings() -> lt_common.RunSettings:
    return lt_common.RunSettings(run_id="r", arm="speculative", repeat=0, endpoint="127.0.0.1:1", model_name="tensorrt_llm_bls",
                                 max_tokens=4, prompts=[{"id": "p", "prompt": "hi"}])


def _record(fallbacks: int | None) -> dict:
    state = lt_common.RequestState(request_id="1", prompt_id="p", category="c", prompt_index=0, prompt_text="hi",
                                   t_scheduled=None, t_sent=0)
    for i in range(4):
        state.add_chunk((100 + 10 * i) * MS, "x", 1)
    perf = {"total_draft_tokens": 6, "total_accepted_draft_tokens": 3}
    if fallbacks is not None:
        perf["draft_fallbacks"] = fallbacks
    state.update_perf(perf)
    state.status = "ok"
    return lt_common.build_record(_settings(), state, worker_pid=1)


def test_record_keeps_draft_fallbacks():
    assert _record(1)["draft_fallbacks"] == 1
    assert _record(0)["draft_fallbacks"] == 0
    assert _record(None)["draft_fallbacks"] is None  # a server without the output (the baseline arm)
    assert "draft_fallbacks" in lt_common.PERF_FIELDS_INT  # read from gRPC and SSE responses alike


def _summary(key: str, fallbacks: list) -> dict:
    records = [_record(f) for f in fallbacks]
    return run_summary(RunData(info={"key": key, "arm": "speculative", "concurrency": 1}, records=records), 1000.0, 100.0)


def test_run_summary_adds_up_fallbacks():
    assert _summary("s", [1, 0, None, 1])["draft_fallbacks"] == 2
    assert _summary("s", [None, None])["draft_fallbacks"] == 0


def _analysis(runs: list[dict]) -> dict:
    return {"runs": runs, "comparisons": [], "greedy": True, "acceptance_rate": 0.7, "crossover_concurrency": None}


def test_gate_fails_a_run_with_fallbacks():
    runs = [_summary("baseline-c1-r0", [None]), _summary("speculative-c1-r0", [0, 1, 1])]
    result = evaluate_gate(_analysis(runs), GateSettings())
    check = next(c for c in result.checks if c.rule == "speculation_fallbacks")
    assert check.status == "fail" and check.value == 2
    assert "speculative-c1-r0" in check.detail and "target-only" in check.detail
    assert result.verdict == "NO-GO"


def test_gate_passes_the_check_without_fallbacks():
    runs = [_summary("speculative-c1-r0", [0, 0]), {"key": "old-run-without-the-field", "accounted": True}]
    check = next(c for c in evaluate_gate(_analysis(runs), GateSettings()).checks if c.rule == "speculation_fallbacks")
    assert check.status == "pass" and check.value == 0
