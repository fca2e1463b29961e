"""One run, one writer: a load test owns its run directory from the moment it creates or adopts it
until its report is written (:mod:`pipeline.infra.owner_lock`; the lock dies with its owner).

- A new run gets a directory of its own, created atomically: two load tests of one config started
  in the same second get ``<stamp>`` and ``<stamp>-2``, never one directory between them.
- ``--resume RUN_DIR`` adopts a run only when its owner is gone; a live owner makes it refuse
  with the owner's pid and command (:class:`~pipeline.infra.owner_lock.DirectoryBusy`, exit code
  5: nothing is wrong with the command, it succeeds once the owner has ended).
- ``specdeploy run`` never picks a live run to resume or reuse (:func:`live_owner`); it measures
  into a new run of its own and says whose run it left alone (pipeline/run.py).
- ``specdeploy report RUN_DIR`` does not write a report into a run that is being measured (its
  owner writes it when the run ends).

Cells are deleted (a cut-short cell before it is measured again) only by the run's owner.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from pipeline.infra import owner_lock
from pipeline.infra.owner_lock import LOCK_NAME, DirectoryBusy, Owner
from pipeline.loadtest.inputs import LoadTestError, LoadTestUsageError

SUBDIRS = ("raw/parts", "settings", "metrics", "logs")
MEASURING = "measuring a load test"


def live_owner(run_dir: Path) -> Owner | None:
    """Who is measuring ``run_dir`` now (this process included); None when nobody is."""
    return owner_lock.owner_of(run_dir)


def claim_to_resume(run_dir: Path) -> None:
    """Own ``run_dir`` to finish it; DirectoryBusy while its owner is alive. (A path that is not a
    directory is left to the resume checks, which say what it is not.)"""
    if run_dir.is_dir():
        owner_lock.claim(run_dir, MEASURING, advice=(
            "a run directory has one writer: wait for that run to end, or start a new run (without --resume)"))


def new_run_dir(root: Path, out_dir: str | Path | None, created: datetime) -> Path:
    """Create and own the directory of a new run: ``out_dir`` (which must be empty, or only
    hold a dead owner's lock file), or ``<root>/<UTC stamp>`` (``-2``, ``-3``… when another run
    took that name first)."""
    if out_dir:
        run_dir = Path(out_dir).resolve()  # locust runs with another working directory
        run_dir.mkdir(parents=True, exist_ok=True)
        owner_lock.claim(run_dir, MEASURING, advice="choose another --out")
        if any(p.name != LOCK_NAME for p in run_dir.iterdir()):
            raise LoadTestUsageError(f"--out: {run_dir} exists and is not empty")
    else:
        root.mkdir(parents=True, exist_ok=True)
        stamp = created.strftime("%Y%m%dT%H%M%SZ")
        for n in range(1, 1000):
            run_dir = (root / (stamp if n == 1 else f"{stamp}-{n}")).resolve()
            try:
                run_dir.mkdir()  # atomic: exactly one process creates a given name
            except FileExistsError:
                continue
            owner_lock.claim(run_dir, MEASURING)
            break
        else:  # pragma: no cover - a thousand runs of one config started in one second
            raise LoadTestError(f"could not create a new run directory under {root}")
    for sub in SUBDIRS:
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return run_dir


__all__ = ["DirectoryBusy", "claim_to_resume", "live_owner", "new_run_dir"]
