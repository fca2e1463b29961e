"""The speculation schedule, ``RUN_DIR/schedule.json``: a draft length K per concurrency (batch
size) range, 0 where speculation does not pay. Written by ``specdeploy schedule RUN_DIR``
(:mod:`pipeline.schedule.derive`, from the run's report); read by ``render --schedule`` (the
engines' own forms), by the reference engine (an ``engine.json`` may carry the ranges as
``draft_len_schedule``) and by a later load-test arm that serves it.

A range covers the batch sizes ``min_concurrency..max_concurrency`` (both inclusive;
``max_concurrency`` None: every larger batch). The ranges start at 1, are contiguous and end
open, so every batch size has exactly one K. Reads and writes only the paths it is given.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.artefacts.base import Artefact, Strict

SCHEDULE_SCHEMA = "specdeploy-schedule/1"
Basis = Literal["measured", "interpolated", "unmeasured"]


class DraftLenRange(Strict):
    """K for the batch sizes ``min_concurrency..max_concurrency`` (inclusive)."""

    min_concurrency: int = Field(ge=1)
    max_concurrency: int | None = Field(None, ge=1, description="None: every larger batch size too.")
    draft_len: int = Field(ge=0, description="Draft tokens per step; 0 = a plain target step (speculation off).")
    basis: Basis = Field("measured", description=(
        "measured: a measured level in this range decided K; interpolated: between two measured levels, from "
        "their intervals; unmeasured: beyond the measured levels (speculation off there)."))
    evidence: str = Field("", description="The figures K rests on, in words.")


def check_ranges(ranges: list[DraftLenRange]) -> None:
    """Raise ValueError unless the ranges start at 1, are contiguous and the last one is open."""
    if not ranges:
        raise ValueError("a schedule needs at least one range")
    expected = 1
    for i, r in enumerate(ranges):
        if r.min_concurrency != expected:
            raise ValueError(f"range {i} starts at {r.min_concurrency}, expected {expected} (contiguous from 1)")
        last = i == len(ranges) - 1
        if last != (r.max_concurrency is None):
            raise ValueError("only the last range is open-ended (max_concurrency null), and it must be")
        if r.max_concurrency is not None:
            if r.max_concurrency < r.min_concurrency:
                raise ValueError(f"range {i}: max_concurrency {r.max_concurrency} < min_concurrency {r.min_concurrency}")
            expected = r.max_concurrency + 1


def draft_len_at(ranges: list[DraftLenRange], batch: int) -> int:
    """K for a live batch of ``batch`` sequences (a batch below 1 counts as 1)."""
    for r in ranges:
        if r.max_concurrency is None or batch <= r.max_concurrency:
            return r.draft_len
    return ranges[-1].draft_len


class SpeculationSchedule(Artefact):
    """K per concurrency range from one run's evidence, and how each engine loads it."""

    SCHEMA = SCHEDULE_SCHEMA
    VERSION = 1
    FILE = "RUN_DIR/schedule.json"
    WRITER = "specdeploy schedule RUN_DIR"

    name: str
    run_dir: str
    method: str | None = Field(None, description="The speculation method the run measured.")
    verdict: str | None = Field(None, description="The report's verdict (the schedule does not change it).")
    max_draft_len: int = Field(ge=0, description="The largest K of any range (the engines' capacity).")
    off_from: int | None = Field(None, description="The lowest batch size with K = 0 (None: speculation never off).")
    ranges: list[DraftLenRange]
    levels: list[dict] = Field(default_factory=list, description=(
        "Per measured level: K chosen (0: off), why, and the figures (TPOT, E2E p95, throughput ratios)."))
    rule: str = ""
    notes: list[str] = Field(default_factory=list)
    context: dict = Field(default_factory=dict, description=(
        "What the evidence was measured under (prompt and output lengths, draft lengths swept): re-derive when "
        "the traffic moves away from it."))

    @model_validator(mode="after")
    def _contiguous(self):
        check_ranges(self.ranges)
        return self

    def draft_len_for(self, batch: int) -> int:
        return draft_len_at(self.ranges, batch)

    def triples(self) -> list[tuple[int, int | None, int]]:
        """``(min, max, K)`` per range (max None: open)."""
        return [(r.min_concurrency, r.max_concurrency, r.draft_len) for r in self.ranges]
