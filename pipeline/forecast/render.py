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
    for row in fc["levels"]:
        best = row["best"]
        best_text = (f"best K {best['draft_len']} ({best['speedup']:.2f}×)" if best.get("swept") and best["draft_len"]
                     else "best: speculation off" if best.get("swept") else "tree kept")
        lines.append(f"  c={row['concurrency']:>4}: TPOT {row['baseline_tpot_ms']:.3g} → {row['speculative_tpot_ms']:.3g} ms, "
                     f"speedup {row['speedup']:.2f}× [{row['band'][0]:.2f}, {row['band'][1]:.2f}], τ {row['tau']:.2f}, "
                     f"verify {row['verify_regime']}-bound; {best_text}")
    cross = fc["crossover_concurrency"]
    lines.append(f"  crossover (speedup < 1): {'concurrency ' + str(cross) if cross else 'none up to 1024'}")
    return lines


def write_plot(fc: dict, path: Path) -> Path:
    import matplotlib  # noqa: PLC0415 - only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib is loaded only when this path runs

    levels = [r["concurrency"] for r in fc["levels"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(levels, [r["speedup"] for r in fc["levels"]], marker="o", label="forecast speedup")
    ax.fill_between(levels, [r["band"][0] for r in fc["levels"]], [r["band"][1] for r in fc["levels"]], alpha=0.25,
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
