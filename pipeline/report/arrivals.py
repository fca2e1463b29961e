"""Arrivals as measured: the send rate an open-loop run achieved against its schedule, each ramp step's
rate or users, a trace's replay lag, a concurrency cap held (docs/arrivals-and-goodput.md).

Reads the raw records and the run's settings (what it was told: arrival, rate, ramp, cap) from
:class:`pipeline.report.stats.RunData`; returns plain dicts the comparisons carry and
:mod:`pipeline.report.gate` checks, as it checks a closed loop's achieved concurrency.

Rates are per worker process and add up (each clock its own): offered = (n − 1) / (last − first
scheduled arrival) over the requests sent, achieved = offered / the least-squares slope of send times
against scheduled times. A client that keeps up sends on schedule (slope 1) and the two agree; one
that falls behind (a saturated client, a concurrency cap the server cannot clear) stretches the
sends (slope above 1) and the achieved rate drops below the offered one. The slope, not the span of
the sends, because one late send at either end (a scheduler hiccup of a busy host) would move the
span by its whole lag; the fit spreads it over every request. The offered rate is the schedule's own, not the nominal
``request_rate``: a Poisson or gamma schedule of a few seconds differs from its mean by chance
(20 arrivals: ±22 %), and that is the load the server was given, not a fault of the client.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

NS = 1e9
SETTLE_S = 1.0  # a closed-loop ramp step's users spawn within a second (spawn rate = users): not counted


def rates(records: list[dict]) -> dict[str, float | int | None]:
    """Achieved and offered send rates (requests/s) of ``records`` (sent requests of one run), summed
    over worker processes; the p95 lag of sends behind their schedule (ms)."""
    by_worker: dict[int, list[dict]] = defaultdict(list)
    for rec in records:
        if rec.get("t_sent") and rec.get("t_scheduled") is not None:
            by_worker[rec.get("worker_pid", 0)].append(rec)
    achieved = offered = 0.0
    counted = False
    for recs in by_worker.values():
        if len(recs) < 2:
            continue
        sent = np.asarray([r["t_sent"] for r in recs], dtype=float)
        scheduled = np.asarray([r["t_scheduled"] for r in recs], dtype=float)
        if np.ptp(scheduled) > 0:
            slope = float(np.polyfit(scheduled, sent, 1)[0])
            mine = (len(recs) - 1) / (np.ptp(scheduled) / NS)
            offered += mine
            achieved += mine / slope if slope > 0 else 0.0
            counted = True
    lags = [(r["t_sent"] - r["t_scheduled"]) / 1e6 for recs in by_worker.values() for r in recs]
    return {"n": sum(len(r) for r in by_worker.values()), "achieved_rate": achieved if counted else None,
            "offered_rate": offered if counted else None,
            "lag_p95_ms": float(np.percentile(lags, 95)) if lags else None}


def in_flight(records: list[dict], start: int, end: int) -> float | None:
    """Time-averaged requests in flight in [start, end) (ns, each worker's own clock), summed over workers."""
    if end <= start:
        return None
    by_worker: dict[int, float] = defaultdict(float)
    for rec in records:
        if not rec.get("t_sent"):
            continue
        r_end = rec.get("t_last") if rec.get("t_last") is not None and rec.get("status") != "incomplete_at_stop" else end
        by_worker[rec.get("worker_pid", 0)] += max(0, min(r_end, end) - max(rec["t_sent"], start))
    return sum(by_worker.values()) / (end - start) if by_worker else None


def run_arrivals(run) -> dict[str, Any] | None:
    """What one run's arrivals achieved; None for a plain closed-loop run (its achieved concurrency is
    checked already) or a run without settings."""
    settings = run.settings or {}
    ramp = settings.get("ramp") or []
    open_loop = settings.get("mode") == "open"
    if not settings or (not open_loop and not ramp):
        return None
    sent = [r for r in run.records if r.get("t_sent")]
    out: dict[str, Any] = {"key": run.info.get("key"), "arrival": settings.get("arrival"),
                           "pattern": "ramp" if ramp else "trace" if settings.get("arrival") == "trace" else "rate",
                           "mode": settings.get("mode"), "nominal_rate": settings.get("target_rate"),
                           "burstiness": settings.get("burstiness", 1.0),
                           "max_concurrency": settings.get("max_concurrency"), "steps": []}
    if open_loop:
        measured = [r for r in sent if r.get("stage") == "measure"]
        out.update(rates(measured))
        stops = {w["pid"]: w.get("t_stop_signal") for w in run.workers if w.get("pid")}
        if measured:
            start = min(r["t_sent"] for r in measured)
            end = max([s for s in stops.values() if s] or [r.get("t_last") or r["t_sent"] for r in measured])
            out["achieved_concurrency"] = in_flight(sent, start, end)
    begin = 0.0
    for n, step in enumerate(ramp):
        length = float(step["duration_s"])
        entry: dict[str, Any] = {"step": n, "duration_s": length}
        if open_loop:
            entry.update({"nominal_rate": step.get("rate"), **rates([r for r in sent if r.get("ramp_step") == n])})
        else:
            settle = min(SETTLE_S, length / 2)
            entry.update({"users": step.get("users"),
                          "achieved_concurrency": in_flight(sent, int((begin + settle) * NS), int((begin + length) * NS))})
        out["steps"].append(entry)
        begin += length
    return out


def cell_arrivals(runs: list) -> dict[str, Any] | None:
    """Every run's arrivals of one cell, and their means (the report's figures)."""
    per_run = [a for a in (run_arrivals(run) for run in runs) if a is not None]
    if not per_run:
        return None

    def mean(values):
        values = [v for v in values if v is not None]
        return float(np.mean(values)) if values else None

    first = per_run[0]
    return {"pattern": first["pattern"], "arrival": first["arrival"], "mode": first["mode"],
            "nominal_rate": first["nominal_rate"], "burstiness": first["burstiness"],
            "max_concurrency": first["max_concurrency"],
            "achieved_rate": mean(a.get("achieved_rate") for a in per_run),
            "offered_rate": mean(a.get("offered_rate") for a in per_run),
            "achieved_concurrency": mean(a.get("achieved_concurrency") for a in per_run),
            "runs": per_run}
