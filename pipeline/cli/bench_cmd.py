"""`specdeploy bench`: Offline in-process engine benchmark (reference backend): target-only vs speculation."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("bench", help="Offline in-process engine benchmark (reference backend): target-only vs speculation.")
    def bench_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy bench` is not implemented yet")
