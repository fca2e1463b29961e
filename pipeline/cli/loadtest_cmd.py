"""`specdeploy loadtest`: Load-test speculative vs baseline under a concurrency sweep (Locust)."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("loadtest", help="Load-test speculative vs baseline under a concurrency sweep (Locust).")
    def loadtest_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy loadtest` is not implemented yet")
