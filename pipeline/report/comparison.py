"""Speculative vs baseline: the comparisons the gate reads, from the summaries in :mod:`pipeline.report.stats`.

Run-level CIs of ratios, the ones the gate decides on: a paired t interval over repeats on log
ratios (:mod:`pipeline.report.intervals`; docs/report.md says why). Pooled request-level CIs of
ratios of medians (``scipy.stats.bootstrap``, percentile method, fixed seed; descriptive only,
never gated), Mann-Whitney U with Cliff's δ, greedy output equivalence, output-length match and the crossover
concurrency. Reads nothing from disk (the summaries come in as dicts); returns plain dicts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.report.intervals import paired_ci, paired_values
from pipeline.report.stats import RunData, e2e_ms, median_of, tpot_ms

# ------------------------------------------------------------------------------------------------
# Comparison


@dataclass(frozen=True)
class BootstrapSettings:
    n_resamples: int = 9999
    seed: int = 0
    confidence_level: float = 0.95
    method: str = "percentile"


def bootstrap_ci(spec: list[float], base: list[float], kind: str, settings: BootstrapSettings,
                 reducer: str = "mean") -> dict[str, Any]:
    """CI of mean(spec)/mean(base) (``kind='ratio'``) or mean(spec) − mean(base) (``'diff'``) over
    replicates; ``reducer='median'`` for request-level pooled samples."""
    from scipy import stats as sps  # noqa: PLC0415 - start-up: scipy (pipeline.report.view.model and pipeline.schedule import this module; scipy loads at the first test)

    spec_arr = np.asarray([v for v in spec if v is not None], dtype=float)
    base_arr = np.asarray([v for v in base if v is not None], dtype=float)
    reduce = np.mean if reducer == "mean" else np.median
    point = _combine(kind, reduce(spec_arr), reduce(base_arr)) if spec_arr.size and base_arr.size else None
    out: dict[str, Any] = {"point": point, "low": None, "high": None, "n_spec": int(spec_arr.size),
                           "n_base": int(base_arr.size), "method": settings.method,
                           "n_resamples": settings.n_resamples, "seed": settings.seed, "statistic": f"{kind} of {reducer}s"}
    if spec_arr.size < 2 or base_arr.size < 2:
        out["note"] = "fewer than 2 samples per arm: no CI"
        return out

    def statistic(s, b, axis=-1):
        return _combine(kind, reduce(s, axis=axis), reduce(b, axis=axis))

    result = sps.bootstrap((spec_arr, base_arr), statistic, paired=False, vectorized=True,
                           n_resamples=settings.n_resamples, confidence_level=settings.confidence_level,
                           method=settings.method, rng=np.random.default_rng(settings.seed))
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if np.isnan(low) or np.isnan(high):  # degenerate (identical values): the CI is the point
        low = high = float(point)
    out.update({"low": low, "high": high})
    return out


def _combine(kind: str, spec_value, base_value):
    if kind == "ratio":
        with np.errstate(divide="ignore", invalid="ignore"):
            return spec_value / base_value
    return spec_value - base_value


def mann_whitney(spec: list[float], base: list[float]) -> dict[str, Any]:
    """Two-sided Mann-Whitney U plus Cliff's δ = P(spec > base) − P(spec < base) (Treeherder labels)."""
    from scipy import stats as sps  # noqa: PLC0415 - start-up: scipy (pipeline.report.view.model and pipeline.schedule import this module; scipy loads at the first test)

    s = [v for v in spec if v is not None]
    b = [v for v in base if v is not None]
    if not s or not b:
        return {"p_value": None, "cliffs_delta": None, "effect": None, "n_spec": len(s), "n_base": len(b)}
    result = sps.mannwhitneyu(s, b, alternative="two-sided")
    delta = 2.0 * float(result.statistic) / (len(s) * len(b)) - 1.0
    size = abs(delta)
    effect = "negligible" if size < 0.15 else "small" if size < 0.33 else "moderate" if size < 0.47 else "large"
    return {"p_value": float(result.pvalue), "cliffs_delta": delta, "effect": effect, "n_spec": len(s), "n_base": len(b)}


def output_equivalence(base_records: list[dict], spec_records: list[dict]) -> dict[str, Any]:
    """Same prompt id → same output text (by sha256) between arms, over ok records."""
    base_hashes: dict[str, set[str]] = defaultdict(set)
    spec_hashes: dict[str, set[str]] = defaultdict(set)
    for rec in base_records:
        if rec.get("status") == "ok":
            base_hashes[rec["prompt_id"]].add(rec["output_sha256"])
    for rec in spec_records:
        if rec.get("status") == "ok":
            spec_hashes[rec["prompt_id"]].add(rec["output_sha256"])
    common = sorted(set(base_hashes) & set(spec_hashes))
    mismatched = [pid for pid in common if base_hashes[pid] != spec_hashes[pid]]
    return {
        "prompts_compared": len(common),
        "mismatched": len(mismatched),
        "mismatched_ids": mismatched[:20],
        "equivalent": bool(common) and not mismatched,
        "hashes": {pid: sorted(base_hashes[pid] | spec_hashes[pid]) for pid in common[:200]},
    }


def output_length_match(base_records: list[dict], spec_records: list[dict], tolerance: float = 0.05) -> dict[str, Any]:
    """Mean OSL per arm over prompts both arms answered; a relative gap above ``tolerance`` flags it."""
    def mean_osl_by_prompt(records):
        acc: dict[str, list[int]] = defaultdict(list)
        for rec in records:
            if rec.get("status") == "ok":
                acc[rec["prompt_id"]].append(rec.get("osl") or 0)
        return {pid: float(np.mean(v)) for pid, v in acc.items()}

    base, spec = mean_osl_by_prompt(base_records), mean_osl_by_prompt(spec_records)
    common = sorted(set(base) & set(spec))
    if not common:
        return {"prompts_compared": 0, "base_mean_osl": None, "spec_mean_osl": None, "relative_gap": None, "match": False}
    b = float(np.mean([base[p] for p in common]))
    s = float(np.mean([spec[p] for p in common]))
    gap = abs(s - b) / b if b else 0.0
    return {"prompts_compared": len(common), "base_mean_osl": b, "spec_mean_osl": s, "relative_gap": gap, "match": gap <= tolerance}


GATED_RUN_METRICS = {
    "tpot_ratio": ("median_tpot_ms", "ratio"),
    "e2e_ratio": ("median_e2e_ms", "ratio"),
    "ttft_p95_delta_ms": ("p95_ttft_ms", "diff"),
    "throughput_ratio": ("output_tokens_per_s", "ratio"),
    "goodput_ratio": ("goodput_rps", "ratio"),
}
# Run-level ratios the report's headline tables show beside the gated ones; never gated.
DESCRIBED_RUN_METRICS = {
    "ttft_p50_ratio": ("median_ttft_ms", "ratio"),
    "ttft_p95_ratio": ("p95_ttft_ms", "ratio"),
    "e2e_p95_ratio": ("p95_e2e_ms", "ratio"),
    "goodput_tokens_ratio": ("goodput_tokens_per_s", "ratio"),
}


def compare_cells(base_runs: list[RunData], spec_runs: list[RunData], base_cell: dict, spec_cell: dict,
                  settings: BootstrapSettings) -> dict[str, Any]:
    """Spec vs base at one concurrency: run-level CIs (gate; paired by repeat), pooled request-level
    CIs (descriptive)."""
    run_level = {}
    for name, (metric, kind) in {**GATED_RUN_METRICS, **DESCRIBED_RUN_METRICS}.items():
        pairs = paired_values(spec_cell["runs"], base_cell["runs"], metric)
        run_level[name] = paired_ci(pairs, kind, settings.confidence_level)
    base_ok = [r for run in base_runs for r in run.measured if r.get("status") == "ok"]
    spec_ok = [r for run in spec_runs for r in run.measured if r.get("status") == "ok"]
    pooled_settings = BootstrapSettings(min(settings.n_resamples, 1999), settings.seed)
    pooled = {
        "tpot_ratio_of_medians": bootstrap_ci([tpot_ms(r) for r in spec_ok], [tpot_ms(r) for r in base_ok], "ratio",
                                              pooled_settings, reducer="median"),
        "e2e_ratio_of_medians": bootstrap_ci([e2e_ms(r) for r in spec_ok], [e2e_ms(r) for r in base_ok], "ratio",
                                             pooled_settings, reducer="median"),
    }
    base_p95 = base_cell["ttft_ms"]["p95"]
    by_category = {}
    for cat in sorted({r.get("category", "default") for r in base_ok + spec_ok}):
        b = median_of([tpot_ms(r) for r in base_ok if r.get("category") == cat])
        s = median_of([tpot_ms(r) for r in spec_ok if r.get("category") == cat])
        by_category[cat] = {"tpot_ratio": s / b if s and b else None, "speedup": b / s if s and b else None,
                            "n_base": sum(r.get("category") == cat for r in base_ok),
                            "n_spec": sum(r.get("category") == cat for r in spec_ok)}
    return {
        "by_category": by_category,
        "run_level": run_level,
        "pooled_request_level": pooled,
        "mann_whitney_tpot": mann_whitney([tpot_ms(r) for r in spec_ok], [tpot_ms(r) for r in base_ok]),
        "mann_whitney_e2e": mann_whitney([e2e_ms(r) for r in spec_ok], [e2e_ms(r) for r in base_ok]),
        "base_ttft_p95_ms": base_p95,
        "speedup_tpot": _inverse(run_level["tpot_ratio"]["point"]),
        "equivalence": output_equivalence(base_ok, spec_ok),
        "output_length": output_length_match(base_ok, spec_ok),
        "n_runs": {"base": len(base_runs), "spec": len(spec_runs)},
        "n_ok": {"base": len(base_ok), "spec": len(spec_ok)},
    }


def _inverse(value: float | None) -> float | None:
    return 1.0 / value if value else None


def best_ci(comparison: dict, name: str) -> dict[str, Any]:
    """The run-level CI when it exists, else the pooled request-level one (descriptive only)."""
    ci = comparison["run_level"][name]
    if ci.get("low") is not None:
        return {**ci, "level": "run"}
    pooled_name = {"tpot_ratio": "tpot_ratio_of_medians", "e2e_ratio": "e2e_ratio_of_medians"}.get(name)
    if pooled_name:
        return {**comparison["pooled_request_level"][pooled_name], "level": "request (pooled)"}
    return {**ci, "level": "run"}


def find_crossover(levels: list[tuple[int, dict]]) -> int | None:
    """Lowest concurrency whose TPOT-ratio CI no longer shows a benefit (upper bound ≥ 1, or no CI
    and point ≥ 1); None when every level still benefits."""
    for concurrency, comparison in sorted(levels, key=lambda x: x[0]):
        ci = best_ci(comparison, "tpot_ratio")
        upper = ci.get("high") if ci.get("high") is not None else ci.get("point")
        if upper is None or upper >= 1.0:
            return concurrency
    return None
