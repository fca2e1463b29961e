"""The recommended rollout range: the concurrency levels where speculation may be enabled.

Reads the analysis (``pipeline.report.builder.analyze``: the primary comparisons per level and
the TPOT crossover) and the config's ``GateSettings``; returns a plain dict that ``report.json``
carries as ``rollout_range`` and the banner words (``pipeline.report.view.summary.rollout``).
Writes nothing.

A level below the crossover (where the TPOT CI still shows a benefit) is recommended only if it
would also pass the gate had it been gated: every check the gate applies at a gated level
(:func:`pipeline.report.gate.level_checks`: errors, output equivalence and length, the TPOT and
E2E benefit ratios, the TTFT p95 guardrail) does not fail there, and its tail latency is not worse
with confidence (E2E p95 spec/base, run-level CI above 1: what the slowest users feel, which the
median E2E check does not see). A check that is only inconclusive does not exclude a level (the
gate itself says INCONCLUSIVE for that at a gated level); a failed one does, and is named with
its figures. The range is the levels from the lowest up to the first excluded one (``enable up
to``): enabling at a level means enabling at every level below it too. The verdict is not
changed here: the gate checks ``gate.target_concurrency`` (default: the lowest level) only.

The range never contradicts the verdict: up to the highest gated level the gate's verdict speaks,
so a tail that is worse with confidence there (which the gate does not check) is a ``caution`` the
banner names beside the range, not an exclusion that would say "do not enable" under a GO.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import GateSettings
from pipeline.report.gate import FAIL, level_checks


def tail_check(level: int, comp: dict) -> dict[str, Any] | None:
    """E2E p95 spec/base worse with confidence (run-level CI entirely above 1), else None."""
    ci = (comp.get("run_level") or {}).get("e2e_p95_ratio") or {}
    if ci.get("low") is None or ci["low"] <= 1.0:
        return None
    return {"rule": "tail_e2e_p95", "scope": f"c={level}", "status": FAIL,
            "detail": f"E2E p95 spec/base {ci['point']:.3g} [95% CI {ci['low']:.3g}, {ci['high']:.3g}]: worse",
            "value": {"point": ci["point"], "low": ci["low"], "high": ci["high"], "level": "run"}}


def failures(level: int, comp: dict, gate: GateSettings, greedy: bool) -> list[dict[str, Any]]:
    """The checks ``level`` fails as if it were gated, as dicts (rule, scope, status, detail, value)."""
    out = [c.as_dict() for c in level_checks(level, comp, gate, greedy=greedy) if c.status == FAIL]
    tail = tail_check(level, comp)
    return out + ([tail] if tail else [])


def rollout_range(analysis: dict[str, Any], gate: GateSettings) -> dict[str, Any]:
    """``levels`` (recommended), ``up_to`` (their highest, None: none), ``crossover``, ``excluded``
    (levels below the crossover that fail a check, with the checks) and ``rule`` (how)."""
    comps = {c["concurrency"]: c for c in analysis["comparisons"] if c.get("primary", True)}
    crossover = analysis.get("crossover_concurrency")
    below = [level for level in sorted(comps) if crossover is None or level < crossover]
    greedy = analysis.get("greedy", True)
    gated = [level for level in (gate.target_concurrency or sorted(comps)[:1]) if level in comps]
    excluded, cautions = [], []
    for level in below:
        failed = failures(level, comps[level], gate, greedy)
        gate_own = [c for c in failed if c["rule"] != "tail_e2e_p95"]
        # up to the highest gated level the verdict speaks (a GO there enables every level below):
        # a tail worse with confidence is named beside it, it does not empty the range under a GO
        if gated and level <= max(gated) and not gate_own:
            cautions += [{"concurrency": level, "checks": failed}] if failed else []
        elif failed:
            excluded.append({"concurrency": level, "checks": failed})
    first_bad = excluded[0]["concurrency"] if excluded else None
    levels = [level for level in below if first_bad is None or level < first_bad]
    return {"levels": levels, "up_to": levels[-1] if levels else None, "crossover": crossover,
            "measured": sorted(comps), "excluded": excluded, "cautions": cautions,
            "rule": "levels below the TPOT crossover up to the first one that fails a check the gate applies at a "
                    "gated level, or whose E2E p95 is worse with confidence (at a gated level: a caution)"}
