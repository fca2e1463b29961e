"""What ``specdeploy report`` and ``specdeploy compare`` write: ``RUN_DIR/report.json``
(:class:`Report`: the verdict and its gate checks, headline rows per arm x level, comparisons,
provenance) and ``compare.json`` (:class:`Comparison`: two runs' reports side by side, each ratio
moved / drifted / steady). ``report.json`` is read by ``compare``, ``run`` (the exit code) and the
report's own renderers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artefacts.base import Artefact, Strict

REPORT_SCHEMA = "specdeploy-report/1"
COMPARE_SCHEMA = "specdeploy-compare/1"


class ReportRow(Strict):
    """One headline row: one arm at one concurrency (or rate)."""

    arm: str
    concurrency: int
    target_rate: float | None = None
    task_set: list[str]
    draft_model: str | None
    speculation_length: int | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    tau_bound_iid: float | None
    first_token_ms: float | None
    first_token_p95_ms: float | None
    tpot_ms: float | None
    decode_tokens_per_s: float | None
    output_tokens_per_s: float | None
    p95_latency_ms: float | None
    output_equivalent: bool | None
    peak_memory_mb: float | None
    n_ok: int
    n_runs: int


class Report(Artefact):
    """The verdict of one load test and everything it rests on."""

    SCHEMA = REPORT_SCHEMA
    VERSION = 1
    FILE = "RUN_DIR/report.json"
    WRITER = "specdeploy report RUN_DIR"

    name: str
    run_dir: str
    verdict: Literal["GO", "NO-GO", "INCONCLUSIVE", "NO DIFFERENCE", "DIFFERENCE"] = Field(description=(
        "The gate's verdict; an A/A run (loadtest --aa) says NO DIFFERENCE or DIFFERENCE instead of GO / NO-GO."))
    exit_code: int
    reasons: list[str]
    advice: list[str] = Field(default_factory=list)
    gate: dict[str, Any] = Field(description="Every gate check: rule, scope, status, detail, value, threshold.")
    gate_settings: dict[str, Any]
    rows: list[ReportRow]
    crossover_concurrency: Any = None
    rollout_range: dict[str, Any] = Field(default_factory=dict, description=(
        "The recommended levels (levels, up_to) and the levels below the crossover left out, each with the "
        "checks it fails (excluded); gated levels kept with a tail worse with confidence (cautions); "
        "pipeline/report/rollout_range.py."))
    recommended_draft_len: dict[str, Any] = Field(default_factory=dict)
    schedule: dict[str, Any] | None = Field(None, description=(
        "Only a run with the scheduled arm: the schedule (ranges -> K), its thresholds, per level and ramp step "
        "the three arms and the scheduled arm against the better static arm (paired t), the schedule_* checks "
        "and the schedule's own verdict (pipeline/report/schedule_gate.py)."))
    acceptance_rate: float | None = None
    acceptance_source: str | None = Field(None, description=(
        "Where acceptance_rate comes from: per-request outputs, a server's metrics (named), or not reported."))
    acceptance_by_source: list[dict[str, Any]] = Field(default_factory=list, description=(
        "Per acceptance source over the speculative runs: the runs, kind, rate and mean acceptance length."))
    acceptance_per_request: dict[str, Any] = Field(default_factory=dict, description=(
        "Per-request acceptance (accepted / drafted) over the speculative requests that drafted: n, p10, p50, p90, "
        "mean and a 10-bin histogram (edges, counts); acceptance_rate is pooled over tokens instead "
        "(pipeline/report/per_request.py)."))
    acceptance_by_position: dict[str, Any] = Field(default_factory=dict, description=(
        "Accepted / verify steps per draft position (1..K) where the server counts it (reported, source, "
        "positions); 'not reported by this server' otherwise."))
    comparisons: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    bootstrap: dict[str, Any] = Field(description="The pooled request-level bootstrap (descriptive, never gated).")
    intervals: dict[str, Any] = Field(default_factory=dict, description=(
        "The run-level intervals the gate decides on: method (paired t on per-repeat log ratios), confidence level "
        "(1 - alpha, or 1 - alpha/K for repeats: auto), why, alpha spending (pipeline/report/intervals.py)."))
    repeats: dict[str, Any] = Field(default_factory=dict, description=(
        "Repeats per cell: fixed, or auto with how many it took and why it stopped (decided / max_repeats / "
        "max_minutes; pipeline/loadtest/auto_repeats.py)."))
    aa: dict[str, Any] | None = Field(None, description=(
        "An A/A run of the rig (loadtest --aa): its design and noise record (also aa.json; pipeline/report/aa.py)."))
    rig_noise: dict[str, Any] | None = Field(None, description=(
        "The latest A/A noise record of this config (reports/<name>/aa.json), quoted by an A/B report."))
    primary_draft_len: int | None = None
    greedy: bool
    provenance: dict[str, Any] = Field(description="run.json without the config snapshot.")
    synthetic_data: bool | None = None
    data_warnings: list[str] = Field(default_factory=list, description=(
        "What makes the acceptance unrepresentative of real traffic, from the data: forced output lengths, "
        "prompts cut to drawn lengths (pipeline/loadtest/inputs.py data_warnings)."))
    formulas: dict[str, str]
    acceptance_reported: dict[str, Any] = Field(
        default_factory=dict, description="Per arm: whether the server reported acceptance figures per request "
                                          "and on /metrics ('reported' / 'not reported', or 'not checked' when its "
                                          "server had no metrics URL; pipeline/report/acceptance_reported.py).")
    sessions: dict[str, Any] = Field(default_factory=dict, description=(
        "resumed, and per session of the load test: when it started, the gap since the previous one, its cells "
        "(pipeline/report/sessions.py)."))
    forecast: dict[str, Any] = Field(default_factory=dict, description=(
        "Forecast vs measured per concurrency with the measured acceptance fed back (pipeline/report/forecast_check.py); "
        "'available': false with the reason when no forecast could be made."))
    capacity: dict[str, Any] | None = Field(default=None, description=(
        "Capacity and cost at gate.slo per arm, when the config has a capacity: section (pipeline/report/capacity.py)."))


class ComparedRun(Strict):
    run_dir: str
    name: str
    run_id: str | None
    verdict: str
    crossover_concurrency: Any = None
    rollout: Any = None
    acceptance_rate: float | None = None
    primary_draft_len: int | None = None


class Comparison(Artefact):
    """Run B against run A: which ratios moved (disjoint 95% CIs), drifted or stayed."""

    SCHEMA = COMPARE_SCHEMA
    VERSION = 1
    FILE = "compare.json (in --out)"
    WRITER = "specdeploy compare RUN_A RUN_B"

    a: ComparedRun
    b: ComparedRun
    ratios: list[dict[str, Any]]
    moved: list[dict[str, Any]]
    moved_worse: list[dict[str, Any]]
    changed_checks: list[dict[str, Any]]
    definition: dict[str, str]
