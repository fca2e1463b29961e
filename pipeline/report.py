"""`specdeploy report`: statistics, the verdict and the report files of one load-test run.

Reads ``RUN_DIR/run.json`` (provenance, config snapshot), ``RUN_DIR/runs.json`` (one entry per
Locust run: arm, concurrency, repeat, draft length, validity, server liveness, Prometheus counter
deltas, peak server RSS) and the raw records ``RUN_DIR/raw/*.jsonl``. Writes ``report.json``
(schema ``specdeploy-report/1``), ``report.md`` and a self-contained ``report.html`` (plots
inlined as base64 PNG, no external URLs). The verdict comes from ``pipeline.gate``; its exit code
is GO 0, NO-GO 1, INCONCLUSIVE 3.
"""

from __future__ import annotations

import base64
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import DeploymentConfig, parse_config
from pipeline.errors import SpecdeployError
from pipeline.gate import GateResult, evaluate_gate
from pipeline.stats import (
    BootstrapSettings,
    RunData,
    best_ci,
    cell_summary,
    compare_cells,
    find_crossover,
    load_runs,
    tpot_ms,
)

REPORT_SCHEMA = "specdeploy-report/1"
FORMULAS = {
    "TTFT": "t_first_token − t_sent (first response carrying ≥ 1 output token; never HTTP headers)",
    "E2E": "t_last − t_sent (open loop also from t_scheduled)",
    "TPOT": "(E2E − TTFT) / (OSL − 1), per request, OSL > 1 only — the headline decode metric",
    "inter-chunk latency": "gap between consecutive non-empty streamed chunks; a chunk can carry several "
                           "tokens (speculation), so this is per CHUNK, not per token",
    "output tokens/s": "Σ OSL / (last response − first send) over the measured window (warm-up excluded)",
    "achieved concurrency": "Σ in-flight time / window (Little's law), clipped to the steady window",
    "goodput": "requests meeting TTFT ≤ slo.ttft_ms and TPOT ≤ slo.tpot_ms (OSL ≤ 1: TPOT = 0) / duration",
    "acceptance rate": "Σ accepted draft tokens / Σ draft tokens (token-weighted, pooled)",
    "mean acceptance length τ": "1 + accepted / verify steps (Prometheus steps, else chunks after the first)",
    "OSL": "server token count (num_output_tokens), not re-tokenized text",
}


class ReportError(SpecdeployError):
    """The run directory cannot be reported on."""


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
        raise ReportError(f"{run_dir}: no run.json — not a load-test run directory")
    return json.loads(path.read_text(encoding="utf-8"))


def config_from_run(run_dir: Path) -> DeploymentConfig:
    snapshot = _load_run_json(run_dir).get("config")
    if not snapshot:
        raise ReportError(f"{run_dir}/run.json has no config snapshot")
    return parse_config(snapshot, f"{run_dir}/run.json:config")


def analyze(run_dir: Path, cfg: DeploymentConfig) -> dict[str, Any]:
    meta = _load_run_json(run_dir)
    try:
        runs = load_runs(run_dir)
    except FileNotFoundError as exc:
        raise ReportError(str(exc)) from None
    if not runs:
        raise ReportError(f"{run_dir}/runs.json lists no runs")
    slo = cfg.gate.slo
    boot = BootstrapSettings(cfg.gate.bootstrap_resamples, cfg.gate.bootstrap_seed, 1 - cfg.gate.alpha)
    groups: dict[tuple, list[RunData]] = defaultdict(list)
    for run in runs:
        groups[(run.info["arm"], run.info["concurrency"], run.info.get("draft_len"))].append(run)
    cells = []
    cell_by_key = {}
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0)):
        summary = cell_summary(groups[key], slo.ttft_ms, slo.tpot_ms)
        cell = {"arm": key[0], "concurrency": key[1], "draft_len": key[2], **summary}
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
        comp.update({
            "concurrency": conc, "draft_len": dl, "primary": dl == primary,
            "target_rate": spec_runs[0].info.get("target_rate"),
            "error_rate": {"base": base_cell["error_rate"], "spec": spec_cell["error_rate"]},
            "achieved_concurrency": {"base": base_cell["achieved_concurrency"], "spec": spec_cell["achieved_concurrency"]},
        })
        comparisons.append(comp)
    primary_comps = [c for c in comparisons if c["primary"]]
    spec_records = [r for (arm, _, dl), rs in groups.items() if arm == "speculative" and dl == primary
                    for run in rs for r in run.measured if r.get("status") == "ok"]
    drafted = sum(r.get("draft_tokens") or 0 for r in spec_records)
    accepted = sum(r.get("accepted_tokens") or 0 for r in spec_records)
    all_summaries = [s for cell in cells for s in cell["runs"]]
    return {
        "runs": all_summaries,
        "cells": cells,
        "comparisons": comparisons,
        "primary_draft_len": primary,
        "greedy": cfg.loadtest.sampling.greedy,
        "crossover_concurrency": find_crossover([(c["concurrency"], c) for c in primary_comps]),
        "acceptance_rate": accepted / drafted if drafted else None,
        "recommended_draft_len": recommend_draft_len(comparisons) if meta.get("sweep_draft_len") else {},
        "bootstrap": {"method": boot.method, "n_resamples": boot.n_resamples, "seed": boot.seed,
                      "confidence_level": boot.confidence_level, "unit": "run (replicate)"},
    }


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


def build_report_data(run_dir: Path, cfg: DeploymentConfig, analysis: dict, gate: GateResult) -> dict[str, Any]:
    meta = _load_run_json(run_dir)
    return {
        "schema": REPORT_SCHEMA,
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
        "recommended_draft_len": analysis["recommended_draft_len"],
        "acceptance_rate": analysis["acceptance_rate"],
        "comparisons": [_strip_comparison(c) for c in analysis["comparisons"]],
        "cells": [{k: v for k, v in cell.items() if k != "runs"} for cell in analysis["cells"]],
        "runs": [{k: v for k, v in r.items() if k != "throughput_timeline"} for r in analysis["runs"]],
        "bootstrap": analysis["bootstrap"],
        "provenance": {k: meta.get(k) for k in ("git_sha", "config_hash", "versions", "hardware", "dataset",
                                                  "seeds", "commands", "method", "draft_model", "created",
                                                  "transport", "mode", "endpoints", "tokenizer_dir")},
        "synthetic_data": bool(meta.get("dataset", {}).get("synthetic")) if isinstance(meta.get("dataset"), dict) else None,
        "formulas": FORMULAS,
    }


def _strip_comparison(comp: dict) -> dict:
    out = dict(comp)
    out["equivalence"] = {k: v for k, v in comp["equivalence"].items()}
    return out


REQUIRED_KEYS = {"schema": str, "verdict": str, "exit_code": int, "reasons": list, "rows": list, "gate": dict,
                 "provenance": dict, "comparisons": list, "bootstrap": dict}
ROW_KEYS = ("arm", "concurrency", "task_set", "draft_model", "speculation_length", "acceptance_rate",
            "first_token_ms", "decode_tokens_per_s", "p95_latency_ms", "output_equivalent", "peak_memory_mb")


def validate_report_json(data: dict) -> list[str]:
    """Structural check of report.json (schema specdeploy-report/1); returns problems."""
    problems = []
    for key, kind in REQUIRED_KEYS.items():
        if not isinstance(data.get(key), kind):
            problems.append(f"{key}: expected {kind.__name__}")
    if data.get("schema") != REPORT_SCHEMA:
        problems.append(f"schema: expected {REPORT_SCHEMA}")
    if data.get("verdict") not in ("GO", "NO-GO", "INCONCLUSIVE"):
        problems.append("verdict: not GO / NO-GO / INCONCLUSIVE")
    for i, row in enumerate(data.get("rows") or []):
        for key in ROW_KEYS:
            if key not in row:
                problems.append(f"rows[{i}].{key}: missing")
    return problems


# ------------------------------------------------------------------------------------------------
# Plots (matplotlib Agg → base64 PNG)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _concurrency_axis(ax, levels: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(v) for v in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


def make_plots(analysis: dict, runs: list[RunData]) -> dict[str, str]:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    plots = {}
    primary = analysis["primary_draft_len"]
    cells = [c for c in analysis["cells"] if c["arm"] == "baseline" or c["draft_len"] == primary]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (metric, label) in zip(axes, (("tpot_ms", "TPOT ms"), ("ttft_ms", "TTFT ms"), ("e2e_ms", "E2E ms"))):
        for arm, color in (("baseline", "tab:blue"), ("speculative", "tab:orange")):
            arm_cells = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["concurrency"])
            if not arm_cells:
                continue
            x = [c["concurrency"] for c in arm_cells]
            for q, style in (("p50", "-"), ("p95", "--")):
                ax.plot(x, [c[metric][q] for c in arm_cells], style, color=color, marker="o", label=f"{arm} {q}")
            run_key = {"tpot_ms": "median_tpot_ms", "ttft_ms": "median_ttft_ms", "e2e_ms": "median_e2e_ms"}[metric]
            lo = [min((r[run_key] for r in c["runs"] if r[run_key] is not None), default=np.nan) for c in arm_cells]
            hi = [max((r[run_key] for r in c["runs"] if r[run_key] is not None), default=np.nan) for c in arm_cells]
            ax.fill_between(x, lo, hi, color=color, alpha=0.2, label=f"{arm} run-median range")
        _concurrency_axis(ax, sorted({c["concurrency"] for c in cells}))
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    plots["latency_vs_concurrency"] = _png(fig)

    comps = sorted((c for c in analysis["comparisons"] if c["primary"]), key=lambda c: c["concurrency"])
    if comps:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        x = [c["concurrency"] for c in comps]
        cis = [best_ci(c, "tpot_ratio") for c in comps]
        speed = [1 / ci["point"] if ci.get("point") else np.nan for ci in cis]
        lo = [1 / ci["high"] if ci.get("high") else np.nan for ci in cis]
        hi = [1 / ci["low"] if ci.get("low") else np.nan for ci in cis]
        ax.plot(x, speed, marker="o", label="TPOT speedup (base/spec)")
        ax.fill_between(x, lo, hi, alpha=0.25, label="95% CI")
        ax.axhline(1.0, color="gray", lw=1)
        if analysis["crossover_concurrency"] is not None:
            ax.axvline(analysis["crossover_concurrency"], color="red", ls=":", label="crossover")
        _concurrency_axis(ax, x)
        ax.set_ylabel("speedup")
        ax.legend(fontsize=7)
        plots["speedup_vs_concurrency"] = _png(fig)

    levels = sorted({c["concurrency"] for c in cells})
    if levels:
        keys = sorted({levels[0], levels[-1]})
        fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 3.4), squeeze=False)
        for ax, level in zip(axes[0], keys):
            for run_arm, color in (("baseline", "tab:blue"), ("speculative", "tab:orange")):
                values = sorted(t for run in runs if run.info["arm"] == run_arm and run.info["concurrency"] == level
                                and (run_arm == "baseline" or run.info.get("draft_len") == primary)
                                for r in run.measured if r.get("status") == "ok" for t in [tpot_ms(r)] if t is not None)
                if values:
                    ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", color=color, label=run_arm)
            ax.set_title(f"TPOT ECDF, c={level}")
            ax.set_xlabel("TPOT ms")
            ax.legend(fontsize=7)
        plots["tpot_ecdf"] = _png(fig)

    spec_cells = [c for c in cells if c["arm"] == "speculative"]
    by_cat: dict[str, list[float]] = defaultdict(list)
    for cell in spec_cells:
        for cat, acc in cell["acceptance_by_category"].items():
            if acc["acceptance_rate"] is not None:
                by_cat[cat].append(acc["acceptance_rate"])
    if by_cat:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        cats = sorted(by_cat)
        ax.bar(cats, [float(np.mean(by_cat[c])) for c in cats], color="tab:orange")
        ax.set_ylim(0, 1)
        ax.set_ylabel("acceptance rate")
        ax.set_title("acceptance by category (mean over concurrency)")
        plots["acceptance_by_category"] = _png(fig)

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for arm, color in (("baseline", "tab:blue"), ("speculative", "tab:orange")):
        arm_cells = sorted((c for c in cells if c["arm"] == arm and c["output_tokens_per_s"]), key=lambda c: c["concurrency"])
        if arm_cells:
            ax.plot([c["output_tokens_per_s"] for c in arm_cells], [c["per_user_tokens_per_s"]["p50"] for c in arm_cells],
                    marker="o", color=color, label=arm)
            for c in arm_cells:
                ax.annotate(f"c={c['concurrency']}", (c["output_tokens_per_s"], c["per_user_tokens_per_s"]["p50"] or 0), fontsize=7)
    ax.set_xlabel("total output tokens/s")
    ax.set_ylabel("per-user tokens/s (p50 of 1/TPOT)")
    ax.set_title("Pareto: per-user vs total throughput")
    ax.legend(fontsize=7)
    plots["pareto"] = _png(fig)

    fig, ax = plt.subplots(figsize=(8, 3.4))
    for summary in analysis["runs"]:
        timeline = summary["throughput_timeline"]
        if timeline:
            ax.plot([p["t_s"] for p in timeline], [p["tokens_per_s"] for p in timeline], lw=1,
                    label=summary["key"], color="tab:orange" if summary["arm"] == "speculative" else "tab:blue")
    ax.set_xlabel("seconds into run")
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput over time per run (warm-up included)")
    plots["throughput_over_time"] = _png(fig)
    return plots


# ------------------------------------------------------------------------------------------------
# Markdown and HTML


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ci_text(ci: dict) -> str:
    if ci.get("point") is None:
        return "–"
    if ci.get("low") is None:
        return f"{ci['point']:.3f} (no CI)"
    return f"{ci['point']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}] ({ci.get('level', 'run')})"


def render_markdown(data: dict) -> str:
    lines = [f"# specdeploy report — {data['name']}", "", f"**Verdict: {data['verdict']}** (exit code {data['exit_code']})", ""]
    lines += [f"- {r}" for r in data["reasons"]] or ["- every gate check passed"]
    lines += [f"- advice: {a}" for a in data["advice"]]
    lines += ["", "## Gate checks", "", "| rule | scope | status | detail |", "|---|---|---|---|"]
    lines += [f"| {c['rule']} | {c['scope']} | {c['status']} | {c['detail']} |" for c in data["gate"]["checks"]]
    lines += ["", "## Per arm and concurrency", "",
              "| arm | conc | K | accept | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | decode tok/s | out tok/s | E2E p95 ms | equivalent | peak MB | n |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['arm']} | {r['concurrency']} | {_f(r['speculation_length'])} | {_f(r['acceptance_rate'], 3)} | "
                     f"{_f(r['first_token_ms'])} | {_f(r['first_token_p95_ms'])} | {_f(r['tpot_ms'], 2)} | "
                     f"{_f(r['decode_tokens_per_s'])} | {_f(r['output_tokens_per_s'])} | {_f(r['p95_latency_ms'])} | "
                     f"{_f(r['output_equivalent'])} | {_f(r['peak_memory_mb'])} | {r['n_ok']} |")
    lines += ["", "## Speculative vs baseline", "",
              "| conc | K | TPOT ratio [95% CI] | E2E ratio [95% CI] | Δp95 TTFT ms [CI] | tok/s ratio [CI] | MW p (TPOT) | Cliff's δ |",
              "|---|---|---|---|---|---|---|---|"]
    for c in data["comparisons"]:
        rl = c["run_level"]
        mw = c["mann_whitney_tpot"]
        lines.append(f"| {c['concurrency']} | {_f(c['draft_len'])} | {_ci_text(best_ci(c, 'tpot_ratio'))} | "
                     f"{_ci_text(best_ci(c, 'e2e_ratio'))} | {_ci_text(rl['ttft_p95_delta_ms'])} | "
                     f"{_ci_text(rl['throughput_ratio'])} | {_f(mw['p_value'], 4)} | "
                     f"{_f(mw['cliffs_delta'], 3)} {mw['effect'] or ''} |")
    lines += ["", f"Crossover concurrency (TPOT benefit gone): {_f(data['crossover_concurrency'])}"]
    spec_rows = [r for r in data["rows"] if r["arm"] == "speculative" and r["tau_bound_iid"]]
    if spec_rows:
        lines += ["", "Mean acceptance length τ vs (1 − α^{K+1})/(1 − α), the tokens per step if every draft "
                      "position were accepted independently with probability α = α̂ (τ above it: acceptances "
                      "are correlated within a step, as usual for draft models):"]
        lines += [f"- c={r['concurrency']}, K={r['speculation_length']}: τ {_f(r['mean_acceptance_length'], 2)} "
                  f"vs bound {_f(r['tau_bound_iid'], 2)}" for r in spec_rows]
    if data["recommended_draft_len"]:
        lines += ["", "## Recommended draft length per concurrency", "", "| conc | K | TPOT ratio | speculation |", "|---|---|---|---|"]
        for level, rec in data["recommended_draft_len"].items():
            lines.append(f"| {level} | {_f(rec['draft_len'])} (best measured {rec['best_measured']}) | {_f(rec['tpot_ratio'], 3)} | {rec['speculation']} |")
    lines += ["", "## Acceptance by category (speculative)", "", "| conc | K | category | acceptance | τ | tokens/chunk |", "|---|---|---|---|---|---|"]
    for cell in data["cells"]:
        if cell["arm"] != "speculative":
            continue
        for cat, acc in cell["acceptance_by_category"].items():
            lines.append(f"| {cell['concurrency']} | {_f(cell['draft_len'])} | {cat} | {_f(acc['acceptance_rate'], 3)} | "
                         f"{_f(acc['mean_acceptance_length'], 2)} | {_f(acc['tokens_per_chunk_mean'], 2)} |")
    lines += ["", "## Per category (Spec-Bench style)", "", "| conc | K | category | TPOT speedup (median, pooled) | τ | acceptance |",
              "|---|---|---|---|---|---|"]
    spec_cells = {(c["concurrency"], c["draft_len"]): c for c in data["cells"] if c["arm"] == "speculative"}
    for comp in data["comparisons"]:
        cell = spec_cells.get((comp["concurrency"], comp["draft_len"]), {})
        for cat, row in comp.get("by_category", {}).items():
            acc = cell.get("acceptance_by_category", {}).get(cat, {})
            lines.append(f"| {comp['concurrency']} | {_f(comp['draft_len'])} | {cat} | {_f(row['speedup'], 2)} | "
                         f"{_f(acc.get('mean_acceptance_length'), 2)} | {_f(acc.get('acceptance_rate'), 3)} |")
    lines += ["", "## Run-to-run variability", "", "| arm | conc | K | median TPOT per run (ms) | CV | out tok/s per run | CV |",
              "|---|---|---|---|---|---|---|"]
    for cell in data["cells"]:
        var = cell["run_variability"]
        lines.append(f"| {cell['arm']} | {cell['concurrency']} | {_f(cell['draft_len'])} | "
                     f"{', '.join(f'{v:.2f}' for v in var['median_tpot_ms']['per_run'])} | {_f(var['median_tpot_ms']['cv'], 3)} | "
                     f"{', '.join(f'{v:.0f}' for v in var['output_tokens_per_s']['per_run'])} | {_f(var['output_tokens_per_s']['cv'], 3)} |")
    quality = [(c["arm"], c["concurrency"], c["data_quality"]) for c in data["cells"]
               if c["data_quality"]["prompt_echoed"] or c["data_quality"]["osl_from_chunks"] or c["data_quality"]["osl_retok_mismatch"]]
    for arm, conc, q in quality:
        lines.append(f"\n> Data quality ({arm}, c={conc}): {q['prompt_echoed']} outputs echo the prompt, "
                     f"{q['osl_from_chunks']} OSL counted from chunks (no server count), "
                     f"{q['osl_retok_mismatch']} of {q['osl_retok_checked']} disagree with re-tokenization")
    lines += ["", "## Runs", "", "| run | valid | server alive | ok | incomplete at stop | median TPOT ms | out tok/s | achieved conc |",
              "|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        lines.append(f"| {r['key']} | {r['valid']} | {r['server_alive']} | {r['n_ok']} | {r['incomplete_at_stop']} | "
                     f"{_f(r['median_tpot_ms'], 2)} | {_f(r['output_tokens_per_s'])} | {_f(r['achieved_concurrency'], 2)} |")
    prov = data["provenance"]
    lines += ["", "## Provenance", ""] + [f"- {k}: `{json.dumps(v)}`" for k, v in prov.items()]
    lines += [f"- bootstrap: `{json.dumps(data['bootstrap'])}`"]
    if data.get("synthetic_data"):
        lines += ["", "> Warning: synthetic prompts were used; acceptance and speedup are likely understated."]
    lines += ["", "## Appendix: metric formulas", ""] + [f"- **{k}**: {v}" for k, v in data["formulas"].items()]
    lines += ["", "Raw per-request records: `raw/*.jsonl`; run list: `runs.json`; Prometheus deltas: `metrics/`."]
    return "\n".join(lines) + "\n"


_HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specdeploy report — {{ name }}</title>
<style>
body { font-family: sans-serif; margin: 1.5em; color: #222; }
.banner { padding: .8em 1.2em; font-size: 1.6em; font-weight: bold; color: white; border-radius: 6px; }
.GO { background: #2e7d32; } .NO-GO { background: #c62828; } .INCONCLUSIVE { background: #ef6c00; }
table { border-collapse: collapse; margin: .6em 0; font-size: .85em; }
td, th { border: 1px solid #ccc; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; } td:first-child { text-align: left; }
.fail { color: #c62828; font-weight: bold; } .inconclusive { color: #ef6c00; } .pass { color: #2e7d32; }
img { max-width: 100%; } code { background: #f5f5f5; }
</style></head><body>
<div class="banner {{ verdict }}">{{ verdict }}</div>
<ul>{% for r in reasons %}<li>{{ r }}</li>{% else %}<li>every gate check passed</li>{% endfor %}
{% for a in advice %}<li><b>advice:</b> {{ a }}</li>{% endfor %}</ul>
<h2>Gate checks</h2>
<table><tr><th>rule</th><th>scope</th><th>status</th><th>detail</th></tr>
{% for c in checks %}<tr><td>{{ c.rule }}</td><td>{{ c.scope }}</td><td class="{{ c.status }}">{{ c.status }}</td><td>{{ c.detail }}</td></tr>{% endfor %}
</table>
{{ body_tables | safe }}
<h2>Plots</h2>
{% for title, png in plots %}<h3>{{ title }}</h3><img alt="{{ title }}" src="data:image/png;base64,{{ png }}">{% endfor %}
</body></html>
"""


def _markdown_tables_to_html(md: str) -> str:
    """The markdown report's sections below the gate table, as HTML (tables, headings, lists)."""
    import html as html_lib  # noqa: PLC0415

    out, in_table = [], False
    sections = md.split("## Per arm and concurrency", 1)
    text = "## Per arm and concurrency" + sections[1] if len(sections) == 2 else md
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{html_lib.escape(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("## "):
            out.append(f"<h2>{html_lib.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            out.append(f"<li>{html_lib.escape(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{html_lib.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def render_html(data: dict, markdown: str, plots: dict[str, str]) -> str:
    import jinja2  # noqa: PLC0415

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=True)
    titles = {"latency_vs_concurrency": "TPOT / TTFT / E2E vs concurrency (p50, p95; band = run-median range)",
              "speedup_vs_concurrency": "Speedup vs concurrency (95% CI, crossover)",
              "tpot_ecdf": "TPOT ECDF", "acceptance_by_category": "Acceptance by category",
              "throughput_over_time": "Throughput over time per run", "pareto": "Pareto: per-user vs total tokens/s"}
    return env.from_string(_HTML_TEMPLATE).render(
        name=data["name"], verdict=data["verdict"], reasons=data["reasons"], advice=data["advice"],
        checks=data["gate"]["checks"], body_tables=_markdown_tables_to_html(markdown),
        plots=[(titles.get(k, k), v) for k, v in plots.items()],
    )


# ------------------------------------------------------------------------------------------------
# Entry point


def make_report(run_dir: str | Path, cfg: DeploymentConfig | None = None) -> Report:
    """Analyse RUN_DIR, decide the verdict, write report.json / report.md / report.html."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run directory")
    cfg = cfg or config_from_run(run_dir)
    analysis = analyze(run_dir, cfg)
    gate = evaluate_gate(analysis, cfg.gate)
    data = build_report_data(run_dir, cfg, analysis, gate)
    problems = validate_report_json(data)
    if problems:
        raise ReportError("report.json failed its schema check: " + "; ".join(problems))
    markdown = render_markdown(data)
    plots = make_plots(analysis, load_runs(run_dir))
    json_path, md_path, html_path = run_dir / "report.json", run_dir / "report.md", run_dir / "report.html"
    json_path.write_text(json.dumps(data, indent=2, default=_json_default), encoding="utf-8")
    md_path.write_text(markdown, encoding="utf-8")
    html_path.write_text(render_html(data, markdown, plots), encoding="utf-8")
    return Report(run_dir, data, gate, json_path, md_path, html_path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
