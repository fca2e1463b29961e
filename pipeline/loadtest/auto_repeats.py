"""`loadtest.repeats: auto`: add interleaved repeats until every gated check is decided, then stop.

The stopping rule, and what keeps it honest under optional stopping: **Bonferroni alpha spending**.
The verdict is looked at after repeat ``min_repeats``, ``min_repeats + 1``, …, ``max_repeats``:
K = max_repeats − min_repeats + 1 possible looks, each spending alpha / K. Every interval of every
look is then a (1 − alpha/K) interval, so the chance that *any* look's interval misses its true
value is at most K · alpha/K = alpha, whichever look the run stops at: stopping when the answer
is known cannot raise the false-GO rate above alpha/2 (a GO needs the upper bound below the
threshold). It is conservative (the looks are correlated), the price of needing no assumption about
when a run stops; the simulation in tests/unit/report/test_interval_coverage.py shows the A/A false-GO rate
with stopping. The final report uses the same per-look level, so its intervals are the ones the
run stopped on.

A look runs the report's own analysis and gate on the repeats so far. The run stops when
  * decided: the gate says NO-GO, or every interval check (benefit, TTFT and peak-throughput
    guardrails; :data:`pipeline.report.gate.INTERVAL_RULES`) lies wholly on one side of its threshold
    and enough requests were measured;
  * max_repeats: the last look was not decided;
  * max_minutes: the next repeat would end after ``loadtest.max_minutes`` of measurement (the
    Locust runs' own seconds, so a resumed run counts no gap).
run.json records the plan (``repeats_auto``), every look and why the run stopped; ``repeats``
there is the repeats planned so far, which is what :mod:`pipeline.loadtest.resume` plans from. A
resumed run replays its looks on the cells it kept: a look at the same data decides the same, so
it spends no extra alpha.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.report.alpha_spending import AUTO, confidence_level, plan, summary  # noqa: F401 - this module's API too
from pipeline.report.builder import analyze
from pipeline.report.gate import INTERVAL_RULES, NO_GO, UNSURE, evaluate_gate
from pipeline.report.intervals import decided
from pipeline.report.stats import load_runs

DECIDED, CAP_REPEATS, CAP_MINUTES = "decided", "max_repeats", "max_minutes"
# undecided non-interval checks that more repeats can settle (they count requests and runs)
MORE_DATA_RULES = ("sample_size", "runs")


def is_auto(repeats: Any) -> bool:
    return repeats == AUTO


def pending(meta: dict) -> bool:
    """An auto run that has not stopped yet (more repeats may follow)."""
    auto = meta.get("repeats_auto")
    return bool(auto) and not auto.get("stopped")


def undecided_checks(gate) -> list[str]:
    """The checks that keep an auto run going: interval checks whose interval contains the
    threshold (or has none), and the request/run counts below their minimum."""

    out = []
    for check in gate.checks:
        if check.rule in INTERVAL_RULES:
            value = check.value if isinstance(check.value, dict) else {}
            if check.status == UNSURE and not decided(value.get("low"), value.get("high"), check.threshold):
                out.append(f"{check.rule} ({check.scope})")
        elif check.rule in MORE_DATA_RULES and check.status == UNSURE:
            out.append(f"{check.rule} ({check.scope})")
    return out


def look(run_dir: Path, cfg) -> dict[str, Any]:
    """The gate on the repeats measured so far (the report's own analysis at the per-look level)."""

    return stop_decision(evaluate_gate(analyze(run_dir, cfg, load_runs(run_dir)), cfg.gate))


def stop_decision(gate) -> dict[str, Any]:
    """Whether a look's gate result ends an auto run: a NO-GO, or nothing left undecided."""

    undecided = undecided_checks(gate)
    return {"verdict": gate.verdict, "undecided": undecided,
            "decided": gate.verdict == NO_GO or not undecided, "repeats_to_decide": gate.repeats_to_decide}


def auto_specs(plan_repeat: Callable[[int], list], kept: set[str], results: list[dict], meta: dict,
               run_dir: Path, cfg, write_meta: Callable[[], None],
               look_fn: Callable[[Path, Any], dict] | None = None) -> Iterator:
    """The specs of an auto run, repeat by repeat, looking at the verdict after each repeat from
    ``min_repeats`` on. ``plan_repeat(r)`` gives repeat r's specs (0-based) in the plan's order;
    ``results`` is the run's list of finished cells, appended by the caller before it asks for
    the next spec (so a look sees every cell of the repeat); ``write_meta`` saves run.json."""
    auto = meta["repeats_auto"]
    look_fn = look_fn or look
    auto["looks"] = []  # replayed from the kept cells on a resume
    for n in range(1, auto["max_repeats"] + 1):
        todo = [s for s in plan_repeat(n - 1) if s.key not in kept]
        if todo:
            reason = _minutes_cap(results, n - 1, auto["max_minutes"])
            if reason:
                _stop(auto, CAP_MINUTES, n - 1, reason, write_meta)
                return
            meta["repeats"] = max(meta.get("repeats") or 0, n)
            write_meta()
            yield from todo
        if n >= auto["min_repeats"]:
            outcome = {"repeats": n, "at": time.time(), **look_fn(run_dir, cfg)}
            auto["looks"].append(outcome)
            if outcome["decided"]:
                _stop(auto, DECIDED, n, _decided_detail(outcome["verdict"]), write_meta)
                return
            write_meta()
    _stop(auto, CAP_REPEATS, auto["max_repeats"],
          f"max_repeats ({auto['max_repeats']}) reached with checks undecided", write_meta)


def _decided_detail(verdict: str) -> str:
    if verdict == "NO-GO":
        return "a gated check failed (NO-GO)"
    if verdict == "INCONCLUSIVE":  # e.g. achieved concurrency off target: not a matter of more repeats
        return "every gated interval is decided; the checks still inconclusive are ones more repeats cannot settle"
    return "every gated check is decided"


def _minutes_cap(results: list[dict], repeats_done: int, max_minutes: float | None) -> str | None:
    """Why the next repeat would break the cap in minutes, or None."""
    if max_minutes is None or repeats_done == 0:
        return None
    used = sum(r.get("seconds") or 0.0 for r in results)
    per_repeat = used / repeats_done
    if used + per_repeat > max_minutes * 60.0:
        return (f"max_minutes ({max_minutes:g}): {used / 60:.1f} min measured in {repeats_done} repeats, "
                f"another would take about {per_repeat / 60:.1f} min")
    return None


def _stop(auto: dict, reason: str, repeats: int, detail: str, write_meta: Callable[[], None]) -> None:
    auto["stopped"] = {"reason": reason, "repeats": repeats, "detail": detail}
    write_meta()
