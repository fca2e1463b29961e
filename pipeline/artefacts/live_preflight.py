"""``engines/NAME/live-preflight.json``: the live preflight's last outcome on a trtllm host (the
checks passed or failed, or that the user skipped them, with the stage and the time). Written by
:mod:`pipeline.validate.live.gate`; read by the build manifest's provenance (:func:`provenance_line`)
and the gpu_sim tests. Here, beneath build and validate, so the build reads the record without
importing the preflight that writes it. A plain JSON record (no pydantic model, so no ``ARTEFACTS``
entry), as the gate has always written it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.paths import engine_root

if TYPE_CHECKING:
    from pipeline.config import DeploymentConfig

RECORD_NAME = "live-preflight.json"


def record_path(cfg: DeploymentConfig) -> Path:
    return engine_root(cfg) / RECORD_NAME


def read_record(cfg: DeploymentConfig) -> dict[str, Any] | None:
    """The last recorded outcome (for provenance), or None."""
    path = record_path(cfg)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def provenance_line(cfg: DeploymentConfig) -> str:
    """``passed at …`` / ``skipped (--skip-live) at …`` / ``not run`` for a manifest's versions."""
    record = read_record(cfg)
    if record is None:
        return "not run"
    how = f"skipped ({record['by']})" if record["status"] == "skipped" else record["status"]
    return f"{how} before {record['stage']} at {record['at']}"
