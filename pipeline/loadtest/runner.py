"""`specdeploy loadtest`: speculative vs baseline under a concurrency sweep, measured with Locust.

Reads the config (``loadtest`` and ``gate`` sections), the dataset (``loadtest.dataset_path`` or ``prompts``), the
build manifest (tokenizer for the optional re-tokenized cross-check) and either starts both arms'
Triton servers as ``render`` placed them (:mod:`pipeline.loadtest.endpoints`) or uses endpoints the
user gives.
Then, for each repeat × concurrency × arm (arms interleaved A B A B), it runs Locust headless
**as a subprocess** (gevent never enters this process) and writes into RUN_DIR:
``run.json`` (provenance), ``runs.json`` (one entry per Locust run: validity, server liveness,
the server's acceptance over the run, peak server RSS, the exact command), ``raw/<arm>-c<conc>-r<rep>.jsonl``
(raw per-request records, merged from each Locust process), ``settings/`` (what each Locust run
was told), ``metrics/`` (the servers' acceptance scrapes before/after, and the run's figures) and
``logs/``. At the end it calls ``pipeline.report.builder.make_report``. The cells and their order are
:mod:`~pipeline.loadtest.cells`'s; what each arm is, its deployment descriptor as ``render`` wrote it.
Inputs are checked in
:mod:`~pipeline.loadtest.inputs`, acceptance read by :mod:`~pipeline.loadtest.acceptance_sources`,
memory and CPU sampled by :mod:`~pipeline.loadtest.server_metrics`, ``run.json``'s provenance
assembled by :mod:`~pipeline.loadtest.provenance`.

Load bigger than one host: run Locust workers elsewhere with
``locust -f locustfiles/locustfile.py --worker --master-host H`` (same settings file via
``SPECDEPLOY_LOADTEST_CONFIG``) and a ``--master --expect-workers N`` here; every worker writes its
own raw file (PID in the name), merged afterwards — never subtract times across processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pipeline.artefacts.deployment import ALL_ARMS, SCHEDULED, ArmDeployment, load_arm
from pipeline.artefacts.runs import RunInfo, RunResults, RunSettings
from pipeline.config import DeploymentConfig, config_hash
from pipeline.errors import StaleInputError
from pipeline.infra import owner_lock
from pipeline.infra.atomic import write_json_atomic
from pipeline.infra.cpu_pinning import spawn_on
from pipeline.infra.processes import spawn
from pipeline.loadtest import acceptance_sources, auto_repeats, fail_fast, harness, ownership, reach
from pipeline.loadtest import resume as resume_run
from pipeline.loadtest.cells import RunSpec
from pipeline.loadtest.crossing import crossing_ramp, thresholds
from pipeline.loadtest.endpoints import (
    ArmEndpoint,
    ManagedEndpoints,
    arm_deployments,
    managed_endpoints,
    remote_endpoint,
    require_reachable,
)
from pipeline.loadtest.inputs import (
    ARMS,
    LoadTestUsageError,
    check_forced_lengths,
    check_sweep,
    load_prompt_set,
)
from pipeline.loadtest.provenance import run_metadata, served_tokenizer_dir
from pipeline.loadtest.server_metrics import CpuSampler, RssSampler
from pipeline.paths import PROJECT_ROOT, reports_root
from pipeline.report.builder import make_report

LOCUSTFILE = PROJECT_ROOT / "locustfiles" / "locustfile.py"
RAMP_SHAPE = PROJECT_ROOT / "locustfiles" / "ramp_shape.py"
PATTERN_MARGIN_S = 3
LOCUST_STOP_S = 5.0  # SIGTERM → SIGKILL for a Locust run that overran or was interrupted
USER_CLASSES = {("grpc", "closed"): "GrpcStreamUser", ("http", "closed"): "HttpStreamUser",
                ("openai", "closed"): "OpenAIStreamUser", ("grpc", "open"): "GrpcOpenLoopUser",
                ("http", "open"): "HttpOpenLoopUser", ("openai", "open"): "OpenAIOpenLoopUser"}


# Why A/A measures the one baseline server as two interleaved arms rather than a second copy of it:
# the paired intervals face the noise between two runs close in time on one rig, and that is what
# an A/A of one server measures, at the cost of one server; a second copy would add its own
# placement (other cores, a cold cache) that the A/B's baseline never has.
AA_DESIGN = ("the baseline server measured as two interleaved arms (A = baseline, B = the same server again, "
             "recorded as the 'speculative' arm): the run-to-run and request-level noise of this rig")

# ------------------------------------------------------------------------------------------------
# One Locust run (the plan of cells: pipeline.loadtest.cells)


def locust_command(cfg: DeploymentConfig, spec: RunSpec, duration_s: float,
                   master: tuple[str, int] | None = None) -> list[str]:
    """The Locust command of one cell; ``master``: its RPC address with processes ≥ 2
    (:func:`pipeline.loadtest.harness.master_address`; loopback unless configured)."""
    lt = cfg.loadtest
    users = 1 if lt.mode == "open" else spec.concurrency
    # a closed-loop ramp: Locust's own load shape sets the users step by step (locustfiles/ramp_shape.py)
    files = f"{LOCUSTFILE},{RAMP_SHAPE}" if lt.ramp and lt.mode == "closed" else str(LOCUSTFILE)
    # a ramp or trace ends with its schedule, not with Locust's timer, which starts before the
    # dispatcher (measured: about a second earlier on a busy host): the timer gets a margin the schedule never uses
    margin = PATTERN_MARGIN_S if spec.level else 0  # a closed-loop ramp: its load shape ends the run
    argv = [sys.executable, "-m", "locust", "-f", files, "--headless", "-u", str(users), "-r", str(users),
            "-t", f"{locust_seconds(duration_s) + margin}s", "--stop-timeout", f"{lt.stop_timeout_s:g}", "--only-summary",
            "--loglevel", "WARNING", "--exit-code-on-error", "0"]
    if lt.processes > 1:
        argv += ["--processes", str(lt.processes), *harness.master_args(master)]
    argv.append(USER_CLASSES[(lt.transport, lt.mode)])
    return argv


def locust_seconds(duration_s: float) -> int:
    """Locust's --run-time takes whole seconds only."""
    return max(1, int(round(duration_s)))


def run_settings(cfg: DeploymentConfig, spec: RunSpec, endpoint: ArmEndpoint, run_dir: Path, run_id: str,
                 prompts: list[dict], duration_s: float, warmup_s: float, tokenizer_dir: str | None) -> dict[str, Any]:
    lt = cfg.loadtest
    extra = dict(endpoint.extra_inputs)
    # as render decided the arm; a server with no deployment config takes no draft length
    per_request = endpoint.deployment is not None and endpoint.deployment.per_request_draft_len
    if spec.arm == "speculative" and spec.draft_len is not None and per_request:
        extra["num_draft_tokens"] = spec.draft_len
    sampling = lt.sampling
    return {
        "run_id": run_id, "arm": spec.arm, "repeat": spec.repeat, "endpoint": endpoint.url,
        "model_name": endpoint.model_name, "contract": endpoint.deployment.contract if endpoint.deployment else "ensemble",
        "transport": lt.transport, "mode": lt.mode,
        "concurrency": spec.concurrency, "target_rate": spec.target_rate, "arrival": lt.arrival,
        "burstiness": lt.burstiness, "max_concurrency": lt.max_concurrency,
        "ramp": [step.model_dump(exclude_none=True) for step in lt.ramp],
        # the key's variable NAME only: the Locust process reads the key from its environment
        # header values travel in the Locust process's environment (reach.HEADERS_ENV), like the key
        "headers": {name: reach.REDACTED for name in lt.headers}, "api_key_env": reach.api_key_env(lt),
        "extra_body": dict(lt.extra_body),
        "prompts": prompts, "max_tokens": lt.max_tokens,
        "sampling": {"top_k": sampling.top_k, "top_p": sampling.top_p, "temperature": sampling.temperature,
                     "seed": sampling.seed},
        "extra_inputs": extra, "seed": lt.seed, "output_prefix": str(run_dir / "raw" / "parts" / spec.key),
        "warmup_s": warmup_s, "duration_s": duration_s, "request_timeout_s": max(60.0, lt.stop_timeout_s * 4),
        "stop_timeout_s": lt.stop_timeout_s, "num_workers": lt.processes, "draft_len": spec.draft_len,
        "tokenizer_dir": tokenizer_dir, "openai_api": lt.openai_api, "openai_top_k": lt.openai_top_k,
        "fail_fast_error_rate": lt.fail_fast_error_rate, "fail_fast_window_s": lt.fail_fast_window_s,
        "ignore_eos": lt.ignore_eos,
    }


def merge_parts(run_dir: Path, key: str) -> tuple[int, list[dict]]:
    """Concatenate every process's raw file into raw/<key>.jsonl; collect worker metas."""
    parts = sorted((run_dir / "raw" / "parts").glob(f"{key}.*.jsonl"))
    out = run_dir / "raw" / f"{key}.jsonl"
    n = 0
    with open(out, "w", encoding="utf-8") as fh:
        for part in parts:
            for line in part.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    fh.write(line + "\n")
                    n += 1
    metas = [json.loads(p.read_text()) for p in sorted((run_dir / "raw" / "parts").glob(f"{key}.*.meta.json"))]
    (run_dir / "raw" / f"{key}.workers.json").write_text(json.dumps(metas, indent=1), encoding="utf-8")
    return n, metas


def execute_run(cfg: DeploymentConfig, spec: RunSpec, endpoint: ArmEndpoint, run_dir: Path, run_id: str,
                prompts: list[dict], duration_s: float, warmup_s: float, tokenizer_dir: str | None) -> dict[str, Any]:
    settings = run_settings(cfg, spec, endpoint, run_dir, run_id, prompts, duration_s, warmup_s, tokenizer_dir)
    settings_path = run_dir / "settings" / f"{spec.key}.json"
    settings_path.write_text(json.dumps(RunSettings.checked(settings), indent=1), encoding="utf-8")
    argv = locust_command(cfg, spec, duration_s, harness.master_address(cfg.loadtest.processes))
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(settings_path), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", reach.HEADERS_ENV: json.dumps(cfg.loadtest.headers)}
    before = acceptance_sources.scrape(endpoint.metrics_url)
    log_path = run_dir / "logs" / f"{spec.key}.log"
    timeout_s = duration_s + PATTERN_MARGIN_S + cfg.loadtest.stop_timeout_s + 90
    started = time.time()
    timed_out = False
    with RssSampler(endpoint.pid) as rss, open(log_path, "w", encoding="utf-8") as log:
        with spawn_on(endpoint.client_cpus):
            # under a keeper: Locust and its worker processes end with this process at the latest
            proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(PROJECT_ROOT),
                         grace_s=LOCUST_STOP_S)
        cpu = CpuSampler(proc.pid)
        try:
            exit_code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.stop(LOCUST_STOP_S)
            exit_code = proc.wait()
        except BaseException:  # Ctrl-C: stop Locust now rather than when this process ends
            proc.stop(LOCUST_STOP_S)
            raise
        client_cpu_s = cpu.stop()
    after = acceptance_sources.scrape(endpoint.metrics_url)
    alive = endpoint.alive() if endpoint.alive else True
    n_records, metas = merge_parts(run_dir, spec.key)
    acceptance = acceptance_sources.run_delta(before, after)
    delta = acceptance_sources.legacy_delta(acceptance)
    (run_dir / "metrics" / f"{spec.key}.json").write_text(
        json.dumps({"before": before, "after": after, "delta": delta, "acceptance": acceptance}, indent=1),
        encoding="utf-8")
    reasons = []
    if not alive:
        reasons.append("server not alive (or the model not ready) after the run")
    if timed_out:
        reasons.append(f"locust did not finish within {timeout_s:.0f}s (killed)")
    if exit_code not in (0, 1) and not timed_out:
        reasons.append(f"locust exited with {exit_code}")
    if n_records == 0:
        reasons.append("no raw records")
    harness_fault = harness.fault(exit_code, timed_out, n_records, alive, log_path)
    if harness_fault:
        reasons.append(f"load harness: {harness_fault}")
    stopped = fail_fast.read_abort(run_dir, spec.key)
    if stopped:
        reasons.append(f"stopped early: {stopped['errors']} of the first {stopped['finished']} requests failed")
    return {
        "key": spec.key, "arm": spec.arm, "concurrency": spec.concurrency, "target_rate": spec.target_rate,
        "repeat": spec.repeat, "draft_len": spec.draft_len, "raw": f"raw/{spec.key}.jsonl",
        "workers": f"raw/{spec.key}.workers.json", "settings": f"settings/{spec.key}.json",
        "log": f"logs/{spec.key}.log", "metrics": f"metrics/{spec.key}.json", "metrics_delta": delta,
        "server_acceptance": acceptance,
        "server_alive": alive, "valid": not reasons, "invalid_reasons": reasons, "locust_exit_code": exit_code,
        "n_records": n_records, "sent": sum(m.get("sent", 0) for m in metas), "peak_rss_mb": rss.peak_mb,
        "started_unix": started, "seconds": time.time() - started, "command": argv, "level": spec.level,
        "client_cpu_s": client_cpu_s, "client_cpus": list(endpoint.client_cpus) if endpoint.client_cpus else None,
        "client_cpu_fraction": client_cpu_s / max(1e-9, (time.time() - started) * cfg.loadtest.processes),
        "server_log_tail": endpoint.log_tail(30) if (not alive and endpoint.log_tail) else None,
        "stopped_early": stopped, "harness_fault": harness_fault,
    }


# ------------------------------------------------------------------------------------------------
# Entry point


def _parse_duration(value: str | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", value)
    if not match:
        raise LoadTestUsageError(f"--duration: '{value}' is not a duration like 20s, 2m or 1.5h")
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[match.group(2)]
    return float(match.group(1)) * scale


@owner_lock.holding(hand_up=True)  # the run dir is this process's until the report: pipeline/loadtest/ownership.py
def run_loadtest(
    cfg: DeploymentConfig,
    *,
    out_dir: str | Path | None = None,
    concurrency: list[int] | None = None,
    duration: str | float | None = None,
    repeats: int | None = None,
    sweep_draft_len: list[int] | None = None,
    endpoint_baseline: str | None = None,
    endpoint_speculative: str | None = None,
    arm: str | None = None,
    progress: bool = True,
    report: bool = True,
    given_endpoints: dict[str, ArmEndpoint] | None = None,
    tokenizer_dir: str | None = None,
    meta_extra: dict[str, Any] | None = None,
    resume: str | Path | None = None,
    aa: bool = False,
    arms: tuple[str, ...] | None = None,
    crossing: bool = False,
    crossing_step_s: float | None = None,
) -> Path:
    """Run the whole load test; returns RUN_DIR (then the report is in it when ``report``).
    ``given_endpoints`` (with ``tokenizer_dir`` and ``meta_extra`` for run.json): arms served by
    someone else, as :mod:`pipeline.loadtest.endpoints_only` builds them. ``resume``: an
    interrupted RUN_DIR of this config to finish (:mod:`pipeline.loadtest.resume`): its plan, its
    complete cells kept, the others measured again, in the plan's order. ``aa``: an A/A run of the
    rig (:data:`AA_DESIGN`): the baseline against itself, under RUN_DIR ``aa/`` by default. ``arms``: the
    arms to interleave (with ``scheduled``, the arm ``render --schedule`` rendered; a resumed run keeps
    its own); ``crossing``: a closed-loop ramp across the scheduled arm's thresholds on every arm
    (:mod:`pipeline.loadtest.crossing`), ``crossing_step_s`` seconds per step."""
    if aa and (arm or endpoint_speculative or sweep_draft_len or arms or crossing):
        raise LoadTestUsageError("--aa measures the baseline against itself: drop --arm, --arms, --crossing, "
                                 "--endpoint-speculative and --sweep-draft-len")
    if resume is not None and arms is None and arm is None:  # a resumed run keeps its own arms
        arms = resume_run.recorded_arms(Path(resume))
    arms = _arms_to_run(cfg, "baseline" if aa else arm, endpoint_baseline, None if aa else endpoint_speculative, arms)
    if crossing and SCHEDULED not in arms:
        arms = (*arms, SCHEDULED)  # the ramp is the scheduled arm's: it runs beside the others
    lt = cfg.loadtest
    reach.api_key_env(lt)  # a named key variable that is unset stops here, before any server starts
    prompts, dataset = load_prompt_set(cfg, tokenizer_dir or served_tokenizer_dir(cfg))
    if lt.mode == "open" and lt.arrival == "trace" and not any(p.get("arrival_s") is not None for p in prompts):
        raise LoadTestUsageError("arrival: trace replays each request's arrival_s: the dataset carries none "
                                 "(use a trace file, docs/arrivals-and-goodput.md)")
    # what each arm is, as render wrote it: a missing or stale descriptor stops here, before any run dir
    deployments = ({a: e.deployment for a, e in given_endpoints.items()} if given_endpoints is not None
                   else arm_deployments(cfg, arms, remote=bool(endpoint_baseline or endpoint_speculative)))
    check_forced_lengths(cfg, deployments)
    serve_cfg, base_hash = cfg, config_hash(cfg)  # the config as rendered: the servers' descriptors carry its hash
    if crossing and resume is None:
        cfg = crossing_config(cfg, deployments, crossing_step_s)
    lt = cfg.loadtest
    now = datetime.now(timezone.utc)
    if resume is not None:
        run_dir = Path(resume).resolve()
        ownership.claim_to_resume(run_dir)  # only a run whose owner is gone
        meta, results = resume_run.load_run_to_resume(run_dir, cfg)
        cfg = resume_run.run_config(meta, cfg)  # a crossing run's ramp is the run's own
        lt = cfg.loadtest
        aa = bool(meta.get("aa"))
        concurrency, repeats, sweep = meta["concurrency"], meta["repeats"], meta.get("sweep_draft_len") or []
        duration_s, warmup_s, run_id = meta["duration_s"], meta["warmup_s"], meta["run_id"]
        if tuple(meta.get("arms") or ARMS) != (ARMS if aa else arms):
            raise LoadTestUsageError(f"--resume: {run_dir} measures the arms {meta['arms']}, these options "
                                     f"{list(arms)}: pass the --arm / --endpoint-* options it was started with")
        for name in ("report.json", "report.md", "report.html"):  # a report of the unfinished run
            (run_dir / name).unlink(missing_ok=True)
        tokenizer_dir = meta.get("tokenizer_dir") or tokenizer_dir or served_tokenizer_dir(cfg)
    else:
        concurrency = sorted(set(concurrency)) if concurrency else list(lt.concurrency)
        # a ramp lasts its steps together (loadtest.run_seconds)
        duration_s = float(locust_seconds(_parse_duration(duration) or lt.run_seconds))
        warmup_s = min(lt.warmup_s, duration_s / 2)
        repeats = repeats or lt.repeats
        sweep = [] if aa else sorted(set(sweep_draft_len)) if sweep_draft_len else list(lt.sweep_draft_len)
        check_sweep(cfg, sweep, deployments.get("speculative"))
        run_dir = _new_run_dir(cfg, out_dir, now, aa=aa)
        # the directory's name when it is the stamp: unique (a same-second run gets `-2`), as records need
        run_id = f"{cfg.name}-{run_dir.name if out_dir is None else now.strftime('%Y%m%dT%H%M%SZ')}"
        tokenizer_dir = tokenizer_dir or served_tokenizer_dir(cfg)
        auto = auto_repeats.is_auto(repeats)
        meta = {**run_metadata(cfg, run_id, now, dataset, sweep, concurrency, duration_s, warmup_s,
                               0 if auto else repeats, tokenizer_dir), **(meta_extra or {}),
                "arms": list(ARMS if aa else arms), "config_hash": base_hash}
        if lt.ramp and crossing:
            meta["crossing"] = {"ramp": [step.model_dump(exclude_none=True) for step in lt.ramp],
                                "thresholds": thresholds(deployments[SCHEDULED].draft_len_schedule or [])}
        if SCHEDULED in arms:  # the schedule the arm ran, beside its records
            meta["schedule"] = copy_schedule(deployments[SCHEDULED], run_dir)
        if aa:
            meta.update({"aa": {"design": AA_DESIGN, "served": "baseline"}, "primary_draft_len": None,
                         "method": f"A/A of the baseline ({cfg.method} config)", "draft_model": None})
        if auto:  # repeats grows as the looks ask for more (auto_repeats)
            meta["repeats_auto"] = auto_repeats.plan(cfg)
        results = []
    kept = {r["key"] for r in results}
    specs, total = _planned_specs(cfg, kept, results, meta, run_dir)
    harness.master_address(lt.processes)  # a taken Locust RPC port stops here, before any server or cell
    if specs:  # else every cell was kept: nothing to serve or measure, only the report is missing
        _measure(cfg, specs, results, meta, run_dir, run_id, prompts, duration_s, warmup_s, tokenizer_dir,
                 progress, given_endpoints, arms, endpoint_baseline, endpoint_speculative,
                 resume_run.new_session(meta, results, now.timestamp(), now.isoformat()), total, serve_cfg)
    if report:

        make_report(run_dir, cfg)
    return run_dir


def _planned_specs(cfg, kept: set[str], results: list[dict], meta: dict,
                   run_dir: Path) -> tuple[Iterable[RunSpec] | None, int]:
    """The cells still to measure and how many at most, from the run's own plan (run.json, as
    :mod:`pipeline.loadtest.resume` reads it): the fixed plan's missing cells, or for ``repeats: auto``
    the stopping rule's repeats (a generator; :mod:`pipeline.loadtest.auto_repeats`). None when there
    is nothing to measure."""
    if not meta.get("repeats_auto"):
        specs = resume_run.missing_cells(meta, kept, cfg)
        return specs or None, len(specs)
    if not auto_repeats.pending(meta):
        return None, 0  # the run already stopped (its looks are in run.json)
    every = resume_run.plan_of(meta, cfg, repeats=meta["repeats_auto"]["max_repeats"])
    specs = auto_repeats.auto_specs(lambda r: [s for s in every if s.repeat == r], kept, results, meta, run_dir, cfg,
                                    lambda: _write_json(run_dir / "run.json", RunInfo.checked(meta)))
    return specs, len([s for s in every if s.key not in kept])


def _measure(cfg, specs: Iterable[RunSpec], results, meta, run_dir, run_id, prompts, duration_s, warmup_s,
             tokenizer_dir, progress, given_endpoints, arms, endpoint_baseline, endpoint_speculative, session: int,
             total: int | None = None, serve_cfg: DeploymentConfig | None = None) -> None:
    """Measure ``specs`` in order (after the kept ``results``), rewriting runs.json after each. ``specs``
    may be a generator that decides what to measure next from the results so far (repeats: auto)."""

    def measure(s: RunSpec) -> dict:
        resume_run.discard_cell(run_dir, s.key)  # what a cut-short measurement left
        # A/A: the second arm is the baseline's own server, measured as a second interleaved arm
        endpoint = endpoints["baseline" if meta.get("aa") else s.arm]
        return execute_run(cfg, s, endpoint, run_dir, run_id, prompts, duration_s, warmup_s, tokenizer_dir)

    _write_json(run_dir / "run.json", RunInfo.checked(meta))
    endpoints_cm = (contextlib.nullcontext({a: e for a, e in given_endpoints.items() if a in arms})
                    if given_endpoints is not None else _endpoints(serve_cfg or cfg, arms, endpoint_baseline,
                                                                   endpoint_speculative))
    with endpoints_cm as endpoints:
        meta["endpoints"] = _endpoints_provenance(endpoints)
        _write_json(run_dir / "run.json", RunInfo.checked(meta))
        for _spec, result in _iterate(specs, progress, measure, total):
            results.append({**result, "session": session})
            meta["commands"].append(" ".join(result["command"]))
            _write_json(run_dir / "runs.json", RunResults.checked({"runs": results}))
            if result["harness_fault"]:  # Locust broke, not the server: a pipeline failure, never a verdict
                raise harness.LoadHarnessError(f"the load generator failed in cell {result['key']}: "
                                               f"{result['harness_fault']} (log {run_dir / result['log']})")
            if not result["server_alive"] or result["stopped_early"]:
                break  # a dead server invalidates the rest; the report can never be GO
        meta["endpoints"] = _endpoints_provenance(endpoints)  # restarts and reported KV capacity
    # a server that died is the dead-server case (a report, never a GO); one that answers with errors stops here
    stopped = next((r for r in results if r["stopped_early"] and r["server_alive"]), None)
    if stopped:
        meta["stopped_early"] = {"run": stopped["key"], "arm": stopped["arm"], **stopped["stopped_early"]}
    _write_json(run_dir / "run.json", RunInfo.checked(meta))
    if stopped:  # nothing can succeed: no report, a distinct exit code, the server's words
        raise fail_fast.LoadTestStopped(stopped["arm"], stopped["key"], stopped["stopped_early"], run_dir)


def _arms_to_run(cfg: DeploymentConfig, arm: str | None, endpoint_baseline: str | None,
                 endpoint_speculative: str | None, chosen: tuple[str, ...] | None = None) -> tuple[str, ...]:
    if arm is not None and arm not in ALL_ARMS:
        raise LoadTestUsageError(f"--arm: expected one of {ALL_ARMS}, got '{arm}'")
    if chosen is not None:
        bad = [a for a in chosen if a not in ALL_ARMS]
        if bad or not chosen or len(set(chosen)) != len(chosen):
            raise LoadTestUsageError(f"--arms: expected distinct arms among {ALL_ARMS}, got {list(chosen)}")
        if arm is not None:
            raise LoadTestUsageError("give --arm or --arms, not both")
        if SCHEDULED in chosen and (endpoint_baseline or endpoint_speculative):
            raise LoadTestUsageError("the scheduled arm is served here (render --schedule): drop --endpoint-*")
    arms: tuple[str, ...] = (arm,) if arm else tuple(chosen) if chosen else ARMS
    if not cfg.speculative and "speculative" in arms and not (endpoint_speculative or arm):
        raise LoadTestUsageError("speculation.method is 'none': there is no speculative arm to compare")
    if endpoint_baseline or endpoint_speculative:
        missing = [a for a in arms if not {"baseline": endpoint_baseline, "speculative": endpoint_speculative}[a]]
        if missing:
            raise LoadTestUsageError(f"no endpoint for arm(s) {missing}: pass --endpoint-{missing[0]} (or --arm)")
    return arms


def default_arms(cfg: DeploymentConfig) -> tuple[str, ...] | None:
    """The arms ``loadtest CONFIG`` measures when none is named: the three when the scheduled arm is
    rendered from this config (``render --schedule``), else None (the A/B arms)."""

    if not cfg.speculative:
        return None
    try:
        load_arm(cfg, SCHEDULED)
    except StaleInputError:
        return None
    return ALL_ARMS


def crossing_config(cfg: DeploymentConfig, deployments: dict, step_s: float | None) -> DeploymentConfig:
    """``cfg`` with ``loadtest.ramp`` the closed-loop ramp across the scheduled arm's thresholds
    (:func:`pipeline.loadtest.crossing.crossing_ramp`), checked as the YAML would be."""
    scheduled = deployments.get(SCHEDULED)
    if scheduled is None or not scheduled.draft_len_schedule:
        raise LoadTestUsageError("--crossing builds its ramp from the scheduled arm's schedule: render it first "
                                 "(specdeploy render CONFIG --schedule RUN_DIR/schedule.json)")
    if cfg.loadtest.mode != "closed":
        raise LoadTestUsageError("--crossing is a closed-loop ramp of users (loadtest.mode: closed)")
    max_users = (cfg.reference.max_batch_size if cfg.backend == "reference" and cfg.reference.max_batch_size
                 else cfg.build.max_batch_size)
    ramp = crossing_ramp(scheduled.draft_len_schedule, max_users, step_s or cfg.loadtest.duration_s)  # a step is a level
    loadtest = type(cfg.loadtest).model_validate({**cfg.loadtest.model_dump(), "ramp": ramp})
    return cfg.model_copy(update={"loadtest": loadtest})


def copy_schedule(scheduled: ArmDeployment, run_dir: Path) -> dict:
    """``RUN_DIR/schedule.json``: the schedule the scheduled arm was rendered from (its content for run.json)."""
    source = Path(scheduled.schedule_path or "")
    if not source.is_file():
        raise LoadTestUsageError(f"the scheduled arm's schedule {source} is gone: re-run `specdeploy render --schedule`")
    data = json.loads(source.read_text(encoding="utf-8"))
    if source.resolve() != (run_dir / "schedule.json").resolve():
        write_json_atomic(run_dir / "schedule.json", data, indent=1)
    return data


def _new_run_dir(cfg: DeploymentConfig, out_dir: str | Path | None, created: datetime, aa: bool = False) -> Path:
    # created and owned by this process; an A/A of the rig under reports/NAME/aa/, beside the A/B runs
    return ownership.new_run_dir(reports_root(cfg) / "aa" if aa else reports_root(cfg), out_dir, created)


def _endpoints(cfg: DeploymentConfig, arms: tuple[str, ...], endpoint_baseline: str | None,
               endpoint_speculative: str | None):
    """The arms' endpoints as a context manager: the user's URLs, or servers started here."""
    if endpoint_baseline or endpoint_speculative:
        remote = {a: remote_endpoint(cfg, a, url) for a, url in (("baseline", endpoint_baseline),
                                                                 ("speculative", endpoint_speculative)) if url and a in arms}
        require_reachable(remote)
        return contextlib.nullcontext(remote)
    return managed_endpoints(cfg, arms)


def _endpoints_provenance(endpoints) -> dict[str, dict[str, Any]]:
    if isinstance(endpoints, ManagedEndpoints):
        return endpoints.provenance()
    return {a: {"url": e.url, "model": e.model_name, "extra_inputs": e.extra_inputs, "metrics_url": e.metrics_url,
                "placement": None, "served": "by the user (--endpoint-*)"} for a, e in endpoints.items()}


def _iterate(specs: Iterable[RunSpec], progress: bool, fn: Callable[[RunSpec], dict],
             total: int | None = None) -> Iterator[tuple[RunSpec, dict]]:
    if not progress:
        for spec in specs:
            yield spec, fn(spec)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415 - start-up: rich (the progress bar, shown only on a terminal)

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("load test", total=total)  # at most: repeats: auto may stop earlier
        for spec in specs:
            bar.update(task, description=f"run {spec.key}")
            result = fn(spec)
            status = "ok" if result["valid"] else "INVALID: " + "; ".join(result["invalid_reasons"])
            bar.console.print(f"  {spec.key}: {result['n_records']} records, {status}")
            bar.advance(task)
            yield spec, result


def _write_json(path: Path, data: Any) -> None:
    write_json_atomic(path, data, indent=1, default=str)
