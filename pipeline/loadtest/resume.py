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

Reads ``RUN_DIR/run.json``, ``runs.json`` and the cells' raw files; removes the files of the cells
it measures again. ``run.json`` gets ``sessions`` (one entry per start: when, the gap since the
last finished cell), and every ``runs.json`` entry the ``session`` that measured it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from pipeline.config import DeploymentConfig, config_hash
from pipeline.loadtest.auto_repeats import pending
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


def planned_keys(meta: dict) -> list[str]:
    """The cell keys of the run's own plan (run.json), in the order they are measured."""
    from pipeline.loadtest.runner import plan_runs  # noqa: PLC0415 - the runner imports this module

    cfg = DeploymentConfig.model_validate(meta["config"])
    arms = tuple(meta.get("arms") or (ARMS if cfg.speculative else ("baseline",)))
    return [s.key for s in plan_runs(cfg, arms, meta["concurrency"], meta["repeats"], meta.get("sweep_draft_len") or [],
                                     aa=bool(meta.get("aa")))]


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
    kept = {r["key"] for r in kept_results(run_dir)}
    return set(planned_keys(meta)) <= kept and not pending(meta)


def newest_run(cfg: DeploymentConfig) -> tuple[Path, bool] | None:
    """The newest run directory of this exact config (same config hash) and whether every planned
    cell of it is complete; None when there is none."""
    root = reports_root(cfg)
    if not root.is_dir():
        return None
    want = config_hash(cfg)
    for run_dir in sorted((p for p in root.iterdir() if p.is_dir()), reverse=True):
        try:
            meta = _read_json(run_dir / "run.json")
        except (OSError, ValueError):
            continue
        if meta.get("config_hash") == want:
            try:
                return run_dir, is_finished(run_dir, meta)
            except (KeyError, ValueError, TypeError):
                continue
    return None


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
