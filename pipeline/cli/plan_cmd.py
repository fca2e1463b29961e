"""`specdeploy plan`: print the exact build steps (argv, inputs, outputs) without running them.

Reads the config only (a dry run: checkpoints need not exist). ``--json`` prints a JSON array of
``{name, argv, inputs, outputs}``; the default is a table of steps followed by each command as a
copy-pastable shell line (shlex-quoted for display only; the build runs argv lists)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def print_plan(plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not plan.steps:
        console.print(f"build plan: {plan.name} ({plan.backend}, {plan.method}): no steps — the LLM-API runtime "
                      "loads these checkpoints as they are (no engine build)", soft_wrap=True)
        console.print("engines: " + ", ".join(f"{role}={path}" for role, path in plan.engines.items()), soft_wrap=True)
        return
    table = Table(title=f"build plan: {plan.name} ({plan.backend}, {plan.method})")
    for column in ("#", "step", "inputs", "outputs"):
        table.add_column(column, overflow="fold")
    for index, step in enumerate(plan.steps, 1):
        table.add_row(str(index), step.name, "\n".join(step.inputs) or "-", "\n".join(step.outputs))
    console.print(table)
    console.print("engines: " + ", ".join(f"{role}={path}" for role, path in plan.engines.items()), soft_wrap=True)
    for step in plan.steps:
        console.print(f"\n# {step.name}", style="bold", soft_wrap=True)
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(step.env.items()))
        console.print((env + " " if env else "") + shlex.join(step.argv), markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Print the exact build steps (argv, inputs, outputs) without running them.")
    def plan_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON array of {name, argv, inputs, outputs}."),
        trtllm_root: Optional[str] = typer.Option(
            None, "--trtllm-root", help="Directory holding TensorRT-LLM's examples/ (default: config trtllm_root, "
            "$SPECDEPLOY_TRTLLM_ROOT, then /app in the NGC image)."
        ),
        workdir: Optional[Path] = workdir_option(),
    ) -> None:
        from pipeline.config import load_config
        from pipeline.plan.planner import make_plan

        cfg = load_config(config, workdir)
        plan = make_plan(cfg, trtllm_root)
        if as_json:
            typer.echo(json.dumps(plan.to_json(), indent=2))
        else:
            print_plan(plan)
            from pipeline.forecast.model import section_lines

            for line in section_lines(cfg):
                typer.echo(line)
