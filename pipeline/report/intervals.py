"""The run-level intervals the gate decides on: a paired, studentised t interval over repeats.

The arms are interleaved (repeat r measures the baseline, then the speculative arm, at each
level), so repeat r of each arm forms a natural pair that shares the machine's state at that time:
its load from other tenants, its thermal state, a slow drift. The interval is taken over the
per-pair differences, on the log scale for ratios:

    d_r = log(spec_r / base_r)   (ratios: TPOT, E2E, throughput, goodput)
    d_r = spec_r − base_r        (differences: p95 TTFT in ms)
    CI  = mean(d) ± t(1 − α/2, n − 1) · sd(d) / √n,  back-transformed by exp for ratios

with n the number of complete pairs. Why this and not a bootstrap: with 2 to 10 runs per arm a
percentile bootstrap cannot see the tails (at 2 runs per arm it returns the extreme pairings, and
covers a true ratio of 1 about two times in three); the t quantile with n − 1 degrees of freedom is
exact for normal log-noise and widens honestly at small n (12.7 standard errors at n = 2). Pairing
removes what the two runs of a pair share (load and drift common to both), so only the within-pair
noise enters. The simulation in tests/unit/report/test_interval_coverage.py (and benchmarks/bench_intervals.py)
shows ≥ 93 % coverage of a nominal 95 % at 2, 3, 5 and 10 pairs, CV 5–30 %, with slow drift.

Also: how many repeats would likely decide a check (:func:`repeats_to_decide`), from the observed
SD of the per-pair log ratios and the distance of their mean to the threshold.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Iterable

METHOD = "paired t on per-repeat log ratios (t, n-1 df)"
METHOD_DIFF = "paired t on per-repeat differences (t, n-1 df)"
MAX_REPEATS_ESTIMATE = 200  # beyond this "more repeats" is no longer a useful answer


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided t quantile t(1 − (1 − confidence)/2, df)."""
    from scipy import stats as sps  # noqa: PLC0415 - start-up: scipy (pipeline.loadtest.auto_repeats and the report import this module; scipy loads at the first interval)

    return float(sps.t.ppf(1.0 - (1.0 - confidence) / 2.0, df))


def paired_values(spec_runs: Iterable[dict], base_runs: Iterable[dict], metric: str) -> list[tuple[float, float]]:
    """(spec, base) of ``metric`` for every repeat both arms measured, in repeat order."""
    spec = {r.get("repeat"): r.get(metric) for r in spec_runs}
    base = {r.get("repeat"): r.get(metric) for r in base_runs}
    pairs = []
    for rep in sorted(set(spec) & set(base), key=lambda x: (x is None, x)):
        s, b = spec[rep], base[rep]
        if s is not None and b is not None:
            pairs.append((float(s), float(b)))
    return pairs


def paired_bounds(values, confidence: float):
    """Vectorised core of :func:`paired_ci`: per-pair values along the last axis → (center, sd, low,
    high) on the analysis scale, each with the leading shape (the simulation in
    tests/unit/interval_simulation.py runs thousands of trials through this same code)."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (pipeline.loadtest.auto_repeats and the report import this module; numpy loads at the first interval)

    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    center = values.mean(axis=-1)
    sd = values.std(axis=-1, ddof=1)
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return center, sd, center - half, center + half


def paired_ci(pairs: list[tuple[float, float]], kind: str, confidence: float) -> dict[str, Any]:
    """The paired t interval of spec/base (``kind='ratio'``) or spec − base (``'diff'``).

    Returns point, low, high and what the gate needs to say how far the evidence is from a decision:
    ``center`` and ``sd`` of the per-pair values on the analysis scale (log for ratios), ``n_pairs``."""
    log_scale = kind == "ratio"
    usable = [(s, b) for s, b in pairs if not log_scale or (s > 0 and b > 0)]
    values = [math.log(s / b) if log_scale else s - b for s, b in usable]
    n = len(values)
    if n == 0:
        return {**ci_dict(None, None, None, None, 0, kind, confidence), "note": "no repeat measured by both arms: no CI"}
    if n < 2:
        return {**ci_dict(values[0], None, None, None, 1, kind, confidence), "note": "fewer than 2 paired repeats: no CI"}
    center, sd, low, high = paired_bounds(values, confidence)
    return ci_dict(float(center), float(sd), float(low), float(high), n, kind, confidence)


def ci_dict(center: float | None, sd: float | None, low: float | None, high: float | None, n: int, kind: str,
            confidence: float) -> dict[str, Any]:
    """The interval as the comparisons carry it (bounds back on the ratio scale for ratios)."""
    log_scale = kind == "ratio"

    def back(x: float | None) -> float | None:
        return None if x is None else math.exp(x) if log_scale else x

    return {"point": back(center), "low": back(low), "high": back(high), "n_pairs": n, "n_spec": n, "n_base": n,
            "method": METHOD if log_scale else METHOD_DIFF, "confidence_level": confidence,
            "statistic": "geometric mean of per-repeat spec/base ratios" if log_scale else "mean of per-repeat spec - base",
            "scale": "log" if log_scale else "linear", "center": center, "sd": sd}


def repeats_to_decide(ci: dict[str, Any], threshold: float) -> int | None:
    """Paired repeats that would likely put the interval wholly on one side of ``threshold``, if the
    mean and SD of the per-pair values stay as observed; None when that cannot be estimated (no SD,
    the mean sits on the threshold) or would take more than MAX_REPEATS_ESTIMATE."""
    center, sd, n = ci.get("center"), ci.get("sd"), ci.get("n_pairs") or 0
    if center is None or sd is None or n < 2:
        return None
    if ci.get("scale") == "log":
        if threshold <= 0:
            return None
        threshold = math.log(threshold)
    distance = abs(center - threshold)
    if distance == 0:
        return None
    if sd == 0:
        return n
    import numpy as np  # noqa: PLC0415 - start-up: numpy (pipeline.loadtest.auto_repeats and the report import this module; numpy loads at the first interval)

    m, t_over_root_m = _t_table(ci.get("confidence_level", 0.95))
    enough = np.flatnonzero((m >= n) & (t_over_root_m * sd < distance))
    return int(m[enough[0]]) if enough.size else None


@lru_cache(maxsize=8)
def _t_table(confidence: float):
    """m = 2..MAX_REPEATS_ESTIMATE and t(1 − α/2, m − 1)/√m: a half-width per unit SD at m pairs."""
    import numpy as np  # noqa: PLC0415 - start-up: numpy (pipeline.loadtest.auto_repeats and the report import this module; numpy loads at the first interval)
    from scipy import stats as sps  # noqa: PLC0415 - start-up: scipy (pipeline.loadtest.auto_repeats and the report import this module; scipy loads at the first interval)

    m = np.arange(2, MAX_REPEATS_ESTIMATE + 1)
    return m, sps.t.ppf(1.0 - (1.0 - confidence) / 2.0, m - 1) / np.sqrt(m)


def decided(low: float | None, high: float | None, threshold: float) -> bool:
    """The interval lies wholly on one side of the threshold."""
    return low is not None and high is not None and not (low <= threshold <= high)
