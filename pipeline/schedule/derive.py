"""A speculation schedule from the evidence one run's report holds.

Reads ``RUN_DIR/report.json`` (what ``specdeploy report`` wrote: the per-level comparisons with
their run-level intervals, the rollout range, the gate settings, the forecast section); computes no
statistic again. Returns a :class:`~pipeline.artefacts.schedule.SpeculationSchedule`; writes
nothing (``specdeploy schedule`` does).

Per measured level, each draft length measured there (all of them with ``sweep_draft_len``, else
the primary one) is a candidate when the rollout range's checks pass for it
(:func:`pipeline.report.rollout_range.failures`: errors, output equivalence and length, the TPOT
and E2E benefit ratios, the TTFT p95 guardrail, the E2E p95 tail not worse with confidence), its
throughput is not worse with confidence (run-level CI wholly below 1), and its TPOT ratio's CI lies
wholly below 1 — an interval that straddles 1 is no evidence of a benefit, so that level gets K 0
however good its point estimate (conservative where intervals are wide). Of the candidates the one
with the lowest CI upper bound wins (the best benefit the evidence guarantees), and the smallest K
within 1 % of it (a shorter draft costs less when the traffic differs from the measured mix).

Speculation stays off from the first level that has no candidate upward: the schedule is never
switched back on at a higher concurrency on the strength of one noisy level. Each K covers the
batch sizes from just above the previous measured level up to its own level (speculation pays
less as the batch grows, so a K that pays at a level pays below it). Between the last level that
pays and the first that does not, when only the TPOT benefit ended it, the boundary is where the
TPOT CI's upper bound, interpolated log-linearly in concurrency between the two levels, reaches 1
(``interpolated`` in the file); a level ended by another check switches off right above the last
level that pays. Above the highest measured level speculation is off (``unmeasured``): the
report's forecast is quoted there (its crossover), never used to switch speculation on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pipeline.artefacts.report import Report
from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule
from pipeline.config import GateSettings
from pipeline.report.comparison import best_ci
from pipeline.report.rollout_range import failures

WITHIN = 0.01  # the smallest K whose TPOT CI upper bound is within 1 % of the best one's

RULE = ("per measured level, the draft length whose TPOT ratio CI lies wholly below 1 with the lowest upper bound "
        "(the smallest K within 1 % of it) among those passing the rollout range's checks and not worse with "
        "confidence in throughput; K 0 from the first level without one upward; between measured levels the K of "
        "the level above, and past the last paying level up to where its TPOT CI upper bound, interpolated "
        "log-linearly, reaches 1; off above the highest measured level")


def _fmt(ci: dict) -> str:
    if ci.get("point") is None:
        return "n/a"
    if ci.get("low") is None or ci.get("high") is None:
        return f"{ci['point']:.3g} (no CI)"
    return f"{ci['point']:.3g} [{ci['low']:.3g}, {ci['high']:.3g}]"


def judge(level: int, comp: dict, gate: GateSettings, greedy: bool) -> dict[str, Any]:
    """One draft length at one level: ``pays`` and, when not, ``why`` (the checks it fails)."""
    tpot, tput = best_ci(comp, "tpot_ratio"), best_ci(comp, "throughput_ratio")
    e2e_p95 = (comp.get("run_level") or {}).get("e2e_p95_ratio") or {}
    why = [f"{c['rule']}: {c['detail']}" for c in failures(level, comp, gate, greedy)]
    if tput.get("high") is not None and tput["high"] < 1.0:
        why.append(f"throughput spec/base {_fmt(tput)}: worse with confidence")
    if tpot.get("high") is None:
        why.append(f"TPOT ratio {_fmt(tpot)}: no interval, no evidence of a benefit")
    elif tpot["high"] >= 1.0:
        why.append(f"TPOT ratio {_fmt(tpot)}: the interval reaches 1, no evidence of a benefit")
    return {"draft_len": comp.get("draft_len"), "pays": not why, "why": why, "tpot_ratio": tpot,
            "throughput_ratio": tput, "e2e_p95_ratio": e2e_p95 or None,
            "tpot_only": bool(why) and all(w.startswith(("TPOT ratio", "benefit_tpot_ratio")) for w in why)}


def choose(candidates: list[dict]) -> dict | None:
    """The paying candidate with the lowest TPOT CI upper bound; the smallest K within 1 % of it."""
    paying = [c for c in candidates if c["pays"]]
    if not paying:
        return None
    best = min(c["tpot_ratio"]["high"] for c in paying)
    close = [c for c in paying if c["tpot_ratio"]["high"] <= best * (1 + WITHIN)]
    return min(close, key=lambda c: (c["draft_len"] or 0))


def _crossing(low_level: int, low_high: float, high_level: int, high_high: float | None) -> int:
    """The last batch size in [low_level, high_level) whose TPOT CI upper bound, log-linear in
    log concurrency between the two levels, stays below 1."""
    if high_high is None or high_high <= 1.0 or high_level - low_level <= 1 or low_high <= 0:
        return low_level
    x0, x1, y0, y1 = math.log(low_level), math.log(high_level), math.log(low_high), math.log(high_high)
    at = math.exp(x0 + (x1 - x0) * (0.0 - y0) / (y1 - y0))  # where log(high) reaches 0
    return max(low_level, min(high_level - 1, math.ceil(at) - 1))


def _levels(report: dict) -> dict[int, list[dict]]:
    """Measured level → its comparisons (every draft length measured there)."""
    out: dict[int, list[dict]] = {}
    for comp in report.get("comparisons", []):
        out.setdefault(int(comp["concurrency"]), []).append(comp)
    return out


def _forecast_note(report: dict) -> str | None:
    forecast = report.get("forecast") or {}
    if not forecast.get("available"):
        return None
    below = [lv["concurrency"] for lv in forecast.get("levels", []) if (lv.get("forecast_tpot_ratio") or 0) < 1.0]
    crossover = forecast.get("crossover")
    if crossover:
        return f"the forecast (this run's acceptance fed back) puts the crossover at concurrency {crossover}"
    if below:
        return f"the forecast (this run's acceptance fed back) has speculation slower at concurrency {below[0]}"
    return "the forecast (this run's acceptance fed back) has speculation paying at every measured level"


def derive(report: dict) -> SpeculationSchedule:
    """The schedule from ``report`` (the content of ``report.json``)."""
    gate = GateSettings(**report["gate_settings"])
    greedy = report.get("greedy", True)
    primary = report.get("primary_draft_len")
    by_level = _levels(report)
    if not by_level:
        raise ValueError("the report holds no comparison: nothing to derive a schedule from")
    swept = any(len(comps) > 1 for comps in by_level.values())
    levels, chosen, off = [], {}, None
    for level in sorted(by_level):
        comps = by_level[level] if swept else [c for c in by_level[level] if c.get("primary", True)] or by_level[level]
        judged = [judge(level, c, gate, greedy) for c in comps]
        pick = choose(judged) if off is None else None
        k = (pick["draft_len"] or primary or 0) if pick else 0
        if pick is None and off is None:
            off = level
        if pick is not None:
            chosen[level] = (k, pick)
        reason = (f"K {k}: TPOT {_fmt(pick['tpot_ratio'])}" if pick else
                  f"off (speculation stopped paying at {off})" if level != off else
                  "off: " + "; ".join(w for j in judged for w in j["why"]))
        levels.append({"concurrency": level, "draft_len": k, "reason": reason, "basis": "measured",
                       "candidates": [{k2: v for k2, v in j.items() if k2 != "tpot_only"} for j in judged]})
    ranges: list[DraftLenRange] = []
    start = 1
    on = sorted(chosen)
    for level in on:
        k, pick = chosen[level]
        below = f"; batch sizes below {level} use it too (drafting costs less there)" if start < level else ""
        ranges.append(DraftLenRange(min_concurrency=start, max_concurrency=level, draft_len=k, basis="measured",
                                    evidence=f"c={level}: TPOT spec/base {_fmt(pick['tpot_ratio'])}, throughput "
                                             f"{_fmt(pick['throughput_ratio'])}{below}"))
        start = level + 1
    notes = []
    if off is not None and on:
        last = on[-1]
        k, pick = chosen[last]
        at_off = next((j for j in [judge(off, c, gate, greedy) for c in by_level[off]] if j["draft_len"] in (k, None)),
                      None) or judge(off, by_level[off][0], gate, greedy)
        end = _crossing(last, pick["tpot_ratio"]["high"], off, at_off["tpot_ratio"].get("high")) \
            if at_off["tpot_only"] else last
        if end > last:
            ranges.append(DraftLenRange(min_concurrency=last + 1, max_concurrency=end, draft_len=k, basis="interpolated",
                                        evidence=f"between c={last} (TPOT CI high {pick['tpot_ratio']['high']:.3g}) and "
                                                 f"c={off} ({at_off['tpot_ratio']['high']:.3g}): log-linear, below 1 "
                                                 f"up to {end}"))
            start = end + 1
    if off is not None:
        ranges.append(DraftLenRange(min_concurrency=start, draft_len=0, basis="measured",
                                    evidence=f"speculation stopped paying at c={off}: "
                                             + next(lv["reason"] for lv in levels if lv["concurrency"] == off)))
    else:
        top = max(by_level)
        ranges.append(DraftLenRange(min_concurrency=start, draft_len=0, basis="unmeasured",
                                    evidence=f"above the highest measured concurrency ({top}): not measured, so off; "
                                             "load-test higher levels to extend the schedule"))
    forecast = _forecast_note(report)
    if forecast:
        notes.append(forecast + " (quoted, never used to switch speculation on)")
    if not on:
        notes.append("speculation paid with confidence at no measured level: the schedule is off everywhere")
    ranges = _merge(ranges)
    off_from = next((r.min_concurrency for r in ranges if r.draft_len == 0), None)
    provenance = report.get("provenance") or {}
    return SpeculationSchedule(
        name=report.get("name", ""), run_dir=report.get("run_dir", ""), method=_method(provenance),
        verdict=report.get("verdict"), max_draft_len=max(r.draft_len for r in ranges), off_from=off_from,
        ranges=ranges, levels=levels, rule=RULE, notes=notes, context=_context(report, swept))


def _merge(ranges: list[DraftLenRange]) -> list[DraftLenRange]:
    """Adjacent ranges of the same K and basis become one (the evidence of both kept)."""
    out: list[DraftLenRange] = []
    for r in ranges:
        prev = out[-1] if out else None
        if prev is not None and prev.draft_len == r.draft_len and prev.basis == r.basis:
            out[-1] = prev.model_copy(update={"max_concurrency": r.max_concurrency,
                                              "evidence": f"{prev.evidence}; {r.evidence}"})
        else:
            out.append(r)
    return out


def _method(provenance: dict) -> str | None:
    return provenance.get("method")  # run.json's method, which report.json's provenance keeps


def _context(report: dict, swept: bool) -> dict[str, Any]:
    forecast = report.get("forecast") or {}
    return {"primary_draft_len": report.get("primary_draft_len"), "swept_draft_lengths": swept,
            "measured_levels": sorted(_levels(report)), "context_tokens": forecast.get("context_tokens"),
            "context_source": forecast.get("context_source"), "acceptance_rate": report.get("acceptance_rate"),
            "greedy": report.get("greedy")}


def derive_from_run(run_dir: Path) -> SpeculationSchedule:
    """The schedule from ``run_dir/report.json`` (refused with the command to run when absent)."""
    path = Path(run_dir) / "report.json"
    Report.load(path)  # the schema check: a missing or foreign file is named with `specdeploy report`
    return derive(json.loads(path.read_text(encoding="utf-8")))  # the raw dict, numbers as written
