"""`specdeploy demo`: Train or inspect the built-in demo models (tokenizer, target, draft, Medusa, EAGLE)."""

from __future__ import annotations

import typer

from pipeline.errors import SpecdeployError


def register(app: typer.Typer) -> None:
    @app.command("demo", help="Train or inspect the built-in demo models (tokenizer, target, draft, Medusa, EAGLE).")
    def demo_command(config: str = typer.Argument(..., help="Deployment config YAML.")) -> None:
        raise SpecdeployError("`specdeploy demo` is not implemented yet")
