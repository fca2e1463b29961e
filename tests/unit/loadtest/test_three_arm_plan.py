"""Three arms in one load test (pipeline/loadtest/cells.py): baseline, speculative and scheduled
interleaved per level and repeat in a Williams design, so a slow drift of the machine favours no
arm; the two-arm plan stays A B, B A."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from pipeline.config import parse_config
from pipeline.loadtest.cells import arm_order, plan_runs
from pipeline.loadtest.resume import plan_of, run_config

ARMS3 = ("baseline", "speculative", "scheduled")


def _cfg(**loadtest):
    return parse_config({"name": "t", "backend": "reference", "hardware": "cpu",
                         "target": {"checkpoint": "builtin:tiny-target"},
                         "speculation": {"method": "medusa", "heads_dir": "builtin:tiny-medusa", "num_heads": 3},
                         "loadtest": {"concurrency": [1, 4], "duration_s": 4, "warmup_s": 1, **loadtest}})


def test_three_arms_are_counterbalanced_across_repeats():
    plan = plan_runs(_cfg(), ARMS3, [1, 4], 6, [])
    assert len(plan) == 6 * 2 * 3
    assert {s.key for s in plan if s.arm == "scheduled"} == {f"scheduled-c{c}-r{r}" for c in (1, 4) for r in range(6)}
    orders = [tuple(s.arm for s in plan if s.repeat == r and s.concurrency == 1) for r in range(6)]
    # every arm in every position equally often, within each three repeats
    for block in (orders[:3], orders[3:]):
        for position in range(3):
            assert sorted(o[position] for o in block) == sorted(ARMS3)
    # over six repeats, each arm runs right after each other arm equally often (first-order carryover)
    follows = Counter(pair for o in orders for pair in pairwise(o))
    assert len(follows) == 6 and set(follows.values()) == {2}
    # both levels of a repeat share its order
    assert orders == [tuple(s.arm for s in plan if s.repeat == r and s.concurrency == 4) for r in range(6)]


def test_two_arms_keep_the_ab_ba_plan():
    assert [arm_order(("baseline", "speculative"), r) for r in range(3)] == [
        ("baseline", "speculative"), ("speculative", "baseline"), ("baseline", "speculative")]


def test_a_crossing_run_plans_one_ramp_level_per_arm_from_its_own_record():
    cfg = _cfg()
    ramp = [{"duration_s": 2.0, "users": u} for u in (2, 3, 4, 3, 2)]
    meta = {"config": cfg.model_dump(mode="json"), "concurrency": [1, 4], "repeats": 2, "arms": list(ARMS3),
            "crossing": {"ramp": ramp, "thresholds": [3]}}
    assert run_config(meta, cfg).loadtest.ramp[2].users == 4
    keys = [s.key for s in plan_of(meta, cfg)]
    assert keys == ["baseline-ramp-r0", "speculative-k3-ramp-r0", "scheduled-ramp-r0",
                    "speculative-k3-ramp-r1", "scheduled-ramp-r1", "baseline-ramp-r1"]
