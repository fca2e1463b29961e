"""`specdeploy render CONFIG`: render the Triton model repositories (baseline and speculative).

Reads the config and ``engines/NAME/manifest.json`` (refused if built from another config);
writes ``engines/NAME/model_repo/{baseline,speculative}/`` atomically after validating every
``config.pbtxt``, and next to each its deployment descriptor ``<variant>.render.json``, Prometheus
alerting rules and Grafana dashboard (``<variant>.alerts.yml``, ``<variant>.dashboard.json``); prints
each repository path, the model each load-test arm calls, the operations files and any validator
warnings. ``--schedule FILE`` then writes a speculation schedule into the speculative arm where its
runtime loads one (:mod:`pipeline.render.schedule`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def register(app: typer.Typer) -> None:
    @app.command("render", help="Render the Triton model repositories (baseline and speculative) from the templates.")
    def render_command(config: str = typer.Argument(..., help="Deployment config YAML."),
                       workdir: Optional[Path] = workdir_option(),
                       schedule: Optional[Path] = typer.Option(
                           None, "--schedule", help="A speculation schedule (RUN_DIR/schedule.json from `specdeploy "
                                                    "schedule`) to write into the speculative arm (docs/schedule.md).")
                       ) -> int:
        return render(config, workdir, schedule)


def render(config: str, workdir: Path | None = None, schedule: Path | None = None) -> int:
    from pipeline.artefacts.deployment import ArmDeployment, descriptor_path
    from pipeline.config import load_config
    from pipeline.render.monitoring import operations_paths
    from pipeline.render.renderer import render as render_repositories
    from pipeline.serve.server import repository_models

    cfg = load_config(config, workdir)
    form = None
    if schedule is not None:  # checked before anything is rendered
        from pipeline.render.schedule import schedule_form

        form = schedule_form(cfg, schedule)
    for variant, (repo, warnings) in render_repositories(cfg).items():
        target = ArmDeployment.load(descriptor_path(repo))  # what render recorded for the arm
        extra = "".join(f" {k}={v}" for k, v in target.extra_inputs.items())
        print(f"{variant:12s} {repo}  models: {', '.join(repository_models(repo))}")
        print(f"{'':12s} load tests call {target.model_name}{extra}")
        if cfg.runs_llm_api:
            serve_dir = repo.parent.parent / "trtllm-serve" / variant
            print(f"{'':12s} launch: {repo.with_name(variant + '.launch.sh')}  (trtllm-serve: {serve_dir / 'launch.sh'})")
        rules, dashboard = operations_paths(repo)
        print(f"{'':12s} alerts {rules.name}, dashboard {dashboard.name} (docs/operations.md)")
        for warning in warnings:
            print(f"{'':12s} warning: {warning}")
    if form is not None:
        from pipeline.render.schedule import apply_schedule

        for note in apply_schedule(cfg, form):
            print(f"{'schedule':12s} {note}")
    return 0
