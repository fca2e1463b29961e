"""The report's acceptance source (pipeline.report.acceptance): per-request outputs first, then the
server's metrics, else "not reported"; the gate leaves a missing acceptance unchecked.

Runs the real report on a private copy of the committed fixture run whose speculative records are
stripped of their per-request acceptance, with server figures made by
pipeline.loadtest.acceptance_sources from exposition texts (tests/unit/loadtest/test_acceptance_sources.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.config import GateSettings
from pipeline.loadtest import acceptance_sources as acc
from pipeline.report import acceptance
from pipeline.report.builder import make_report
from pipeline.report.gate import NOT_CHECKED, evaluate_gate
from tests.unit.loadtest.test_acceptance_sources import sglang_text, vllm_text
from tests.unit.report.test_gate import GOOD, analysis, comparison
from tests.unit.report_fixtures import copy_fixture


def _strip_request_acceptance(run_dir: Path) -> None:
    for path in (run_dir / "raw").glob("speculative-*.jsonl"):
        rows = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            rec.update(draft_tokens=None, accepted_tokens=None, acceptance_rate=None)
            rows.append(json.dumps(rec))
        path.write_text("\n".join(rows) + "\n")


def _set_server_acceptance(run_dir: Path, delta_for_key) -> None:
    path = run_dir / "runs.json"
    data = json.loads(path.read_text())
    for run in data["runs"]:
        run["server_acceptance"] = delta_for_key(run["key"])
        run["metrics_delta"] = acc.legacy_delta(run["server_acceptance"])
    path.write_text(json.dumps(data, indent=1))


def _report(run_dir: Path) -> tuple[dict, str]:
    make_report(run_dir)
    return json.loads((run_dir / "report.json").read_text()), (run_dir / "report.md").read_text()


VLLM = acc.run_delta(acc.parse(vllm_text(0, 0, 0, [0, 0, 0])), acc.parse(vllm_text(10, 30, 18, [8, 6, 4])))
NOT_REPORTED = acc.run_delta(acc.parse("# nothing\n"), acc.parse("# nothing\n"))


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_per_request_outputs_come_first(rendered):
    data, md = json.loads((rendered / "report.json").read_text()), (rendered / "report.md").read_text()
    assert data["acceptance_source"] == "per-request outputs"
    assert data["acceptance_rate"] is not None
    assert "Acceptance by source" in md and "per-request outputs" in md
    assert {r["source"] for r in data["acceptance_by_source"]} == {"per-request outputs"}


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_server_counters_fill_in_when_requests_carry_no_acceptance(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    _strip_request_acceptance(run_dir)
    _set_server_acceptance(run_dir, lambda key: VLLM if key.startswith("speculative") else NOT_REPORTED)
    data, md = _report(run_dir)
    assert data["acceptance_source"] == "vllm"
    assert data["acceptance_rate"] == pytest.approx(18 / 30)
    spec_runs = [r for r in data["runs"] if r["arm"] == "speculative"]
    assert {r["acceptance_source"] for r in spec_runs} == {"vllm"}
    (row,) = data["acceptance_by_source"]
    assert row["source"] == "vllm" and row["kind"] == acc.COUNTER_DELTA and len(row["runs"]) == len(spec_runs)
    assert row["mean_acceptance_length"] == pytest.approx(1 + 18 / 10)
    spec_rows = [r for r in data["rows"] if r["arm"] == "speculative"]
    assert all(r["acceptance_rate"] == pytest.approx(0.6) for r in spec_rows)
    assert "| vllm | counter delta |" in md
    html = (run_dir / "report.html").read_text()
    assert 'id="acceptance-sources"' in html and "counter delta" in html


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_gauges_are_labelled_as_a_window(tmp_path):
    run_dir = copy_fixture(tmp_path / "run")
    _strip_request_acceptance(run_dir)
    gauge = acc.run_delta(acc.parse(sglang_text(1.0, 0.1)), acc.parse(sglang_text(2.5, 0.7)))
    _set_server_acceptance(run_dir, lambda key: gauge if key.startswith("speculative") else NOT_REPORTED)
    data, md = _report(run_dir)
    assert data["acceptance_source"] == "sglang" and data["acceptance_rate"] == pytest.approx(0.7)
    assert data["acceptance_by_source"][0]["kind"] == acc.GAUGE_WINDOW
    assert "gauge window" in md


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_no_acceptance_anywhere_is_not_reported_and_leaves_the_verdict(tmp_path, rendered):
    with_acceptance = json.loads((rendered / "report.json").read_text())
    run_dir = copy_fixture(tmp_path / "b")
    _strip_request_acceptance(run_dir)
    _set_server_acceptance(run_dir, lambda key: NOT_REPORTED)
    data, md = _report(run_dir)
    assert data["acceptance_rate"] is None and data["acceptance_source"] == "not reported"
    assert all(r["acceptance_rate"] is None for r in data["rows"])  # never 0
    check = next(c for c in data["gate"]["checks"] if c["rule"] == "acceptance_rate")
    assert check["status"] == NOT_CHECKED
    assert data["verdict"] == with_acceptance["verdict"]
    assert not any("acceptance" in r for r in data["reasons"])
    assert "not reported" in md


def test_gate_not_checked_changes_no_verdict():
    missing = analysis(comparison(1), comparison(8), acceptance=None)
    result = evaluate_gate(missing, GateSettings())
    assert result.verdict == evaluate_gate(GOOD, GateSettings()).verdict == "GO"
    assert [c.status for c in result.checks if c.rule == "acceptance_rate"] == [NOT_CHECKED]
    low_from_server = {**analysis(comparison(1), acceptance=0.2), "acceptance_source": "vllm"}
    warned = evaluate_gate(low_from_server, GateSettings())  # a proxy warns, the measured benefit decides
    assert warned.verdict == "GO" and any("from vllm" in r and "[warning]" in r for r in warned.reasons)
    failed = evaluate_gate(low_from_server, GateSettings(acceptance_is_gate=True))
    assert failed.verdict == "NO-GO" and any("from vllm" in r for r in failed.reasons)


def test_headline_prefers_requests_then_server():
    records = [{"draft_tokens": 10, "accepted_tokens": 5}]
    assert acceptance.headline(records, [VLLM]) == (0.5, "per-request outputs")
    assert acceptance.headline([{"draft_tokens": None}], [VLLM, None]) == (pytest.approx(0.6), "vllm")
    assert acceptance.headline([], [NOT_REPORTED, None]) == (None, "not reported")


def test_one_test_decides_whether_a_server_reported_acceptance():
    """``acceptance.server_reported`` is the one test, for both runs.json shapes (run_delta's
    server_acceptance and the older counters-only metrics_delta), and the per-arm table
    (acceptance_reported) answers with it; "not reported" has one spelling."""
    from pipeline.report import acceptance_reported
    from pipeline.report.stats import RunData

    sglang = acc.run_delta(acc.parse(sglang_text(2.0, 0.5)), acc.parse(sglang_text(2.5, 0.6)))
    assert acceptance.server_reported(VLLM) and acceptance.server_reported(acc.legacy_delta(VLLM))
    assert acceptance.server_reported(sglang)  # gauges only: a rate and a length, no counts
    assert not acceptance.server_reported(NOT_REPORTED) and not acceptance.server_reported(acc.legacy_delta(NOT_REPORTED))
    assert not acceptance.server_reported(None) and not acceptance.server_reported({"draft_tokens": 0.0, "source": "vllm"})
    assert acceptance.NOT_REPORTED is acc.NOT_REPORTED is acceptance_reported.NOT_REPORTED
    ok = {"status": "ok", "draft_tokens": None}
    runs = [RunData(info={"arm": "speculative", "metrics_delta": acc.legacy_delta(VLLM)}, records=[ok]),
            RunData(info={"arm": "baseline", "metrics_delta": acc.legacy_delta(NOT_REPORTED)}, records=[ok])]
    table = acceptance_reported.acceptance_reported(runs)
    assert (table["speculative"]["metrics"], table["speculative"]["metrics_source"]) == ("reported", "vllm")
    assert table["baseline"]["metrics"] == "not reported"
