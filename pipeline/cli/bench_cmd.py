"""`specdeploy bench`: offline in-process benchmark of the reference engine (target-only vs the
config's speculation method, batch 1 and 8, per prompt category). Reads the config and the
checkpoints it names (no build needed); prints a table, or JSON with ``--json``; ``--output``
also writes the JSON to a file. The work is in :mod:`pipeline.engine_bench`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipeline.errors import UsageError


def _table(report: dict) -> str:
    lines = [f"{report['config']} ({report['method']}), {report['max_tokens']} new tokens, greedy",
             f"{'method':<22}{'batch':>6}  {'category':<12}{'tok/s':>9}{'base':>9}{'speedup':>9}"
             f"{'accept':>8}{'tau':>7}{'eff':>7}{'cpu-x':>7}{'tpot-x':>8}  same"]
    for r in report["results"]:
        lines.append(f"{r['method']:<22}{r['batch']:>6}  {r['category']:<12}{r['tokens_per_s']:>9.1f}"
                     f"{r['baseline_tokens_per_s']:>9.1f}{r['speedup']:>8.2f}x{r['acceptance_rate']:>8.2f}"
                     f"{r['mean_acceptance_length']:>7.2f}{r['efficiency']:>7.2f}{r['speedup_cpu']:>7.2f}"
                     f"{r['decode_speedup']:>7.2f}x  {'yes' if r['outputs_match'] else 'NO'}")
    for s in report["summary"]:
        scope = "all categories" if s.get("scope", "all") == "all" else "in-domain"
        lines.append(f"{scope}: {s['method']} batch {s['batch']}: {s['tokens_per_s']:.1f} tok/s vs "
                     f"{s['baseline_tokens_per_s']:.1f} -> {s['speedup']:.2f}x (per CPU-second {s['speedup_cpu']:.2f}x); "
                     f"TPOT {s['tpot_ms']:.2f} vs {s['baseline_tpot_ms']:.2f} ms -> {s['decode_speedup']:.2f}x")
    scaling = report.get("baseline_scaling")
    if scaling:
        lines.append(f"baseline batch {scaling['batch']} / batch 1 (side by side, {scaling['rounds']} rounds): "
                     f"{scaling['batch_tokens_per_s']:.1f} / {scaling['batch1_tokens_per_s']:.1f} tok/s = "
                     f"{scaling['ratio']:.2f}x (rounds {', '.join(f'{r:.2f}' for r in scaling['per_round'])})")
    peer = report.get("peer")
    if peer and "skipped" not in peer:
        lines.append(f"HF assisted generation (K={peer['num_assistant_tokens']}): {peer['hf_assisted_tokens_per_s']:.1f} "
                     f"tok/s ({peer['hf_speedup']:.2f}x over HF greedy); engine {peer['engine_vs_hf_assisted']:.2f}x HF assisted")
    elif peer:
        lines.append(f"peer: {peer['skipped']}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    @app.command("bench", help="Offline in-process engine benchmark (reference backend): target-only vs speculation.")
    def bench_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        peer: Optional[str] = typer.Option(None, "--peer", help="'hf': add Hugging Face assisted generation (draft_target)."),
        prompts: int = typer.Option(8, "--prompts", min=1, help="Prompts per category."),
        max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="New tokens per request."),
        batch: list[int] = typer.Option([1, 8], "--batch", help="Batch sizes (1 and one larger size)."),
        int8: bool = typer.Option(False, "--int8", help="Also measure an int8 weight-only target."),
        draft_int8: bool = typer.Option(False, "--draft-int8", help="Also measure the other draft-side weights: int8 rows, or float rows when the config's reference.draft_weights is int8."),  # noqa: E501 - a help text reads better whole
        stop_at_eos: bool = typer.Option(False, "--stop-at-eos", help="Stop requests at EOS (default: decode --max-tokens)."),
        output: Optional[Path] = typer.Option(None, "--output", help="Also write the JSON report here."),
        versus: Optional[Path] = typer.Option(None, "--versus", help="Another config on the same target: its method's rows too, in this run (e.g. EAGLE-3 vs EAGLE-1)."),  # noqa: E501 - a help text reads better whole
    ) -> None:
        from pipeline.engine_bench import run_bench

        if peer not in (None, "hf"):
            raise UsageError(f"--peer {peer!r}: only 'hf' is supported")
        report = run_bench(config, prompts_per_category=prompts, max_tokens=max_tokens,
                           batches=tuple(sorted(set(batch))), peer=peer, int8=int8,
                           draft_int8=draft_int8, stop_at_eos=stop_at_eos, versus=versus)
        if output is not None:
            from pipeline.infra.provenance import result_provenance

            report = {**report, "provenance": result_provenance()}
        text = json.dumps(report, indent=2)
        if output is not None:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text + "\n", encoding="utf-8")
        typer.echo(text if as_json else _table(report))
