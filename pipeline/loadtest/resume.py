"""Resuming an interrupted load test: which cells of a run directory are finished and kept, which
are measured again, and the sessions the run was measured in.

A cell (one Locust run: arm x level x repeat) is kept when ``runs.json`` lists it with the server
alive and the run valid, and its records are whole: ``raw/<key>.jsonl`` holds exactly the
``n_records`` the entry says, and the Locust processes' own counts (``raw/<key>.workers.json``)
agree: completed + incomplete == sent. Any other planned cell, including the one a crash or a
signal cut short, is measured again, after its files are removed (a half-written cell is never
used). The plan is the run's own (``run.json``: levels, repeats, draft lengths, arms), in its
order, so a resumed run keeps its A/B interleaving. With ``repeats: auto`` the plan is the repeats
planned so far, and a run whose stopping rule has not stopped is unfinished
(:mod:`pipeline.loadtest.auto_repeats`: the resume replays its looks, then goes on).

This module is the one owner of "is this run finished, and where does it resume" (:func:`is_finished`,
:func:`missing_cells`), for ``loadtest --resume`` and for ``specdeploy run``, which reuses the newest
finished and reported run of its config and resumes the newest unfinished one (:func:`previous_runs`).

Reads ``RUN_DIR/run.json``, ``runs.json`` and the cells' raw files (and, for ``run``, the run
directories under ``reports/NAME/``); removes the files of the cells it measures again. ``run.json``
gets ``sessions`` (one entry per start: when, the gap since the last finished cell), and every
``runs.json`` entry the ``session`` that measured it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import DeploymentConfig, config_hash
from pipeline.loadtest.auto_repeats import pending
from pipeline.loadtest.cells import RunSpec, plan_runs
from pipeline.loadtest.inputs import ARMS, LoadTestUsageError
from pipeline.paths import reports_root

CELL_FILES = ("raw/{key}.jsonl", "raw/{key}.workers.json", "metrics/{key}.json", "logs/{key}.log",
              "settings/{key}.json")


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def cell_complete(run_dir: Path, result: dict) -> bool:
    """Finished, valid, and its records whole (completed + incomplete == sent)."""
    if not (result.get("server_alive") and result.get("valid")):
        return False
    try:
        lines = (run_dir / result["raw"]).read_text(encoding="utf-8").splitlines()
        metas = _read_json(run_dir / result["workers"])
        records = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError, KeyError):
        return False
    sent = sum(m.get("sent", 0) for m in metas) if isinstance(metas, list) else -1
    return 0 < len(records) == result.get("n_records") == sent


def kept_results(run_dir: Path) -> list[dict]:
    """The complete cells of ``runs.json``, in the order they ran (the first entry per key)."""
    try:
        runs = _read_json(run_dir / "runs.json")["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    seen: set[str] = set()
    out = []
    for result in runs:
        if result.get("key") not in seen and cell_complete(run_dir, result):
            seen.add(result["key"])
            out.append({**result, "session": result.get("session", 1)})
    return out


def discard_cell(run_dir: Path, key: str) -> None:
    """Remove whatever a cut-short measurement of ``key`` left (its Locust parts too)."""
    for pattern in CELL_FILES:
        (run_dir / pattern.format(key=key)).unlink(missing_ok=True)
    for part in (run_dir / "raw" / "parts").glob(f"{key}.*"):
        if part.is_dir():
            shutil.rmtree(part)
        else:
            part.unlink(missing_ok=True)


def plan_of(meta: dict, cfg: DeploymentConfig | None = None, repeats: int | None = None) -> list[RunSpec]:
    """The run's own plan (run.json: levels, repeats, draft lengths, arms, A/A), in the order it is
    measured; ``cfg``: the run's config when at hand (else read from run.json), ``repeats``: another
    number of repeats (``repeats: auto`` plans up to its maximum)."""
    cfg = run_config(meta, cfg or DeploymentConfig.model_validate(meta["config"]))
    return plan_runs(cfg, _arms(meta, cfg), meta["concurrency"], meta["repeats"] if repeats is None else repeats,
                     meta.get("sweep_draft_len") or [], aa=bool(meta.get("aa")))


def run_config(meta: dict, cfg: DeploymentConfig) -> DeploymentConfig:
    """``cfg`` as the run measured it: a crossing run (``loadtest --crossing``) adds its ramp, recorded
    in run.json (``crossing.ramp``), to the config it was started with."""
    ramp = (meta.get("crossing") or {}).get("ramp")
    if not ramp or [s.model_dump(exclude_none=True) for s in cfg.loadtest.ramp] == ramp:
        return cfg
    loadtest = type(cfg.loadtest).model_validate({**cfg.loadtest.model_dump(), "ramp": ramp})
    return cfg.model_copy(update={"loadtest": loadtest})


def recorded_arms(run_dir: Path) -> tuple[str, ...] | None:
    """The arms run.json of ``run_dir`` records (None: unreadable, or none recorded)."""
    try:
        arms = _read_json(Path(run_dir) / "run.json").get("arms")
    except (OSError, ValueError, AttributeError):
        return None
    return tuple(arms) if arms else None


def planned_keys(meta: dict) -> list[str]:
    """The cell keys of the run's own plan (run.json), in the order they are measured."""
    return [s.key for s in plan_of(meta)]


def missing_cells(meta: dict, kept: set[str], cfg: DeploymentConfig | None = None) -> list[RunSpec]:
    """The cells of the run's fixed plan not kept, in the plan's order: where the run resumes."""
    return [s for s in plan_of(meta, cfg) if s.key not in kept]


def _arms(meta: dict, cfg: DeploymentConfig) -> tuple[str, ...]:
    return tuple(meta.get("arms") or (ARMS if cfg.speculative else ("baseline",)))


def load_run_to_resume(run_dir: Path, cfg: DeploymentConfig) -> tuple[dict, list[dict]]:
    """(run.json, kept cells) of ``run_dir``; LoadTestError when it is not a run of this config."""
    try:
        meta = _read_json(run_dir / "run.json")
    except (OSError, ValueError):
        raise LoadTestUsageError(f"--resume: {run_dir} has no readable run.json: not a load test to resume") from None
    want = config_hash(cfg)
    if meta.get("config_hash") != want:
        raise LoadTestUsageError(f"--resume: {run_dir} was measured with config hash {meta.get('config_hash')}, this "
                                 f"config's is {want}: resume it with the config it was started with, or start afresh")
    return meta, kept_results(run_dir)


def is_finished(run_dir: Path, meta: dict) -> bool:
    """The one rule of a finished run: every cell of its plan kept (:func:`cell_complete`), and with
    ``repeats: auto`` its stopping rule has stopped. ``loadtest --resume`` measures what this
    leaves out, and ``run`` reuses or resumes by it (:func:`previous_runs`)."""
    kept = {r["key"] for r in kept_results(run_dir)}
    return not missing_cells(meta, kept) and not pending(meta)


@dataclass(frozen=True)
class PreviousRuns:
    """What ``specdeploy run`` finds among the runs of its config (same config hash, both arms as
    ``run`` measures them), decided by :func:`is_finished` alone."""

    resume: Path | None = None  # the newest run, unless finished and reported: finish it (or only its report)
    reuse: Path | None = None  # the newest finished and reported run: nothing to measure


def previous_runs(cfg: DeploymentConfig, arms: tuple[str, ...] | None = None) -> PreviousRuns:
    """The run ``run`` resumes and the one it may reuse. The newest run of this config is resumed
    unless it is finished and reported; the newest finished and reported run is reused (when the
    newest is another process's, ``run`` falls back to it). A run of other arms (``--arm``) is not
    one ``run`` would have measured, and an unreadable run directory is no run. ``arms``: the runs of
    these arms instead (``run --schedule``'s three-arm crossing run)."""
    root = reports_root(cfg)
    want, arms = config_hash(cfg), arms or (ARMS if cfg.speculative else ("baseline",))
    resume = None
    for run_dir in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True) if root.is_dir() else []:
        try:
            meta = _read_json(run_dir / "run.json")
            if meta.get("config_hash") != want or meta.get("aa") or _arms(meta, cfg) != arms:
                continue
            finished = is_finished(run_dir, meta) and (run_dir / "report.json").is_file()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if finished:
            return PreviousRuns(resume=resume, reuse=run_dir)
        resume = resume or run_dir
    return PreviousRuns(resume=resume)


def new_session(meta: dict, kept: list[dict], now_unix: float, now_iso: str) -> int:
    """Record a new session in ``meta`` (run.json); its number. The first session is the run's
    start; a later one records the gap since the last kept cell ended."""
    sessions = meta.setdefault("sessions", [])
    if not sessions and "created" in meta and kept:  # a run from before sessions were recorded
        sessions.append({"session": 1, "started": meta["created"]})
    ended = max((r["started_unix"] + r["seconds"] for r in kept), default=None)
    entry: dict[str, Any] = {"session": len(sessions) + 1, "started": now_iso}
    if sessions:
        entry["resumed"] = True
        entry["kept_cells"] = len(kept)
        entry["gap_s"] = None if ended is None else round(now_unix - ended, 1)
    sessions.append(entry)
    return entry["session"]
