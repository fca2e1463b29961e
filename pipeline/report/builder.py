"""`specdeploy report`: statistics, the verdict and the report files of one load-test run.

Reads ``RUN_DIR/run.json`` (provenance, config snapshot), ``RUN_DIR/runs.json`` (one entry per
Locust run: arm, concurrency, repeat, draft length, validity, server liveness, Prometheus counter
deltas, peak server RSS) and the raw records ``RUN_DIR/raw/*.jsonl``. Writes ``report.json``
(schema ``specdeploy-report/1``), ``report.md`` and a self-contained ``report.html`` (plots
inlined as base64 PNG, no external URLs), decision first; the pages themselves are built by
``pipeline.report.view``. The verdict comes from ``pipeline.report.gate``; its exit code is GO 0, NO-GO 1,
INCONCLUSIVE 3.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from pipeline.artefacts.base import problem_lines
from pipeline.artefacts.report import REPORT_SCHEMA
from pipeline.artefacts.report import Report as ReportFile
from pipeline.artefacts.runs import RunInfo
from pipeline.config import DeploymentConfig, parse_config
from pipeline.errors import EXIT_USAGE, SpecdeployError
from pipeline.infra.atomic import write_json_atomic, write_text_atomic
from pipeline.paths import reports_root
from pipeline.report import aa, acceptance, alpha_spending, arrivals, per_request
from pipeline.report.acceptance_reported import acceptance_reported
from pipeline.report.capacity import report_section
from pipeline.report.comparison import BootstrapSettings, best_ci, compare_cells, find_crossover
from pipeline.report.forecast_check import run_context, safe_forecast_section
from pipeline.report.gate import GateResult, evaluate_gate
from pipeline.report.intervals import METHOD as INTERVAL_METHOD
from pipeline.report.kv_capacity_check import with_kv_capacity_check
from pipeline.report.rollout_range import rollout_range
from pipeline.report.schedule_gate import schedule_section
from pipeline.report.schedule_gate import verdict as schedule_verdict
from pipeline.report.sessions import sessions
from pipeline.report.stats import RunData, cell_summary, e2e_ms, load_runs, tpot_ms, ttft_ms
from pipeline.report.view.compare import comparison_data
from pipeline.report.view.plots import compare_plot, report_plots
from pipeline.report.view.render import render_comparison, render_report

PROVENANCE_EXCLUDED = ("config",)
FORMULAS = {
    "TTFT": "t_first_token − t_sent (first response carrying ≥ 1 output token; never HTTP headers)",
    "E2E": "t_last − t_sent (open loop also from t_scheduled)",
    "TPOT": "(E2E − TTFT) / (OSL − 1), per request, OSL > 1 only — the headline decode metric",
    "engine TPOT": "(last − first token time, the server's perf outputs) / (OSL − 1): TPOT as the engine made the "
                   "tokens; delivery lag = mean TPOT ÷ mean engine TPOT − 1",
    "inter-chunk latency": "gap between consecutive non-empty streamed chunks; a chunk can carry several "
                           "tokens (speculation), so this is per CHUNK, not per token",
    "output tokens/s": "Σ OSL / (last response − first send) over the measured window (warm-up excluded)",
    "achieved concurrency": "Σ in-flight time / window (Little's law), clipped to the steady window",
    "goodput": "requests meeting every SLO set (TTFT ≤ slo.ttft_ms, TPOT ≤ slo.tpot_ms, E2E ≤ slo.e2e_ms; OSL ≤ 1: "
               "TPOT = 0) / duration; goodput tokens/s: their output tokens / duration",
    "achieved rate": "open loop, per worker: offered = (n − 1) / (last − first scheduled arrival) of the requests sent, "
                     "achieved = offered ÷ the least-squares slope of send times on scheduled times (1: on schedule)",
    "acceptance rate": "Σ accepted draft tokens / Σ draft tokens (token-weighted, pooled)",
    "mean acceptance length τ": "1 + accepted / verify steps (Prometheus steps, else chunks after the first)",
    "OSL": "server token count (num_output_tokens), not re-tokenized text",
}


class ReportError(SpecdeployError):
    """The run directory cannot be reported on: a missing or wrong path is a usage error (2), a run
    that holds no usable data a pipeline failure (5, the default)."""


@dataclass
class Report:
    run_dir: Path
    data: dict[str, Any]
    gate: GateResult
    json_path: Path
    md_path: Path
    html_path: Path

    @property
    def verdict(self) -> str:
        return self.gate.verdict

    @property
    def exit_code(self) -> int:
        return self.gate.exit_code


# ------------------------------------------------------------------------------------------------
# Analysis


def _load_run_json(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.is_file():
        raise ReportError(f"{run_dir}: no run.json — not a load-test run directory", exit_code=EXIT_USAGE)
    data = json.loads(path.read_text(encoding="utf-8"))
    RunInfo.load(path, data)  # the right schema and fields, or one line naming the problem
    return data


def config_from_run(run_dir: Path) -> DeploymentConfig:
    snapshot = _load_run_json(run_dir).get("config")
    if not snapshot:
        raise ReportError(f"{run_dir}/run.json has no config snapshot")
    slo = (snapshot.get("gate") or {}).get("slo")
    if isinstance(slo, dict) and "declared" not in slo:  # written before SLOs could be declared: the defaults
        snapshot = {**snapshot, "gate": {**snapshot["gate"], "slo": {**slo, "declared": False}}}
    return parse_config(snapshot, f"{run_dir}/run.json:config")


def _runs(run_dir: Path) -> list[RunData]:
    """The run's load-test runs and their records; a clear error when there are none."""
    try:
        runs = load_runs(run_dir)
    except FileNotFoundError as exc:
        raise ReportError(str(exc)) from None
    if not runs:
        raise ReportError(f"{run_dir}/runs.json lists no runs")
    return runs


def analyze(run_dir: Path, cfg: DeploymentConfig, runs: list[RunData]) -> dict[str, Any]:
    """Cells, comparisons, crossover and acceptance of RUN_DIR's ``runs`` (:func:`_runs`)."""
    meta = _load_run_json(run_dir)
    slo = cfg.gate.slo
    # an auto run's looks each spend alpha / K (pipeline/report/alpha_spending.py): its intervals too
    confidence = alpha_spending.confidence_level(meta, cfg.gate.alpha)
    boot = BootstrapSettings(cfg.gate.bootstrap_resamples, cfg.gate.bootstrap_seed, confidence)
    groups: dict[tuple, list[RunData]] = defaultdict(list)
    for run in runs:
        groups[(run.info["arm"], run.info["concurrency"], run.info.get("draft_len"))].append(run)
    cells = []
    cell_by_key = {}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0)):
        summary = cell_summary(groups[key], slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)
        cell = {"arm": key[0], "concurrency": key[1], "draft_len": key[2], **summary,
                "arrivals": arrivals.cell_arrivals(groups[key]), "slo": slo_attainment(_ok(groups[key]), slo)}
        cells.append(cell)
        cell_by_key[key] = cell
    primary = meta.get("primary_draft_len")
    comparisons = []
    for (arm, conc, dl), spec_runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2] or 0)):
        if arm != "speculative":
            continue
        base_key = ("baseline", conc, None)
        if base_key not in groups:
            continue
        base_cell, spec_cell = cell_by_key[base_key], cell_by_key[(arm, conc, dl)]
        comp = compare_cells(groups[base_key], spec_runs, base_cell, spec_cell, boot)
        comp["category_slower"] = per_request.slower_categories(_ok(groups[base_key]), _ok(spec_runs), cfg.gate.alpha)
        comp.update({
            "concurrency": conc, "draft_len": dl, "primary": dl == primary,
            "target_rate": spec_runs[0].info.get("target_rate"),
            "error_rate": {"base": base_cell["error_rate"], "spec": spec_cell["error_rate"]},
            "achieved_concurrency": {"base": base_cell["achieved_concurrency"], "spec": spec_cell["achieved_concurrency"]},
            "arrivals": {"base": base_cell["arrivals"], "spec": spec_cell["arrivals"]},
            "goodput": {arm: {"requests_per_s": cell["goodput_rps"], "output_tokens_per_s": cell["goodput_tokens_per_s"],
                              "slo": cell["slo"]} for arm, cell in (("base", base_cell), ("spec", spec_cell))},
        })
        comparisons.append(comp)
    primary_comps = [c for c in comparisons if c["primary"]]
    spec_records = [r for (arm, _, dl), rs in groups.items() if arm == "speculative" and dl == primary
                    for run in rs for r in run.measured if r.get("status") == "ok"]
    spec_deltas = [run.info.get("server_acceptance") for (arm, _, dl), rs in groups.items()
                   if arm == "speculative" and dl == primary for run in rs]
    acceptance_rate, acceptance_source = acceptance.headline(spec_records, spec_deltas)
    all_summaries = [s for cell in cells for s in cell["runs"]]
    scheduled = schedule_section(runs, meta, confidence, cfg.gate.peak_throughput_ratio_min)  # None for a two-arm run: its analysis is unchanged
    return {
        **({"schedule": scheduled} if scheduled else {}),
        "acceptance_per_request": per_request.acceptance_per_request(spec_records),
        "acceptance_by_position": per_request.acceptance_by_position(spec_deltas),
        "runs": all_summaries,
        "cells": cells,
        "comparisons": comparisons,
        "primary_draft_len": primary,
        "greedy": cfg.loadtest.sampling.greedy,
        "crossover_concurrency": find_crossover([(c["concurrency"], c) for c in primary_comps]),
        "acceptance_rate": acceptance_rate,
        "acceptance_source": acceptance_source,
        "acceptance_by_source": acceptance.by_source(all_summaries),
        "recommended_draft_len": recommend_draft_len(comparisons) if meta.get("sweep_draft_len") else {},
        "bootstrap": {"method": boot.method, "n_resamples": boot.n_resamples, "seed": boot.seed,
                      "confidence_level": boot.confidence_level,
                      "unit": "request (pooled over runs): descriptive only, never gated"},
        "intervals": {"method": INTERVAL_METHOD, "confidence_level": confidence,
                      "unit": "paired repeat (repeat r of each arm, interleaved)",
                      "why": "holds its confidence level at 2-10 repeats per arm where a percentile bootstrap "
                             "cannot (docs/report.md); pairing removes load and drift common to a pair",
                      "alpha_spending": (meta.get("repeats_auto") or {}).get("spending")},
    }


def slo_attainment(ok: list[dict], slo) -> dict[str, Any]:
    """Each SLO bound against the cell's percentile of its metric (``gate.slo.percentile``, numpy on the
    ok requests' raw samples): ``{percentile, declared, metrics: {ttft: {bound_ms, value_ms, met}, ...}}``;
    a bound not set is left out."""
    out: dict[str, Any] = {"percentile": slo.percentile, "declared": slo.declared, "metrics": {}}
    for name, bound, metric in (("ttft", slo.ttft_ms, ttft_ms), ("tpot", slo.tpot_ms, tpot_ms), ("e2e", slo.e2e_ms, e2e_ms)):
        if bound is None:
            continue
        values = [v for v in (metric(r) for r in ok) if v is not None]
        value = float(np.percentile(values, slo.percentile)) if values else None
        out["metrics"][name] = {"bound_ms": bound, "value_ms": value, "met": None if value is None else value <= bound}
    return out


def _ok(runs: list[RunData]) -> list[dict]:
    return [r for run in runs for r in run.measured if r.get("status") == "ok"]


def recommend_draft_len(comparisons: list[dict]) -> dict[str, Any]:
    """Per concurrency, the draft length with the lowest spec/base median-TPOT ratio (point), and
    whether its CI shows a benefit; speculation off when none does."""
    by_level: dict[int, list[dict]] = defaultdict(list)
    for comp in comparisons:
        if comp["draft_len"] is not None:
            by_level[comp["concurrency"]].append(comp)
    out = {}
    for level, comps in sorted(by_level.items()):
        scored = [(best_ci(c, "tpot_ratio"), c["draft_len"]) for c in comps]
        scored = [(ci, dl) for ci, dl in scored if ci.get("point") is not None]
        if not scored:
            continue
        ci, dl = min(scored, key=lambda x: x[0]["point"])
        benefit = ci.get("high") is not None and ci["high"] < 1.0
        out[str(level)] = {"draft_len": dl if benefit else None, "best_measured": dl, "tpot_ratio": ci["point"],
                           "ci": [ci.get("low"), ci.get("high")], "speculation": "on" if benefit else "off"}
    return out


# ------------------------------------------------------------------------------------------------
# report.json


def _headline_rows(analysis: dict, meta: dict, cfg: DeploymentConfig) -> list[dict[str, Any]]:
    categories = sorted({cat for cell in analysis["cells"] for cat in cell["acceptance_by_category"]})
    equivalence = {(c["concurrency"], c["draft_len"]): c["equivalence"]["equivalent"] for c in analysis["comparisons"]}
    rows = []
    for cell in analysis["cells"]:
        is_spec = cell["arm"] == "speculative"
        median_tpot = cell["tpot_ms"]["p50"]
        rows.append({
            "arm": cell["arm"],
            "concurrency": cell["concurrency"],
            "target_rate": cell["runs"][0].get("target_rate") if cell["runs"] else None,
            "task_set": categories,
            "draft_model": meta.get("draft_model") if is_spec else None,
            "speculation_length": (cell["draft_len"] or meta.get("primary_draft_len")) if is_spec else 0,
            "acceptance_rate": cell["acceptance"]["acceptance_rate"] if is_spec else None,
            "mean_acceptance_length": cell["acceptance"]["mean_acceptance_length"] if is_spec else 1.0,
            "tau_bound_iid": tau_bound(cell["acceptance"]["acceptance_rate"], cell["draft_len"] or meta.get("primary_draft_len"))
            if is_spec else None,
            "first_token_ms": cell["ttft_ms"]["p50"],
            "first_token_p95_ms": cell["ttft_ms"]["p95"],
            "tpot_ms": median_tpot,
            "decode_tokens_per_s": 1000.0 / median_tpot if median_tpot else None,
            "output_tokens_per_s": cell["output_tokens_per_s"],
            "p95_latency_ms": cell["e2e_ms"]["p95"],
            "output_equivalent": equivalence.get((cell["concurrency"], cell["draft_len"])) if is_spec else None,
            "peak_memory_mb": cell["peak_rss_mb"],
            "n_ok": cell["n_ok"],
            "n_runs": cell["n_runs"],
        })
    return rows


def tau_bound(alpha: float | None, k: int | None) -> float | None:
    """Expected tokens per verify step for i.i.d. acceptance α and K drafts: (1 − α^{K+1}) / (1 − α)."""
    if alpha is None or not k:
        return None
    if alpha >= 1.0:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def build_report_data(run_dir: Path, cfg: DeploymentConfig, analysis: dict, gate: GateResult,
                      runs: list[RunData]) -> dict[str, Any]:
    meta = _load_run_json(run_dir)
    data = {
        "schema": REPORT_SCHEMA,
        "schema_version": ReportFile.VERSION,
        "name": cfg.name,
        "run_dir": str(run_dir),
        "verdict": gate.verdict,
        "exit_code": gate.exit_code,
        "reasons": gate.reasons,
        "advice": gate.advice,
        "gate": gate.as_dict(),
        "gate_settings": cfg.gate.model_dump(mode="json"),
        "rows": _headline_rows(analysis, meta, cfg),
        "crossover_concurrency": analysis["crossover_concurrency"],
        "rollout_range": rollout_range(analysis, cfg.gate),
        "recommended_draft_len": analysis["recommended_draft_len"],
        "acceptance_rate": analysis["acceptance_rate"],
        "acceptance_source": analysis["acceptance_source"],
        "acceptance_by_source": analysis["acceptance_by_source"],
        "acceptance_per_request": analysis["acceptance_per_request"],
        "acceptance_by_position": analysis["acceptance_by_position"],
        "comparisons": [_strip_comparison(c) for c in analysis["comparisons"]],
        "cells": [{k: v for k, v in cell.items() if k != "runs"} for cell in analysis["cells"]],
        "runs": [{k: v for k, v in r.items() if k != "throughput_timeline"} for r in analysis["runs"]],
        "bootstrap": analysis["bootstrap"],
        "intervals": analysis["intervals"],
        "repeats": alpha_spending.summary(meta),
        "aa": meta.get("aa"),
        "rig_noise": None if meta.get("aa") else aa.quote(reports_root(cfg)),
        "primary_draft_len": analysis["primary_draft_len"],
        "greedy": analysis["greedy"],
        # every run.json entry but the config snapshot (config_hash names it), so whatever a stage
        # records about the run reaches the report without a change here
        "provenance": {k: v for k, v in meta.items() if k not in PROVENANCE_EXCLUDED},
        "synthetic_data": bool(meta.get("dataset", {}).get("synthetic")) if isinstance(meta.get("dataset"), dict) else None,
        "data_warnings": data_warnings(meta.get("dataset")),
        "formulas": FORMULAS,
        "acceptance_reported": acceptance_reported(runs, meta.get("server_metrics")),
        "sessions": sessions(meta, [run.info for run in runs]),
    }
    if analysis.get("schedule"):  # only a three-arm run: a two-arm report.json is unchanged
        data["schedule"] = {**analysis["schedule"], "verdict": schedule_verdict(analysis["schedule"]["checks"])}
    data["forecast"] = safe_forecast_section(data, cfg, run_context(r for run in runs for r in run.records))
    if cfg.capacity is not None:
        data["capacity"] = safe_capacity_section(run_dir, data, cfg)
    return data


def data_warnings(dataset: Any) -> list[str]:
    """What the data makes unrepresentative (forced lengths, cut text), as the load test found it
    (pipeline/loadtest/inputs.py ``data_warnings``); a run recorded before that says "synthetic" only."""
    if not isinstance(dataset, dict):
        return []
    if "warnings" in dataset:
        return [str(w) for w in dataset["warnings"]]
    return ["synthetic prompts were used; acceptance and speedup are likely understated"] if dataset.get("synthetic") else []


def safe_capacity_section(run_dir: Path, data: dict, cfg: DeploymentConfig) -> dict[str, Any]:
    """The capacity section (docs/capacity.md), never raising: a report must not fail for it."""

    per_replica = 1 if cfg.hardware == "cpu" else cfg.target.tp * cfg.target.pp
    try:
        return report_section(run_dir, data, cfg.capacity, per_replica)
    except Exception as exc:  # noqa: BLE001 - capacity is advice; the report stands without it
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}


def _strip_comparison(comp: dict) -> dict:
    out = dict(comp)
    out["equivalence"] = {k: v for k, v in comp["equivalence"].items()}
    return out


def validate_report_json(data: dict) -> list[str]:
    """report.json checked against its model (:class:`pipeline.artefacts.report.Report`); returns
    one ``field.path: message`` per problem."""
    try:
        ReportFile.model_validate(data)
    except ValidationError as exc:
        return problem_lines(exc)
    return []


# ------------------------------------------------------------------------------------------------
# Entry point


def prepare(run_dir: Path, cfg: DeploymentConfig | None = None) -> tuple[dict[str, Any], dict[str, Any], GateResult]:
    """(report data, analysis, gate result) of RUN_DIR, checked against the report schema."""
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory", exit_code=EXIT_USAGE)
    cfg = cfg or config_from_run(run_dir)
    runs = _runs(run_dir)  # records are the bulk of a run: read once for the analysis and the report
    analysis = analyze(run_dir, cfg, runs)
    meta = _load_run_json(run_dir)
    if meta.get("aa"):  # the rig against itself: "no difference" or not, and its noise
        gate = aa.evaluate_aa(analysis, cfg.gate, analysis["intervals"]["confidence_level"])
    else:
        gate = with_kv_capacity_check(evaluate_gate(analysis, cfg.gate), meta)
    data = build_report_data(run_dir, cfg, analysis, gate, runs)
    if meta.get("aa"):
        data["aa"] = {**meta["aa"], "noise": aa.noise_record(analysis, runs, gate, meta, cfg, run_dir)}
    problems = validate_report_json(data)
    if problems:
        raise ReportError("report.json failed its schema check: " + "; ".join(problems))
    return data, analysis, gate


def make_report(run_dir: str | Path, cfg: DeploymentConfig | None = None) -> Report:
    """Analyse RUN_DIR, decide the verdict, write report.json / report.md / report.html."""

    run_dir = Path(run_dir)
    data, analysis, gate = prepare(run_dir, cfg)
    markdown, html = render_report(data, report_plots(data, analysis, load_runs(run_dir)))
    json_path, md_path, html_path = run_dir / "report.json", run_dir / "report.md", run_dir / "report.html"
    if data.get("aa"):  # the noise record the A/B reports of this config quote
        aa.write_record(data["aa"]["noise"], run_dir, reports_root(cfg or config_from_run(run_dir)))
    write_json_atomic(json_path, data, default=_json_default)
    write_text_atomic(md_path, markdown)  # a full disk leaves the old file, not half a new one
    write_text_atomic(html_path, html)
    return Report(run_dir, data, gate, json_path, md_path, html_path)


@dataclass
class Comparison:
    data: dict[str, Any]
    json_path: Path
    md_path: Path
    html_path: Path

    @property
    def moved_worse(self) -> list[dict[str, Any]]:
        return self.data["moved_worse"]


def make_comparison(run_a: str | Path, run_b: str | Path, out_dir: str | Path | None = None) -> Comparison:
    """RUN_B against RUN_A (each gated with its own config snapshot): write compare.json /
    compare.md / compare.html into OUT_DIR (default RUN_B); the run directories are only read."""

    run_a, run_b = Path(run_a), Path(run_b)
    data_a, _, _ = prepare(run_a)
    data_b, _, _ = prepare(run_b)
    out = Path(out_dir) if out_dir is not None else run_b
    out.mkdir(parents=True, exist_ok=True)
    comp = comparison_data(data_a, data_b, str(run_a), str(run_b))
    markdown, html = render_comparison(data_a, data_b, comp, compare_plot(data_a, data_b))
    paths = out / "compare.json", out / "compare.md", out / "compare.html"
    write_json_atomic(paths[0], comp, default=_json_default)
    write_text_atomic(paths[1], markdown)
    write_text_atomic(paths[2], html)
    return Comparison(comp, *paths)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
