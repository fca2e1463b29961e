"""Traffic that crosses a schedule's thresholds (pipeline/loadtest/crossing.py): users just below, at
and just above every batch size where K changes, up through them and back down in one run."""

from __future__ import annotations

import pytest

from pipeline.loadtest.crossing import CrossingError, crossing_levels, crossing_ramp, thresholds


def _ranges(*rows):
    return [{"min_concurrency": lo, "max_concurrency": hi, "draft_len": k} for lo, hi, k in rows]


def test_one_threshold_is_crossed_up_and_back_down():
    ranges = _ranges((1, 2, 5), (3, None, 0))
    assert thresholds(ranges) == [3]
    assert crossing_levels(ranges, 8) == [2, 3, 4, 3, 2]
    assert crossing_ramp(ranges, 8, 5) == [{"duration_s": 5.0, "users": u} for u in (2, 3, 4, 3, 2)]


def test_every_change_of_k_is_a_threshold_and_steps_stay_within_the_batch():
    ranges = _ranges((1, 1, 5), (2, 4, 3), (5, 7, 3), (8, None, 0))
    assert thresholds(ranges) == [2, 8]  # 5-7 keeps K 3: no switch there
    assert crossing_levels(ranges, 8) == [1, 2, 3, 7, 8, 7, 3, 2, 1]


def test_a_schedule_without_a_switch_has_nothing_to_cross():
    with pytest.raises(CrossingError, match="nothing to cross"):
        crossing_levels(_ranges((1, None, 4)), 8)
