"""The scheduled arm against the better static arm, per level and per ramp step, and the schedule gate.

A run with the third arm ``scheduled`` (the speculative engine running a schedule.json: K per
concurrency range, 0 = off) is judged on what the schedule promises: at every load it is at least as
good as the better of the two static arms (baseline, static speculation), and switching K when load
crosses a threshold costs nothing. Per point (a level, or a ramp step, whose concurrency is the
step's users):

- each arm's median TPOT, p95 E2E and output tokens/s per repeat; the scheduled arm against the
  better static arm *for that metric* (better by the geometric mean over repeats) with the paired t
  interval of :mod:`pipeline.report.intervals` (repeat r of each arm is a pair: the arms interleave);
- where the point lies against each schedule threshold (the first concurrency of a range whose K
  differs from the range below): at, just below / just above (the nearest measured point on that
  side), below, above.

Checks (rules ``schedule_*``), folded into the run's verdict by :func:`pipeline.report.gate.evaluate_gate`:

- ``schedule_not_worse`` per point and metric, a non-inferiority check with the margin of the peak
  throughput guardrail (``gate.peak_throughput_ratio_min``, m = 0.95 by default; 1/m for the latency
  ratios): FAIL when the whole interval lies beyond the margin (worse with confidence by more than
  the run tolerates), PASS when it rules such a loss out, INCONCLUSIVE in between or without an
  interval (< 2 pairs), as the existing guardrail decides. Why a margin and not 1: a schedule that
  is the better static arm still runs on other requests, and with tight intervals (many requests,
  a quiet machine) a 0.3 % edge effect would otherwise "fail with confidence". Comparing against the
  better of two arms chosen after the fact favours the static side a little (a bias against the
  schedule, the safe side).
- ``schedule_boundary_throughput`` at the point just after each crossing (up: the first point above a
  threshold; down: the last point below it): the scheduled arm's throughput not below the better
  static arm's beyond the margin with confidence: the collapse vLLM #49548 reports when load crossed
  its schedule.
- ``schedule_boundary_stall`` at the same points: the longest wait for a token of any scheduled
  request (its TTFT or its largest inter-chunk gap) against the same figure of the static arms under
  the same load. A switch that stalls the batch (a re-capture, a drain, a lock) shows as waits no
  static arm ever made a request sit through; a wait above STALL_FACTOR times the static arms' longest
  *and* more than STALL_MIN_MS longer fails. Why the static arms as the reference: they ran the same
  load at the same point, so their longest wait is the load's own tail; why both a factor and a
  floor: at millisecond waits a factor alone trips on scheduler jitter.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from pipeline.report.intervals import paired_ci, paired_values
from pipeline.report.stats import chunk_gaps_ms, e2e_ms, tpot_ms, ttft_ms

SCHEDULED, STATIC_ARMS = "scheduled", ("baseline", "speculative")
STALL_FACTOR = 3.0
STALL_MIN_MS = 250.0
# metric: (name in the section, lower is better)
METRICS = {"tpot_ms": True, "e2e_p95_ms": True, "output_tokens_per_s": False}
NS_PER_S = 1e9


def point_metrics(records: list[dict]) -> dict[str, float | None]:
    """One run's (or one ramp step's) figures from its ok measured records."""

    ok = [r for r in records if r.get("status") == "ok"]
    tpots = [v for v in (tpot_ms(r) for r in ok) if v is not None]
    e2es = [v for v in (e2e_ms(r) for r in ok) if v is not None]
    timed = [r for r in ok if r.get("t_last") and r.get("t_sent") is not None]
    window = (max(r["t_last"] for r in timed) - min(r["t_sent"] for r in timed)) / NS_PER_S if timed else 0.0
    waits = [max([ttft_ms(r) or 0.0, *chunk_gaps_ms(r)]) for r in ok]
    return {"tpot_ms": float(np.median(tpots)) if tpots else None,
            "e2e_p95_ms": float(np.percentile(e2es, 95)) if e2es else None,
            "output_tokens_per_s": sum(r.get("osl") or 0 for r in timed) / window if window > 0 else None,
            "longest_wait_ms": max(waits) if waits else None, "n_ok": len(ok)}


def thresholds(schedule: dict) -> list[int]:
    """The first concurrency of every range whose K differs from the range below it."""
    ranges = sorted(schedule.get("ranges") or [], key=lambda r: r["min_concurrency"])
    return [b["min_concurrency"] for a, b in zip(ranges, ranges[1:]) if a["draft_len"] != b["draft_len"]]


def draft_len_at(schedule: dict, concurrency: int) -> int:
    for r in schedule.get("ranges") or []:
        if r["min_concurrency"] <= concurrency and (r.get("max_concurrency") is None or concurrency <= r["max_concurrency"]):
            return int(r["draft_len"])
    return 0


def positions(concurrency: int, levels: list[int], marks: list[int]) -> list[str]:
    """Where ``concurrency`` lies against each threshold, e.g. ``['just above 2']``."""
    out = []
    for t in marks:
        below = [c for c in levels if c < t]
        above = [c for c in levels if c > t]
        if concurrency == t:
            out.append(f"at {t}")
        elif below and concurrency == max(below):
            out.append(f"just below {t}")
        elif above and concurrency == min(above):
            out.append(f"just above {t}")
        else:
            out.append(f"{'below' if concurrency < t else 'above'} {t}")
    return out


def _points(runs, meta: dict) -> list[dict]:
    """Per point (levels first, then ramp steps in order): per arm, per repeat, the figures."""
    ramp = ((meta.get("config") or {}).get("loadtest") or {}).get("ramp") or []
    levels: dict[Any, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    steps: dict[int, dict[str, dict[int, dict]]] = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        arm, rep = run.info["arm"], run.info.get("repeat")
        if arm == "speculative" and run.info.get("draft_len") not in (None, meta.get("primary_draft_len")):
            continue  # a swept K: the static arm is the primary one
        measured = run.measured
        by_step: dict[int, list[dict]] = defaultdict(list)
        for rec in measured:
            if rec.get("ramp_step") is not None:
                by_step[int(rec["ramp_step"])].append(rec)
        if by_step:
            for step, recs in by_step.items():
                steps[step][arm][rep] = point_metrics(recs)
        else:
            levels[run.info["concurrency"]][arm][rep] = point_metrics(measured)
    out = [{"scope": f"c={c}", "concurrency": c, "ramp_step": None, "arms": arms}
           for c, arms in sorted(levels.items()) if SCHEDULED in arms]
    for step, arms in sorted(steps.items()):
        users = ramp[step].get("users") if step < len(ramp) and isinstance(ramp[step], dict) else None
        if SCHEDULED in arms and users:
            out.append({"scope": f"ramp step {step} (users {users})", "concurrency": int(users), "ramp_step": step,
                        "arms": arms})
    return out


def _geo(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _compare(arms: dict, metric: str, lower_better: bool, confidence: float, margin: float) -> dict[str, Any]:
    means = {arm: _geo([m[metric] for m in arms.get(arm, {}).values()]) for arm in (SCHEDULED, *STATIC_ARMS)}
    static = [a for a in STATIC_ARMS if means[a] is not None]
    if not static or means[SCHEDULED] is None:
        return {"arms": means, "better_static": None, "ci": None, "worse": None}
    better = (min if lower_better else max)(static, key=lambda a: means[a])
    as_runs = {arm: [{"repeat": rep, metric: m[metric]} for rep, m in arms[arm].items()] for arm in (SCHEDULED, better)}
    ci = paired_ci(paired_values(as_runs[SCHEDULED], as_runs[better], metric), "ratio", confidence)
    low, high = ci.get("low"), ci.get("high")
    limit = 1.0 / margin if lower_better else margin  # the ratio beyond which the schedule is worse
    worse = None if low is None else (low > limit if lower_better else high < limit)
    not_worse = None if low is None else (high < limit if lower_better else low > limit)
    return {"arms": means, "better_static": better, "limit": limit,
            "ci": {k: ci.get(k) for k in ("point", "low", "high", "n_pairs", "method", "confidence_level")},
            "worse": worse, "not_worse": not_worse}


def schedule_section(runs, meta: dict, confidence: float, margin: float = 0.95) -> dict[str, Any] | None:
    """The three-arm section and its checks (as dicts) of a run with the scheduled arm; None without one.
    ``margin``: the non-inferiority margin (``gate.peak_throughput_ratio_min``)."""
    if not any(run.info["arm"] == SCHEDULED for run in runs):
        return None
    schedule = meta.get("schedule") or {}
    marks = thresholds(schedule)
    points = _points(runs, meta)
    levels = sorted({p["concurrency"] for p in points})
    rows, checks = [], []
    for p in points:
        row = {"scope": p["scope"], "concurrency": p["concurrency"], "ramp_step": p["ramp_step"],
               "draft_len": draft_len_at(schedule, p["concurrency"]),
               "position": positions(p["concurrency"], levels, marks),
               "metrics": {m: _compare(p["arms"], m, lower, confidence, margin) for m, lower in METRICS.items()},
               "longest_wait_ms": {arm: max((m["longest_wait_ms"] or 0.0 for m in p["arms"].get(arm, {}).values()),
                                            default=None) for arm in (SCHEDULED, *STATIC_ARMS)}}
        rows.append(row)
        for metric, comp in row["metrics"].items():
            checks.append(_not_worse_check(row["scope"], metric, comp))
    for i, row in enumerate(rows):
        after = _after_crossing(rows, i)
        if after:
            checks.append(_collapse_check(row, after))
            checks.append(_stall_check(row, after))
    return {"schedule": {"ranges": schedule.get("ranges") or [], "off_from": schedule.get("off_from")},
            "thresholds": marks, "points": rows, "checks": checks,
            "stall_rule": f"longest token wait (TTFT or largest inter-chunk gap) > {STALL_FACTOR:g}x the static arms' "
                          f"longest at the same point and > {STALL_MIN_MS:g} ms longer"}


def _after_crossing(rows: list[dict], i: int) -> str | None:
    """'up'/'down' when row i is the point just after a crossing: ramp steps by their order, levels as
    the nearest measured level on the far side of a threshold (load arriving from either side)."""
    row = rows[i]
    if row["ramp_step"] is not None:
        prev = [r for r in rows[:i] if r["ramp_step"] is not None]
        if prev and prev[-1]["draft_len"] != row["draft_len"]:
            return "up" if row["concurrency"] > prev[-1]["concurrency"] else "down"
        return None
    if any(pos.startswith("just above") or pos.startswith("at ") for pos in row["position"]):
        return "up"
    if any(pos.startswith("just below") for pos in row["position"]):
        return "down"
    return None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _not_worse_check(scope: str, metric: str, comp: dict) -> dict:
    ci = comp["ci"]
    if ci is None or ci.get("low") is None:
        return _check("schedule_not_worse", scope, "inconclusive",
                      f"{metric}: scheduled vs {comp['better_static'] or 'static'} has no interval (fewer than 2 pairs)", ci)
    text = (f"{metric} scheduled/{comp['better_static']} {_fmt(ci['point'])} "
            f"[{round(100 * ci['confidence_level'], 2):g}% CI {_fmt(ci['low'])}, {_fmt(ci['high'])}], "
            f"worse beyond {_fmt(comp['limit'])}")
    if comp["worse"]:
        return _check("schedule_not_worse", scope, "fail", text + f": the schedule is worse than {comp['better_static']}", ci)
    if comp["not_worse"]:
        return _check("schedule_not_worse", scope, "pass", text, ci)
    return _check("schedule_not_worse", scope, "inconclusive", text + " (the CI straddles the margin)", ci)


def _collapse_check(row: dict, direction: str) -> dict:
    comp = row["metrics"]["output_tokens_per_s"]
    ci = comp["ci"]
    scope = f"{row['scope']} (after crossing {direction})"
    if ci is None or ci.get("low") is None:
        return _check("schedule_boundary_throughput", scope, "inconclusive", "throughput: no interval", ci)
    text = (f"output tok/s scheduled/{comp['better_static']} {_fmt(ci['point'])} [{_fmt(ci['low'])}, {_fmt(ci['high'])}], "
            f"collapsed below {_fmt(comp['limit'])}")
    if comp["worse"]:
        return _check("schedule_boundary_throughput", scope, "fail", text + ": throughput collapsed at the boundary", ci)
    if comp["not_worse"]:
        return _check("schedule_boundary_throughput", scope, "pass", text, ci)
    return _check("schedule_boundary_throughput", scope, "inconclusive", text + " (the CI straddles the margin)", ci)


def _stall_check(row: dict, direction: str) -> dict:
    waits = row["longest_wait_ms"]
    scope = f"{row['scope']} (after crossing {direction})"
    mine = waits.get(SCHEDULED)
    ref = max((waits.get(a) or 0.0 for a in STATIC_ARMS), default=0.0)
    value = {"scheduled_ms": mine, "static_ms": ref}
    if mine is None or not ref:
        return _check("schedule_boundary_stall", scope, "inconclusive", "no token waits to compare", value)
    text = f"longest token wait scheduled {mine:.0f} ms vs static arms {ref:.0f} ms"
    if mine > STALL_FACTOR * ref and mine - ref > STALL_MIN_MS:
        return _check("schedule_boundary_stall", scope, "fail", text + ": the switch stalled requests", value)
    return _check("schedule_boundary_stall", scope, "pass", text, value)


def _check(rule: str, scope: str, status: str, detail: str, value: Any) -> dict:
    return {"rule": rule, "scope": scope, "status": status, "detail": detail, "value": value}


def verdict(checks: list[dict]) -> str:
    """The schedule's own verdict from its checks alone (the run's verdict folds them in too)."""
    statuses = {c["status"] for c in checks}
    return "NO-GO" if "fail" in statuses else "INCONCLUSIVE" if "inconclusive" in statuses else "GO"
