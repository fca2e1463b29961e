"""The rollout gate: GO / NO-GO / INCONCLUSIVE from the analysed load test (docs/report.md).

Reads the analysis dict built by ``pipeline.report.builder.analyze`` (run summaries, per-cell stats and
spec-vs-base comparisons per concurrency) and the ``GateSettings`` of the config; returns a
:class:`GateResult` with every check (rule, scope, pass/fail/inconclusive, value, threshold).
Any failed check → NO-GO; else any inconclusive check → INCONCLUSIVE; else GO (a check "not
checked", such as acceptance no one reports, is listed and changes nothing; so is a "warning", such
as acceptance below ``min_acceptance_rate``: a proxy warns, the measured benefit decides, unless
``gate.acceptance_is_gate``). The interval checks use the run-level paired t intervals of
:mod:`pipeline.report.intervals`; an undecided one says how many paired repeats would likely decide it. A run whose
server died is invalid and makes the verdict NO-GO: such a run can never be a GO; so does a run in
which speculative requests fell back to target-only after a draft failure (``draft_fallbacks``).
Exit codes: GO 0, NO-GO 1, INCONCLUSIVE 3, from the one table in ``pipeline.errors`` (docs/ci.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config import GateSettings
from pipeline.errors import EXIT_GO, EXIT_INCONCLUSIVE, EXIT_NO_GO
from pipeline.report.comparison import best_ci
from pipeline.report.intervals import repeats_to_decide

GO, NO_GO, INCONCLUSIVE = "GO", "NO-GO", "INCONCLUSIVE"
NO_DIFFERENCE, DIFFERENCE = "NO DIFFERENCE", "DIFFERENCE"  # the A/A verdicts (pipeline/report/aa.py)
EXIT_CODES = {GO: EXIT_GO, NO_GO: EXIT_NO_GO, INCONCLUSIVE: EXIT_INCONCLUSIVE, NO_DIFFERENCE: EXIT_GO, DIFFERENCE: EXIT_NO_GO}
PASS, FAIL, UNSURE = "pass", "fail", "inconclusive"
NOT_CHECKED = "not checked"  # shown with the checks, no reason for the verdict
WARNING = "warning"  # shown with its explanation, no reason for the verdict
# The checks decided by a run-level interval against a threshold: what `repeats: auto` waits for
INTERVAL_RULES = ("benefit_tpot_ratio", "benefit_e2e_ratio", "guardrail_ttft_p95", "guardrail_peak_throughput",
                  "guardrail_goodput")
CLIENT_CPU_MAX = 0.9  # Locust's own warning threshold


@dataclass
class Check:
    rule: str
    scope: str
    status: str
    detail: str
    value: Any = None
    threshold: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "scope": self.scope, "status": self.status, "detail": self.detail,
                "value": self.value, "threshold": self.threshold}


@dataclass
class GateResult:
    verdict: str
    checks: list[Check]
    advice: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def reasons(self) -> list[str]:
        return [f"[{c.status}] {c.rule} ({c.scope}): {c.detail}" for c in self.checks
                if c.status not in (PASS, NOT_CHECKED)]

    @property
    def repeats_to_decide(self) -> int | None:
        """Paired repeats per arm that would likely decide every undecided interval check (the most any
        one needs); None when none is undecided or no estimate exists."""
        wanted = [c.value.get("repeats_to_decide") for c in self.checks
                  if c.status == UNSURE and c.rule in INTERVAL_RULES and isinstance(c.value, dict)]
        wanted = [w for w in wanted if w is not None]
        return max(wanted) if wanted else None

    def as_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "exit_code": self.exit_code, "reasons": self.reasons,
                "advice": self.advice, "repeats_to_decide": self.repeats_to_decide,
                "checks": [c.as_dict() for c in self.checks]}


def evaluate_gate(analysis: dict[str, Any], gate: GateSettings) -> GateResult:
    checks: list[Check] = []
    advice: list[str] = []
    comparisons = {c["concurrency"]: c for c in analysis["comparisons"] if c.get("primary", True)}
    levels = sorted(comparisons)
    targets = [c for c in (gate.target_concurrency or levels[:1]) if c in comparisons]
    checks += _validity_checks(analysis, gate)
    if not levels:
        checks.append(Check("coverage", "run", UNSURE, "no concurrency level has both arms"))
    missing = [c for c in (gate.target_concurrency or []) if c not in comparisons]
    if missing:
        checks.append(Check("coverage", "run", UNSURE, f"target concurrency {missing} was not measured"))
    for level in levels:
        checks += _level_validity(level, comparisons[level], gate, greedy=analysis.get("greedy", True))
    for level in targets:
        checks += _benefit_checks(level, comparisons[level], gate)
        checks.append(_ttft_guardrail(level, comparisons[level], gate))
        if gate.slo.declared:  # the user's SLOs: goodput must not fall (vLLM's and AIPerf's --goodput)
            checks.append(goodput_guardrail(level, comparisons[level], gate))
    if levels:
        checks.append(_peak_throughput_guardrail(levels[-1], comparisons[levels[-1]], gate, analysis, targets, advice))
    checks += _acceptance_checks(analysis, gate, advice)
    # a run with the scheduled arm is a run to deploy the schedule: its checks decide the verdict too
    for c in (analysis.get("schedule") or {}).get("checks", []):
        checks.append(Check(c["rule"], c["scope"], c["status"], c["detail"], c.get("value")))
    verdict = NO_GO if any(c.status == FAIL for c in checks) else INCONCLUSIVE if any(c.status == UNSURE for c in checks) else GO
    result = GateResult(verdict, checks, advice)
    needed = result.repeats_to_decide
    if verdict == INCONCLUSIVE and needed is not None:
        have = max((c.value.get("n_pairs") or 0 for c in checks if isinstance(c.value, dict)), default=0)
        advice.append(f"about {needed} paired repeats per arm ({needed - have} more) would likely decide every "
                      "undecided interval check (from the observed spread of the per-repeat ratios; "
                      "loadtest.repeats: auto stops when they are)")
    return result


def level_checks(level: int, comp: dict, gate: GateSettings, *, greedy: bool = True) -> list[Check]:
    """Every check the gate applies at a gated level ``level`` (its validity, the benefit ratios,
    the TTFT guardrail): what :mod:`pipeline.report.rollout_range` asks of every level it
    recommends."""
    return [*_level_validity(level, comp, gate, greedy=greedy), *_benefit_checks(level, comp, gate),
            _ttft_guardrail(level, comp, gate)]


def _validity_checks(analysis: dict, gate: GateSettings) -> list[Check]:
    out = []
    runs = analysis["runs"]
    dead = [r["key"] for r in runs if not r.get("server_alive", True)]
    invalid = [r["key"] for r in runs if not r.get("valid", True) and r["key"] not in dead]
    out.append(Check("server_alive", "run", FAIL if dead else PASS,
                     f"server died during {dead}: the run is invalid" if dead else "server alive after every run",
                     value=dead))
    if invalid:
        out.append(Check("run_valid", "run", FAIL, f"runs marked invalid: {invalid}", value=invalid))
    saturated = [r["key"] for r in runs if (r.get("client_cpu_fraction") or 0.0) > CLIENT_CPU_MAX]
    if saturated:
        out.append(Check("client_saturation", "run", UNSURE,
                         f"load generator above {CLIENT_CPU_MAX:.0%} CPU in {saturated}: latencies may include "
                         "client queueing; add --processes or hosts and rerun", value=saturated, threshold=CLIENT_CPU_MAX))
    out.append(_fallback_check(runs))
    unaccounted = [r["key"] for r in runs if not r.get("accounted", True)]
    out.append(Check("requests_accounted", "run", FAIL if unaccounted else PASS,
                     f"completed + incomplete != sent in {unaccounted}" if unaccounted
                     else "completed + incomplete == sent in every run", value=unaccounted))
    return out


def _fallback_check(runs: list[dict]) -> Check:
    """Requests whose draft failed went on target-only (the BLS's draft_fallbacks): the speculative
    arm then measured a mix of speculation and plain decoding, and the draft is broken or too
    slow for its timeout. A finding to fix, never evidence of a speedup."""
    hit = {r["key"]: r["draft_fallbacks"] for r in runs if r.get("draft_fallbacks")}
    if not hit:
        return Check("speculation_fallbacks", "run", PASS, "no request fell back to target-only", value=0, threshold=0)
    total = sum(hit.values())
    return Check("speculation_fallbacks", "run", FAIL,
                 f"{total} requests fell back to target-only after a draft failure in {sorted(hit)}: the speculative "
                 "arm did not measure speculation; fix the draft (server log, specdeploy_spec_decode_fallbacks_total) "
                 "and rerun", value=total, threshold=0)


def _level_validity(level: int, comp: dict, gate: GateSettings, *, greedy: bool) -> list[Check]:
    scope = f"c={level}"
    out = []
    base_err, spec_err = comp["error_rate"]["base"] or 0.0, comp["error_rate"]["spec"] or 0.0
    out.append(Check("errors", scope, FAIL if spec_err > base_err + gate.max_error_rate_delta else PASS,
                     f"error+timeout rate spec {spec_err:.2%} vs base {base_err:.2%} (allowed +{gate.max_error_rate_delta:.2%})",
                     value=spec_err, threshold=base_err + gate.max_error_rate_delta))
    if base_err > gate.max_error_rate_delta:
        out.append(Check("baseline_errors", scope, UNSURE,
                         f"the baseline itself failed {base_err:.2%} of requests: the comparison is not trustworthy; rerun",
                         value=base_err, threshold=gate.max_error_rate_delta))
    eq = comp["equivalence"]
    if gate.require_output_equivalence and greedy:
        status = PASS if eq["equivalent"] else (UNSURE if eq["prompts_compared"] == 0 else FAIL)
        out.append(Check("output_equivalence", scope, status,
                         f"{eq['mismatched']} of {eq['prompts_compared']} prompts differ between arms (greedy)",
                         value=eq["mismatched"], threshold=0))
    length = comp["output_length"]
    out.append(Check("output_length_match", scope,
                     PASS if length["match"] else (UNSURE if not length["prompts_compared"] else FAIL),
                     f"mean OSL base {length['base_mean_osl']} vs spec {length['spec_mean_osl']}",
                     value=length["relative_gap"], threshold=0.05))
    n_ok = min(comp["n_ok"]["base"], comp["n_ok"]["spec"])
    n_runs = min(comp["n_runs"]["base"], comp["n_runs"]["spec"])
    out.append(Check("sample_size", scope, PASS if n_ok >= gate.min_requests_per_cell else UNSURE,
                     f"{n_ok} ok requests per arm (minimum {gate.min_requests_per_cell})",
                     value=n_ok, threshold=gate.min_requests_per_cell))
    out.append(Check("runs", scope, PASS if n_runs >= gate.min_runs else UNSURE,
                     f"{n_runs} runs per arm (minimum {gate.min_runs})", value=n_runs, threshold=gate.min_runs))
    arrivals = comp.get("arrivals") or {}
    for arm in ("base", "spec"):
        out += arrival_checks(scope, arm, arrivals.get(arm), gate)
        achieved = comp["achieved_concurrency"][arm]
        if achieved is None or comp.get("target_rate") is not None or arrivals.get(arm):
            continue  # open loop: concurrency is an outcome; a ramp checks each step's users
        gap = abs(achieved - level) / level
        out.append(Check("achieved_concurrency", f"{scope} {arm}",
                         PASS if gap <= gate.achieved_concurrency_tolerance else UNSURE,
                         f"achieved {achieved:.2f} vs target {level} (rerun if off)", value=achieved,
                         threshold=gate.achieved_concurrency_tolerance))
    return out


def arrival_checks(scope: str, arm: str, arrivals: dict | None, gate: GateSettings) -> list[Check]:
    """The arrivals a run asked for against what it achieved (pipeline/report/arrivals.py), worst run
    first: the open-loop send rate against its own schedule (a client that falls behind stretches
    it), each ramp step's rate or users, and a concurrency cap held. Like achieved concurrency, a
    miss makes the level inconclusive (rerun), never a failure of speculation."""
    if not arrivals:
        return []
    out = []
    tol, runs = gate.achieved_rate_tolerance, arrivals.get("runs") or []
    where = f"{scope} {arm}"
    cap = arrivals.get("max_concurrency")

    def rate_gap(entry: dict) -> float | None:
        achieved, offered = entry.get("achieved_rate"), entry.get("offered_rate")
        return None if not achieved or not offered else (offered - achieved) / offered

    def rate_check(rule: str, label: str, entries: list[dict]) -> None:
        scored = [(rate_gap(e), e) for e in entries]
        scored = [(g, e) for g, e in scored if g is not None]
        if not scored:
            out.append(Check(rule, where, UNSURE, f"{label}: too few requests sent to measure a rate"))
            return
        gap, worst = max(scored, key=lambda x: abs(x[0]))
        nominal = worst.get("nominal_rate")
        text = (f"{label}: achieved {worst['achieved_rate']:.3g} req/s vs the schedule's {worst['offered_rate']:.3g}"
                + (f" (nominal {nominal:g})" if nominal else "") + f", p95 send lag {_fmt(worst.get('lag_p95_ms'))} ms")
        if abs(gap) <= tol:
            out.append(Check(rule, where, PASS, text, worst["achieved_rate"], tol))
            return
        held = " — the max_concurrency cap held the arrivals back" if cap else " — the client fell behind its schedule"
        out.append(Check(rule, where, UNSURE, text + held + " (rerun, or lower the rate)", worst["achieved_rate"], tol))

    if arrivals.get("mode") == "open":
        rate_check("achieved_rate", f"{arrivals.get('pattern')} ({arrivals.get('arrival')})", runs)
    steps = max((len(r.get("steps") or []) for r in runs), default=0)
    for n in range(steps):
        entries = [r["steps"][n] for r in runs if len(r.get("steps") or []) > n]
        if arrivals.get("mode") == "open":
            rate_check("ramp_step_rate", f"ramp step {n}", entries)
            continue
        users = entries[0].get("users")
        values = [e["achieved_concurrency"] for e in entries if e.get("achieved_concurrency") is not None]
        if not values or not users:
            out.append(Check("ramp_step_concurrency", where, UNSURE, f"ramp step {n}: no request in flight"))
            continue
        worst = max(values, key=lambda v: abs(v - users))
        ok = abs(worst - users) / users <= gate.achieved_concurrency_tolerance
        out.append(Check("ramp_step_concurrency", where, PASS if ok else UNSURE,
                         f"ramp step {n}: achieved concurrency {worst:.2f} vs {users} users", worst,
                         gate.achieved_concurrency_tolerance))
    if cap:
        peak = max((r.get("achieved_concurrency") or 0.0 for r in runs), default=0.0)
        out.append(Check("concurrency_cap", where, PASS if peak <= cap * (1 + tol) else UNSURE,
                         f"mean requests in flight {peak:.2f} under max_concurrency {cap}", peak, cap))
    return out


def goodput_guardrail(level: int, comp: dict, gate: GateSettings) -> Check:
    """Goodput at the user's SLOs (requests/s meeting every bound, per repeat): spec/base with its paired
    interval must stay above ``goodput_ratio_min`` (non-inferiority, as the peak-throughput guardrail)."""
    ci = {**comp["run_level"]["goodput_ratio"], "level": "run"}
    limit, scope = gate.goodput_ratio_min, f"c={level}"
    value = _interval_value(ci, limit)
    slo = gate.slo
    bounds = ", ".join(f"{name} ≤ {bound:g} ms" for name, bound in
                       (("TTFT", slo.ttft_ms), ("TPOT", slo.tpot_ms), ("E2E", slo.e2e_ms)) if bound is not None)
    good = comp.get("goodput") or {}
    base_rps = (good.get("base") or {}).get("requests_per_s")
    spec_rps = (good.get("spec") or {}).get("requests_per_s")
    if ci.get("low") is None and base_rps is not None and spec_rps is not None and (base_rps == 0) != (spec_rps == 0):
        # a ratio with a zero has no log: decided by which arm has none within the SLOs
        worse = spec_rps == 0
        return Check("guardrail_goodput", scope, FAIL if worse else PASS,
                     f"goodput at the SLO ({bounds}): {'no speculative' if worse else 'no baseline'} request met the "
                     f"SLOs (baseline {base_rps:.3g} req/s, speculative {spec_rps:.3g} req/s)", value, limit)
    if ci.get("low") is None:
        return Check("guardrail_goodput", scope, UNSURE,
                     f"goodput at the SLO ({bounds}) spec/base {_fmt(ci.get('point'))}, no CI "
                     "(fewer than 2 paired repeats, or no request of an arm met the SLOs)", value, limit)
    text = (f"goodput at the SLO ({bounds}) spec/base {_fmt(ci['point'])} [{_ci_words(ci)} {_fmt(ci['low'])}, "
            f"{_fmt(ci['high'])}], need lower > {limit}")
    if ci["low"] > limit:
        return Check("guardrail_goodput", scope, PASS, text, value, limit)
    if ci["high"] < limit:
        return Check("guardrail_goodput", scope, FAIL, text + "; fewer requests meet the SLOs with speculation",
                     value, limit)
    return Check("guardrail_goodput", scope, UNSURE, text + " (straddles)" + _more_repeats(value), value, limit)


def _benefit_checks(level: int, comp: dict, gate: GateSettings) -> list[Check]:
    out = []
    for name, limit in (("tpot_ratio", gate.tpot_ratio_max), ("e2e_ratio", gate.e2e_ratio_max)):
        ci = best_ci(comp, name)
        out.append(_ratio_check(f"benefit_{name}", f"c={level}", ci, limit))
    return out


def _interval_value(ci: dict, threshold: float) -> dict[str, Any]:
    """What a check records of its interval: the bounds, the method, the pairs, and (straddling) the
    paired repeats that would likely decide it."""
    value = {"point": ci.get("point"), "low": ci.get("low"), "high": ci.get("high"), "level": ci.get("level", "run"),
             "method": ci.get("method"), "confidence_level": ci.get("confidence_level"), "n_pairs": ci.get("n_pairs")}
    if ci.get("low") is not None and ci["low"] <= threshold <= ci["high"]:
        value["repeats_to_decide"] = repeats_to_decide(ci, threshold)
    return value


def _ci_words(ci: dict) -> str:
    return f"{round(100 * ci.get('confidence_level', 0.95), 2):g}% CI"


def _more_repeats(value: dict) -> str:
    needed = value.get("repeats_to_decide")
    if needed is None:
        return "; more repeats are unlikely to decide it soon (the estimate sits on the threshold)"
    more = needed - (value.get("n_pairs") or 0)
    return f"; about {needed} paired repeats ({more} more) would likely decide it"


def _ratio_check(rule: str, scope: str, ci: dict, limit: float) -> Check:
    low, high, point = ci.get("low"), ci.get("high"), ci.get("point")
    value = _interval_value(ci, limit)
    if low is None or high is None:
        return Check(rule, scope, UNSURE, f"no confidence interval (point {_fmt(point)})", value, limit)
    text = f"spec/base {_fmt(point)} [{_ci_words(ci)} {_fmt(low)}, {_fmt(high)}] ({ci.get('level')} level), need upper < {limit}"
    if ci.get("level") != "run":
        return Check(rule, scope, UNSURE, text + "; request-level CI is descriptive only", value, limit)
    if high < limit:
        return Check(rule, scope, PASS, text, value, limit)
    if low > 1.0:
        return Check(rule, scope, FAIL, text + "; speculation is slower", value, limit)
    if low >= limit:  # no evidence of the required benefit, none of a loss either (NO-GO only above 1.0)
        return Check(rule, scope, UNSURE, text + "; no evidence of the required benefit (CI above the threshold; "
                     "more repeats will not make it a GO)", value, limit)
    return Check(rule, scope, UNSURE, text + "; the CI straddles the threshold" + _more_repeats(value), value, limit)


def _ttft_guardrail(level: int, comp: dict, gate: GateSettings) -> Check:
    ci = comp["run_level"]["ttft_p95_delta_ms"]
    base = comp.get("base_ttft_p95_ms") or 0.0
    margin = max(gate.ttft_p95_delta_ms_max, base * gate.ttft_p95_delta_pct_max / 100.0)
    scope = f"c={level}"
    value = _interval_value(ci, margin)
    if ci.get("low") is None:
        return Check("guardrail_ttft_p95", scope, UNSURE, f"Δp95 TTFT {_fmt(ci.get('point'))} ms, no CI", value, margin)
    text = f"Δp95 TTFT {_fmt(ci['point'])} ms [{_ci_words(ci)} {_fmt(ci['low'])}, {_fmt(ci['high'])}], margin +{_fmt(margin)} ms"
    if ci["high"] < margin:
        return Check("guardrail_ttft_p95", scope, PASS, text, value, margin)
    if ci["low"] > margin:
        return Check("guardrail_ttft_p95", scope, FAIL, text, value, margin)
    return Check("guardrail_ttft_p95", scope, UNSURE, text + " (straddles)" + _more_repeats(value), value, margin)


def _peak_throughput_guardrail(level: int, comp: dict, gate: GateSettings, analysis: dict,
                               targets: list[int], advice: list[str]) -> Check:
    ci = best_ci(comp, "throughput_ratio")
    scope = f"peak c={level}"
    limit = gate.peak_throughput_ratio_min
    value = _interval_value(ci, limit)
    crossover = analysis.get("crossover_concurrency")
    if ci.get("low") is None:
        return Check("guardrail_peak_throughput", scope, UNSURE, f"throughput ratio {_fmt(ci.get('point'))}, no CI", value, limit)
    text = (f"output tok/s spec/base {_fmt(ci['point'])} [{_ci_words(ci)} {_fmt(ci['low'])}, {_fmt(ci['high'])}], "
            f"need lower > {limit}")
    if ci["low"] > limit:
        return Check("guardrail_peak_throughput", scope, PASS, text, value, limit)
    cutoff_ok = gate.allow_cutoff_above_crossover and crossover is not None and all(t < crossover for t in targets)
    if ci["high"] < limit:
        if cutoff_ok:
            advice.append(f"disable speculation at concurrency >= {crossover} (the crossover)")
            return Check("guardrail_peak_throughput", scope, PASS, text + f"; passes with speculation off from c={crossover}", value, limit)
        return Check("guardrail_peak_throughput", scope, FAIL, text, value, limit)
    return Check("guardrail_peak_throughput", scope, UNSURE, text + " (straddles)" + _more_repeats(value), value, limit)


def _acceptance_checks(analysis: dict, gate: GateSettings, advice: list[str]) -> list[Check]:
    out = []
    rate = analysis.get("acceptance_rate")
    source = analysis.get("acceptance_source") or "per-request outputs"
    if rate is None:
        out.append(Check("acceptance_rate", "speculative", NOT_CHECKED,
                         "acceptance not reported (no per-request figures, no server metrics): not checked"))
        return out
    rate_detail = "" if source == "per-request outputs" else f" (from {source})"
    if rate < gate.min_acceptance_rate and gate.acceptance_is_gate:
        advice.append(f"acceptance rate {rate:.0%} is below {gate.min_acceptance_rate:.0%} (a gate in this config): "
                      "use a better-aligned draft, or turn speculation off")
        out.append(Check("acceptance_rate", "speculative", FAIL,
                         f"{rate:.1%} < {gate.min_acceptance_rate:.0%}{rate_detail} (gate.acceptance_is_gate)",
                         rate, gate.min_acceptance_rate))
    elif rate < gate.min_acceptance_rate:
        # a proxy: low acceptance *usually* means speculation does not pay; where the speed-up was
        # measured, the measurement decides. It still warns: traffic unlike the measured mix may lose
        out.append(Check("acceptance_rate", "speculative", WARNING,
                         f"{rate:.1%} < {gate.min_acceptance_rate:.0%}{rate_detail}: below this, speculation usually "
                         "does not pay; the verdict follows the measured benefit here, but traffic unlike the measured "
                         "prompts may accept less and lose; gate.acceptance_is_gate: true makes this a gate",
                         rate, gate.min_acceptance_rate))
    else:
        out.append(Check("acceptance_rate", "speculative", PASS, f"{rate:.1%} ≥ {gate.min_acceptance_rate:.0%}{rate_detail}",
                         rate, gate.min_acceptance_rate))
    return out


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
