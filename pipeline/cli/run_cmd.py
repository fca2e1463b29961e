"""`specdeploy run`: validate -> build -> render -> serve -> loadtest -> report, resumable."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("run", help="validate -> build -> render -> serve -> loadtest -> report, resumable.")
    def run_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy run` is not implemented yet")
