"""The decision summary and the generic details of report.html / report.md: the verdict banner's
sentences come from the analysis (crossover → rollout), every gate check that is not a pass gets a
line and leads the check table, and whatever run.json records shows up in the provenance."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import pipeline.report.builder as report_mod
from pipeline.report.builder import make_report
from pipeline.report.gate import FAIL, NO_GO, Check
from pipeline.report.view.summary import rollout
from tests.unit.report_fixtures import copy_fixture, slow_down_speculative, worsen_tail


def _data(levels: list[int], crossover: int | None) -> dict:
    return {"comparisons": [{"concurrency": level, "primary": True} for level in levels],
            "crossover_concurrency": crossover}


@pytest.mark.parametrize("levels, crossover, text", [
    ([1, 2, 4, 8], 8, "enable up to concurrency 4, disable from 8"),
    ([1, 2, 4, 8], 1, "do not enable: no measured concurrency shows a TPOT benefit"),
    ([1, 2, 4, 8], None, "enable at every measured concurrency (up to 8)"),
    ([], None, "no concurrency level has both arms measured"),
])
def test_rollout_follows_the_crossover(levels, crossover, text):
    assert rollout(_data(levels, crossover)).startswith(text)


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_banner_names_the_crossover_and_the_rollout(tmp_path: Path):
    run_dir = slow_down_speculative(copy_fixture(tmp_path / "run"), 2.5, concurrency=2)
    worsen_tail(run_dir, 4.0, concurrency=1, share=0.2)  # E2E p95 at c=1 worse with confidence
    report = make_report(run_dir)
    assert report.data["crossover_concurrency"] == 2
    html = report.html_path.read_text()
    banner = html[html.index('id="verdict-banner"'):html.index('class="findings"')]
    assert "stops paying at concurrency 2" in banner
    # below the crossover the range holds the gated checks and the tail: E2E p95 at c=1 is worse
    # with confidence (pipeline/report/rollout_range.py), so the banner names it as a caution
    found = re.search(r"enable up to concurrency 1, disable from 2; caution at 1 \(gated\), E2E p95 is [\d.]+× baseline "
                      r"\[[\d.]+, [\d.]+\], worse with confidence \(tail guardrail\)", banner)
    assert found
    rollout = found.group(0)
    assert "Concurrency 2 (past crossover)" in html and "Concurrency 1 (gated)" in html
    md = report.md_path.read_text()
    assert rollout.replace("[", "\\[") in md.split("## Per concurrency")[0]  # Markdown escapes what it did not write


@pytest.mark.slow
def test_disagreeing_repeats_are_named_as_noise(tmp_path: Path, rendered: Path):
    assert "Noise:" not in (rendered / "report.html").read_text()  # the fixture as committed: quiet
    noisy_dir = slow_down_speculative(copy_fixture(tmp_path / "noisy"), 3.0, runs="speculative-k3-c2-r0")
    top = make_report(noisy_dir).md_path.read_text().split("## Per concurrency")[0]
    assert "- Noise: repeats disagree — median TPOT varies by" in top and "speculative c=2" in top


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_every_check_that_is_not_a_pass_is_listed_first(tmp_path: Path, monkeypatch):
    real = report_mod.evaluate_gate

    def gate_with_a_new_rule(analysis, settings):
        result = real(analysis, settings)
        result.checks.append(Check("speculation_fallbacks", "c=1", FAIL,
                                   "12 of 40 requests fell back (0.30000000000000004)", 12, 0))
        result.checks.append(Check("future_rule", "run", "warn", "a status the report has never seen"))
        result.verdict = NO_GO
        return result

    monkeypatch.setattr(report_mod, "evaluate_gate", gate_with_a_new_rule)
    report = make_report(copy_fixture(tmp_path / "run"))
    html = report.html_path.read_text()
    top = html[:html.index('id="per-concurrency"')]
    assert "FAIL: speculation_fallbacks (c=1) — 12 of 40 requests fell back (0.300)" in top
    assert "0.30000000000000004" not in html
    assert "WARN: future_rule (run) — a status the report has never seen" in top
    assert "Do not roll out" in top
    gate_section = html[html.index('id="gate"'):html.index('id="statistics"')]
    assert gate_section.index("speculation_fallbacks") < gate_section.index("future_rule") < gate_section.index("<details>")
    assert "server_alive" in gate_section[gate_section.index("<details>"):]  # passing checks folded
    assert "speculation\\_fallbacks" in report.md_path.read_text().split("## Per concurrency")[0]


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_new_run_json_entries_reach_the_provenance(tmp_path: Path):
    run_dir = copy_fixture(tmp_path / "run")
    meta = json.loads((run_dir / "run.json").read_text())
    meta["arms"] = {"baseline": {"kv_capacity_tokens": 4096, "gpus": [0]},
                    "speculative": {"kv_capacity_tokens": 3072, "gpus": [1]}}
    (run_dir / "run.json").write_text(json.dumps(meta))
    report = make_report(run_dir)
    assert report.data["provenance"]["arms"]["speculative"]["kv_capacity_tokens"] == 3072
    html = report.html_path.read_text()
    provenance = html[html.index('id="provenance"'):html.index('id="formulas"')]
    assert "arms.speculative.kv_capacity_tokens</td><td>3072" in provenance
    assert "arms.baseline.gpus</td><td>0" in provenance
    assert "| arms.speculative.kv\\_capacity\\_tokens | 3072 |" in report.md_path.read_text()
    assert "config" not in report.data["provenance"]  # the snapshot stays in run.json
