"""`specdeploy build`: Run the build plan: quantize/convert, compile engines, write engines/NAME/manifest.json."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("build", help="Run the build plan: quantize/convert, compile engines, write engines/NAME/manifest.json.")
    def build_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy build` is not implemented yet")
