"""`specdeploy run CONFIG`: validate → build → render → serve → loadtest → report in one command.

Prints one stage display and, at the end, where the report is and the verdict; the exit code is
the verdict (0 GO, 1 NO-GO, 3 INCONCLUSIVE), so CI can gate on it; a stage's usage or config
error exits 2, its failure 5 (the one table: docs/ci.md). Resumable: a re-run skips
cached build steps, reuses a finished load test of the same config and resumes an unfinished one
(its complete cells kept; ``--fresh``, or ``--new-run``, measures again from the start). The load-test overrides are those of ``specdeploy loadtest``.
On a CPU config, ``run`` calibrates the forecast's CPU cost model before the load test when this
machine has no calibration for the config (``--recalibrate``: make a new one anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.options import workdir_option


def _int_list(value: Optional[str]) -> Optional[list[int]]:
    if not value:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got '{value}'") from None


def register(app: typer.Typer) -> None:
    @app.command(
        "run",
        help=(
            "validate -> build -> render -> (calibrate, CPU) -> serve -> loadtest -> report, resumable. Prints where the "
            "report is and the verdict; exit code = verdict (0 GO, 1 NO-GO, 3 INCONCLUSIVE)."
        ),
    )
    def run_command(
        config: str = typer.Argument(..., help="Deployment config YAML (e.g. configs/tiny-cpu-draft-target.yaml)."),
        new_run: bool = typer.Option(False, "--fresh", "--new-run", help="Start a new load test even if a finished or "
                                     "unfinished one of this config exists (default: reuse it, or resume it)."),
        concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Override the concurrency levels, e.g. 1,4,16."),
        duration: Optional[str] = typer.Option(None, "--duration", help="Override the duration of each cell, e.g. 20s."),
        repeats: Optional[int] = typer.Option(None, "--repeats", min=1, help="Override the repeats per cell."),
        skip_live: bool = typer.Option(False, "--skip-live", help="trtllm: run without the live preflight "
                                       "(installed TensorRT-LLM, scripts, GPUs); recorded in the provenance."),
        recalibrate: bool = typer.Option(False, "--recalibrate", help="CPU configs: calibrate the forecast's cost "
                                         "model again even if this machine has a calibration for the config "
                                         "(default: made only when none is stored)."),
        schedule: bool = typer.Option(False, "--schedule", help="After the A/B report: derive the speculation "
                                      "schedule, render and serve the scheduled arm, load-test baseline, speculative "
                                      "and scheduled across its thresholds, report (CPU reference engine; "
                                      "docs/schedule.md)."),
        crossing_step_s: Optional[float] = typer.Option(None, "--crossing-step-s", min=1, help="With --schedule: "
                                                        "seconds per step of the ramp across the thresholds (default loadtest.duration_s: a step is a level)."),
        workdir: Optional[Path] = workdir_option(),
    ) -> int:
        from rich.console import Console

        from pipeline.config import load_config
        from pipeline.run import run_pipeline
        from pipeline.validate.live.gate import require_live

        cfg = load_config(config, workdir)
        require_live(cfg, skip=skip_live, stage="run", console=Console())
        overrides = {k: v for k, v in {"concurrency": _int_list(concurrency), "duration": duration,
                                        "repeats": repeats}.items() if v is not None}
        report = run_pipeline(cfg, new_run=new_run, loadtest_overrides=overrides, recalibrate=recalibrate,
                              schedule=schedule, crossing_step_s=crossing_step_s)
        raise typer.Exit(report.exit_code)
