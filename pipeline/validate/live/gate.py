"""``build`` / ``serve`` / ``run`` on ``backend: trtllm``: the live preflight first, unless
``--skip-live``; the outcome is recorded for provenance.

Reads what :func:`pipeline.validate.live.run_live_preflight` reads. Writes
``engines/NAME/live-preflight.json`` (:mod:`pipeline.artefacts.live_preflight`: the checks, or that the user skipped them, with the time),
which the build manifest and the load test's provenance quote. Raises
:class:`~pipeline.errors.PreflightError` (one line per failed check, each with its fix) before
anything is built or started.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pipeline.artefacts.live_preflight import record_path
from pipeline.config import DeploymentConfig
from pipeline.errors import EXIT_FAILURE, PreflightError
from pipeline.validate.live import failures, run_live_preflight
from pipeline.validate.live.table import print_checks


def _write(cfg: DeploymentConfig, record: dict[str, Any]) -> None:
    path = record_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def require_live(cfg: DeploymentConfig, *, skip: bool, stage: str, trtllm_root: str | None = None,
                 console=None) -> dict[str, Any] | None:
    """Run the live preflight before ``stage`` (trtllm backend only); None for the CPU backend."""
    if cfg.backend != "trtllm":
        return None
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if skip:
        record = {"status": "skipped", "by": "--skip-live", "stage": stage, "at": when}
        _write(cfg, record)
        return record
    checks = run_live_preflight(cfg, trtllm_root)
    failed = failures(checks)
    record = {"status": "failed" if failed else "passed", "stage": stage, "at": when,
              "checks": [c.to_dict() for c in checks]}
    _write(cfg, record)
    if failed:
        if console is not None:
            print_checks(cfg, checks, console)
        raise PreflightError([f"live preflight: {c.line()}" for c in failed]
                             + ["(to start anyway: --skip-live; it is recorded in the provenance)"], exit_code=EXIT_FAILURE)
    return record
