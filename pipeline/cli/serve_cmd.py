"""`specdeploy serve`: Start tritonserver on a rendered repository (gRPC + HTTP + metrics)."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("serve", help="Start tritonserver on a rendered repository (gRPC + HTTP + metrics).")
    def serve_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy serve` is not implemented yet")
