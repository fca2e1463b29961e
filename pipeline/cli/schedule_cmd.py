"""`specdeploy schedule RUN_DIR`: the speculation schedule from a run's report — a draft length K
per concurrency range, 0 where speculation stops paying (docs/schedule.md).

Reads ``RUN_DIR/report.json`` (``specdeploy report`` writes it); writes ``RUN_DIR/schedule.json``
(:class:`pipeline.artefacts.schedule.SpeculationSchedule`, what ``render --schedule`` reads) and
``RUN_DIR/schedule/``: the TensorRT-LLM LLM-API ``speculative_config`` per recorded release line,
vLLM's ``--speculative-config`` and what the engine runtime can express. Prints the schedule and
each form.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("schedule", help="Derive the speculation schedule (K per concurrency range) from a run's report "
                                  "and write it as each engine loads it.")
    def schedule_command(run_dir: Path = typer.Argument(..., help="A run directory holding report.json."),
                         max_batch_size: Optional[int] = typer.Option(
                             None, "--max-batch-size", help="The served max batch size (closes vLLM's last range).")
                         ) -> int:
        return schedule(run_dir, max_batch_size)


def schedule(run_dir: Path, max_batch_size: int | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeline.errors import UsageError
    from pipeline.schedule.derive import derive_from_run
    from pipeline.schedule.forms import all_forms, write_forms

    if not Path(run_dir).is_dir():
        raise UsageError(f"schedule: {run_dir} is not a run directory")
    sched = derive_from_run(run_dir)
    path = sched.write(Path(run_dir) / "schedule.json")
    written = write_forms(sched, Path(run_dir) / "schedule", max_batch_size)
    forms = all_forms(sched, max_batch_size)
    console = Console(highlight=False)
    table = Table(title=f"Speculation schedule: {sched.name} ({sched.method or 'method not recorded'})")
    for col in ("batch sizes", "K", "basis", "evidence"):
        table.add_column(col, overflow="fold")
    for r in sched.ranges:
        span = f"{r.min_concurrency}–{r.max_concurrency}" if r.max_concurrency else f"{r.min_concurrency}+"
        table.add_row(span, "off" if r.draft_len == 0 else str(r.draft_len), r.basis, r.evidence)
    console.print(table)
    for note in sched.notes:
        console.print(f"note: {note}")
    for form in forms["trtllm_llmapi"].values():
        console.print(f"TensorRT-LLM {form['line']} LLM API speculative_config: "
                      f"{json.dumps(form['fields']) if form['fields'] else 'nothing to load'}")
        for note in form["notes"]:
            console.print(f"  - {note}")
    console.print(f"vLLM --speculative-config: {json.dumps(forms['vllm']['config'])}")
    for line in forms["engine_runtime"]:
        console.print(f"engine runtime: {line}")
    console.print(f"wrote {path} and {', '.join(p.name for p in written)} in {written[0].parent}")
    return 0
