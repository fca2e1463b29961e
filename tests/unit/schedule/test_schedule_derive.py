"""The schedule derived from a report's evidence (pipeline/schedule/derive.py): K per concurrency
range from the measured levels and their intervals, 0 from the level where speculation stops
paying (TPOT, E2E tail or throughput), conservative where an interval straddles 1, the best K
per range when draft lengths were swept; and from a recorded run's report.json through
`specdeploy schedule`."""

from __future__ import annotations

import json

import pytest

from pipeline.artefacts.schedule import SpeculationSchedule
from pipeline.schedule.derive import derive
from tests.unit.report.test_gate import analysis, ci, comparison
from tests.unit.report.test_rollout_range import report_data


def report(*comps, **gate) -> dict:
    data = report_data(analysis(*comps), **gate)
    return {**data, "name": "t", "run_dir": "/r", "primary_draft_len": 4,
            "provenance": {"method": "draft_target"}}


def spans(s: SpeculationSchedule) -> list[tuple]:
    return [(r.min_concurrency, r.max_concurrency, r.draft_len, r.basis) for r in s.ranges]


def test_k_up_to_the_last_paying_level_then_interpolated_then_off():
    s = derive(report(comparison(1), comparison(2, tpot=(0.7, 0.6, 0.8)), comparison(4, tpot=(0.85, 0.75, 0.95)),
                      comparison(16, tpot=(1.3, 1.2, 1.4))))
    # log-linear CI upper bound between c=4 (0.95) and c=16 (1.4): reaches 1 at about c=4.9
    assert spans(s) == [(1, 4, 4, "measured"), (5, None, 0, "measured")]
    s = derive(report(comparison(1), comparison(2, tpot=(0.5, 0.45, 0.55)), comparison(16, tpot=(1.05, 1.0, 1.1))))
    # between c=2 (0.55) and c=16 (1.1): reaches 1 at c = exp(ln 2 + ln 8 · ln(1/0.55) / ln 2) ≈ 12.02
    assert spans(s) == [(1, 2, 4, "measured"), (3, 12, 4, "interpolated"), (13, None, 0, "measured")]
    assert s.off_from == 13 and s.draft_len_for(12) == 4 and s.draft_len_for(13) == 0 and s.draft_len_for(500) == 0


def test_an_interval_straddling_one_is_off_however_good_its_point_and_nothing_above_comes_back():
    s = derive(report(comparison(1), comparison(2, tpot=(0.8, 0.55, 1.05)), comparison(4)))
    assert spans(s)[-1][:3] == (2, None, 0) and s.draft_len_for(4) == 0
    level2 = next(lv for lv in s.levels if lv["concurrency"] == 2)
    assert "reaches 1" in level2["reason"]
    assert "stopped paying at 2" in next(lv for lv in s.levels if lv["concurrency"] == 4)["reason"]


def test_a_tail_or_throughput_worse_with_confidence_switches_off_right_above_the_last_paying_level():
    tail = comparison(16)
    tail["run_level"]["e2e_p95_ratio"] = ci(1.3, 1.2, 1.4)
    s = derive(report(comparison(1), comparison(2), tail))
    assert spans(s) == [(1, 2, 4, "measured"), (3, None, 0, "measured")]  # no interpolation past another check
    assert "tail_e2e_p95" in s.ranges[-1].evidence
    s = derive(report(comparison(1), comparison(8, throughput=(0.8, 0.7, 0.9))))
    assert spans(s) == [(1, 1, 4, "measured"), (2, None, 0, "measured")]
    assert "throughput" in s.ranges[-1].evidence


def test_every_level_pays_off_above_the_highest_measured():
    s = derive(report(comparison(1), comparison(4)))
    assert spans(s) == [(1, 4, 4, "measured"), (5, None, 0, "unmeasured")]


def test_swept_draft_lengths_give_the_best_k_per_range():
    def at(level, k, tpot):
        c = comparison(level, tpot=tpot)
        c["draft_len"], c["primary"] = k, k == 4
        return c

    s = derive(report(at(1, 2, (0.6, 0.55, 0.65)), at(1, 4, (0.5, 0.45, 0.55)),
                      at(4, 2, (0.7, 0.65, 0.8)), at(4, 4, (0.69, 0.6, 0.805)),   # within 1 %: the smaller K
                      at(8, 2, (0.9, 0.8, 1.1)), at(8, 4, (1.1, 1.0, 1.2))))
    # K 2 past c=4 until its CI upper bound, 0.8 at 4 and 1.1 at 8, reaches 1 (≈ c 6.5)
    assert spans(s) == [(1, 1, 4, "measured"), (2, 4, 2, "measured"), (5, 6, 2, "interpolated"), (7, None, 0, "measured")]
    assert s.max_draft_len == 4 and s.context["swept_draft_lengths"]


@pytest.mark.slow
def test_schedule_command_on_a_recorded_run(tmp_path):
    """The committed fixture run with its speculative arm decoding 2.2x slower at c=2: the report
    says speculation stops paying there; `specdeploy schedule` writes K 3 at 1, off from 2, in
    every engine's form."""
    from tests.unit.cli_inproc import specdeploy
    from tests.unit.report_fixtures import copy_fixture, slow_down_speculative

    run = slow_down_speculative(copy_fixture(tmp_path / "run"), 2.2, concurrency=2)
    assert specdeploy("report", str(run)).returncode in (0, 1, 3)
    result = specdeploy("schedule", str(run))
    assert result.returncode == 0, (result.stdout + result.stderr)
    s = SpeculationSchedule.load(run / "schedule.json")
    assert [(r.min_concurrency, r.max_concurrency, r.draft_len) for r in s.ranges] == [(1, 1, 3), (2, None, 0)]
    assert s.method == "draft_target" and s.off_from == 2
    vllm = json.loads((run / "schedule" / "vllm-speculative-config.json").read_text())["config"]
    assert vllm["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 2, 0]]
    assert "max_concurrency: 1" in (run / "schedule" / "trtllm-1.2.speculative_config.yaml").read_text()
    assert "off" in (result.stdout + result.stderr) and "max_concurrency" in (result.stdout + result.stderr)


def test_schedule_command_without_a_report_names_the_command(tmp_path):
    from tests.unit.cli_inproc import specdeploy

    result = specdeploy("schedule", str(tmp_path))
    assert result.returncode == 2 and "specdeploy report" in (result.stdout + result.stderr)


def test_the_forecast_beyond_the_measured_levels_is_quoted_never_used_to_switch_on():
    data = report(comparison(1), comparison(4))
    data["forecast"] = {"available": True, "crossover": 16, "levels": []}
    s = derive(data)
    assert s.draft_len_for(5) == 0 and s.ranges[-1].basis == "unmeasured"
    assert any("crossover at concurrency 16" in n and "never used to switch speculation on" in n for n in s.notes)
