"""`specdeploy schema`: Print the config reference (JSON schema or Markdown) generated from the pydantic model."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("schema", help="Print the config reference (JSON schema or Markdown) generated from the pydantic model.")
    def schema_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy schema` is not implemented yet")
