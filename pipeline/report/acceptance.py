"""Which acceptance figure a run, a cell and the report use, and from where.

Reads run summaries and cells (``runs.json``'s ``server_acceptance``, from
:mod:`pipeline.loadtest.acceptance_sources`, and the raw records' per-request acceptance); writes
nothing. Order of preference: the per-request outputs (the server's own per-request counts), then
what the server's metrics say over the run, else None, shown as "not reported" and never as 0.
"""

from __future__ import annotations

from typing import Any

from pipeline.artefacts.runs import NOT_REPORTED  # the one spelling, beside the runs.json field it is a value of

PER_REQUEST = "per-request outputs"


def server_reported(delta: dict | None) -> bool:
    """Whether a server's metrics over one run reported acceptance: a named source that gives a
    rate, a mean acceptance length or a nonzero draft / verify-step count. The one test, for both
    ``runs.json`` figures: ``server_acceptance`` (:func:`pipeline.loadtest.acceptance_sources.run_delta`)
    and the older counters-only ``metrics_delta`` (``legacy_delta``)."""
    if not delta or delta.get("source") in (None, NOT_REPORTED):
        return False
    return (delta.get("acceptance_rate") is not None or delta.get("mean_acceptance_length") is not None
            or bool(delta.get("draft_tokens")) or bool(delta.get("verify_steps")))


def _server(delta: dict | None) -> dict | None:
    return delta if server_reported(delta) else None


def run_source(records: list[dict], delta: dict | None) -> str:
    """Where this run's acceptance comes from: per-request outputs, a server source, or not reported."""
    if any((r.get("draft_tokens") or 0) > 0 for r in records):
        return PER_REQUEST
    server = _server(delta)
    return server["source"] if server else NOT_REPORTED


def pooled_server(deltas: list[dict | None]) -> dict[str, Any] | None:
    """The server's figures over several runs: counts summed where the runs give counts (counter
    deltas, drained iteration stats); else the mean of the gauge values at the runs' ends."""
    usable = [d for d in (_server(d) for d in deltas) if d]
    if not usable:
        return None
    source, kinds = usable[0]["source"], sorted({d.get("kind") or "?" for d in usable})
    counted = [d for d in usable if d.get("draft_tokens")]
    if counted:
        drafted = sum(d["draft_tokens"] for d in counted)
        accepted = sum(d.get("accepted_tokens") or 0 for d in counted)
        steps = sum(d.get("verify_steps") or 0 for d in counted)
        return {"source": source, "kind": ", ".join(kinds), "n_runs": len(usable), "draft_tokens": drafted,
                "accepted_tokens": accepted, "verify_steps": steps or None,
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_acceptance_length": _mean([d.get("mean_acceptance_length") for d in usable])
                if not steps else 1 + accepted / steps}
    return {"source": source, "kind": ", ".join(kinds), "n_runs": len(usable), "draft_tokens": None,
            "accepted_tokens": None, "verify_steps": None,
            "acceptance_rate": _mean([d.get("acceptance_rate") for d in usable]),
            "mean_acceptance_length": _mean([d.get("mean_acceptance_length") for d in usable])}


def with_server(summary: dict[str, Any], deltas: list[dict | None]) -> dict[str, Any]:
    """A cell's acceptance summary with its ``source``; the server's figures fill what the
    per-request outputs do not give."""
    out = dict(summary)
    if out.get("draft_tokens"):
        out["source"] = PER_REQUEST
        return out
    if out.get("prometheus"):  # our own counters (or vLLM's) already folded in by acceptance_summary
        out["source"] = out["prometheus"].get("source", "specdeploy")
        return out
    server = pooled_server(deltas)
    if server is None:
        out["source"] = NOT_REPORTED
        return out
    out["source"], out["server"] = server["source"], server
    for key in ("acceptance_rate", "mean_acceptance_length"):
        if out.get(key) is None and server.get(key) is not None:
            out[key] = server[key]
    if server.get("verify_steps"):
        out["tau_source"] = server["source"]
    return out


def headline(records: list[dict], deltas: list[dict | None]) -> tuple[float | None, str]:
    """The report's acceptance rate (the gate's input) and its source, over the primary speculative runs."""
    drafted = sum(r.get("draft_tokens") or 0 for r in records)
    if drafted:
        return sum(r.get("accepted_tokens") or 0 for r in records) / drafted, PER_REQUEST
    server = pooled_server(deltas)
    if server is None or server.get("acceptance_rate") is None:
        return None, NOT_REPORTED
    return server["acceptance_rate"], server["source"]


def by_source(runs: list[dict]) -> list[dict[str, Any]]:
    """One row per acceptance source over the speculative runs: which runs, kind, counts, rate, τ."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        if run.get("arm") == "speculative":
            groups.setdefault(run.get("acceptance_source") or NOT_REPORTED, []).append(run)
    rows = []
    for source, group in groups.items():
        if source == PER_REQUEST:
            drafted = sum((r.get("request_acceptance") or {}).get("draft_tokens") or 0 for r in group)
            accepted = sum((r.get("request_acceptance") or {}).get("accepted_tokens") or 0 for r in group)
            figures = {"kind": "per request", "acceptance_rate": accepted / drafted if drafted else None,
                       "mean_acceptance_length": None}
        else:
            server = pooled_server([r.get("server_acceptance") for r in group])
            figures = {"kind": server["kind"] if server else None,
                       "acceptance_rate": server["acceptance_rate"] if server else None,
                       "mean_acceptance_length": server["mean_acceptance_length"] if server else None}
        rows.append({"source": source, "runs": [r["key"] for r in group], **figures})
    return rows


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None
