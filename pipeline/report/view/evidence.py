"""What the first screen says about the evidence itself (issue 42): how many repeats a
``repeats: auto`` run took and why it stopped, the rig's noise from the latest A/A of the config,
and for an A/A run (``loadtest --aa``) its own banner — "no difference" or not, and the noise.

Reads the report data (``report.json`` content: ``repeats``, ``rig_noise``, ``aa``); writes nothing.
"""

from __future__ import annotations

from typing import Any

from pipeline.report.view.rounding import fmt_pct, tidy_text

STOP_WORDS = {"decided": "every gated check was decided", "max_repeats": "the cap in repeats was reached",
              "max_minutes": "the cap in minutes was reached"}
AA_TITLES = {"NO DIFFERENCE": "A/A: no difference between identical arms",
             "DIFFERENCE": "A/A: this rig measures a difference between identical arms",
             "INCONCLUSIVE": "A/A: not decided"}


def ci_words(data: dict) -> str:
    """``95% CI``, or the level a ``repeats: auto`` run's intervals have (``98.33% CI``)."""
    level = (data.get("intervals") or {}).get("confidence_level") or 0.95
    return f"{round(100 * level, 2):g}% CI"


def repeats_line(data: dict) -> str | None:
    repeats = data.get("repeats") or {}
    if repeats.get("mode") != "auto":
        return None
    return (f"Repeats: {repeats.get('repeats')} per cell (repeats: auto; looked at the verdict {repeats.get('looks')} "
            f"of at most {repeats.get('looks_planned')} times, each interval at "
            f"{1 - repeats.get('alpha_per_look', 0.05):.2%}); stopped because "
            f"{STOP_WORDS.get(repeats.get('stopped'), repeats.get('stopped'))}.")


def rig_noise_line(data: dict) -> str | None:
    noise = data.get("rig_noise")
    if not noise:
        return None
    where = "this host" if noise.get("same_host") else f"host {noise.get('host')}"
    return (f"Rig noise (A/A of {noise.get('created')}, {where}: {noise.get('verdict')}): median TPOT varies "
            f"{fmt_pct(noise.get('run_to_run_cv_tpot'))} run to run (CV), TPOT {fmt_pct(noise.get('request_cv_tpot'))} "
            "request to request.")


def aa_decision(data: dict, checks: list[str], counts: str) -> dict[str, Any]:
    """The banner of an A/A run: the verdict on the rig and its noise, in place of a rollout."""
    noise = (data.get("aa") or {}).get("noise") or {}
    verdict = data["verdict"]
    findings = []
    for level in noise.get("levels", []):
        cv = level["run_to_run_cv"]
        detectable = level.get("detectable_tpot_ratio") or {}
        findings.append(
            f"Concurrency {level['concurrency']}: median TPOT varies {fmt_pct(cv.get('median_tpot_ms'))} run to run, "
            f"output tok/s {fmt_pct(cv.get('output_tokens_per_s'))}; TPOT varies "
            f"{fmt_pct(level['request_cv'].get('tpot_ms'))} request to request; an A/B here tells a TPOT ratio "
            f"below {_ratio(detectable.get('5'))} from 1 at 5 repeats, {_ratio(detectable.get('10'))} at 10.")
    sentence = {"NO DIFFERENCE": "The baseline measured against itself shows no difference at any level: "
                                 "this rig can be trusted with an A/B at the noise below.",
                "DIFFERENCE": "The baseline measured against itself differs: drift, a noisy neighbour or a "
                              "non-deterministic server; an A/B on this rig would report the same difference.",
                }.get(verdict, "The A/A could not be decided: see the checks.")
    return {"verdict": verdict, "exit_code": data["exit_code"], "title": AA_TITLES.get(verdict, verdict),
            "sentence": sentence, "rollout": tidy_text(f"Design: {(data.get('aa') or {}).get('design')}."),
            "findings": findings, "checks": checks, "advice": [], "counts": counts}


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
