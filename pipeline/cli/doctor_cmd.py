"""`specdeploy doctor`: Show versions, where tritonserver comes from, and GPUs."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("doctor", help="Show versions, where tritonserver comes from, and GPUs.")
    def doctor_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy doctor` is not implemented yet")
