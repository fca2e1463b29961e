"""Two runs side by side (``specdeploy report --compare RUN_A RUN_B``): what moved beyond its CI.

Reads the report data of both runs (built fresh from each run directory by ``pipeline.report.builder``);
returns the comparison data (``compare.json``, schema ``specdeploy-compare/1``) and the page model
of ``compare.html`` / ``compare.md``; writes nothing itself.

For every spec/base ratio at every concurrency both runs measured (each run's primary draft
length), with A the reference (e.g. the last release) and B the candidate:

- **moved**: both runs have a 95% CI and the two intervals are disjoint (B's lower bound above
  A's upper bound, or B's upper bound below A's lower bound);
- **drifted**: the intervals overlap but B's point estimate lies outside A's interval — a hint,
  not evidence;
- **steady**: B's point estimate lies inside A's interval;
- **no CI**: either run has no interval for the ratio (fewer than two runs per arm): not judged.

Direction: a lower ratio is better for latencies (TTFT, TPOT, E2E), a higher one for output
tokens/s and goodput.
"""

from __future__ import annotations

from typing import Any

from pipeline.artefacts.report import COMPARE_SCHEMA, Comparison
from pipeline.report.forecast_check import compare_line
from pipeline.report.view.model import category_acceptance, primary_comparisons, ratio_ci
from pipeline.report.view.rounding import fmt_ci, fmt_pct, fmt_value, tidy_text
from pipeline.report.view.summary import ratio_phrase, rollout
from pipeline.report.view.tables import flatten, table

# label, run-level ratio, lower is better
COMPARED_RATIOS = (
    ("TPOT p50", "tpot_ratio", True),
    ("E2E p50", "e2e_ratio", True),
    ("E2E p95", "e2e_p95_ratio", True),
    ("TTFT p50", "ttft_p50_ratio", True),
    ("TTFT p95", "ttft_p95_ratio", True),
    ("output tokens/s", "throughput_ratio", False),
    ("goodput", "goodput_ratio", False),
)


def movement(a: dict, b: dict, lower_is_better: bool) -> dict[str, Any]:
    """``{"status": moved | drifted | steady | no CI, "direction": better | worse | None}`` of B against A."""
    if None in (a.get("low"), a.get("high"), b.get("low"), b.get("high"), a.get("point"), b.get("point")):
        return {"status": "no CI", "direction": None}
    if b["low"] > a["high"] or b["high"] < a["low"]:
        status = "moved"
    elif b["point"] > a["high"] or b["point"] < a["low"]:
        status = "drifted"
    else:
        return {"status": "steady", "direction": None}
    lower = b["point"] < a["point"]
    return {"status": status, "direction": "better" if lower == lower_is_better else "worse"}


def compare_ratios(data_a: dict, data_b: dict) -> list[dict[str, Any]]:
    """One entry per (concurrency both runs measured, ratio): both CIs and the movement."""
    comps_a = {c["concurrency"]: c for c in primary_comparisons(data_a)}
    comps_b = {c["concurrency"]: c for c in primary_comparisons(data_b)}
    out = []
    for level in sorted(set(comps_a) & set(comps_b)):
        for label, name, lower in COMPARED_RATIOS:
            a, b = ratio_ci(comps_a[level], name), ratio_ci(comps_b[level], name)
            out.append({"concurrency": level, "metric": label, "ratio": name, "lower_is_better": lower,
                        "a": a, "b": b, **movement(a, b, lower)})
    return out


def changed_checks(data_a: dict, data_b: dict) -> list[dict[str, Any]]:
    """Gate checks whose status differs between the runs (a check only one run has counts too)."""
    def by_key(data):
        return {(c["rule"], c["scope"]): c for c in data["gate"]["checks"]}

    a, b = by_key(data_a), by_key(data_b)
    out = []
    for key in list(a) + [k for k in b if k not in a]:
        sa, sb = a.get(key, {}).get("status", "absent"), b.get(key, {}).get("status", "absent")
        if sa != sb:
            out.append({"rule": key[0], "scope": key[1], "a": sa, "b": sb,
                        "detail": tidy_text(str(b.get(key, a.get(key))["detail"]))})
    return out


def comparison_data(data_a: dict, data_b: dict, dir_a: str, dir_b: str) -> dict[str, Any]:
    """The content of compare.json."""
    def side(data, run_dir):
        return {"run_dir": run_dir, "name": data["name"], "run_id": (data.get("provenance") or {}).get("run_id"),
                "verdict": data["verdict"], "crossover_concurrency": data["crossover_concurrency"],
                "rollout": rollout(data), "acceptance_rate": data.get("acceptance_rate"),
                "primary_draft_len": data.get("primary_draft_len")}

    ratios = compare_ratios(data_a, data_b)
    return Comparison.checked({
        "schema": COMPARE_SCHEMA,
        "a": side(data_a, dir_a),
        "b": side(data_b, dir_b),
        "ratios": ratios,
        "moved": [r for r in ratios if r["status"] == "moved"],
        "moved_worse": [r for r in ratios if r["status"] == "moved" and r["direction"] == "worse"],
        "changed_checks": changed_checks(data_a, data_b),
        "definition": {"moved": "both 95% CIs exist and are disjoint",
                       "drifted": "CIs overlap, B's point estimate outside A's CI",
                       "steady": "B's point estimate inside A's CI", "no CI": "a run has no CI: not judged"},
    })


def _label(side: dict) -> str:
    return f"{side['name']} ({side['run_id']})" if side.get("run_id") else side["name"]


def ratio_line(r: dict) -> str:
    word = {"moved": "CIs disjoint", "drifted": "point outside A's CI, CIs overlap"}[r["status"]]
    return (f"{r['metric']} at c={r['concurrency']}: {ratio_phrase(r['a'])} → {ratio_phrase(r['b'])}, "
            f"{r['direction']} ({word})")


def banner(comp: dict) -> dict[str, Any]:
    moved, worse = comp["moved"], comp["moved_worse"]
    word, cls = ("WORSE", "NO-GO") if worse else ("BETTER", "GO") if moved else ("SAME", "neutral")
    a, b = comp["a"], comp["b"]
    title = (f"{len(moved)} of {len(comp['ratios'])} ratios moved beyond their CIs ({len(worse)} worse, "
             f"{len(moved) - len(worse)} better)" if moved else
             f"No ratio moved beyond its CI ({len(comp['ratios'])} compared)")
    findings = [f"Verdict: A {a['verdict']} → B {b['verdict']}",
                f"Crossover: A {fmt_value(a['crossover_concurrency'])} → B {fmt_value(b['crossover_concurrency'])}",
                f"Rollout: A {a['rollout']} → B {b['rollout']}",
                f"Acceptance: A {fmt_pct(a['acceptance_rate'])} → B {fmt_pct(b['acceptance_rate'])} (no CI: not judged)",
                f"Draft length: A K={fmt_value(a['primary_draft_len'])} → B K={fmt_value(b['primary_draft_len'])}"]
    return {"verdict": word, "cls": cls, "title": title,
            "sentence": f"B = {_label(b)} against A = {_label(a)}.",
            "moved": [ratio_line(r) for r in moved],
            "drifted": [ratio_line(r) for r in comp["ratios"] if r["status"] == "drifted"],
            "findings": findings}


def ratio_tables(comp: dict) -> list[dict[str, Any]]:
    """Per concurrency: metric | A ratio [CI] | B ratio [CI] | change."""
    levels = sorted({r["concurrency"] for r in comp["ratios"]})
    out = []
    for level in levels:
        rows = [r for r in comp["ratios"] if r["concurrency"] == level]
        cells, classes = [], []
        for r in rows:
            change = r["status"] if r["direction"] is None else f"{r['status']}, {r['direction']}"
            cells.append([r["metric"], fmt_ci(r["a"]["point"], r["a"]["low"], r["a"]["high"])["text"],
                          fmt_ci(r["b"]["point"], r["b"]["low"], r["b"]["high"])["text"], change])
            cls = {"moved": f"moved-{r['direction']}", "drifted": "drifted"}.get(r["status"], "")
            classes.append(["", "", "", cls])
        out.append({"concurrency": level, "table": table(["spec/base", "A [95% CI]", "B [95% CI]", "change"], cells, classes)})
    return out


def category_compare_table(data_a: dict, data_b: dict) -> dict:
    a = {r["category"]: r["acceptance_rate"] for r in category_acceptance(data_a)}
    b = {r["category"]: r["acceptance_rate"] for r in category_acceptance(data_b)}
    rows = []
    for cat in sorted(set(a) | set(b)):
        delta = (b[cat] - a[cat]) * 100 if a.get(cat) is not None and b.get(cat) is not None else None
        rows.append([cat, fmt_pct(a.get(cat)), fmt_pct(b.get(cat)),
                     "–" if delta is None else f"{delta:+.1f} points"])
    return table(["category", "acceptance A", "acceptance B", "B − A"], rows)


def provenance_diff(data_a: dict, data_b: dict) -> dict[str, Any]:
    a, b = dict(flatten(data_a["provenance"])), dict(flatten(data_b["provenance"]))
    keys = list(a) + [k for k in b if k not in a]
    rows = [(k, a.get(k, ["–"]), b.get(k, ["–"])) for k in keys]
    return {"differ": [r for r in rows if r[1] != r[2]], "same": [r for r in rows if r[1] == r[2]]}


def compare_page(comp: dict, data_a: dict, data_b: dict, plot: str | None) -> dict[str, Any]:
    changed = comp["changed_checks"]
    head = banner(comp)
    head["findings"].append(compare_line(data_a, data_b))
    return {
        "banner": head,
        "plot": plot,
        "levels": ratio_tables(comp),
        "categories": category_compare_table(data_a, data_b),
        "checks": table(["check", "scope", "A", "B", "detail (B)"],
                        ([c["rule"], c["scope"], c["a"], c["b"], c["detail"]] for c in changed),
                        (["", "", c["a"], c["b"], ""] for c in changed)),
        "n_changed_checks": len(changed),
        "provenance": provenance_diff(data_a, data_b),
        "a": comp["a"], "b": comp["b"],
        "definition": comp["definition"],
    }
