"""The report's check that the arms ran with the KV capacity the plan gave them.

Reads ``run.json``'s ``endpoints.<arm>.kv_cache_tokens_planned`` and ``kv_cache_tokens_reported``
(pipeline/serve/kv_capacity.py); returns one gate check. Speculation is judged against the
baseline at equal KV capacity (pipeline/plan/gpu_layout.py): when a model's reported capacity
differs from its planned one by more than :data:`TOLERANCE_TOKENS`, the arms are not comparable,
the run is invalid and a GO becomes INCONCLUSIVE, with both figures in the reason. Writes nothing.

Tolerance: the plan sizes capacities in whole granules of ``KV_TOKEN_GRANULE`` tokens, and the
runtime holds whole KV blocks (``tokens_per_block``, at most that granule), so rounding to blocks
moves a reported figure by less than one granule; anything more means the runtime did not get the
memory the plan assumed (a smaller KV fraction won, or the weights/runtime took more)."""

from __future__ import annotations

from typing import Any

from pipeline.plan.gpu_layout import KV_TOKEN_GRANULE
from pipeline.report.gate import INCONCLUSIVE, NO_GO, NOT_CHECKED, PASS, UNSURE, Check, GateResult

TOLERANCE_TOKENS = KV_TOKEN_GRANULE
RULE = "kv_capacity"


def kv_capacity_rows(endpoints: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm and model: planned and reported tokens, their difference, and whether it is within
    the tolerance (None when either figure is missing)."""
    rows = []
    for arm, info in sorted(endpoints.items()):
        planned = info.get("kv_cache_tokens_planned") or {}
        reported = info.get("kv_cache_tokens_reported") or {}
        for model in sorted(set(planned) | set(reported)):
            p, r = planned.get(model), reported.get(model)
            within = None if p is None or r is None else abs(r - p) <= TOLERANCE_TOKENS
            rows.append({"arm": arm, "model": model, "planned_tokens": p, "reported_tokens": r, "within": within})
    return rows


def kv_capacity_check(meta: dict[str, Any]) -> Check:
    rows = kv_capacity_rows(meta.get("endpoints") or {})
    checked = [row for row in rows if row["within"] is not None]
    off = [row for row in checked if not row["within"]]
    if off:
        figures = "; ".join(f"{r['arm']} {r['model']}: planned {r['planned_tokens']}, backend reported "
                            f"{r['reported_tokens']} tokens" for r in off)
        return Check(RULE, "run", UNSURE, f"KV capacity differs from the plan by more than {TOLERANCE_TOKENS} tokens "
                     f"({figures}): the arms are not comparable and the run is invalid", value=rows,
                     threshold=TOLERANCE_TOKENS)
    if not checked:
        return Check(RULE, "run", NOT_CHECKED, "no arm has both a planned and a backend-reported KV capacity",
                     value=rows, threshold=TOLERANCE_TOKENS)
    unmatched = [f"{r['arm']} {r['model']}" for r in rows if r["within"] is None]
    extra = f" (not reported or not planned: {', '.join(unmatched)})" if unmatched else ""
    return Check(RULE, "run", PASS, f"every model's reported KV capacity is within {TOLERANCE_TOKENS} tokens of "
                 f"the plan{extra}", value=rows, threshold=TOLERANCE_TOKENS)


def with_kv_capacity_check(gate: GateResult, meta: dict[str, Any]) -> GateResult:
    """``gate`` with the check added: runs on arms that are not comparable cannot support a GO, so
    a GO becomes INCONCLUSIVE; a NO-GO stays (it may stand on a dead server or errors alone)."""
    check = kv_capacity_check(meta)
    verdict = INCONCLUSIVE if check.status == UNSURE and gate.verdict != NO_GO else gate.verdict
    return GateResult(verdict, [*gate.checks, check], gate.advice)
