"""Which session of a load test measured which cells: a run interrupted and resumed
(:mod:`pipeline.loadtest.resume`) was measured in several, on separate server starts and with a
gap in time between them, which a reader must know before comparing its cells.

Reads ``run.json``'s ``sessions`` and the ``session`` of every ``runs.json`` entry (as loaded by
:func:`pipeline.report.stats.load_runs`); returns what ``report.json`` carries as ``sessions``.
Writes nothing.
"""

from __future__ import annotations

from typing import Any


def sessions(meta: dict[str, Any], run_infos: list[dict[str, Any]]) -> dict[str, Any]:
    """``resumed`` (measured in more than one session) and, per session, when it started, the gap
    since the previous session's last cell, and the cells it measured (keys, in run order)."""
    cells: dict[int, list[str]] = {}
    for info in run_infos:
        cells.setdefault(int(info.get("session") or 1), []).append(info["key"])
    recorded = {int(s["session"]): s for s in meta.get("sessions") or []}
    out = []
    for number in sorted(set(cells) | set(recorded)):
        entry = recorded.get(number, {})
        out.append({"session": number, "started": entry.get("started", meta.get("created") if number == 1 else None),
                    "gap_s": entry.get("gap_s"), "cells": cells.get(number, [])})
    measured = [s for s in out if s["cells"]]
    return {"resumed": len(measured) > 1, "sessions": out}
