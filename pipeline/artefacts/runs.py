"""What ``specdeploy loadtest`` writes into RUN_DIR besides the raw records: ``run.json``
(:class:`RunInfo`: provenance, the config snapshot, the sweep), ``runs.json`` (:class:`RunResults`:
one :class:`RunResult` per Locust run) and ``settings/<key>.json`` (:class:`RunSettings`: what
one Locust run was told). Read by ``report`` (run.json, runs.json) and by the locustfile
(settings, through ``SPECDEPLOY_LOADTEST_CONFIG``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from pipeline.artefacts.base import Artefact, Strict

# `server_acceptance.source` / `metrics_delta.source` when no server counter gave acceptance: written by
# the load test's counter reader, read by the report; here, beneath both, with the file it is a value of
NOT_REPORTED = "not reported"


class RunInfo(Artefact):
    """Provenance of one load test: config snapshot and hash, code and package versions, host,
    prompt set, seeds, the sweep, the endpoints and the commands run."""

    SCHEMA = "specdeploy-run/1"
    VERSION = 1
    FILE = "RUN_DIR/run.json"
    WRITER = "specdeploy loadtest"
    LEGACY_FORMAT = True

    # open by design: whatever a stage records about the run (e.g. per-arm placement) reaches the
    # report's provenance without a change to the report; the fields below are the ones read
    model_config = {**Artefact.model_config, "extra": "allow"}

    format: str = Field("", description="The schema tag again, as run.json carried it before `schema`.")
    run_id: str
    name: str
    created: str
    config: dict[str, Any] = Field(description="The deployment config as loaded (config_hash names it).")
    config_hash: str
    git_sha: str | None = None
    versions: dict[str, str | None] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict)
    dataset: dict[str, Any] | None = None
    seeds: dict[str, int | None] = Field(default_factory=dict)
    method: str
    draft_model: str | None = None
    primary_draft_len: int | None = None
    sweep_draft_len: list[int] = Field(default_factory=list)
    transport: str
    mode: str
    concurrency: list[int]
    duration_s: float
    warmup_s: float
    repeats: int
    tokenizer_dir: str | None = None
    endpoints: dict[str, dict[str, Any]] = Field(default_factory=dict)
    commands: list[str] = Field(default_factory=list)


class RunResult(Strict):
    """One Locust run: where its files are, whether it is valid and why not, server liveness,
    counter deltas, resource use and the exact command."""

    key: str
    arm: str
    concurrency: int
    target_rate: float | None = None
    repeat: int
    draft_len: int | None = None
    raw: str = Field(description="Raw records, relative to RUN_DIR.")
    workers: str
    settings: str
    log: str
    metrics: str
    metrics_delta: dict[str, float | str] | None = Field(None, description=(
        "Acceptance counters over the run, and `source`: whose counters (specdeploy, vllm, not reported)."))
    server_acceptance: dict[str, Any] | None = Field(None, description=(
        "The run's acceptance as the server reports it (pipeline/loadtest/acceptance_sources.py): `source`, "
        "`kind` (counter delta, drained window, gauge window), counts, rate and mean acceptance length "
        "(None when not given)."))
    server_alive: bool
    valid: bool
    invalid_reasons: list[str] = Field(default_factory=list)
    locust_exit_code: int | None = None
    n_records: int
    sent: int = 0
    peak_rss_mb: float | None = None
    started_unix: float
    seconds: float
    command: list[str]
    client_cpu_s: float | None = None
    client_cpus: list[int] | None = None
    client_cpu_fraction: float | None = None
    server_log_tail: str | None = None
    stopped_early: dict[str, Any] | None = Field(None, description=(
        "The run's Locust stopped itself (pipeline/loadtest/fail_fast.py): the first error verbatim, its HTTP "
        "status, the counts in the window, the likely fix."))
    harness_fault: str | None = Field(None, description=(
        "The load generator itself failed in this cell (pipeline/loadtest/harness.py): what and the cause from its "
        "log; the load test then stopped with exit code 5."))
    level: str | None = Field(None, description="A ramp or trace run's level name (ramp, trace); None for a "
                                                "concurrency or rate level.")
    session: int = Field(1, description="Which start of the load test measured this cell (2 and on: resumed; "
                                        "run.json `sessions`).")


class RunResults(Artefact):
    """Every Locust run of a load test so far, in the order they ran (rewritten after each)."""

    SCHEMA = "specdeploy-runs/1"
    VERSION = 1
    FILE = "RUN_DIR/runs.json"
    WRITER = "specdeploy loadtest"
    LEGACY_FORMAT = True

    format: str = Field("", description="The schema tag again, as runs.json carried it before `schema`.")
    runs: list[RunResult]


class RunSettings(Artefact):
    """What one Locust run is told: one arm x one concurrency (or rate) x one repeat. The
    locustfile reads it (``locustfiles/lt_common.RunSettings``, which ignores the schema keys)."""

    SCHEMA = "specdeploy-run-settings/1"
    VERSION = 1
    FILE = "RUN_DIR/settings/<key>.json"
    WRITER = "specdeploy loadtest"

    run_id: str
    arm: str
    repeat: int
    endpoint: str = Field(description="grpc: host:port; http: http://host:port.")
    model_name: str
    contract: Literal["ensemble", "bls", "llmapi"] = Field("ensemble", description="The model's tensor contract: ensemble, bls or llmapi "
                                                  "(the arm's deployment descriptor).")
    transport: str
    mode: str
    concurrency: int
    target_rate: float | None = None
    arrival: str
    prompts: list[dict[str, Any]]
    max_tokens: int
    sampling: dict[str, Any]
    extra_inputs: dict[str, Any]
    seed: int
    output_prefix: str
    warmup_s: float
    duration_s: float
    request_timeout_s: float
    stop_timeout_s: float
    num_workers: int
    draft_len: int | None = None
    tokenizer_dir: str | None = None
    openai_api: str | None = Field(None, description="transport openai: completions or chat.")
    openai_top_k: int | None = None
    fail_fast_error_rate: float | None = None
    fail_fast_window_s: float = 10.0
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ramp: list[dict[str, Any]] = Field(default_factory=list)
    headers: dict[str, str] = Field(default_factory=dict)
    api_key_env: str | None = Field(None, description="The variable's name; the key itself is never written.")
    extra_body: dict[str, Any] = Field(default_factory=dict)
    ignore_eos: bool = Field(False, description="Outputs forced to their max_tokens (min_tokens; OpenAI also ignore_eos).")
