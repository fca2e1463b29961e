"""`specdeploy plan`: Print the exact build steps (argv, inputs, outputs) without running them."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Print the exact build steps (argv, inputs, outputs) without running them.")
    def plan_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy plan` is not implemented yet")
