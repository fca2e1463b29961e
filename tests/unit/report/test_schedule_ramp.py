"""The schedule gate over a closed-loop ramp that crosses the threshold up and back down: points are
the records' ramp steps (their users the concurrency), a crossing is a change of K between
consecutive steps, and a stall right after the crossing down fails (quick: no report build)."""

from __future__ import annotations

import random

from pipeline.report.schedule_gate import schedule_section
from pipeline.report.stats import RunData

SCHEDULE = {"ranges": [{"min_concurrency": 1, "max_concurrency": 2, "draft_len": 3},
                       {"min_concurrency": 3, "max_concurrency": None, "draft_len": 0}], "off_from": 3}
USERS = [1, 2, 4, 2, 1]  # up through the threshold 3 and back down
MS = 1_000_000


def ramp_records(arm: str, rep: int, tpot: dict[int, float], seed: int, stall_step: int | None = None) -> list[dict]:
    """Per step, requests back to back: TTFT 40 ms, 20 tokens at the arm's TPOT for that load (± 3 %)."""
    rng = random.Random(seed)
    recs, t = [], 0
    for step, users in enumerate(USERS):
        for i in range(10 * users):
            gap = tpot[users] * rng.uniform(0.97, 1.03) * MS
            first = t + 40 * MS + (2000 * MS if stall_step == step and i == 0 else 0)
            chunks = [int(first + j * gap) for j in range(20)]
            recs.append({"arm": arm, "repeat": rep, "stage": "measure", "status": "ok", "ramp_step": step,
                         "t_sent": t, "t_first_token": first, "t_last": chunks[-1], "chunk_times": chunks, "osl": 20})
            t += int(chunks[-1] - t) // users
    return recs


def runs(stall_step: int | None = None) -> list[RunData]:
    base = {1: 20.0, 2: 22.0, 4: 30.0}
    spec = {1: 10.0, 2: 13.0, 4: 45.0}  # speculation pays at 1-2 users, not at 4
    sched = {u: (spec if u < 3 else base)[u] for u in base}
    out = []
    for rep in range(3):
        for arm, tpot in (("baseline", base), ("speculative", spec), ("scheduled", sched)):
            recs = ramp_records(arm, rep, tpot, seed=rep * 10 + len(arm), stall_step=stall_step if arm == "scheduled" else None)
            out.append(RunData(info={"arm": arm, "repeat": rep, "concurrency": 0,
                                     "draft_len": 3 if arm == "speculative" else None}, records=recs))
    return out


META = {"schedule": SCHEDULE, "primary_draft_len": 3,
        "config": {"loadtest": {"ramp": [{"users": u, "duration_s": 10} for u in USERS]}}}


def test_ramp_steps_cross_up_and_down_and_a_good_schedule_holds():
    section = schedule_section(runs(), META, 0.95)
    assert [p["concurrency"] for p in section["points"]] == USERS
    assert section["thresholds"] == [3]
    assert [p["draft_len"] for p in section["points"]] == [3, 3, 0, 3, 3]
    boundary = [c["scope"] for c in section["checks"] if c["rule"] == "schedule_boundary_stall"]
    assert boundary == ["ramp step 2 (users 4) (after crossing up)", "ramp step 3 (users 2) (after crossing down)"]
    assert not [c for c in section["checks"] if c["status"] != "pass"], section["checks"]


def test_a_stall_after_the_crossing_down_fails():
    section = schedule_section(runs(stall_step=3), META, 0.95)
    stalls = {c["scope"]: c["status"] for c in section["checks"] if c["rule"] == "schedule_boundary_stall"}
    assert stalls == {"ramp step 2 (users 4) (after crossing up)": "pass",
                      "ramp step 3 (users 2) (after crossing down)": "fail"}
    # a 2 s stall in every repeat also costs that step's throughput, beyond the margin with confidence
    failed = {(c["rule"], c["scope"]) for c in section["checks"] if c["status"] == "fail"}
    assert ("schedule_boundary_throughput", "ramp step 3 (users 2) (after crossing down)") in failed
    assert {scope for _, scope in failed} <= {"ramp step 3 (users 2)", "ramp step 3 (users 2) (after crossing down)"}


def test_no_scheduled_arm_no_section():
    assert schedule_section([r for r in runs() if r.info["arm"] != "scheduled"], META, 0.95) is None
