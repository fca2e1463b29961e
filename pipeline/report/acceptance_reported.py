"""Which acceptance figures the servers reported, per arm: the per-request outputs
(``draft_tokens`` / ``accepted_tokens`` in the raw records) and the Prometheus counters the load
test scraped (each run's ``metrics_delta`` in runs.json). Reads the loaded runs
(:func:`pipeline.report.stats.load_runs`); writes nothing (the report carries the result as
``acceptance_reported``).

A figure nobody reported is "not reported", never 0: the Triton ``llmapi`` model sends its
acceptance outputs only when the request asks for perf metrics and the LLM returns them, and
its ``/metrics`` has no speculative-decoding counters (docs/gpu-llmapi.md)."""

from __future__ import annotations

from typing import Any

from pipeline.report.acceptance import NOT_REPORTED, server_reported

REPORTED = "reported"
NOT_CHECKED = "not checked"  # no metrics URL: the server was never asked (endpoints_only.NOT_CHECKED)


def _metrics_state(deltas: list[dict | None]) -> tuple[str, str | None]:
    found = [d for d in deltas if server_reported(d)]
    if not found:
        return NOT_REPORTED, None
    return REPORTED, next((d.get("source") for d in found if d.get("source")), None)


def acceptance_reported(runs, server_metrics: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """arm → {per_request, requests_with_figures, requests, metrics, metrics_source, contract}.
    ``server_metrics``: run.json's record of each given endpoint's metrics URL
    (:func:`pipeline.loadtest.endpoints_only.metrics_urls`); an arm whose server had none was
    "not checked" (with ``metrics_why``), which is not the same as a server that was read and
    reported nothing."""
    out: dict[str, dict[str, Any]] = {}
    for arm in sorted({run.info.get("arm") for run in runs if run.info.get("arm")}):
        arm_runs = [run for run in runs if run.info.get("arm") == arm]
        ok = [r for run in arm_runs for r in run.measured if r.get("status") == "ok"]
        with_figures = sum(r.get("draft_tokens") is not None for r in ok)
        metrics, source = _metrics_state([run.info.get("metrics_delta") for run in arm_runs])
        out[arm] = {"per_request": REPORTED if with_figures else NOT_REPORTED, "requests_with_figures": with_figures,
                    "requests": len(ok), "metrics": metrics, "metrics_source": source}
        note = (server_metrics or {}).get(arm) or {}
        if metrics == NOT_REPORTED and note.get("from") == NOT_CHECKED:
            out[arm].update(metrics=NOT_CHECKED, metrics_why=note.get("why"))
    return out


def missing_acceptance_line(reported: dict[str, dict[str, Any]]) -> str:
    """The summary's sentence when the speculative arm's acceptance is missing."""
    spec = reported.get("speculative")
    if not spec:
        return "Acceptance: not reported (no speculative arm was measured)."
    return (f"Acceptance: not reported by the speculative arm's server (per-request outputs: {spec['per_request']}"
            f" in {spec['requests'] - spec['requests_with_figures']} of {spec['requests']} requests; "
            f"/metrics counters: {spec['metrics']}"
            + (f" — {spec['metrics_why']}" if spec.get("metrics_why") else "") + ").")
