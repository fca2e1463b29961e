"""The A/A check of the rig (`specdeploy loadtest CONFIG --aa`): its verdict and its noise record.

An A/A run measures the baseline against itself through the same sweep, pairing and intervals as
an A/B (:data:`pipeline.loadtest.runner.AA_DESIGN`). Its verdict:

  * NO DIFFERENCE (exit 0): every paired interval (TPOT, E2E, output tokens/s ratios; p95 TTFT
    difference) at every level contains "no difference", and greedy outputs match;
  * DIFFERENCE (exit 1): an interval excludes it, or outputs differ: the rig shows a difference
    between identical arms (drift, a noisy neighbour, a non-deterministic server), so an A/B on it
    would too;
  * INCONCLUSIVE (exit 3): no interval could be formed, or the runs are invalid.

The intervals are widened for their number m (Bonferroni, 1 − alpha/m each), so the chance that a
sound rig reports DIFFERENCE is at most alpha, however many levels and metrics were measured.

The noise record, ``aa.json`` (in RUN_DIR and, the latest one, in ``reports/<name>/aa.json`` of
the workdir): per level the run-to-run CV of each run statistic, the SD of the per-pair log
ratios (what the A/B's paired intervals face), the request-level CV within a run, and the smallest
ratio a paired 95 % interval would tell from 1 at 3, 5 and 10 repeats. :func:`quote` gives the A/B
report the latest record of its config.
"""

from __future__ import annotations

import json
import math
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import GateSettings
from pipeline.infra.atomic import write_json_atomic
from pipeline.report.gate import (
    DIFFERENCE,
    FAIL,
    INCONCLUSIVE,
    NO_DIFFERENCE,
    NOT_CHECKED,
    PASS,
    UNSURE,
    Check,
    GateResult,
    _validity_checks,
)
from pipeline.report.intervals import paired_values, t_quantile
from pipeline.report.stats import RunData, e2e_ms, tpot_ms

AA_SCHEMA = "specdeploy-aa/1"
# (name in run_level, run statistic, kind): the intervals an A/A checks
AA_METRICS = (("tpot_ratio", "median_tpot_ms", "ratio"), ("e2e_ratio", "median_e2e_ms", "ratio"),
              ("throughput_ratio", "output_tokens_per_s", "ratio"), ("ttft_p95_delta_ms", "p95_ttft_ms", "diff"))
DETECTABLE_AT = (3, 5, 10)


def widened(ci: dict, confidence: float) -> tuple[float | None, float | None]:
    """The paired interval ``ci`` at another confidence level (same pairs, t with n − 1 df)."""
    center, sd, n = ci.get("center"), ci.get("sd"), ci.get("n_pairs") or 0
    if center is None or sd is None or n < 2:
        return None, None
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    if ci.get("scale") == "log":
        return math.exp(center - half), math.exp(center + half)
    return center - half, center + half


def evaluate_aa(analysis: dict[str, Any], gate: GateSettings, confidence: float) -> GateResult:
    """NO DIFFERENCE / DIFFERENCE / INCONCLUSIVE of an A/A run (module docstring)."""
    comparisons = sorted((c for c in analysis["comparisons"] if c.get("primary", True)), key=lambda c: c["concurrency"])
    m = max(1, len(comparisons) * len(AA_METRICS))
    family = 1.0 - (1.0 - confidence) / m
    checks: list[Check] = [c for c in _validity_checks(analysis, gate) if c.status != PASS]
    for comp in comparisons:
        scope = f"c={comp['concurrency']}"
        for name, _, kind in AA_METRICS:
            ci = comp["run_level"][name]
            low, high = widened(ci, family)
            null = 1.0 if kind == "ratio" else 0.0
            value = {"point": ci.get("point"), "low": low, "high": high, "confidence_level": family,
                     "method": ci.get("method"), "n_pairs": ci.get("n_pairs")}
            words = f"B/A {_fmt(ci.get('point'))}" if kind == "ratio" else f"B − A {_fmt(ci.get('point'))} ms"
            if low is None:
                checks.append(Check(f"aa_{name}", scope, UNSURE, f"{words}, no CI (fewer than 2 paired repeats)", value, null))
            elif low <= null <= high:
                checks.append(Check(f"aa_{name}", scope, PASS, f"{words} [{family:.2%} CI {_fmt(low)}, {_fmt(high)}] "
                                    "contains no difference", value, null))
            else:
                checks.append(Check(f"aa_{name}", scope, FAIL, f"{words} [{family:.2%} CI {_fmt(low)}, {_fmt(high)}]: "
                                    "identical arms differ — drift, a noisy neighbour or a non-deterministic server",
                                    value, null))
        eq = comp["equivalence"]
        if analysis.get("greedy", True) and eq["prompts_compared"]:
            checks.append(Check("aa_output_equivalence", scope, PASS if eq["equivalent"] else FAIL,
                                f"{eq['mismatched']} of {eq['prompts_compared']} prompts differ between A and A (greedy)",
                                eq["mismatched"], 0))
    if not comparisons:
        checks.append(Check("coverage", "run", UNSURE, "no concurrency level has both arms"))
    differs = any(c.status == FAIL and c.rule.startswith("aa_") for c in checks)
    # an invalid run (a dead server, unaccounted requests) measured no noise: inconclusive, not a difference
    unsure = any(c.status == UNSURE or (c.status == FAIL and not c.rule.startswith("aa_")) for c in checks)
    verdict = DIFFERENCE if differs else INCONCLUSIVE if unsure else NO_DIFFERENCE
    return GateResult(verdict, [c for c in checks if c.status != NOT_CHECKED], [])


def _cv(values: list[float]) -> float | None:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size < 2 or not arr.mean():
        return None
    return float(arr.std(ddof=1) / arr.mean())


def noise_record(analysis: dict[str, Any], runs: list[RunData], gate: GateResult, meta: dict, cfg,
                 run_dir: Path) -> dict[str, Any]:
    """The rig's noise as this A/A measured it (module docstring)."""
    levels = []
    for comp in sorted(analysis["comparisons"], key=lambda c: c["concurrency"]):
        level = comp["concurrency"]
        cells = [c for c in analysis["cells"] if c["concurrency"] == level]
        summaries = [s for c in cells for s in c["runs"]]
        base = next((c["runs"] for c in cells if c["arm"] == "baseline"), [])
        second = next((c["runs"] for c in cells if c["arm"] != "baseline"), [])
        paired_sd = {}
        for name, metric, kind in AA_METRICS:
            if kind == "ratio":
                pairs = paired_values(second, base, metric)
                logs = [math.log(s / b) for s, b in pairs if s > 0 and b > 0]
                paired_sd[name] = float(np.std(logs, ddof=1)) if len(logs) > 1 else None
        level_runs = [r for r in runs if r.info.get("concurrency") == level]
        request_cv = {"tpot_ms": _median([_cv([tpot_ms(r) for r in run.measured if r.get("status") == "ok"])
                                           for run in level_runs]),
                      "e2e_ms": _median([_cv([e2e_ms(r) for r in run.measured if r.get("status") == "ok"])
                                         for run in level_runs])}
        sd = paired_sd.get("tpot_ratio")
        levels.append({
            "concurrency": level,
            "n_pairs": comp["run_level"]["tpot_ratio"].get("n_pairs"),
            "run_to_run_cv": {m: _cv([s.get(m) for s in summaries])
                              for m in ("median_tpot_ms", "median_e2e_ms", "p95_ttft_ms", "output_tokens_per_s")},
            "paired_log_ratio_sd": paired_sd,
            "request_cv": request_cv,
            # the TPOT ratio a paired 95 % interval would tell from 1 at n repeats, at this noise
            "detectable_tpot_ratio": {str(n): (math.exp(-t_quantile(0.95, n - 1) * sd / math.sqrt(n)) if sd else None)
                                      for n in DETECTABLE_AT},
        })

    def worst(path: tuple[str, str]) -> float | None:
        values = [lv[path[0]].get(path[1]) for lv in levels]
        values = [v for v in values if v is not None]
        return max(values) if values else None

    return {
        "schema": AA_SCHEMA, "name": cfg.name, "config_hash": meta.get("config_hash"), "run_dir": str(run_dir),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "host": socket.gethostname(),
        "verdict": gate.verdict, "exit_code": gate.exit_code, "design": (meta.get("aa") or {}).get("design"),
        "repeats": meta.get("repeats"), "duration_s": meta.get("duration_s"),
        "summary": {"run_to_run_cv_tpot": worst(("run_to_run_cv", "median_tpot_ms")),
                    "run_to_run_cv_throughput": worst(("run_to_run_cv", "output_tokens_per_s")),
                    "paired_log_ratio_sd_tpot": worst(("paired_log_ratio_sd", "tpot_ratio")),
                    "request_cv_tpot": worst(("request_cv", "tpot_ms"))},
        "levels": levels,
    }


def _median(values: list[float | None]) -> float | None:
    arr = [v for v in values if v is not None]
    return float(np.median(arr)) if arr else None


def record_path(reports_dir: Path) -> Path:
    """Where the latest A/A record of a config lives: ``reports/<name>/aa.json`` of its workdir."""
    return reports_dir / "aa.json"


def write_record(record: dict[str, Any], run_dir: Path, reports_dir: Path) -> None:

    write_json_atomic(run_dir / "aa.json", record, indent=1)
    reports_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record_path(reports_dir), record, indent=1)


def quote(reports_dir: Path) -> dict[str, Any] | None:
    """What an A/B report says of the rig: the latest A/A record of this config, if any."""
    path = record_path(reports_dir)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("schema") != AA_SCHEMA:
        return None
    return {"source": str(path), "created": record.get("created"), "host": record.get("host"),
            "same_host": record.get("host") == socket.gethostname(), "verdict": record.get("verdict"),
            "run_dir": record.get("run_dir"), **(record.get("summary") or {})}


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
