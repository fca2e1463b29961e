"""The decision summary at the top of the report: a verdict banner and one-line findings.

Reads the report data (``report.json`` content); writes nothing. Every sentence is generated from
the analysis and the gate: what speculation gives at each measured concurrency (with CIs), where
it stops paying, the rollout that follows, acceptance overall and its weakest category, output
equivalence, and every gate check that did not pass.

One message: the headline's "where it stops paying" and the rollout line are both worded from the
one recommended range (``rollout_range`` in report.json, which the verdict bounds: a gated level
the gate passed stays in it), so they cannot disagree; the level that ends the range is named with
its reason (the tail guardrail by name) in both. Every level or prompt category where speculation
is worse with confidence is named on the first screen.
"""

from __future__ import annotations

from typing import Any

from pipeline.report.acceptance_reported import missing_acceptance_line
from pipeline.report.view.evidence import aa_decision, ci_words, repeats_line, rig_noise_line
from pipeline.report.view.model import (
    category_acceptance,
    data_warning_lines,
    primary_comparisons,
    ratio_ci,
    target_levels,
    weakest_category,
)
from pipeline.report.view.rounding import fmt_ci, fmt_p, fmt_pct, fmt_value, invert_ci, tidy_text

TITLES = {"GO": "Roll out speculative decoding", "NO-GO": "Do not roll out speculative decoding",
          "INCONCLUSIVE": "Not decided: the evidence is not strong enough"}
STATUS_ORDER = {"fail": 0, "inconclusive": 1, "not checked": 3, "pass": 9}
# Repeats of one cell whose median TPOT differs by more than this (coefficient of variation) widen
# every CI; the reader should learn that from the summary, not from the variability table.
NOISY_CV = 0.2


def ratio_phrase(ci: dict, of: str = "") -> str:
    """``0.45× baseline [0.43, 0.48]``: a spec/base ratio with its CI, rounded to what the CI supports."""
    text = fmt_ci(ci["point"], ci["low"], ci["high"])
    of = f" {of}" if of else ""
    if text["point"] == "–":
        return "not measured"
    if text["low"] == "–":
        return f"{text['point']}×{of} (no CI)"
    pooled = " (request-level CI)" if ci.get("level") not in (None, "run") else ""
    return f"{text['point']}×{of} [{text['low']}, {text['high']}]{pooled}"


def speed_phrase(tpot: dict) -> str:
    """``2.2× faster`` / ``1.3× slower`` from the TPOT ratio (spec/base)."""
    point = tpot["point"]
    if not point:
        return "no TPOT measured"
    if point <= 1.0:
        inv = invert_ci(point, tpot["low"], tpot["high"])
        return f"{fmt_ci(*inv)['point']}× faster"
    return f"{fmt_ci(point, tpot['low'], tpot['high'])['point']}× slower"


def level_name(comp: dict) -> str:
    """"concurrency 4" for a closed-loop level; an open-loop level is its offered rate (its
    concurrency field is only the level's index)."""
    rate = comp.get("target_rate")
    return f"rate {rate:g} req/s (level {comp['concurrency']})" if rate else f"concurrency {comp['concurrency']}"


def level_line(comp: dict, targets: list[int], crossover: int | None, window: dict | None = None) -> str:
    level = comp["concurrency"]
    window = window or {}
    outside = window.get("measured") is not None and level not in (window.get("levels") or []) \
        and (crossover is None or level < crossover)
    tags = [t for t, on in (("gated", level in targets), ("past crossover", crossover is not None and level >= crossover),
                            ("outside the recommended range", outside)) if on]
    tpot = ratio_ci(comp, "tpot_ratio")
    label = level_name(comp).capitalize() + (f" ({', '.join(tags)})" if tags else "")
    return (f"{label}: decoding {speed_phrase(tpot)} per user — TPOT {ratio_phrase(tpot, 'baseline')}, "
            f"E2E {ratio_phrase(ratio_ci(comp, 'e2e_ratio'))}, "
            f"E2E p95 {ratio_phrase(ratio_ci(comp, 'e2e_p95_ratio'))}, "
            f"throughput {ratio_phrase(ratio_ci(comp, 'throughput_ratio'))}")


def rollout(data: dict) -> str:
    """Where to enable speculation: below the crossover of the primary draft length, up to the
    first level that fails a check (``rollout_range`` in report.json,
    :mod:`pipeline.report.rollout_range`), each excluded level named with what it fails."""
    levels = [c["concurrency"] for c in primary_comparisons(data)]
    crossover = data["crossover_concurrency"]
    if not levels:
        return "no concurrency level has both arms measured"
    window = data.get("rollout_range") or {}
    excluded = window.get("excluded") or []
    if crossover == levels[0]:
        return "do not enable: no measured concurrency shows a TPOT benefit"
    if not excluded:
        if crossover is None:
            return (f"enable at every measured concurrency (up to {levels[-1]}); no crossover was found, so "
                    f"measure higher before running above {levels[-1]}")
        last_good = max(level for level in levels if level < crossover)
        return f"enable up to concurrency {last_good}, disable from {crossover}"
    up_to = window.get("up_to")
    head = f"enable up to concurrency {up_to}" if up_to is not None else "do not enable"
    reasons = "; ".join(f"at {e['concurrency']}, {excluded_reason(e['checks'])}" for e in excluded)
    tail = f"; disable from {crossover} (the crossover)" if crossover is not None else ""
    return f"{head}; {reasons}{tail}"


def cautions(data: dict) -> str:
    """``; caution at 1 (gated), E2E p95 is …, worse with confidence (tail guardrail): …`` or ``""``:
    the gate passed the level, and the tail is not one of its checks."""
    items = (data.get("rollout_range") or {}).get("cautions") or []
    if not items:
        return ""
    parts = [f"at {c['concurrency']} (gated), {excluded_reason(c['checks'])}" for c in items]
    return "; caution " + "; ".join(parts) + ": check the slowest requests against your SLO before enabling"


RANGE_LABELS = {"benefit_tpot_ratio": "TPOT", "benefit_e2e_ratio": "E2E", "tail_e2e_p95": "E2E p95"}
RULE_NAMES = {"tail_e2e_p95": "tail guardrail"}


def excluded_reason(checks: list[dict]) -> str:
    """``E2E p95 is 1.29× baseline [1.24, 1.35], worse with confidence (tail guardrail)`` (and the
    other failed checks) for one level."""
    parts = []
    for check in checks:
        label, value = RANGE_LABELS.get(check["rule"]), check.get("value")
        if label and isinstance(value, dict):
            name = RULE_NAMES.get(check["rule"])
            parts.append(f"{label} is {ratio_phrase(value, 'baseline')}"
                         + (f", worse with confidence ({name})" if name else ""))
        else:
            parts.append(f"{check['rule']} fails ({tidy_text(str(check['detail']))})")
    return " and ".join(parts)


def range_clause(data: dict) -> str:
    """Where speculation stops paying, worded from the recommended range (the rollout line's source)."""
    comps = [c["concurrency"] for c in primary_comparisons(data)]
    window = data.get("rollout_range") or {}
    crossover = data["crossover_concurrency"]
    excluded = window.get("excluded") or []
    if excluded:
        first = excluded[0]
        reason = f"at {first['concurrency']}, {excluded_reason(first['checks'])}"
        if window.get("up_to") is None:
            return f"but no measured level qualifies for a rollout: {reason}"
        return f"pays up to concurrency {window['up_to']}; {reason}"
    if crossover is not None:
        if crossover == comps[0]:
            return "shows no TPOT benefit at any measured level"
        return f"stops paying at concurrency {crossover} (its TPOT CI no longer shows a benefit there)"
    return f"still pays at the highest measured concurrency, {max(comps)}"


def draft_length_line(data: dict) -> str | None:
    recs = data.get("recommended_draft_len") or {}
    if not recs:
        return None
    parts = [f"c={level} K={rec['draft_len']}" if rec["speculation"] == "on" else f"c={level} off"
             for level, rec in recs.items()]
    return "Draft length per concurrency (lowest TPOT ratio whose CI shows a benefit): " + ", ".join(parts)


def headline_sentence(data: dict) -> str:
    comps = {c["concurrency"]: c for c in primary_comparisons(data)}
    targets = target_levels(data)
    if not targets:
        return "No concurrency level was measured with both arms."
    level = targets[0]
    tpot = ratio_ci(comps[level], "tpot_ratio")
    clause = range_clause(data)
    joint = ", " if clause.startswith("but ") else " and "
    # the gated level's own tail, when worse with confidence, in the same sentence as its speed-up
    caution = next((c for c in (data.get("rollout_range") or {}).get("cautions") or [] if c["concurrency"] == level), None)
    tail = f", though its {excluded_reason(caution['checks'])}," if caution else ""
    return (f"At {level_name(comps[level])}, speculation makes decoding {speed_phrase(tpot)} per user "
            f"(TPOT {ratio_phrase(tpot, 'baseline')}, {ci_words(data)}){tail}{joint}{clause}.")


# ratio, label, lower is better: what "worse with confidence" is looked for in, per level
WORSE_RATIOS = (("tpot_ratio", "TPOT", True), ("e2e_ratio", "E2E", True), ("e2e_p95_ratio", "E2E p95", True),
                ("ttft_p95_ratio", "TTFT p95", True), ("throughput_ratio", "throughput", False))


def worse_line(data: dict) -> str | None:
    """Every level (run-level CI wholly on the worse side of 1) and prompt category (one-sided
    request-level test, :mod:`pipeline.report.per_request`) where speculation is worse with confidence."""
    parts = []
    for comp in primary_comparisons(data):
        for name, label, lower in WORSE_RATIOS:
            ci = ratio_ci(comp, name)
            if ci.get("level") != "run" or ci.get("low") is None:
                continue
            if (ci["low"] > 1.0) if lower else (ci["high"] < 1.0):
                parts.append(f"c={comp['concurrency']} {label} {ratio_phrase(ci, 'baseline')}")
    slow: dict[str, list[str]] = {}
    for comp in primary_comparisons(data):
        for cat, figures in (comp.get("category_slower") or {}).items():
            if figures.get("slower"):
                slow.setdefault(cat, []).append(f"c={comp['concurrency']} TPOT {fmt_value(figures['tpot_ratio'])}× "
                                                f"(p {fmt_p(figures['p_slower'])})")
    parts += [f"category {cat} ({', '.join(where)}; request level)" for cat, where in slow.items()]
    if not parts:
        return None
    level = (data.get("bootstrap") or {}).get("confidence_level") or 0.95
    return f"Worse with speculation, with {fmt_pct(level)} confidence: " + "; ".join(parts) + "."


def goodput_line(data: dict) -> str | None:
    """Goodput at the user's SLOs, per level: each arm's requests/s and output tokens/s meeting every
    bound, the spec/base ratio with its CI, and each arm's percentile against each bound. None when
    the SLOs are the defaults nobody declared."""
    slo = (data.get("gate_settings") or {}).get("slo") or {}
    if not slo.get("declared"):
        return None
    bounds = ", ".join(f"{label} ≤ {fmt_value(slo[key])} ms" for key, label in
                       (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")) if slo.get(key) is not None)
    parts = []
    for comp in primary_comparisons(data):
        good = comp.get("goodput") or {}
        base, spec = good.get("base") or {}, good.get("spec") or {}
        missed = [f"{arm} p{figures['slo']['percentile']:g} {name.upper()} {fmt_value(m['value_ms'])} ms"
                  for arm, figures in (("baseline", base), ("speculative", spec)) if figures.get("slo")
                  for name, m in figures["slo"]["metrics"].items() if m.get("met") is False]
        parts.append(f"c={comp['concurrency']} baseline {fmt_value(base.get('requests_per_s'))} req/s "
                     f"({fmt_value(base.get('output_tokens_per_s'))} tok/s), speculative "
                     f"{fmt_value(spec.get('requests_per_s'))} req/s ({fmt_value(spec.get('output_tokens_per_s'))} tok/s), "
                     f"{_goodput_ratio(comp, base, spec)}"
                     + (f"; over the bound: {', '.join(missed)}" if missed else ""))
    if not parts:
        return None
    return f"Goodput at the SLO (requests meeting {bounds}): " + "; ".join(parts) + "."


def _goodput_ratio(comp: dict, base: dict, spec: dict) -> str:
    if not base.get("requests_per_s") or not spec.get("requests_per_s"):  # a ratio with a zero: say which
        none = [arm for arm, figures in (("baseline", base), ("speculative", spec)) if not figures.get("requests_per_s")]
        return f"no {' and no '.join(none)} request within the SLOs"
    return ratio_phrase(ratio_ci(comp, "goodput_ratio"))


def acceptance_line(data: dict) -> str:
    rate = data.get("acceptance_rate")
    if rate is None:
        return missing_acceptance_line(data.get("acceptance_reported") or {})
    floor = (data.get("gate_settings") or {}).get("min_acceptance_rate")
    text = f"Acceptance: {fmt_pct(rate)} of drafted tokens accepted, pooled over tokens"
    text += f" (floor {fmt_pct(floor)})" if floor is not None else ""
    per_request = data.get("acceptance_per_request") or {}
    if per_request.get("n"):
        text += (f"; per request p10 {fmt_pct(per_request['p10'])}, median {fmt_pct(per_request['p50'])}, "
                 f"p90 {fmt_pct(per_request['p90'])} ({per_request['n']} requests)")
    weakest = weakest_category(category_acceptance(data))
    if weakest:
        text += f"; weakest category: {weakest['category']} at {fmt_pct(weakest['acceptance_rate'])}"
    return text + "."


def equivalence_line(data: dict) -> str:
    comps = primary_comparisons(data)
    if not data.get("greedy", True):
        return "Output equivalence: not checked — sampling is not greedy, so outputs may legitimately differ."
    differing = [(c["concurrency"], c["equivalence"]) for c in comps if c["equivalence"]["mismatched"]]
    if differing:
        parts = [f"{eq['mismatched']} of {eq['prompts_compared']} prompts at c={level}" for level, eq in differing]
        return "Output equivalence: outputs differ between arms — " + ", ".join(parts) + " (greedy decoding)."
    compared = ", ".join(f"{c['equivalence']['prompts_compared']} at c={c['concurrency']}" for c in comps)
    if not any(c["equivalence"]["prompts_compared"] for c in comps):
        return "Output equivalence: no prompt was answered by both arms, nothing to compare."
    return f"Output equivalence: identical outputs from both arms for every prompt compared ({compared}; greedy)."


def noise_line(data: dict) -> str | None:
    """A warning when repeats of one cell disagree enough to explain wide intervals."""
    scored = [(c["run_variability"]["median_tpot_ms"]["cv"], c) for c in data["cells"]
              if c["run_variability"]["median_tpot_ms"]["cv"] is not None]
    if not scored:
        return None
    cv, worst = max(scored, key=lambda x: x[0])
    if cv <= NOISY_CV:
        return None
    return (f"Noise: repeats disagree — median TPOT varies by {fmt_pct(cv)} (CV) between the runs of {worst['arm']} "
            f"c={worst['concurrency']}, which widens every CI; rerun on a quiet machine or with more repeats.")


def capacity_line(data: dict) -> str | None:
    """Capacity and cost at the SLO, with and without speculation, and the method's last check."""
    section = data.get("capacity")
    if not section:
        return None
    if not section.get("available"):
        return f"Capacity: not available — {section.get('reason')}."
    fleet, slo = section["fleet"], section["capacity"]["slo"]
    limits = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items() if k != "percentile")
    demand = fleet["demand"]
    load = (f"{demand['rate_rps']:g} req/s" if demand.get("rate_rps") is not None
            else f"a daily profile (peak {max(demand['hourly_rps']):g} req/s)")

    def arm(name: str) -> str:
        a = fleet["arms"][name]
        if a["gpus"] is None:
            return "no load within the SLO"
        cost = f", ${a['cost_per_m_tokens_usd']:.3g} per M output tokens" if a.get("cost_per_m_tokens_usd") is not None else ""
        return f"{a['gpus']} GPUs{cost}"

    text = (f"Capacity at p{slo['percentile']:g} {limits}: {load} needs {arm('speculative')} with speculation, "
            f"{arm('baseline')} without")
    ratio = section["capacity"].get("capacity_ratio") or {}
    if ratio.get("low") is not None:
        text += f" (capacity × {ratio['point']:.2f}, {ratio['low']:.2f}–{ratio['high']:.2f})"
    check = section.get("last_check")
    if check and check.get("comparison"):
        errors = {arm: c["p95_tpot_error"] for arm, c in check["comparison"].items() if c.get("p95_tpot_error") is not None}
        if errors:
            text += ("; in its last check against an open-loop run at a rate it had not measured, this sizing's p95 "
                     "TPOT was off by " + ", ".join(f"{e:+.0%} ({arm})" for arm, e in errors.items())
                     + " (benchmarks/results/capacity-check.json)")
    return text + "."


def sessions_line(data: dict) -> str | None:
    """A resumed run: which cells came from which session, and the gap between them."""
    info = data.get("sessions") or {}
    if not info.get("resumed"):
        return None
    parts = []
    for entry in info["sessions"]:
        if not entry["cells"]:
            continue
        gap = f", {fmt_gap(entry['gap_s'])} after the previous session's last cell" if entry.get("gap_s") is not None else ""
        parts.append(f"session {entry['session']} ({entry.get('started') or 'start unknown'}{gap}) measured "
                     f"{len(entry['cells'])} cells: {', '.join(entry['cells'])}")
    return ("Resumed run: the cells were measured in separate sessions, on separate server starts — "
            + "; ".join(parts) + ".")


def fmt_gap(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def open_checks(data: dict) -> list[dict[str, Any]]:
    """Every gate check that is not a pass, failures first, in the gate's order otherwise."""
    checks = [c for c in data["gate"]["checks"] if c["status"] != "pass"]
    return sorted(checks, key=lambda c: STATUS_ORDER.get(c["status"], 2))


def check_line(check: dict) -> str:
    return f"{check['status'].upper()}: {check['rule']} ({check['scope']}) — {tidy_text(str(check['detail']))}"


def decision(data: dict) -> dict[str, Any]:
    """The banner (verdict, title, sentence, rollout) and the findings list under it."""
    verdict = data["verdict"]
    if data.get("aa"):  # an A/A of the rig: its verdict and noise, no rollout
        return aa_decision(data, [check_line(c) for c in open_checks(data)], _status_counts(data))
    crossover = data["crossover_concurrency"]
    targets = target_levels(data)
    window = data.get("rollout_range") or {}
    findings = [line for line in (schedule_line(data),) if line]
    findings += [level_line(c, targets, crossover, window) for c in primary_comparisons(data)]
    findings += [line for line in (goodput_line(data), worse_line(data)) if line]
    findings += [line for line in (draft_length_line(data),) if line]
    findings += [acceptance_line(data), equivalence_line(data)]
    findings += [line for line in (noise_line(data), capacity_line(data)) if line]
    findings += [line for line in (sessions_line(data), repeats_line(data), rig_noise_line(data)) if line]
    findings += [f"Data: {w}." for w in data_warning_lines(data)]
    prefix = {"GO": "Recommended rollout", "NO-GO": "Where speculation would pay once the failures are fixed",
              "INCONCLUSIVE": "Provisional rollout, if a rerun confirms it"}.get(verdict, "Rollout")
    method = (data.get("provenance") or {}).get("method")
    k = data.get("primary_draft_len")
    what = f" ({method}, K={k})" if method and k else ""
    return {
        "verdict": verdict,
        "exit_code": data["exit_code"],
        "title": f"{TITLES.get(verdict, verdict)}{what}",
        "sentence": headline_sentence(data),
        "rollout": f"{prefix}: {rollout(data)}{cautions(data)}.",
        "findings": findings,
        "checks": [check_line(c) for c in open_checks(data)],
        "advice": [tidy_text(a) for a in data.get("advice", [])],
        "counts": _status_counts(data),
    }


def schedule_line(data: dict) -> str | None:
    """A run with the scheduled arm: the schedule (ranges → K) and how it held across its thresholds,
    with the schedule's own verdict (its checks are folded into the run's verdict too)."""
    section = data.get("schedule")
    if not section:
        return None
    ranges = [f"c {r['min_concurrency']}{'+' if r.get('max_concurrency') is None else '-' + str(r['max_concurrency'])}"
              f" → {'off' if not r['draft_len'] else 'K=' + str(r['draft_len'])}" for r in section["schedule"]["ranges"]]
    boundary = [c for c in section["checks"] if c["rule"] != "schedule_not_worse"]
    failed = [c for c in section["checks"] if c["status"] == "fail"]
    failures = "; ".join(dict.fromkeys(f"{c['rule']} at {c['scope']}" for c in failed))  # once per rule and point
    held = (f"did not hold: {failures}" if failed
            else f"held ({sum(c['status'] == 'pass' for c in boundary)} of {len(boundary)} boundary checks pass, "
                 f"never worse with confidence than the better static arm)" if all(c["status"] == "pass" for c in section["checks"])
            else "not yet shown to hold (some checks inconclusive)")
    marks = ", ".join(str(t) for t in section["thresholds"]) or "none"
    return (f"Schedule {section['verdict']}: {'; '.join(ranges) or 'no ranges'}; across its thresholds "
            f"(concurrency {marks}) it {held}.")


def _status_counts(data: dict) -> str:
    counts: dict[str, int] = {}
    for c in data["gate"]["checks"]:
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    order = sorted(counts, key=lambda s: STATUS_ORDER.get(s, 2))
    return ", ".join(f"{counts[s]} {s}" for s in order) + f" of {len(data['gate']['checks'])} gate checks"

