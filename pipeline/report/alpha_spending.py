"""The alpha spending of `loadtest.repeats: auto`, as the report needs it: the plan run.json
records, the confidence level of a run's intervals, and what the report says about the repeats.

The stopping rule itself (looking at the verdict after each repeat) is
:mod:`pipeline.loadtest.auto_repeats`, whose docstring says why Bonferroni spending keeps the
false-GO rate at alpha under optional stopping. This module imports no stage, so the report
reads a run's level without importing the load test.
"""

from __future__ import annotations

from typing import Any

AUTO = "auto"
SPENDING = "Bonferroni alpha spending: alpha split equally over the possible looks (min_repeats..max_repeats)"


def plan(cfg, alpha: float | None = None) -> dict[str, Any]:
    """The ``repeats_auto`` entry of run.json for this config."""
    lt = cfg.loadtest
    alpha = cfg.gate.alpha if alpha is None else alpha
    looks = lt.max_repeats - lt.min_repeats + 1
    return {"min_repeats": lt.min_repeats, "max_repeats": lt.max_repeats, "max_minutes": lt.max_minutes,
            "alpha": alpha, "looks_planned": looks, "alpha_per_look": alpha / looks, "spending": SPENDING,
            "looks": [], "stopped": None}


def confidence_level(meta: dict, alpha: float) -> float:
    """The intervals' confidence level for a run: 1 − alpha, or 1 − alpha/K for an auto run."""
    auto = meta.get("repeats_auto")
    return 1.0 - (auto["alpha_per_look"] if auto else alpha)


def summary(meta: dict) -> dict[str, Any]:
    """What the report says about the repeats: fixed or auto, how many, why it stopped."""
    auto = meta.get("repeats_auto")
    if not auto:
        return {"mode": "fixed", "repeats": meta.get("repeats")}
    stopped = auto.get("stopped") or {}
    return {"mode": AUTO, "repeats": stopped.get("repeats", meta.get("repeats")), "stopped": stopped.get("reason"),
            "detail": stopped.get("detail"), "min_repeats": auto["min_repeats"], "max_repeats": auto["max_repeats"],
            "max_minutes": auto["max_minutes"], "looks": len(auto.get("looks") or []),
            "looks_planned": auto["looks_planned"], "alpha_per_look": auto["alpha_per_look"],
            "spending": auto["spending"]}
