"""`specdeploy report`: Compute statistics and the GO / NO-GO / INCONCLUSIVE verdict for a load-test run."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("report", help="Compute statistics and the GO / NO-GO / INCONCLUSIVE verdict for a load-test run.")
    def report_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy report` is not implemented yet")
