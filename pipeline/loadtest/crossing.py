"""Traffic that crosses a speculation schedule's thresholds: a closed-loop ramp built from the
schedule the scheduled arm runs (``loadtest --crossing``, docs/schedule.md "Load-testing it across
its boundaries").

A threshold is the lowest batch size of a range whose K differs from the range below (speculation
switched off, or a shorter draft). The ramp holds the users at just below, at and just above every
threshold (t − 1, t, t + 1, within 1..the deployment's batch limit), going up through them and back
down within one run: A-B-C-B-A, so a switch is crossed in both directions and a stall or a lost
proposer state on the way back shows in the steps after the peak. The same ramp runs on every arm
(one ``ramp`` level per arm and repeat, each record's ``ramp_step``), so each step compares the arms at
the same load. Reads the schedule's ranges; writes nothing.
"""

from __future__ import annotations

from typing import Any

from pipeline.artefacts.schedule import DraftLenRange
from pipeline.errors import UsageError


class CrossingError(UsageError):
    """The schedule has no threshold to cross (a usage error: exit 2)."""


def thresholds(ranges: list[DraftLenRange] | list[dict[str, Any]]) -> list[int]:
    """The batch sizes where K changes (each range's first batch size whose K differs from the range below)."""
    rows = [r if isinstance(r, DraftLenRange) else DraftLenRange.model_validate(r) for r in ranges]
    return [b.min_concurrency for a, b in zip(rows, rows[1:]) if b.draft_len != a.draft_len]


def crossing_levels(ranges, max_users: int) -> list[int]:
    """Users per step: up through t − 1, t, t + 1 of every threshold t, then back down (the peak once)."""
    points = sorted({u for t in thresholds(ranges) for u in (t - 1, t, t + 1) if 1 <= u <= max_users})
    if not points:
        raise CrossingError("the schedule has no threshold within 1.."
                            f"{max_users} users (one K at every batch size): nothing to cross, load-test its levels instead")
    return points + points[-2::-1]


def crossing_ramp(ranges, max_users: int, step_s: float) -> list[dict[str, Any]]:
    """``loadtest.ramp`` steps (closed loop) that cross every threshold of ``ranges`` both ways."""
    return [{"duration_s": float(step_s), "users": users} for users in crossing_levels(ranges, max_users)]
