"""A forecast as text lines (CLI, ``plan``/``validate`` sections) and as a plot.

Reads a forecast dict (:func:`pipeline.forecast.model.forecast`); writes only the plot file it is
given (matplotlib, PNG).
"""

from __future__ import annotations

from pathlib import Path


def summary_lines(fc: dict) -> list[str]:
    acc = fc["acceptance"]
    dev = fc["device"]
    where = dev.get("hardware") or dev.get("machine", {}).get("processor") or dev["kind"]
    lines = [f"forecast: {fc['method']} K={fc['draft_len']} (verify {fc['verify_width']} tokens/sequence) on "
             f"{where} [{dev.get('engine', dev['kind'])}], context {fc['context_tokens']} tokens",
             f"  acceptance: {acc['source']}" + (f", α {acc['alpha']}" if acc.get("alpha") is not None else "")
             + (f", τ {acc['tau']}" if acc.get("tau") is not None else "")]
    req = fc.get("requests")
    if req:
        lines.append(f"  closed loop: {req['prompt_tokens']} prompt and {req['output_tokens']} output tokens per request "
                     f"({req['source']}); the others' prefills are charged to every output token")
    if dev.get("stale"):
        lines.append(f"  calibration stale ({dev['stale']}): remake it with `specdeploy forecast CONFIG --calibrate`")
    error = fc.get("model_error")
    lines.append("  band: every input over its range (" + ", ".join(
        f"{b['input']} {_range(b['range'])}" for b in fc.get("band_inputs", [])) + ")"
        + (f", then the model's error {error['range'][0]:+.0%}…{error['range'][1]:+.0%} on {error['points']} checked points"
           if error else ", no model error on record (benchmarks/results)"))
    lines.extend(f"  ! {warning}" for warning in fc.get("warnings", []))
    if fc.get("limit"):
        lines.append(f"  limit: at most {fc['limit']['sequences']} sequences decode together ({fc['limit']['set_by']})")
    for row in fc["levels"]:
        if row.get("refused"):
            lines.append(f"  c={row['concurrency']:>4}: not forecast — {row['refused']}")
            continue
        best = row["best"]
        best_text = (f"best K {best['draft_len']} ({best['speedup']:.2f}×)" if best.get("swept") and best["draft_len"]
                     else "best: speculation off" if best.get("swept") else "tree kept")
        if best.get("draft_len_range") and best["draft_len_range"][0] != best["draft_len_range"][1]:
            best_text += f", K {best['draft_len_range'][0]}–{best['draft_len_range'][1]} across the band"
        lines.append(f"  c={row['concurrency']:>4}: TPOT {row['baseline_tpot_ms']:.3g} → {row['speculative_tpot_ms']:.3g} ms, "
                     f"speedup {row['speedup']:.2f}× [{row['band'][0]:.2f}, {row['band'][1]:.2f}], τ {row['tau']:.2f}, "
                     f"verify {row['verify_regime']}-bound; {best_text}")
        lines.extend(f"          ! {warning}" for warning in row.get("warnings", []))
    lines.append("  crossover (speedup < 1): " + crossover_text(fc))
    return lines


def crossover_text(fc: dict) -> str:
    cross = fc.get("crossover") or {"point": fc["crossover_concurrency"], "when_none": "none up to 1024"}
    point = f"concurrency {cross['point']}" if cross["point"] else cross["when_none"]
    if "earliest" not in cross:
        return point

    def edge(value):
        return str(value) if value else f"beyond {cross['searched_up_to']}"

    return f"{point}; within the band between {edge(cross['earliest'])} and {edge(cross['latest'])}"


def _range(values) -> str:
    if not values or values[0] is None:
        return "(fixed)"
    return f"[{values[0]:g}, {values[1]:g}]"


def write_plot(fc: dict, path: Path) -> Path:
    import matplotlib  # noqa: PLC0415 - start-up: matplotlib (about 0.3 s; `specdeploy forecast` loads it only for --plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - start-up: matplotlib (about 0.3 s; `specdeploy forecast` loads it only for --plot)

    rows = [r for r in fc["levels"] if not r.get("refused")]  # levels beyond the deployment's limit have no forecast
    levels = [r["concurrency"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(levels, [r["speedup"] for r in rows], marker="o", label="forecast speedup")
    ax.fill_between(levels, [r["band"][0] for r in rows], [r["band"][1] for r in rows], alpha=0.25,
                    label="band")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("TPOT speedup (×)")
    ax.set_title(f"{fc.get('config', '')} {fc['method']} K={fc['draft_len']}")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
