"""`specdeploy validate CONFIG [--offline] [--live] [--json]`: load the config and run preflight.

Reads the config YAML and (unless ``--offline``) the checkpoint directories it names and the
TensorRT-LLM example scripts the build plan runs (under ``--trtllm-root``, the config's
``trtllm_root``, ``$SPECDEPLOY_TRTLLM_ROOT`` or the NGC image's ``/app``); prints the
findings as a table (or JSON with ``--json``) plus the per-GPU memory estimate, and exits 0 when
there are no errors, 2 otherwise (config errors: one ``field.path: message`` line each).
``--live`` adds the live preflight (:func:`pipeline.validate.live.run_host_preflight`, the same
function as ``doctor CONFIG``): the installed TensorRT-LLM, Triton, backends, scripts' parsers,
LLM-args classes, packages, checkpoints and GPUs, one table; a failure there is the
host's, and exits 5 (docs/ci.md).
"""

from __future__ import annotations

import json
from typing import Optional

import typer

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def register(app: typer.Typer) -> None:
    @app.command("validate", help="Check a config and run preflight (tokenizers, GPU x quantization, method rules, memory fit).")
    def validate_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        offline: bool = typer.Option(False, "--offline", help="Check the config's logic without checkpoint files."),
        as_json: bool = typer.Option(False, "--json", help="Print the findings as JSON."),
        trtllm_root: Optional[str] = typer.Option(
            None, "--trtllm-root", help="Directory holding TensorRT-LLM's examples/ (default: config trtllm_root, "
            "$SPECDEPLOY_TRTLLM_ROOT, then /app in the NGC image)."),
        live: bool = typer.Option(False, "--live", help="Also check the installed TensorRT-LLM, Triton, scripts, "
                                  "LLM-args classes, packages and GPUs (run it inside the container)."),
    ) -> int:
        return validate(config, offline=offline, as_json=as_json, trtllm_root=trtllm_root, live=live)


def validate(config: str, offline: bool = False, as_json: bool = False, trtllm_root: str | None = None,
             live: bool = False) -> int:
    from pipeline.config import load_config
    from pipeline.validate.preflight import errors_of, memory_estimate_of, raise_on_errors, run_preflight

    cfg = load_config(config)
    if live:
        return report_host_preflight(cfg, trtllm_root, as_json)
    findings = run_preflight(cfg, offline=offline, trtllm_root=trtllm_root)
    if as_json:
        payload = {
            "config": config,
            "name": cfg.name,
            "offline": offline,
            "ok": not errors_of(findings),
            "findings": [f.to_dict() for f in findings],
            "memory": memory_estimate_of(findings),
        }
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        _print_report(cfg, findings, offline)
    raise_on_errors(findings)
    return 0


def _console():
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    return console


def _print_report(cfg, findings, offline: bool) -> None:
    from rich.table import Table

    from pipeline.validate.preflight import memory_estimate_of

    console = _console()
    mode = " (offline)" if offline else ""
    console.print(f"[bold]{cfg.name}[/]{mode}: backend {cfg.backend}, hardware {cfg.hardware}, "
                  f"method {cfg.method}, target {cfg.target.checkpoint}")
    table = Table(title="Preflight findings", show_lines=False)
    for column in ("severity", "field", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for f in sorted(findings, key=lambda f: ("error", "warning", "info").index(f.severity)):
        table.add_row(f"[{SEVERITY_STYLE[f.severity]}]{f.severity}[/]", f.field or "-", f.message, f.fix or "")
    console.print(table)
    estimate = memory_estimate_of(findings)
    if estimate:
        console.print(_memory_table(estimate))
    from pipeline.forecast.model import section_lines

    for line in section_lines(cfg):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}
    verdict = "[bold red]FAILED[/]" if counts["error"] else "[bold green]OK[/]"
    console.print(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s)")


def _memory_table(estimate: dict):
    from rich.table import Table

    table = Table(title=f"Memory per GPU (rank 0) — {estimate['device']}")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("detail", overflow="fold")
    for row in estimate["rows"]:
        table.add_row(row["component"], f"{row['gib']:.2f}", row["detail"])
    table.add_row("[bold]total[/]", f"[bold]{estimate['total_gib']:.2f}[/]", "")
    table.add_row("device", f"{estimate['device_gib']:.2f}", "")
    style = "red" if not estimate["fits"] else ("yellow" if estimate["thin"] else "green")
    table.add_row(f"[{style}]headroom[/]", f"[{style}]{estimate['headroom_gib']:.2f}[/]",
                  f"runtime KV pool ≈ {estimate['kv_pool_gib']:.2f} GiB")
    return table


def report_host_preflight(cfg, trtllm_root: str | None, as_json: bool, extra: dict | None = None,
                          print_extra=None) -> int:
    """The host preflight (:func:`pipeline.validate.live.run_host_preflight`) printed, or as JSON;
    PreflightError naming every error and failure. ``validate --live`` and ``doctor CONFIG`` both
    call this, so they run and print the same checks (``extra``: doctor's machine report, printed
    first by ``print_extra`` or merged into the JSON)."""
    from pipeline.errors import EXIT_FAILURE, EXIT_USAGE, PreflightError
    from pipeline.validate.live import failures, run_host_preflight
    from pipeline.validate.live.table import print_checks
    from pipeline.validate.preflight import errors_of

    outcome = run_host_preflight(cfg, trtllm_root)
    if as_json:
        print(json.dumps({**(extra or {}), "config": cfg.name,
                          "ok": not errors_of(outcome.findings) and not failures(outcome.checks),
                          "findings": [f.to_dict() for f in outcome.findings],
                          "live": [c.to_dict() for c in outcome.checks]}, indent=2, ensure_ascii=False))
    else:
        if print_extra is not None:
            print_extra(extra)
        _print_report(cfg, outcome.findings, offline=False)
        print_checks(cfg, outcome.checks, _console())
    problems = outcome.problems()
    if problems:
        # a config error when the config itself is wrong, else the host's failure (docs/ci.md)
        raise PreflightError(problems, exit_code=EXIT_USAGE if errors_of(outcome.findings) else EXIT_FAILURE)
    return 0
