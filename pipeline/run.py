"""`specdeploy run`: every stage in order — validate → build → render → (calibrate, on a CPU
config) → loadtest (which serves both arms) → report — with one stage display, resumable.

Reads the config; each stage writes its usual files (``engines/<name>/manifest.json``, the
rendered repositories, ``reports/<name>/<run>/``). A re-run skips what is still valid: the build
cache skips unchanged steps, a finished load test of the same config (same config hash, every
planned cell complete, a report written) is reused, and when the newest load test of the same
config is unfinished (killed, crashed, its server died) it is resumed: its complete cells are kept
and only the others measured — both by :mod:`pipeline.loadtest.resume`'s one rule of a finished
run — unless ``new_run`` (``--fresh``) is set, which starts a new one. On ``hardware: cpu`` the
calibrate stage makes this machine's CPU calibration for the config (:mod:`pipeline.forecast.machine_calibration`) when none is stored, or
``recalibrate`` asks for a new one, so the report can check the forecast against the
measurement; a failed calibration does not fail the run. Its outcome is recorded in ``run.json``
(``forecast_calibration``), where the report's forecast section finds why a forecast is missing.
Returns the :class:`pipeline.report.builder.Report`; its exit code is the
verdict (0 GO, 1 NO-GO, 3 INCONCLUSIVE).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from pipeline.artefacts.deployment import ALL_ARMS
from pipeline.build.builder import build
from pipeline.config import DeploymentConfig
from pipeline.errors import UsageError
from pipeline.forecast.machine_calibration import ensure_calibration
from pipeline.infra import owner_lock
from pipeline.infra.atomic import write_json_atomic
from pipeline.infra.owner_lock import DirectoryBusy
from pipeline.loadtest import auto_repeats
from pipeline.loadtest.crossing import CrossingError, crossing_levels
from pipeline.loadtest.ownership import live_owner
from pipeline.loadtest.resume import PreviousRuns, kept_results, previous_runs
from pipeline.loadtest.runner import run_loadtest
from pipeline.render.renderer import render
from pipeline.render.schedule import BLS_DRAFTS, apply_schedule, schedule_form, serves_scheduled_arm
from pipeline.report.builder import make_report
from pipeline.schedule.derive import derive_from_run
from pipeline.schedule.forms import write_forms
from pipeline.validate.preflight import errors_of, raise_on_errors, run_preflight

STAGES = ("validate", "build", "render", "loadtest", "report")
CPU_STAGES = ("validate", "build", "render", "calibrate", "loadtest", "report")
# run --schedule, after the A/B report: the schedule from it, the scheduled arm rendered, the three
# arms load-tested across its thresholds, and that run's report (docs/schedule.md)
SCHEDULE_STAGES = ("schedule", "render scheduled", "crossing loadtest", "crossing report")


def stages_of(cfg: DeploymentConfig) -> tuple[str, ...]:
    """The stages `run` goes through for ``cfg``: a CPU config is calibrated before its load test."""
    return CPU_STAGES if cfg.hardware == "cpu" else STAGES


@dataclass
class StageLog:
    """What each stage did and how long it took (printed as the closing table)."""

    stages: tuple[str, ...] = STAGES
    rows: list[tuple[str, str, float]] = field(default_factory=list)

    def run(self, console, name: str, fn: Callable[[], Any]) -> Any:
        console.rule(f"[bold][{self.stages.index(name) + 1}/{len(self.stages)}] {name}")
        started = time.monotonic()
        result = fn()
        elapsed = time.monotonic() - started
        detail = result[1] if isinstance(result, tuple) else ""
        self.rows.append((name, detail, elapsed))
        return result[0] if isinstance(result, tuple) else result


def run_pipeline(
    cfg: DeploymentConfig,
    *,
    new_run: bool = False,
    loadtest_overrides: dict[str, Any] | None = None,
    console=None,
    recalibrate: bool = False,
    schedule: bool = False,
    crossing_step_s: float | None = None,
):
    """Run every stage; return the Report. Raises SpecdeployError subclasses for user problems.
    ``schedule``: then derive the schedule from the A/B report, render and serve the scheduled arm and
    load-test the three arms across its thresholds (:func:`schedule_stages`); the report returned is
    that run's."""


    console = console or Console()
    if schedule:
        check_schedule_run(cfg)  # before any stage: a layout that cannot serve the third arm
    log = StageLog(stages_of(cfg) + (SCHEDULE_STAGES if schedule else ()))
    overrides = loadtest_overrides or {}

    def validate_stage():
        findings = run_preflight(cfg, offline=False)
        for finding in findings:
            if finding.severity != "info":
                console.print(f"  {finding.severity}: {finding.field or '-'}: {finding.message}")
        raise_on_errors(findings)
        warnings = sum(1 for f in findings if f.severity == "warning")
        return None, f"{len(errors_of(findings))} errors, {warnings} warnings"

    def build_stage():
        manifest = build(cfg, progress=True, wait_for_lock=True)  # a concurrent run's build: wait, then all cached
        statuses = [s.get("status") for s in manifest.get("steps", [])]
        return manifest, f"{statuses.count('cached')} cached, {len(statuses) - statuses.count('cached')} built"

    def render_stage():
        repos = render(cfg)
        return repos, ", ".join(f"{variant}: {path}" for variant, (path, _) in repos.items())

    def loadtest_stage():
        # finished or not is pipeline.loadtest.resume's one rule; a run another live process owns is
        # never resumed nor reused (pipeline/loadtest/ownership.py)
        previous = PreviousRuns() if (new_run or overrides) else previous_runs(cfg)
        reuse, resume = previous.reuse, previous.resume
        left_alone = False
        if resume is not None and (owner := live_owner(resume)) is not None:
            console.print(f"  the newest load test {resume} is being measured by {owner.describe()}: "
                          "leaving it to its owner (two load tests on one host share its cores)")
            resume, left_alone = None, True
        if resume is not None:  # the newest run of the config: newer than any finished one
            kept = len(kept_results(resume))
            console.print(f"  resuming the unfinished load test {resume}: {kept} finished cells kept "
                          "(pass --fresh to start over)")
            try:
                run_dir = run_loadtest(cfg, progress=True, report=False, resume=resume)
                return run_dir, f"resumed {run_dir} ({kept} cells kept)"
            except DirectoryBusy as busy:  # another process adopted it first
                console.print(f"  {busy}")
                left_alone = True
        if reuse is not None:
            try:
                owner_lock.claim(reuse, "reporting a finished load test")
                console.print(f"  reusing the finished load test {reuse} (same config; pass --fresh to measure again)")
                return reuse, f"reused {reuse}"
            except DirectoryBusy as busy:  # its owner is still writing its report
                console.print(f"  {busy}")
                left_alone = True
        if left_alone:
            console.print("  measuring into a new run directory of its own")
        run_dir = run_loadtest(cfg, progress=True, report=False, **overrides)
        return run_dir, str(run_dir) + (" (a new run: the newest was another process's)" if left_alone else "")

    log.run(console, "validate", validate_stage)
    log.run(console, "build", build_stage)
    log.run(console, "render", render_stage)
    calibration = None
    if "calibrate" in log.stages:
        calibration = log.run(console, "calibrate", lambda: calibrate_stage(cfg, console, recalibrate))
    with owner_lock.holding():  # the run dir is this process's from the load test until its report is written
        run_dir = log.run(console, "loadtest", loadtest_stage)
        if calibration is not None:
            record_calibration(run_dir, calibration)
        report = log.run(console, "report", lambda: (make_report(run_dir, cfg), str(run_dir / "report.html")))
    if schedule:
        console.print(f"A/B verdict: {report.verdict} ({run_dir / 'report.html'})")
        report = schedule_stages(cfg, run_dir, log, console, new_run=new_run, repeats=overrides.get("repeats"),
                                 crossing_step_s=crossing_step_s)
    _print_summary(console, log, report)
    return report


def check_schedule_run(cfg: DeploymentConfig) -> None:
    """``run --schedule`` serves a third arm: the CPU reference engine's own layout only (the llmapi
    layout takes the schedule into its speculative arm, the engine runtime cannot run one)."""

    if cfg.backend != "reference" or cfg.llmapi_layout or not cfg.speculative:
        raise UsageError("run --schedule serves a scheduled arm beside the A/B arms on the CPU reference engine "
                         "(backend: reference, not the llmapi layout); elsewhere run `specdeploy schedule RUN_DIR` "
                         "and `render --schedule` (docs/schedule.md)")
    if not serves_scheduled_arm(cfg):
        raise UsageError("run --schedule: " + BLS_DRAFTS)


def schedule_stages(cfg: DeploymentConfig, ab_run: Path, log: StageLog, console, *, new_run: bool = False,
                    repeats: int | None = None, crossing_step_s: float | None = None):
    """After the A/B report: ``ab_run/schedule.json`` (:func:`pipeline.schedule.derive.derive_from_run`),
    the scheduled arm rendered (``model_repo/scheduled/``), the three arms interleaved over a ramp
    across its thresholds (:mod:`pipeline.loadtest.crossing`; the A/B's levels when the schedule has
    no threshold to cross), and that run's report. A finished crossing run of the config is reused,
    an unfinished one resumed, as the A/B run is."""

    def schedule_stage():
        sched = derive_from_run(ab_run)
        path = sched.write(Path(ab_run) / "schedule.json")
        write_forms(sched, Path(ab_run) / "schedule", None)
        ranges = ", ".join(f"{r.min_concurrency}{'-' + str(r.max_concurrency) if r.max_concurrency else '+'}: "
                           f"{'off' if r.draft_len == 0 else 'K ' + str(r.draft_len)}" for r in sched.ranges)
        console.print(f"  schedule: {ranges}")
        return (path, sched), f"{path} ({ranges})"

    path, sched = log.run(console, "schedule", schedule_stage)

    def render_stage():
        for note in apply_schedule(cfg, schedule_form(cfg, path)):
            console.print(f"  {note}")
        return None, "model_repo/scheduled"

    log.run(console, "render scheduled", render_stage)
    max_users = cfg.reference.max_batch_size or cfg.build.max_batch_size
    try:
        crossing_levels(sched.ranges, max_users)
        crossing = True
    except CrossingError as exc:
        console.print(f"  {exc}: the three arms run at the A/B's levels instead")
        crossing = False
    rounds = repeats or (cfg.loadtest.min_repeats if auto_repeats.is_auto(cfg.loadtest.repeats) else None)

    def loadtest_stage():
        previous = None if new_run else previous_runs(cfg, ALL_ARMS)
        if previous is not None and previous.resume is not None:
            return run_loadtest(cfg, progress=True, report=False, resume=previous.resume), f"resumed {previous.resume}"
        if previous is not None and previous.reuse is not None and _same_schedule(previous.reuse, path):
            return previous.reuse, f"reused {previous.reuse}"
        run_dir = run_loadtest(cfg, progress=True, report=False, arms=ALL_ARMS, crossing=crossing,
                               crossing_step_s=crossing_step_s, repeats=rounds)
        return run_dir, str(run_dir)

    crossing_run = log.run(console, "crossing loadtest", loadtest_stage)
    return log.run(console, "crossing report", lambda: (make_report(crossing_run), str(crossing_run / "report.html")))


def _same_schedule(run_dir: Path, schedule_path: Path) -> bool:
    """The finished run measured this schedule (its copy in RUN_DIR/schedule.json has the same ranges)."""
    try:
        ran = json.loads((Path(run_dir) / "schedule.json").read_text(encoding="utf-8"))["ranges"]
        now = json.loads(Path(schedule_path).read_text(encoding="utf-8"))["ranges"]
    except (OSError, ValueError, KeyError):
        return False
    return ran == now


def calibrate_stage(cfg: DeploymentConfig, console, force: bool) -> tuple[dict, str]:
    """This machine's CPU calibration for ``cfg``: reused when stored, made when not (or when
    ``force``); (the outcome, its summary). Never raises: the run goes on without it."""

    def starting(why: str) -> None:
        console.print(f"  calibration {why}: microbenchmarking the reference engine on the load test's prompts, "
                      "so the report can check the forecast against the measurement")

    outcome = ensure_calibration(cfg, force=force, on_start=starting)
    status = outcome["status"]
    if status == "stored":
        detail = f"reused the stored calibration of {outcome['created']}"
        console.print(f"  {detail} ({outcome['path']}; --recalibrate makes a new one)")
    elif status == "calibrated":
        detail = f"calibrated: {outcome['path']}"
        console.print(f"  {detail}, timed on {outcome['prompts']}")
    elif status == "failed":
        detail = "calibration failed: the report has no forecast"
        console.print(f"  calibration failed ({outcome['reason']}); the run goes on and its report says why "
                      "the forecast is not available")
    else:
        detail = f"not needed: {outcome['reason']}"
        console.print(f"  {detail}")
    return outcome, detail


def record_calibration(run_dir: Path, outcome: dict) -> None:
    """Record the calibrate stage's outcome in ``run_dir/run.json`` (``forecast_calibration``), where
    the report reads why a CPU run has no forecast; kept across ``specdeploy report`` re-runs."""

    path = run_dir / "run.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta["forecast_calibration"] = outcome
    write_json_atomic(path, meta, indent=1, default=str)  # as the load test writes it


def _print_summary(console, log: StageLog, report) -> None:

    table = Table(title="specdeploy run")
    for column in ("stage", "result", "seconds"):
        table.add_column(column, overflow="fold")
    for name, detail, elapsed in log.rows:
        table.add_row(name, detail, f"{elapsed:.1f}")
    console.print(table)
    style = {"GO": "bold green", "NO-GO": "bold red"}.get(report.verdict, "bold yellow")
    console.print(f"report: {report.html_path}  (json: {report.json_path})")
    console.print(f"verdict: [{style}]{report.verdict}[/] (exit code {report.exit_code})")
    repeats = (getattr(report, "data", None) or {}).get("repeats") or {}  # stand-ins without data: nothing to say
    if repeats.get("mode") == "auto":  # loadtest.repeats: auto — how many it took and why it stopped
        console.print(f"  repeats: {repeats.get('repeats')} per cell (auto; stopped: {repeats.get('stopped')} — "
                      f"{repeats.get('detail')})", markup=False)
    for reason in report.gate.reasons[:8] if hasattr(report.gate, "reasons") else []:
        console.print(f"  - {reason}")
