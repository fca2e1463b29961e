"""`specdeploy build`: run the build plan — resolve/quantize/convert, compile engines — and write
engines/NAME/manifest.json. Steps whose argv and inputs are unchanged are skipped (cache);
``--force`` rebuilds everything, ``--dry-run`` lists what would run. Preflight (the checks of
``specdeploy validate``) runs first unless ``--skip-preflight``; on ``backend: trtllm`` the live
preflight (``validate --live``) too, unless ``--skip-live`` (recorded in the manifest's provenance)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def register(app: typer.Typer) -> None:
    @app.command("build", help="Run the build plan: quantize/convert, compile engines, write engines/NAME/manifest.json.")
    def build_command(
        config: str = typer.Argument(..., help="Deployment config YAML."),
        force: bool = typer.Option(False, "--force", help="Rebuild every step, ignoring the cache."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List the steps and whether each is cached; run nothing."),
        trtllm_root: Optional[str] = typer.Option(
            None, "--trtllm-root", help="Directory holding TensorRT-LLM's examples/ (default: config trtllm_root, "
            "$SPECDEPLOY_TRTLLM_ROOT, then /app in the NGC image)."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress display on stderr."),
        skip_preflight: bool = typer.Option(False, "--skip-preflight", help="Build without running preflight first."),
        skip_live: bool = typer.Option(False, "--skip-live", help="trtllm: build without the live preflight "
                                       "(installed TensorRT-LLM, scripts, GPUs); recorded in the provenance."),
        workdir: Optional[Path] = workdir_option(),
    ) -> None:
        from rich.console import Console
        from rich.table import Table

        from pipeline.build import builder
        from pipeline.config import load_config
        from pipeline.paths import manifest_path

        cfg = load_config(config, workdir)
        console = Console()
        if dry_run:
            rows = builder.dry_run(cfg, force=force, trtllm_root=trtllm_root)
            table = Table(title=f"build {cfg.name} (dry run)")
            for column in ("step", "status", "outputs"):
                table.add_column(column, overflow="fold")
            for row in rows:
                table.add_row(row["name"], "cached" if row["status"] == "cached" else "would run", "\n".join(row["outputs"]))
            console.print(table)
            return
        if cfg.backend == "trtllm":
            from pipeline.plan.planner import make_plan

            builder.require_trtllm(cfg)  # before preflight: stop at once without TensorRT-LLM
            builder.require_scripts(make_plan(cfg, trtllm_root), cfg)  # and without the example scripts
            from pipeline.validate.live.gate import require_live

            require_live(cfg, skip=skip_live, stage="build", trtllm_root=trtllm_root, console=console)
        if not skip_preflight:
            from pipeline.validate.preflight import raise_on_errors, run_preflight

            raise_on_errors(run_preflight(cfg, offline=False, trtllm_root=trtllm_root))
        manifest = builder.build(cfg, force=force, progress=progress, trtllm_root=trtllm_root)
        built = sum(1 for s in manifest["steps"] if s["status"] == "built")
        console.print(
            f"built {built}, cached {len(manifest['steps']) - built} step(s); manifest: {manifest_path(cfg).absolute()}",
            soft_wrap=True,
        )
