"""The report's plots: matplotlib (Agg) figures returned as base64 PNG for ``data:`` URIs.

Reads the report data (``report.json`` content), the analysis (per-run throughput timelines) and
the raw records of each run (TPOT distributions); writes nothing. Each function returns a base64
string, or None when the run holds nothing to draw. Colours: baseline blue, speculative orange,
the same in every figure.
"""

from __future__ import annotations

import base64
import io
from collections import defaultdict
from typing import Any

from pipeline.report.stats import RunData, tpot_ms
from pipeline.report.view.model import category_acceptance, primary_cells, primary_comparisons, ratio_ci

BASE_COLOR, SPEC_COLOR, OTHER_COLOR = "#1f77b4", "#ff7f0e", "#2ca02c"
ARM_COLORS = {"baseline": BASE_COLOR, "speculative": SPEC_COLOR}
DPI = 110


def _pyplot():
    import matplotlib  # noqa: PLC0415 - start-up: matplotlib (about 0.3 s; loaded when a plot is drawn, not when the report is analysed)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (about 0.3 s; loaded when a plot is drawn, not when the report is analysed)

    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def png(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    # constrained layout fits labels inside the figure in one drawing; bbox_inches="tight" drew every
    # figure twice (once to measure, once to print), most of a report's CPU time
    fig.set_layout_engine("constrained")
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def concurrency_axis(ax, levels: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(v) for v in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (users in flight)")


def _gain_band(comps: list[dict], name: str, invert: bool) -> tuple[list, list, list]:
    """Per level: the gain (base/spec for latencies, spec/base for throughput) and its CI."""
    nan = float("nan")
    mid, lo, hi = [], [], []
    for comp in comps:
        ci = ratio_ci(comp, name)
        point, low, high = ci["point"], ci["low"], ci["high"]
        if invert:
            point, low, high = (1 / point if point else None), (1 / high if high else None), (1 / low if low else None)
        mid.append(point if point is not None else nan)
        lo.append(low if low is not None else nan)
        hi.append(high if high is not None else nan)
    return mid, lo, hi


def draw_gain(ax, comps: list[dict], crossover: int | None, label_prefix: str = "", style: str = "-") -> None:
    """TPOT speedup and throughput gain vs concurrency with CI bands on ``ax``."""
    x = [c["concurrency"] for c in comps]
    for name, invert, color, label in (("tpot_ratio", True, SPEC_COLOR, "TPOT speedup (base ÷ spec)"),
                                       ("throughput_ratio", False, OTHER_COLOR, "throughput gain (spec ÷ base)")):
        mid, lo, hi = _gain_band(comps, name, invert)
        ax.plot(x, mid, style, marker="o", color=color, label=f"{label_prefix}{label}")
        ax.fill_between(x, lo, hi, color=color, alpha=0.18 if style == "-" else 0.1, lw=0)
    if crossover is not None:
        ax.axvline(crossover, color="#c62828", ls=":", lw=1.5)
        ax.axvspan(crossover, max(x + [crossover]) * 1.3, color="#c62828", alpha=0.06, lw=0)
        ax.annotate(f"{label_prefix}crossover c={crossover}", (crossover, 1.0), xytext=(4, 6),
                    textcoords="offset points", color="#c62828", fontsize=8)


def speedup_plot(data: dict) -> str | None:
    comps = primary_comparisons(data)
    if not comps:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.9))
    draw_gain(ax, comps, data["crossover_concurrency"])
    ax.axhline(1.0, color="gray", lw=1)
    concurrency_axis(ax, [c["concurrency"] for c in comps])
    ax.set_ylabel("× baseline (above 1 = speculation pays)")
    ax.set_title("Speedup vs concurrency (bands: 95% CI)")
    ax.legend(fontsize=8, loc="best")
    return png(fig)


def pareto_plot(data: dict) -> str | None:
    cells = [c for c in primary_cells(data) if c["output_tokens_per_s"] and c["per_user_tokens_per_s"]["p50"]]
    if not cells:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 2.9))
    for arm, color in ARM_COLORS.items():
        arm_cells = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["concurrency"])
        if not arm_cells:
            continue
        xs = [c["output_tokens_per_s"] for c in arm_cells]
        ys = [c["per_user_tokens_per_s"]["p50"] for c in arm_cells]
        ax.plot(xs, ys, marker="o", color=color, label=arm)
        for c, x, y in zip(arm_cells, xs, ys):
            ax.annotate(f"c={c['concurrency']}", (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7)
    ax.set_xlabel("total output tokens/s (all users)")
    ax.set_ylabel("per-user tokens/s (p50 of 1/TPOT)")
    ax.set_title("Latency vs throughput (up and right is better)")
    ax.legend(fontsize=8)
    return png(fig)


def latency_plot(data: dict) -> str | None:
    cells = primary_cells(data)
    if not cells:
        return None
    plt = _pyplot()
    levels = sorted({c["concurrency"] for c in cells})
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.0))
    for ax, (metric, label) in zip(axes, (("tpot_ms", "TPOT ms"), ("ttft_ms", "TTFT ms"), ("e2e_ms", "E2E ms"))):
        for arm, color in ARM_COLORS.items():
            arm_cells = sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["concurrency"])
            if arm_cells:
                x = [c["concurrency"] for c in arm_cells]
                ax.plot(x, [c[metric]["p50"] for c in arm_cells], "-", marker="o", color=color, label=f"{arm} p50")
                ax.plot(x, [c[metric]["p95"] for c in arm_cells], "--", marker=".", color=color, label=f"{arm} p95")
        concurrency_axis(ax, levels)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle("Latency per arm vs concurrency (p50 solid, p95 dashed)", fontsize=9)
    return png(fig)


def tpot_ecdf_plot(data: dict, runs: list[RunData]) -> str | None:
    primary = data["primary_draft_len"]
    levels = sorted({c["concurrency"] for c in primary_cells(data)})
    if not levels:
        return None
    plt = _pyplot()
    shown = sorted({levels[0], levels[-1]})
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 2.8), squeeze=False)
    for ax, level in zip(axes[0], shown):
        for arm, color in ARM_COLORS.items():
            values = sorted(t for run in runs if run.info["arm"] == arm and run.info["concurrency"] == level
                            and (arm == "baseline" or run.info.get("draft_len") == primary)
                            for r in run.measured if r.get("status") == "ok" for t in [tpot_ms(r)] if t is not None)
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", color=color, label=arm)
        ax.set_title(f"TPOT distribution, c={level}")
        ax.set_xlabel("TPOT ms")
        ax.set_ylabel("fraction of requests")
        ax.legend(fontsize=7)
    return png(fig)


def acceptance_plot(categories: list[dict[str, Any]]) -> str | None:
    rows = [c for c in categories if c["acceptance_rate"] is not None]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 2.6))
    names = [r["category"] for r in rows]
    bars = ax.bar(names, [r["acceptance_rate"] for r in rows], color=SPEC_COLOR)
    for bar, row in zip(bars, rows):
        ax.annotate(f"{row['acceptance_rate']:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("acceptance rate")
    ax.set_title("Acceptance by category (all concurrencies pooled)")
    return png(fig)


def acceptance_histogram_plot(data: dict) -> str | None:
    """Per-request acceptance (accepted / drafted) over requests, with the pooled figure marked."""
    dist = data.get("acceptance_per_request") or {}
    hist = dist.get("histogram")
    if not hist:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 2.6))
    edges, counts = hist["edges"], hist["counts"]
    ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges[:-1], edges[1:])], align="edge",
           color=SPEC_COLOR, edgecolor="white")
    for q, style in (("p10", ":"), ("p50", "-"), ("p90", ":")):
        ax.axvline(dist[q], color="black", lw=1, ls=style)
    if data.get("acceptance_rate") is not None:
        ax.axvline(data["acceptance_rate"], color="gray", lw=1.5, ls="--", label="pooled over tokens")
        ax.legend(fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("acceptance per request (p10, median, p90 in black)")
    ax.set_ylabel("requests")
    ax.set_title(f"Acceptance per request ({dist['n']} requests)")
    return png(fig)


def throughput_plot(analysis: dict) -> str | None:
    summaries = [s for s in analysis["runs"] if s["throughput_timeline"]]
    if not summaries:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.0))
    seen: dict[str, int] = defaultdict(int)
    for summary in summaries:
        timeline = summary["throughput_timeline"]
        arm = summary["arm"]
        seen[arm] += 1
        ax.plot([p["t_s"] - timeline[0]["t_s"] for p in timeline], [p["tokens_per_s"] for p in timeline], lw=1,
                color=ARM_COLORS.get(arm, OTHER_COLOR), alpha=0.8, label=arm if seen[arm] == 1 else None)
    ax.set_xlabel("seconds into run")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput over time, one line per run (warm-up included)")
    ax.legend(fontsize=7)
    return png(fig)


def compare_plot(data_a: dict, data_b: dict) -> str | None:
    """TPOT speedup and throughput gain of run A (dashed, grey) and run B (solid, orange) with CI bands."""
    comps = {"A": primary_comparisons(data_a), "B": primary_comparisons(data_b)}
    if not comps["A"] and not comps["B"]:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.0))
    levels = sorted({c["concurrency"] for side in comps.values() for c in side})
    for ax, (name, invert, title) in zip(axes, (("tpot_ratio", True, "TPOT speedup (base ÷ spec)"),
                                                ("throughput_ratio", False, "Throughput gain (spec ÷ base)"))):
        for side, color, style in (("A", "#757575", "--"), ("B", SPEC_COLOR, "-")):
            if not comps[side]:
                continue
            x = [c["concurrency"] for c in comps[side]]
            mid, lo, hi = _gain_band(comps[side], name, invert)
            ax.plot(x, mid, style, marker="o", color=color, label=f"run {side}")
            ax.fill_between(x, lo, hi, color=color, alpha=0.18, lw=0)
        ax.axhline(1.0, color="gray", lw=1)
        concurrency_axis(ax, levels)
        ax.set_title(title + ", 95% CI bands")
        ax.set_ylabel("× baseline")
        ax.legend(fontsize=8)
    return png(fig)


def report_plots(data: dict, analysis: dict, runs: list[RunData]) -> dict[str, str | None]:
    """Every plot of report.html by name (None where there is nothing to draw)."""
    return {
        "speedup": speedup_plot(data),
        "pareto": pareto_plot(data),
        "latency": latency_plot(data),
        "tpot_ecdf": tpot_ecdf_plot(data, runs),
        "acceptance": acceptance_plot(category_acceptance(data)),
        "acceptance_per_request": acceptance_histogram_plot(data),
        "throughput": throughput_plot(analysis),
    }
