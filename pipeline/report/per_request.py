"""Per-request and per-category figures the first screen needs beside the run-level ratios.

Reads the measured records of the primary draft length (``RunData.measured``) and ``runs.json``'s
per-run server acceptance; writes nothing. Three figures:

- acceptance per request: the distribution (p10/p50/p90, a histogram) of accepted / drafted over
  requests. The headline rate is pooled over drafted tokens, so long completions weigh more; the
  per-request view is what vLLM and AIPerf report, and shows a bimodal draft at a glance.
- acceptance by draft position: accepted / drafted at position 1..K where the server counts both
  (our reference engine's ``specdeploy_spec_decode_{accepted,draft}_tokens_per_pos_total``), else
  accepted / verify steps (vLLM's ``spec_decode_num_accepted_tokens_per_pos`` over its drafts, one
  per verify step), captured per run by :mod:`pipeline.loadtest.acceptance_sources`; otherwise
  "not reported by this server". Tells a team whether K is too long (late positions rarely accepted).
- a prompt category slower with speculation, with confidence: a one-sided Mann-Whitney test of
  the category's per-request TPOT, speculative greater than baseline, at ``alpha``. Request level
  (a category has too few requests per run for a run-level interval), so it names a category on
  the first screen as a warning; it decides nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.report.stats import median_of, tpot_ms

HISTOGRAM_BINS = 10  # 0-10 %, ..., 90-100 %
NOT_REPORTED_BY_SERVER = "not reported by this server"


def acceptance_per_request(records: list[dict]) -> dict[str, Any]:
    """Distribution of per-request acceptance (accepted / drafted) over requests that drafted."""
    rates = [r["accepted_tokens"] / r["draft_tokens"] for r in records
             if (r.get("draft_tokens") or 0) > 0 and r.get("accepted_tokens") is not None]
    if not rates:
        return {"n": 0, "p10": None, "p50": None, "p90": None, "mean": None, "histogram": None,
                "note": "no request reported its own draft and accepted counts"}
    arr = np.asarray(rates, dtype=float)
    counts, edges = np.histogram(np.clip(arr, 0.0, 1.0), bins=HISTOGRAM_BINS, range=(0.0, 1.0))
    return {"n": len(rates), "p10": float(np.percentile(arr, 10)), "p50": float(np.percentile(arr, 50)),
            "p90": float(np.percentile(arr, 90)), "mean": float(arr.mean()),
            "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}}


def acceptance_by_position(deltas: list[dict | None]) -> dict[str, Any]:
    """Per draft position: accepted there / drafted there (or / verify steps where the server counts
    no drafts per position), summed over the runs whose server counted it."""
    accepted: dict[int, float] = {}
    drafted: dict[int, float] = {}
    steps = 0.0
    sources = set()
    for delta in deltas:
        per_pos = (delta or {}).get("accepted_per_position")
        per_pos_drafted = (delta or {}).get("drafted_per_position")
        if not per_pos or not (per_pos_drafted or delta.get("verify_steps")):
            continue
        sources.add(delta.get("source"))
        for pos, value in per_pos.items():
            accepted[int(pos)] = accepted.get(int(pos), 0.0) + float(value)
        if per_pos_drafted:
            for pos, value in per_pos_drafted.items():
                drafted[int(pos)] = drafted.get(int(pos), 0.0) + float(value)
        else:  # vLLM: every draft offers K positions, one draft per verify step
            steps += float(delta["verify_steps"])
            for pos in per_pos:
                drafted[int(pos)] = drafted.get(int(pos), 0.0) + float(delta["verify_steps"])
    positions = [{"position": pos + 1, "accepted": accepted.get(pos, 0.0), "drafted": drafted[pos],
                  "rate": accepted.get(pos, 0.0) / drafted[pos]}  # the server counts from 0, a reader from 1
                 for pos in sorted(drafted) if drafted[pos]]
    if not positions:
        return {"reported": False, "note": NOT_REPORTED_BY_SERVER, "positions": []}
    return {"reported": True, "source": ", ".join(sorted(str(s) for s in sources)), "positions": positions}


def slower_categories(base_ok: list[dict], spec_ok: list[dict], alpha: float) -> dict[str, dict[str, Any]]:
    """Per prompt category: median TPOT ratio and the one-sided p that speculation is slower."""
    from scipy import stats as sps  # noqa: PLC0415 - start-up: scipy (loaded when the per-request statistics are computed)

    out = {}
    for cat in sorted({r.get("category", "default") for r in base_ok + spec_ok}):
        b = [v for v in (tpot_ms(r) for r in base_ok if r.get("category", "default") == cat) if v is not None]
        s = [v for v in (tpot_ms(r) for r in spec_ok if r.get("category", "default") == cat) if v is not None]
        if len(b) < 2 or len(s) < 2:
            out[cat] = {"tpot_ratio": None, "p_slower": None, "slower": False, "n_base": len(b), "n_spec": len(s)}
            continue
        p = float(sps.mannwhitneyu(s, b, alternative="greater").pvalue)
        ratio = median_of(s) / median_of(b) if median_of(b) else None
        out[cat] = {"tpot_ratio": ratio, "p_slower": p, "slower": bool(p < alpha and ratio is not None and ratio > 1.0),
                    "n_base": len(b), "n_spec": len(s)}
    return out
