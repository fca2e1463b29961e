"""`specdeploy validate`: Check a config and run preflight (tokenizers, GPU x quantization, method rules, memory fit)."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("validate", help="Check a config and run preflight (tokenizers, GPU x quantization, method rules, memory fit).")
    def validate_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy validate` is not implemented yet")
