"""`specdeploy render`: Render the Triton model repositories (baseline and speculative) from the templates."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("render", help="Render the Triton model repositories (baseline and speculative) from the templates.")
    def render_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy render` is not implemented yet")
