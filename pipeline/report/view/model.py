"""Read-only accessors on the report data (the content of ``report.json``) that every page uses.

Reads the dict ``pipeline.report.builder.build_report_data`` returns (or a ``report.json`` loaded back);
writes nothing. Tolerates report data written before a figure existed: a missing ratio reads as
"no value" instead of failing, so ``--compare`` works against an older run.
"""

from __future__ import annotations

from typing import Any

NO_CI: dict[str, Any] = {"point": None, "low": None, "high": None, "level": None}


def ratio_ci(comparison: dict, name: str) -> dict[str, Any]:
    """The run-level CI of ``name`` (pooled request level for TPOT/E2E when runs are too few)."""
    from pipeline.report.comparison import best_ci  # noqa: PLC0415 - start-up: numpy (pipeline.report.comparison; the templates' view model stays light)

    if name not in comparison.get("run_level", {}):
        return dict(NO_CI)
    ci = best_ci(comparison, name)
    return {"point": ci.get("point"), "low": ci.get("low"), "high": ci.get("high"), "level": ci.get("level")}


def primary_comparisons(data: dict) -> list[dict]:
    """Spec-vs-base comparisons of the primary draft length, by concurrency."""
    return sorted((c for c in data["comparisons"] if c.get("primary", True)), key=lambda c: c["concurrency"])


def primary_cells(data: dict) -> list[dict]:
    """Baseline cells and the primary draft length's speculative cells."""
    primary = data.get("primary_draft_len")
    return [c for c in data["cells"] if c["arm"] == "baseline" or c.get("draft_len") == primary]


def cell(data: dict, arm: str, concurrency: int) -> dict | None:
    for c in primary_cells(data):
        if c["arm"] == arm and c["concurrency"] == concurrency:
            return c
    return None


def target_levels(data: dict) -> list[int]:
    """The concurrency levels the gate judges the benefit at (its targets, else the lowest level)."""
    levels = [c["concurrency"] for c in primary_comparisons(data)]
    wanted = (data.get("gate_settings") or {}).get("target_concurrency") or levels[:1]
    return [level for level in wanted if level in levels]


def data_warning_lines(data: dict) -> list[str]:
    """The data's warnings (forced lengths, cut text); a report.json written before they existed
    has only ``synthetic_data``."""
    if "data_warnings" in data:
        return [str(w) for w in data["data_warnings"]]
    return ["synthetic prompts were used; acceptance and speedup are likely understated"] if data.get("synthetic_data") else []


def category_acceptance(data: dict) -> list[dict[str, Any]]:
    """Per prompt category over every primary speculative cell: pooled acceptance, τ proxy, and
    the TPOT speedup at each concurrency."""
    drafted: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for c in primary_cells(data):
        if c["arm"] != "speculative":
            continue
        for cat, acc in c["acceptance_by_category"].items():
            drafted[cat] = drafted.get(cat, 0) + (acc.get("draft_tokens") or 0)
            accepted[cat] = accepted.get(cat, 0) + (acc.get("accepted_tokens") or 0)
    comps = primary_comparisons(data)
    categories = sorted(set(drafted) | {cat for comp in comps for cat in comp.get("by_category", {})})
    rows = []
    for cat in categories:
        rows.append({
            "category": cat,
            "acceptance_rate": accepted.get(cat, 0) / drafted[cat] if drafted.get(cat) else None,
            "speedup": {comp["concurrency"]: comp.get("by_category", {}).get(cat, {}).get("speedup") for comp in comps},
        })
    return rows


def weakest_category(rows: list[dict]) -> dict | None:
    rated = [r for r in rows if r["acceptance_rate"] is not None]
    return min(rated, key=lambda r: r["acceptance_rate"]) if len(rated) > 1 else None
