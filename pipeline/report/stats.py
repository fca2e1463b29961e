"""Statistics for speculative vs baseline, from raw per-request records only.

Reads the raw JSONL records the Locust users write (``RUN_DIR/raw/*.jsonl``, schema
``specdeploy-raw/1``) plus ``RUN_DIR/runs.json`` and returns plain dicts: per-run summaries (the
unit of replication), per-cell pooled distributions (arm × concurrency [× draft length]),
per-category acceptance; the spec-vs-base comparisons the gate reads are in
:mod:`pipeline.report.comparison`. Never reads Locust's
bucketed statistics. Formulas (docs/report.md): TTFT = t_first_token − t_sent (the first token of
any kind: a reasoning model's thinking counts); first answer = t_first_answer − t_sent (the first
answer token after the reasoning; equal to TTFT for other models);
E2E = t_last − t_sent; TPOT = (E2E − TTFT)/(OSL − 1) for OSL > 1; engine TPOT = the same from the
server's own first and last token times, where its responses carry them (the delivery lag compares
the two); inter-chunk latency = gaps
between non-empty chunks (a chunk may carry several tokens); throughput denominator = first
send → last response of the measured window.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from pipeline.artefacts.runs import RunResults
from pipeline.report.acceptance import run_source, with_server

PERCENTILES = (50, 90, 95, 99)
NS_PER_MS = 1e6
NS_PER_S = 1e9


# ------------------------------------------------------------------------------------------------
# Per-request metrics


def ttft_ms(rec: dict) -> float | None:
    if rec.get("t_first_token") is None:
        return None
    return (rec["t_first_token"] - rec["t_sent"]) / NS_PER_MS


def first_answer_ms(rec: dict) -> float | None:
    """Time to the first answer token; a record without ``t_first_answer`` (older records, a
    stream with reasoning only) falls back to its TTFT when it carries no reasoning."""
    t = rec.get("t_first_answer")
    if t is None and not rec.get("reasoning_text"):
        t = rec.get("t_first_token")
    return None if t is None else (t - rec["t_sent"]) / NS_PER_MS


def e2e_ms(rec: dict, *, from_scheduled: bool = False) -> float | None:
    if rec.get("t_last") is None:
        return None
    start = rec["t_scheduled"] if from_scheduled and rec.get("t_scheduled") is not None else rec["t_sent"]
    return (rec["t_last"] - start) / NS_PER_MS


def tpot_ms(rec: dict) -> float | None:
    """(E2E − TTFT)/(OSL − 1); None for OSL ≤ 1 (no decode interval exists)."""
    osl = rec.get("osl") or 0
    if osl <= 1 or rec.get("t_first_token") is None or rec.get("t_last") is None:
        return None
    return (rec["t_last"] - rec["t_first_token"]) / (osl - 1) / NS_PER_MS


def engine_tpot_ms(rec: dict) -> float | None:
    """TPOT as the engine made the tokens: (last − first token time, the server's perf outputs) /
    (OSL − 1); None without both times or for OSL ≤ 1."""
    times, osl = rec.get("server_times_ns") or {}, rec.get("osl") or 0
    first, last = times.get("first_token_time_ns"), times.get("last_token_time_ns")
    if osl <= 1 or not first or not last or last < first:
        return None
    return (last - first) / (osl - 1) / NS_PER_MS


def delivery_lag(records: list[dict]) -> float | None:
    """How much slower the client saw tokens arrive than the engine made them: mean TPOT ÷ mean
    engine TPOT − 1 over the requests that have both. Near 0 when the serving path and the load
    generator keep up; a cell where it is large measured its delivery, not its engine. None
    without the server's token times (OpenAI endpoints, a backend without perf outputs)."""
    pairs = [(tpot_ms(r), engine_tpot_ms(r)) for r in records]
    pairs = [(client, engine) for client, engine in pairs if client is not None and engine]
    if not pairs:
        return None
    return sum(c for c, _ in pairs) / sum(e for _, e in pairs) - 1


def chunk_gaps_ms(rec: dict) -> list[float]:
    times = rec.get("chunk_times") or []
    return [(b - a) / NS_PER_MS for a, b in zip(times, times[1:])]


def percentiles(values: Iterable[float]) -> dict[str, float | int | None]:
    """p50/p90/p95/p99 and mean by ``numpy.percentile`` (linear interpolation) on raw samples."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    out: dict[str, float | int | None] = {"n": int(arr.size)}
    for q in PERCENTILES:
        out[f"p{q}"] = float(np.percentile(arr, q)) if arr.size else None
    out["mean"] = float(arr.mean()) if arr.size else None
    return out


def meets_slo(rec: dict, slo_ttft_ms: float | None, slo_tpot_ms: float | None, slo_e2e_ms: float | None = None) -> bool:
    """Goodput rule, per record: an ok request meets every bound that is set (None: not an SLO),
    TTFT ≤ a, TPOT ≤ b, E2E ≤ c; OSL ≤ 1 counts TPOT as 0 (vLLM's rule)."""
    if rec.get("status") != "ok":
        return False
    ttft = ttft_ms(rec)
    if slo_ttft_ms is not None and (ttft is None or ttft > slo_ttft_ms):
        return False
    tpot = tpot_ms(rec)
    if slo_tpot_ms is not None and (tpot if tpot is not None else 0.0) > slo_tpot_ms:
        return False
    e2e = e2e_ms(rec)
    return slo_e2e_ms is None or (e2e is not None and e2e <= slo_e2e_ms)


# ------------------------------------------------------------------------------------------------
# Loading


@dataclass
class RunData:
    """One Locust run (arm × concurrency × repeat [× draft length]) and its records."""

    info: dict[str, Any]
    records: list[dict[str, Any]]
    workers: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # settings/<key>.json: what the run was told

    @property
    def measured(self) -> list[dict]:
        return [r for r in self.records if r.get("stage") == "measure"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def load_runs(run_dir: Path) -> list[RunData]:
    runs_file = run_dir / "runs.json"
    if not runs_file.is_file():
        raise FileNotFoundError(f"{runs_file} not found: not a load-test run directory")
    listing = json.loads(runs_file.read_text(encoding="utf-8"))
    RunResults.load(runs_file, listing)  # the right schema and fields, or one line naming the problem
    runs = []
    for info in listing["runs"]:
        raw = run_dir / info["raw"]
        records = read_jsonl(raw) if raw.is_file() else []
        workers_file = run_dir / info.get("workers", "")
        workers = json.loads(workers_file.read_text()) if info.get("workers") and workers_file.is_file() else []
        settings_file = run_dir / info.get("settings", "")
        settings = json.loads(settings_file.read_text()) if info.get("settings") and settings_file.is_file() else {}
        runs.append(RunData(info=info, records=records, workers=workers, settings=settings))
    return runs


# ------------------------------------------------------------------------------------------------
# Run level


def measured_window(records: list[dict]) -> tuple[float, dict[int, tuple[int, int]]]:
    """Duration (s) = max over worker processes of (last response − first send) in that worker's
    own clock, over the measured records; also each worker's window."""
    windows: dict[int, tuple[int, int]] = {}
    for rec in records:
        if rec.get("t_last") is None:
            continue
        pid = rec.get("worker_pid", 0)
        lo, hi = windows.get(pid, (rec["t_sent"], rec["t_last"]))
        windows[pid] = (min(lo, rec["t_sent"]), max(hi, rec["t_last"]))
    if not windows:
        return 0.0, {}
    return max(hi - lo for lo, hi in windows.values()) / NS_PER_S, windows


def achieved_concurrency(records: list[dict], stop_signals: dict[int, int] | None = None,
                         measured: list[dict] | None = None) -> float | None:
    """Time-averaged requests in flight over the steady window (Little's law, Σ E2E / duration).

    Per worker process the window runs from the first measured send to the stop signal (else the
    last response); every request that overlaps it counts for the overlap — also warm-up requests
    still running when the window opens, and requests still in flight at stop — and the workers'
    averages add up."""
    measured = records if measured is None else measured
    starts: dict[int, int] = {}
    for rec in measured:
        pid = rec.get("worker_pid", 0)
        starts[pid] = min(starts.get(pid, rec["t_sent"]), rec["t_sent"])
    total, any_window = 0.0, False
    for pid, start in starts.items():
        mine = [r for r in records if r.get("worker_pid", 0) == pid]
        ends = [r["t_last"] for r in mine if r.get("t_last") is not None]
        end = (stop_signals or {}).get(pid) or (max(ends) if ends else None)
        if end is None or end <= start:
            continue
        any_window = True
        busy = 0
        for r in mine:
            if r.get("status") == "incomplete_at_stop" or r.get("t_last") is None:
                r_end = end
            else:
                r_end = r["t_last"]
            busy += max(0, min(r_end, end) - max(r["t_sent"], start))
        total += busy / (end - start)
    return total if any_window else None


def status_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for rec in records:
        counts[rec.get("status", "unknown")] += 1
    return dict(counts)


def run_summary(run: RunData, slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                slo_e2e_ms: float | None = None) -> dict[str, Any]:
    measured = run.measured
    ok = [r for r in measured if r.get("status") == "ok"]
    duration_s, _ = measured_window(ok)
    stop_signals = {w["pid"]: w.get("t_stop_signal") for w in run.workers if w.get("pid")}
    counts = status_counts(run.records)
    sent_by_workers = sum(w.get("sent", 0) for w in run.workers) if run.workers else None
    osl_total = sum(r.get("osl") or 0 for r in ok)
    failures = sum(1 for r in measured if r.get("status") in ("error", "timeout", "cancelled"))
    return {
        "key": run.info.get("key"),
        "arm": run.info.get("arm"),
        "concurrency": run.info.get("concurrency"),
        "repeat": run.info.get("repeat"),
        "draft_len": run.info.get("draft_len"),
        "valid": bool(run.info.get("valid", True)),
        "server_alive": bool(run.info.get("server_alive", True)),
        "n_records": len(run.records),
        "n_measured": len(measured),
        "n_ok": len(ok),
        "n_warmup": sum(1 for r in run.records if r.get("stage") == "warmup"),
        "status_counts": counts,
        "incomplete_at_stop": counts.get("incomplete_at_stop", 0),
        "sent": sent_by_workers,
        "accounted": sent_by_workers is None or sent_by_workers == len(run.records),
        "draft_fallbacks": sum(r.get("draft_fallbacks") or 0 for r in run.records),  # any stage: the draft failed
        "error_rate": failures / len(measured) if measured else 0.0,
        "duration_s": duration_s,
        "median_tpot_ms": median_of([tpot_ms(r) for r in ok]),
        "median_e2e_ms": median_of([e2e_ms(r) for r in ok]),
        "median_ttft_ms": median_of([ttft_ms(r) for r in ok]),
        "p95_ttft_ms": _quantile([ttft_ms(r) for r in ok], 95),
        "p95_e2e_ms": _quantile([e2e_ms(r) for r in ok], 95),
        "output_tokens_per_s": osl_total / duration_s if duration_s > 0 else None,
        "requests_per_s": len(ok) / duration_s if duration_s > 0 else None,
        "goodput_rps": (sum(meets_slo(r, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms) for r in ok) / duration_s)
        if duration_s > 0 else None,
        # the same in output tokens/s: what the requests within every SLO delivered (vLLM and AIPerf give req/s only)
        "goodput_tokens_per_s": (sum(r.get("osl") or 0 for r in ok if meets_slo(r, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms))
                                 / duration_s) if duration_s > 0 else None,
        "achieved_concurrency": achieved_concurrency(
            [r for r in run.records if r.get("status") in ("ok", "incomplete_at_stop")], stop_signals, ok),
        "peak_rss_mb": run.info.get("peak_rss_mb"),
        "client_cpu_fraction": run.info.get("client_cpu_fraction"),
        "target_rate": run.info.get("target_rate"),
        "metrics_delta": run.info.get("metrics_delta"),
        "server_acceptance": run.info.get("server_acceptance"),
        "acceptance_source": run_source(ok, run.info.get("server_acceptance")),
        "request_acceptance": {"draft_tokens": sum(r.get("draft_tokens") or 0 for r in ok),
                               "accepted_tokens": sum(r.get("accepted_tokens") or 0 for r in ok)},
        "throughput_timeline": throughput_timeline(run.records),
    }


def throughput_timeline(records: list[dict], bin_s: float = 1.0) -> list[dict[str, float]]:
    """Output tokens/s per second of the run (by last-token time, first worker clock) — drift plot."""
    counts: dict[int, int] = defaultdict(int)
    for rec in records:
        if rec.get("status") == "ok" and rec.get("t_last") is not None:
            counts[int(rec["t_last"] / NS_PER_S / bin_s)] += rec.get("osl") or 0
    return [{"t_s": k * bin_s, "tokens_per_s": v / bin_s} for k, v in sorted(counts.items())]


def median_of(values: Iterable[float | None]) -> float | None:
    return _quantile(values, 50)


def _quantile(values: Iterable[float | None], q: float) -> float | None:
    arr = [v for v in values if v is not None]
    return float(np.percentile(arr, q)) if arr else None


# ------------------------------------------------------------------------------------------------
# Cell level (pooled requests of every repeat)


def cell_summary(runs: list[RunData], slo_ttft_ms: float | None, slo_tpot_ms: float | None,
                 slo_e2e_ms: float | None = None) -> dict[str, Any]:
    ok = [r for run in runs for r in run.measured if r.get("status") == "ok"]
    gaps = [g for r in ok for g in chunk_gaps_ms(r)]
    tokens_per_chunk = [t for r in ok for t in (r.get("tokens_per_chunk") or [])]
    per_user = [1000.0 / t for t in (tpot_ms(r) for r in ok) if t]
    summaries = [run_summary(run, slo_ttft_ms, slo_tpot_ms, slo_e2e_ms) for run in runs]
    return {
        "n_runs": len(runs),
        "n_ok": len(ok),
        "ttft_ms": percentiles(ttft_ms(r) for r in ok),
        "first_answer_ms": percentiles(first_answer_ms(r) for r in ok),
        "reasoning_requests": sum(bool(r.get("reasoning_text")) for r in ok),
        "tpot_ms": percentiles(tpot_ms(r) for r in ok),
        "engine_tpot_ms": percentiles(engine_tpot_ms(r) for r in ok),
        "delivery_lag": delivery_lag(ok),
        "e2e_ms": percentiles(e2e_ms(r) for r in ok),
        "e2e_from_scheduled_ms": percentiles(e2e_ms(r, from_scheduled=True) for r in ok),
        "inter_chunk_latency_ms": percentiles(gaps),  # per CHUNK, not per token
        "tokens_per_chunk": percentiles(tokens_per_chunk),
        "per_user_tokens_per_s": {"p50": _quantile(per_user, 50), "p10": _quantile(per_user, 10)},
        "osl": percentiles(r.get("osl") for r in ok),
        "hit_max_tokens_pct": 100.0 * sum(bool(r.get("hit_max_tokens")) for r in ok) / len(ok) if ok else None,
        "output_tokens_per_s": _mean_of(s["output_tokens_per_s"] for s in summaries),
        "requests_per_s": _mean_of(s["requests_per_s"] for s in summaries),
        "goodput_rps": _mean_of(s["goodput_rps"] for s in summaries),
        "goodput_tokens_per_s": _mean_of(s["goodput_tokens_per_s"] for s in summaries),
        "achieved_concurrency": _mean_of(s["achieved_concurrency"] for s in summaries),
        "error_rate": _mean_of(s["error_rate"] for s in summaries),
        "incomplete_at_stop": sum(s["incomplete_at_stop"] for s in summaries),
        "peak_rss_mb": max((s["peak_rss_mb"] for s in summaries if s["peak_rss_mb"]), default=None),
        "run_variability": run_variability(summaries),
        "data_quality": data_quality(ok),
        "acceptance": with_server(acceptance_summary(ok, [run.info.get("metrics_delta") for run in runs]),
                                  [run.info.get("server_acceptance") for run in runs]),
        "acceptance_by_category": {
            cat: acceptance_summary([r for r in ok if r.get("category") == cat], [])
            for cat in sorted({r.get("category", "default") for r in ok})
        },
        "runs": summaries,
    }


def run_variability(summaries: list[dict]) -> dict[str, Any]:
    """Each repeat's median TPOT / E2E and p95 TTFT, with the coefficient of variation across runs."""
    out: dict[str, Any] = {}
    for metric in ("median_tpot_ms", "median_e2e_ms", "p95_ttft_ms", "output_tokens_per_s"):
        values = [s[metric] for s in summaries if s.get(metric) is not None]
        mean = float(np.mean(values)) if values else None
        cv = float(np.std(values, ddof=1) / mean) if len(values) > 1 and mean else None
        out[metric] = {"per_run": values, "cv": cv}
    return out


def data_quality(ok: list[dict]) -> dict[str, Any]:
    """Prompt echo (exclude_input_in_output ignored) and server-vs-retokenized OSL disagreement."""
    retok = [r for r in ok if r.get("osl_retok") is not None]
    mismatched = [r for r in retok if abs(r["osl_retok"] - (r.get("osl") or 0)) > max(1, 0.1 * (r.get("osl") or 0))]
    return {
        "prompt_echoed": sum(bool(r.get("prompt_echoed")) for r in ok),
        "osl_from_chunks": sum(r.get("osl_source") != "server" for r in ok),
        "osl_retok_checked": len(retok),
        "osl_retok_mismatch": len(mismatched),
    }


def _mean_of(values: Iterable[float | None]) -> float | None:
    arr = [v for v in values if v is not None]
    return float(np.mean(arr)) if arr else None


def acceptance_summary(records: list[dict], metric_deltas: list[dict | None]) -> dict[str, Any]:
    """Pooled α̂ = Σ accepted / Σ drafted and τ = 1 + accepted / verify steps.

    Steps come from the Prometheus counter deltas when present; otherwise from streamed chunks
    after the first (one chunk per verify step), labelled as a proxy."""
    drafted = sum(r.get("draft_tokens") or 0 for r in records)
    accepted = sum(r.get("accepted_tokens") or 0 for r in records)
    chunk_steps = sum(max(0, (r.get("n_chunks") or 0) - 1) for r in records)
    out: dict[str, Any] = {
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_acceptance_length": 1 + accepted / chunk_steps if chunk_steps and drafted else None,
        "tau_source": "chunks (proxy)",
        # target passes after prefill, with or without drafts: 1 + accepted / decode_steps is the
        # tokens a pass gains, below τ when some passes had nothing to verify (n-gram without a match)
        "decode_steps": chunk_steps or None,
        "tokens_per_chunk_mean": (sum(r.get("osl") or 0 for r in records) / sum(r.get("n_chunks") or 0 for r in records))
        if any(r.get("n_chunks") for r in records) else None,
    }
    deltas = [d for d in metric_deltas if d]
    steps = sum(d.get("verify_steps", 0) for d in deltas)
    if deltas and steps:
        m_drafted = sum(d.get("draft_tokens", 0) for d in deltas)
        m_accepted = sum(d.get("accepted_tokens", 0) for d in deltas)
        out["prometheus"] = {"draft_tokens": m_drafted, "accepted_tokens": m_accepted, "verify_steps": steps,
                             "acceptance_rate": m_accepted / m_drafted if m_drafted else None,
                             "source": next((d["source"] for d in deltas if d.get("source")), "specdeploy")}
        out["mean_acceptance_length"] = 1 + m_accepted / steps
        out["tau_source"] = "prometheus"
        if out["acceptance_rate"] is None and m_drafted:
            out["acceptance_rate"] = m_accepted / m_drafted
    return out
