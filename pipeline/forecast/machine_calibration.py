"""This machine's CPU calibration for a deployment config: made by ``forecast --calibrate`` and,
when none is stored, by ``specdeploy run`` before its load test, so a CPU run's report can check
the forecast against the measurement.

Reads the config, the stored calibrations (:func:`pipeline.forecast.cpu.stored_device`) and,
through :mod:`pipeline.forecast.calibration_prompts`, the config's load-test prompts and the
target's tokenizer; microbenchmarks the reference engine (:func:`pipeline.forecast.cpu.calibrate`)
and writes the result under ``$SPECDEPLOY_FORECAST_HOME`` (:func:`pipeline.forecast.cpu.store`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pipeline.engine_bench import proposer_spec, resolve_checkpoint
from pipeline.forecast import cpu
from pipeline.forecast.calibration_prompts import config_prompt_groups
from pipeline.forecast.figures import ForecastInputError
from pipeline.forecast.proposers import PLANS


def calibrate_config(cfg) -> tuple[Path, dict]:
    """Calibrate the config's target, draft and proposer on this machine, timed on the config's
    load-test prompts (synthetic ones when those cannot be used); store it. Returns (the file it
    is stored in, the calibration)."""

    if cfg.hardware != "cpu":
        raise ForecastInputError(f"--calibrate: {cfg.name} runs on {cfg.hardware}; only the CPU reference engine is calibrated")
    draft = resolve_checkpoint(cfg.draft.checkpoint) if cfg.draft is not None else None
    groups, described = config_prompt_groups(cfg)
    calibration = cpu.calibrate(resolve_checkpoint(cfg.target.checkpoint), draft, threads=cfg.reference.threads,
                                proposer=proposer_spec(cfg), prompt_groups=groups)
    calibration["prompts"] = described  # calibrate's own wording cannot tell load-test prompts from others
    return cpu.store(calibration, cpu.calibration_key(cfg)), calibration


def not_needed(cfg) -> str | None:
    """Why the config needs no CPU calibration (None: it needs one)."""

    if cfg.hardware != "cpu":
        return f"hardware {cfg.hardware}: the forecast uses its hardware and engine figures"
    if cfg.method not in PLANS:
        return f"speculation method {cfg.method!r} has no forecast"
    return None


def stored(cfg) -> dict | None:
    """The calibration stored on this machine for the config's :func:`~pipeline.forecast.cpu.calibration_key`."""
    try:
        return cpu.stored_device(key=cpu.calibration_key(cfg)).calibration
    except (ForecastInputError, OSError, ValueError):  # none, or a file that cannot be read: make one
        return None


def ensure_calibration(cfg, force: bool = False, on_start: Callable[[str], None] | None = None) -> dict:
    """Make the config's calibration unless one is stored that is not stale
    (:func:`~pipeline.forecast.cpu.stale_reason`), or ``force``; never raises: a failed
    calibration is an outcome, because the run and its report stand without a forecast.
    ``on_start`` is told why, before the microbenchmarks start.

    Returns the outcome, as ``run.json`` records it: ``status`` (``stored``: reused; ``calibrated``;
    ``failed``; ``not needed``), the ``key``, and ``path``, ``created`` and ``prompts`` of the
    calibration, or ``reason``."""
    key = cpu.calibration_key(cfg)
    reason = not_needed(cfg)
    if reason is not None:
        return {"status": "not needed", "key": key, "reason": reason}
    existing = None if force else stored(cfg)
    stale = cpu.stale_reason(existing) if existing is not None else None
    if existing is not None and stale is None:
        return {"status": "stored", "key": key, "path": str(cpu.calibration_path()),
                "created": existing.get("created"), "prompts": existing.get("prompts")}
    if on_start is not None:
        on_start("asked for (--recalibrate)" if force else
                 f"the stored one is stale ({stale})" if stale else "none stored for this config on this machine")
    try:
        path, calibration = calibrate_config(cfg)
    except Exception as exc:  # noqa: BLE001 - the forecast is advice: the run goes on and its report says why
        return {"status": "failed", "key": key, "reason": f"{type(exc).__name__}: {exc}"}
    return {"status": "calibrated", "key": key, "path": str(path), "created": calibration.get("created"),
            "prompts": calibration.get("prompts")}
