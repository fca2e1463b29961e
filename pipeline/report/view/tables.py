"""The report's tables as plain rows of display strings, shared by the HTML and Markdown pages.

Reads the report data (``report.json`` content); writes nothing. A table is
``{"headers": [...], "rows": [{"cells": [...], "classes": [...]}]}``; a cell class marks a ratio
whose CI lies wholly on the good (``good``) or bad (``bad``) side of 1, or a check's status.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from pipeline.report.acceptance_reported import NOT_REPORTED
from pipeline.report.view.evidence import ci_words
from pipeline.report.view.model import (
    category_acceptance,
    cell,
    data_warning_lines,
    primary_comparisons,
    ratio_ci,
    target_levels,
)
from pipeline.report.view.rounding import MISSING, fmt_ci, fmt_p, fmt_pct, fmt_value, tidy_text
from pipeline.report.view.summary import open_checks

# label, cell statistic, percentile, run-level ratio (None: the pooled percentiles' ratio, no CI),
# unit, lower is better. TPOT p95/p99 are what latency SLOs are written in; p99s show the tail.
HEADLINE_METRICS = (
    ("TTFT p50", "ttft_ms", "p50", "ttft_p50_ratio", "ms", True),
    ("TTFT p95", "ttft_ms", "p95", "ttft_p95_ratio", "ms", True),
    ("TTFT p99", "ttft_ms", "p99", None, "ms", True),
    ("TPOT p50", "tpot_ms", "p50", "tpot_ratio", "ms", True),
    ("TPOT p95", "tpot_ms", "p95", None, "ms", True),
    ("TPOT p99", "tpot_ms", "p99", None, "ms", True),
    ("E2E p95", "e2e_ms", "p95", "e2e_p95_ratio", "ms", True),
    ("E2E p99", "e2e_ms", "p99", None, "ms", True),
    ("output tokens/s", "output_tokens_per_s", None, "throughput_ratio", "", False),
)
NO_CI_MARK = " (pooled, no CI)"


def table(headers: list[str], rows: Iterable[list[str]], classes: Iterable[list[str]] | None = None) -> dict:
    rows = [list(r) for r in rows]
    classes = [list(c) for c in classes] if classes is not None else [[""] * len(r) for r in rows]
    return {"headers": headers, "rows": [{"cells": r, "classes": c} for r, c in zip(rows, classes)]}


def side_class(ci: dict, lower_is_better: bool) -> str:
    """``good`` / ``bad`` when the whole CI of a spec/base ratio is on one side of 1."""
    low, high = ci.get("low"), ci.get("high")
    if low is None or high is None:
        return ""
    if high < 1.0:
        return "good" if lower_is_better else "bad"
    if low > 1.0:
        return "bad" if lower_is_better else "good"
    return ""


def ratio_text(ci: dict) -> str:
    text = fmt_ci(ci["point"], ci["low"], ci["high"])["text"]
    return text + " *" if ci.get("level") not in (None, "run") and text != MISSING else text


def _stat(c: dict | None, stat: str, q: str | None) -> Any:
    if c is None:
        return None
    value = c.get(stat)
    return value.get(q) if q and isinstance(value, dict) else value


def headline_tables(data: dict) -> list[dict[str, Any]]:
    """One table per concurrency of the primary draft length: base | spec | spec/base [95% CI]."""
    targets, crossover = target_levels(data), data["crossover_concurrency"]
    out = []
    for comp in primary_comparisons(data):
        level = comp["concurrency"]
        base, spec = cell(data, "baseline", level), cell(data, "speculative", level)
        rows, classes = [], []
        for label, stat, q, ratio_name, unit, lower in HEADLINE_METRICS:
            b, s = _stat(base, stat, q), _stat(spec, stat, q)
            if ratio_name is None:  # a percentile of the pooled requests: its ratio, descriptive only
                ratio = fmt_value(s / b) + NO_CI_MARK if b and s is not None else MISSING
                rows.append([f"{label} ({unit})", fmt_value(b), fmt_value(s), ratio])
                classes.append(["", "", "", ""])
                continue
            ci = ratio_ci(comp, ratio_name)
            rows.append([f"{label} ({unit})" if unit else label, fmt_value(b), fmt_value(s), ratio_text(ci)])
            classes.append(["", "", "", side_class(ci, lower)])
        if any((c or {}).get("reasoning_requests") for c in (base, spec)):  # reasoning model: answer after thinking
            rows.append(["first answer p50 (ms)", fmt_value(_stat(base, "first_answer_ms", "p50")),
                         fmt_value(_stat(spec, "first_answer_ms", "p50")), MISSING])
            classes.append(["", "", "", ""])
        tags = [t for t, on in (("gated", level in targets), ("past crossover", crossover is not None and level >= crossover)) if on]
        out.append({"concurrency": level, "tags": tags,
                    "table": table(["metric", "baseline", "speculative", f"spec/base [{ci_words(data)}]"], rows, classes),
                    "request_level": any(ratio_ci(comp, m[3]).get("level") not in (None, "run")
                                         for m in HEADLINE_METRICS if m[3])})
    return out


def category_table(data: dict) -> dict:
    rows = category_acceptance(data)
    levels = [c["concurrency"] for c in primary_comparisons(data)]
    headers = ["category", "acceptance (pooled over tokens)"] + [f"speedup c={level}" for level in levels]
    return table(headers, ([r["category"], fmt_pct(r["acceptance_rate"])] +
                           [fmt_value(r["speedup"].get(level)) for level in levels] for r in rows))


def _acceptance_text(rate: float | None) -> str:
    return fmt_pct(rate) if rate is not None else NOT_REPORTED  # a missing figure is never shown as 0


def acceptance_cells_table(data: dict) -> dict:
    rows = []
    for c in data["cells"]:
        if c["arm"] != "speculative":
            continue
        for cat, acc in c["acceptance_by_category"].items():
            rows.append([str(c["concurrency"]), fmt_value(c["draft_len"]), cat, _acceptance_text(acc["acceptance_rate"]),
                         fmt_value(acc["mean_acceptance_length"]), fmt_value(acc["tokens_per_chunk_mean"])])
    return table(["concurrency", "K", "category", "acceptance", "τ", "tokens/chunk"], rows)


def acceptance_request_table(data: dict) -> dict:
    """Per-request acceptance: p10 / p50 / p90 over requests, beside the pooled figure."""
    dist = data.get("acceptance_per_request") or {}
    pooled = data.get("acceptance_rate")
    if not dist.get("n"):
        return table(["figure", "value"], [["per-request acceptance", dist.get("note") or NOT_REPORTED],
                                           ["pooled over tokens", _acceptance_text(pooled)]])
    return table(["figure", "value"], [
        ["requests that drafted", str(dist["n"])],
        ["per request p10", fmt_pct(dist["p10"])], ["per request median", fmt_pct(dist["p50"])],
        ["per request p90", fmt_pct(dist["p90"])], ["per request mean", fmt_pct(dist["mean"])],
        ["pooled over tokens (headline)", _acceptance_text(pooled)],
    ])


def acceptance_position_table(data: dict) -> dict:
    """Acceptance by draft position (1..K): accepted at that position per verify step."""
    by_pos = data.get("acceptance_by_position") or {}
    if not by_pos.get("reported"):
        return table(["draft position", "acceptance"], [["all", by_pos.get("note") or "not reported by this server"]])
    return table(["draft position", "acceptance", "accepted"],
                 ([str(p["position"]), fmt_pct(p["rate"]), fmt_value(p["accepted"])] for p in by_pos["positions"]))


def acceptance_source_table(data: dict) -> dict:
    """Acceptance by source: where each speculative run's acceptance comes from, and the figure."""
    rows = data.get("acceptance_by_source") or []
    return table(["source", "kind", "runs", "acceptance", "τ"],
                 ([r["source"], r.get("kind") or MISSING, ", ".join(r["runs"]), fmt_pct(r.get("acceptance_rate")),
                   fmt_value(r.get("mean_acceptance_length"))] for r in rows))


def statistics_table(data: dict) -> dict:
    """Every spec-vs-base comparison (all draft lengths) with the tests behind the headline."""
    taus = {(r["concurrency"], r["speculation_length"]): r for r in data["rows"] if r["arm"] == "speculative"}
    rows = []
    for comp in data["comparisons"]:
        mw = comp["mann_whitney_tpot"]
        row = taus.get((comp["concurrency"], comp["draft_len"] or data.get("primary_draft_len")), {})
        rows.append([str(comp["concurrency"]), fmt_value(comp["draft_len"]),
                     ratio_text(ratio_ci(comp, "tpot_ratio")), ratio_text(ratio_ci(comp, "e2e_ratio")),
                     ratio_text(ratio_ci(comp, "ttft_p95_delta_ms")), ratio_text(ratio_ci(comp, "goodput_ratio")),
                     fmt_p(mw["p_value"]), f"{fmt_value(mw['cliffs_delta'], 2)} {mw['effect'] or ''}".strip(),
                     fmt_value(row.get("mean_acceptance_length")), fmt_value(row.get("tau_bound_iid"))])
    return table(["concurrency", "K", "TPOT ratio", "E2E ratio", "Δ TTFT p95 ms", "goodput ratio",
                  "Mann-Whitney p (TPOT)", "Cliff's δ", "τ", "τ if i.i.d."], rows)


def draft_length_table(data: dict) -> dict | None:
    recs = data.get("recommended_draft_len") or {}
    if not recs:
        return None
    return table(["concurrency", "recommended K", "best measured K", "TPOT ratio [95% CI]", "speculation"],
                 ([level, fmt_value(rec["draft_len"]), fmt_value(rec["best_measured"]),
                   fmt_ci(rec["tpot_ratio"], *rec["ci"])["text"], rec["speculation"]] for level, rec in recs.items()))


def gate_tables(data: dict) -> dict[str, Any]:
    """Checks that did not pass (failures first), and the passing ones grouped by rule."""

    failing = open_checks(data)
    open_table = table(["status", "check", "scope", "detail"],
                       ([c["status"], c["rule"], c["scope"], tidy_text(str(c["detail"]))] for c in failing),
                       ([c["status"], "", "", ""] for c in failing))
    by_rule: dict[str, list[dict]] = {}
    for c in data["gate"]["checks"]:
        if c["status"] == "pass":
            by_rule.setdefault(c["rule"], []).append(c)
    passing = table(["check", "scope", "detail"],
                    ([rule, ", ".join(c["scope"] for c in checks), "; ".join(_scoped_details(checks))]
                     for rule, checks in by_rule.items()))
    return {"open": open_table, "n_open": len(failing), "passing": passing,
            "n_passing": sum(len(v) for v in by_rule.values())}


def _scoped_details(checks: list[dict]) -> list[str]:
    if len(checks) == 1:
        return [tidy_text(str(checks[0]["detail"]))]
    return [f"{c['scope']}: {tidy_text(str(c['detail']))}" for c in checks]


def run_status(run: dict) -> str:
    return "server died" if not run["server_alive"] else "valid" if run["valid"] else "invalid"


def runs_table(data: dict) -> dict:
    runs = data["runs"]
    return table(["run", "status", "ok", "cut at stop", "median TPOT ms", "output tok/s", "achieved conc."],
                 ([r["key"], run_status(r), str(r["n_ok"]), str(r["incomplete_at_stop"]), fmt_value(r["median_tpot_ms"]),
                   fmt_value(r["output_tokens_per_s"]), fmt_value(r["achieved_concurrency"])] for r in runs),
                 (["", "" if run_status(r) == "valid" else "fail", "", "", "", "", ""] for r in runs))


def variability_table(data: dict) -> dict:
    rows = []
    for c in data["cells"]:
        var = c["run_variability"]
        rows.append([c["arm"], str(c["concurrency"]), fmt_value(c["draft_len"]),
                     ", ".join(fmt_value(v) for v in var["median_tpot_ms"]["per_run"]), fmt_pct(var["median_tpot_ms"]["cv"]),
                     ", ".join(fmt_value(v) for v in var["output_tokens_per_s"]["per_run"]),
                     fmt_pct(var["output_tokens_per_s"]["cv"])])
    return table(["arm", "concurrency", "K", "median TPOT per run (ms)", "CV", "output tok/s per run", "CV"], rows)


def quality_table(data: dict) -> dict:
    rows = []
    for c in data["cells"]:
        q = c["data_quality"]
        rows.append([c["arm"], str(c["concurrency"]), fmt_value(c["draft_len"]), str(c["n_ok"]), fmt_pct(c["error_rate"]),
                     str(c["incomplete_at_stop"]), str(q["prompt_echoed"]), str(q["osl_from_chunks"]),
                     f"{q['osl_retok_mismatch']} of {q['osl_retok_checked']}",
                     fmt_value(c["hit_max_tokens_pct"]) + ("%" if c["hit_max_tokens_pct"] is not None else "")])
    return table(["arm", "concurrency", "K", "ok", "errors", "incomplete at stop", "prompt echoed",
                  "OSL from chunks", "OSL ≠ re-tokenized", "hit max_tokens"], rows)


def quality_issues(data: dict) -> list[str]:
    out = []
    for c in data["cells"]:
        q = c["data_quality"]
        where = f"{c['arm']} c={c['concurrency']}"
        if q["prompt_echoed"]:
            out.append(f"{where}: {q['prompt_echoed']} outputs echo the prompt")
        if q["osl_from_chunks"]:
            out.append(f"{where}: {q['osl_from_chunks']} output lengths counted from chunks (no server count)")
        if q["osl_retok_mismatch"]:
            out.append(f"{where}: {q['osl_retok_mismatch']} of {q['osl_retok_checked']} output lengths disagree "
                       "with re-tokenization")
    out += data_warning_lines(data)
    return out


def flatten(value: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """A nested value as (dotted key, lines) rows: every key appears, whatever the run recorded."""
    if isinstance(value, dict) and value:
        rows = []
        for key, sub in value.items():
            rows += flatten(sub, f"{prefix}.{key}" if prefix else str(key))
        return rows
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        rows = []
        for i, sub in enumerate(value):
            rows += flatten(sub, f"{prefix}[{i}]")
        return rows
    if isinstance(value, list) and not value:
        return [(prefix, [MISSING])]
    if isinstance(value, list):
        long = sum(len(str(v)) for v in value) > 80
        return [(prefix, [tidy_text(str(v)) for v in value] if long else [", ".join(tidy_text(str(v)) for v in value)])]
    if isinstance(value, bool):
        return [(prefix, [fmt_value(value)])]
    if isinstance(value, float):
        return [(prefix, [tidy_text(repr(value))])]
    return [(prefix, [MISSING if value is None else json.dumps(value) if isinstance(value, dict) else str(value)])]


def provenance_rows(data: dict) -> list[tuple[str, list[str]]]:
    return flatten(data["provenance"]) + flatten({"bootstrap": data["bootstrap"]})


SCHEDULE_METRICS = (("tpot_ms", "TPOT p50 (ms)"), ("e2e_p95_ms", "E2E p95 (ms)"), ("output_tokens_per_s", "output tok/s"))


def schedule_table(data: dict) -> dict | None:
    """A run with the scheduled arm: per level and ramp step the three arms side by side (geometric
    mean over repeats) and the scheduled arm against the better static arm [paired CI]; None otherwise."""
    section = data.get("schedule")
    if not section:
        return None
    rows, classes = [], []
    for point in section["points"]:
        where = f"{point['scope']}, K={point['draft_len']}" + (f" ({', '.join(point['position'])})" if point["position"] else "")
        for name, label in SCHEDULE_METRICS:
            comp = point["metrics"][name]
            arms = comp["arms"]
            ci = comp["ci"]
            ratio = f"vs {comp['better_static']}: {ratio_text(ci)}" if ci else MISSING
            rows.append([where, label, fmt_value(arms.get("baseline")), fmt_value(arms.get("speculative")),
                         fmt_value(arms.get("scheduled")), ratio])
            classes.append(["", "", "", "", "", "fail" if comp["worse"] else ""])
    return table(["point", "metric", "baseline", "speculative", "scheduled", f"scheduled/better static [{ci_words(data)}]"],
                 rows, classes)
