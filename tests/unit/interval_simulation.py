"""Simulated load tests for the report's intervals and gate (issue 42): known truth, real code.

A trial is one load test at one level: n interleaved repeat pairs in the runner's counterbalanced
order (A B, B A, ...: ``pipeline.loadtest.cells.plan_runs``), each run's statistic = truth × run-level log-normal noise (CV 5–30 %) ×
a slow linear drift of the machine across the run's slots (DRIFT in total, e.g. 10 % slower by
the end). The true spec/base ratio is ``effect`` (1 = A/A).

* :func:`coverage` — how often an interval method's 95 % interval holds the true ratio, for the
  report's paired t (``pipeline.report.intervals.paired_bounds``, the code the report runs) and,
  as a negative control, the method the report used before issue 42 (:func:`old_bootstrap`, an
  unpaired percentile bootstrap of mean(spec)/mean(base), re-implemented vectorised here).
* :func:`gate_rates` — the verdicts of the real gate (``pipeline.report.gate.evaluate_gate``) on
  the simulated intervals of the four interval checks (TPOT and E2E benefit, p95 TTFT and peak
  throughput guardrails), at fixed repeats or with ``repeats: auto``'s stopping rule
  (``pipeline.loadtest.auto_repeats.stop_decision``, Bonferroni alpha spending over the looks).

Used by tests/unit/report/test_interval_coverage.py and benchmarks/bench_intervals.py.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.config import GateSettings
from pipeline.loadtest.auto_repeats import stop_decision
from pipeline.report.gate import GO, NO_GO, evaluate_gate
from pipeline.report.intervals import ci_dict, paired_bounds

N_PAIRS = (2, 3, 5, 10)
CVS = (0.05, 0.1, 0.2, 0.3)
EFFECTS = (1.0, 0.8, 0.5)
DRIFT = 0.10  # total multiplicative drift over a run's time slots (slow: 10 % from first to last run)
BASE_TTFT_P95_MS = 100.0


def simulate(rng: np.random.Generator, trials: int, n: int, cv: float, effect: float,
             drift: float = DRIFT) -> tuple[np.ndarray, np.ndarray]:
    """(spec, base) run statistics, shape (trials, n), in the runner's order (``plan_runs``): pair r
    takes slots 2r and 2r + 1, baseline first in even pairs, speculative first in odd ones."""
    sigma = math.sqrt(math.log1p(cv * cv))
    trend = np.exp(math.log1p(drift) * np.arange(2 * n) / max(1, 2 * n - 1))
    pairs = np.arange(n)
    base_slot = 2 * pairs + pairs % 2
    spec_slot = 2 * pairs + 1 - pairs % 2
    base = np.exp(sigma * rng.standard_normal((trials, n))) * trend[base_slot]
    spec = effect * np.exp(sigma * rng.standard_normal((trials, n))) * trend[spec_slot]
    return spec, base


def new_interval(spec: np.ndarray, base: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The report's interval (the same function the report calls), on the ratio scale."""
    _, _, low, high = paired_bounds(np.log(spec / base), confidence)
    return np.exp(low), np.exp(high)


def old_bootstrap(spec: np.ndarray, base: np.ndarray, confidence: float = 0.95, resamples: int = 999,
                  seed: int = 0, chunk: int = 250, kind: str = "ratio") -> tuple[np.ndarray, np.ndarray]:
    """Negative control: the report's interval before issue 42 (``comparison.bootstrap_ci`` on the
    runs: arms resampled independently, mean(spec)/mean(base) or their difference, percentile method)."""
    rng = np.random.default_rng(seed)
    trials, n = spec.shape
    q = [50 * (1 - confidence), 100 - 50 * (1 - confidence)]
    lows, highs = [], []
    for start in range(0, trials, chunk):
        s, b = spec[start:start + chunk], base[start:start + chunk]
        rows = np.arange(s.shape[0])[:, None, None]
        ms = s[rows, rng.integers(0, n, (s.shape[0], resamples, n))].mean(axis=2)
        mb = b[rows, rng.integers(0, n, (s.shape[0], resamples, n))].mean(axis=2)
        low, high = np.percentile(ms / mb if kind == "ratio" else ms - mb, q, axis=1)
        lows.append(low)
        highs.append(high)
    return np.concatenate(lows), np.concatenate(highs)


def coverage(method, trials: int = 4000, seed: int = 42, n_pairs=N_PAIRS, cvs=CVS,
             effects=EFFECTS) -> list[dict]:
    """Empirical coverage of ``method``'s 95 % interval per (n, CV, effect)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in n_pairs:
        for cv in cvs:
            for effect in effects:
                spec, base = simulate(rng, trials, n, cv, effect)
                low, high = method(spec, base)
                rows.append({"n": n, "cv": cv, "effect": effect,
                             "coverage": float(np.mean((low <= effect) & (effect <= high)))})
    return rows


# ------------------------------------------------------------------------------------------------
# The gate


def _comparison(cis: dict[str, dict], n: int) -> dict:
    ok = {"base": 200, "spec": 200}
    return {"concurrency": 1, "draft_len": None, "primary": True, "run_level": cis,
            "pooled_request_level": {}, "base_ttft_p95_ms": BASE_TTFT_P95_MS,
            "equivalence": {"equivalent": True, "mismatched": 0, "prompts_compared": 10},
            "output_length": {"match": True, "base_mean_osl": 64.0, "spec_mean_osl": 64.0, "relative_gap": 0.0,
                              "prompts_compared": 10},
            "n_ok": ok, "n_runs": {"base": n, "spec": n}, "error_rate": {"base": 0.0, "spec": 0.0},
            "achieved_concurrency": {"base": 1.0, "spec": 1.0}}


class GateTrials:
    """Per trial, the four interval checks' run statistics over max_n repeats: TPOT and E2E (the
    benefit: ``effect``), output tokens/s (1/effect: speculation raises it) and p95 TTFT (unchanged).
    A GO is false when the true ratio is not below the gate's tpot_ratio_max (0.9): A/A (1.0) and
    the threshold itself (0.9) are the cases to watch."""

    def __init__(self, rng: np.random.Generator, trials: int, max_n: int, cv: float, effect: float):
        self.trials, self.max_n = trials, max_n
        tpot = simulate(rng, trials, max_n, cv, effect)
        # E2E shares TPOT's runs (decode dominates it): the worst case for a false GO, since the two
        # benefit checks are then one piece of evidence, not two
        self.raw = {"tpot_ratio": tpot, "e2e_ratio": tpot,
                    "throughput_ratio": simulate(rng, trials, max_n, cv, 1.0 / effect)}
        spec, base = simulate(rng, trials, max_n, cv, 1.0)
        self.raw["ttft_p95_delta_ms"] = (BASE_TTFT_P95_MS * spec, BASE_TTFT_P95_MS * base)

    def _bounds(self, name: str, n: int, confidence: float, rows: np.ndarray, method: str):
        spec, base = self.raw[name][0][rows, :n], self.raw[name][1][rows, :n]
        ratio = name != "ttft_p95_delta_ms"
        if method == "old":  # the pre-issue-42 bootstrap; its point was the ratio (difference) of means
            if ratio:
                low, high = old_bootstrap(spec, base, confidence)
                point = spec.mean(axis=1) / base.mean(axis=1)
                return np.log(point), np.full(len(rows), np.nan), np.log(low), np.log(high)
            low, high = old_bootstrap(spec, base, confidence, kind="diff")
            return spec.mean(axis=1) - base.mean(axis=1), np.full(len(rows), np.nan), low, high
        return paired_bounds(np.log(spec / base) if ratio else spec - base, confidence)

    def analyses(self, n: int, confidence: float, rows: np.ndarray, method: str = "new") -> list[dict]:
        """The gate's input for the given trials after n repeats."""
        bounds = {name: self._bounds(name, n, confidence, rows, method) for name in self.raw}
        out = []
        for i in range(len(rows)):
            cis = {name: ci_dict(float(c[i]), None if np.isnan(sd[i]) else float(sd[i]), float(lo[i]), float(hi[i]), n,
                                 "diff" if name == "ttft_p95_delta_ms" else "ratio", confidence)
                   for name, (c, sd, lo, hi) in bounds.items()}
            out.append({"runs": [], "comparisons": [_comparison(cis, n)], "greedy": True, "acceptance_rate": 0.7,
                        "crossover_concurrency": None})
        return out


def gate_rates(n: int, cv: float, effect: float, trials: int = 1000, seed: int = 7,
               gate: GateSettings | None = None, method: str = "new") -> dict:
    """Verdict rates of the real gate at a fixed n repeats (95 % intervals; ``method='old'``: the
    pre-issue-42 bootstrap as the negative control)."""
    gate = gate or GateSettings()
    sim = GateTrials(np.random.default_rng(seed), trials, n, cv, effect)
    verdicts = [evaluate_gate(a, gate).verdict for a in sim.analyses(n, 1 - gate.alpha, np.arange(trials), method)]
    return {"n": n, "cv": cv, "effect": effect, "method": method, "go": verdicts.count(GO) / trials,
            "no_go": verdicts.count(NO_GO) / trials, "inconclusive": 1 - (verdicts.count(GO) + verdicts.count(NO_GO)) / trials}


def auto_rates(cv: float, effect: float, min_repeats: int = 3, max_repeats: int = 8, trials: int = 1000,
               seed: int = 11, spend: bool = True, gate: GateSettings | None = None) -> dict:
    """Verdict rates and repeats used with ``repeats: auto``: a look after each repeat from
    min_repeats, each at 1 − alpha/K (``spend``; else 1 − alpha at every look, the naive rule),
    stopping when ``auto_repeats.stop_decision`` says decided or at max_repeats."""
    gate = gate or GateSettings()
    looks = max_repeats - min_repeats + 1
    confidence = 1 - (gate.alpha / looks if spend else gate.alpha)
    sim = GateTrials(np.random.default_rng(seed), trials, max_repeats, cv, effect)
    verdict = np.array([""] * trials, dtype=object)
    used = np.zeros(trials, dtype=int)
    running = np.arange(trials)
    for n in range(min_repeats, max_repeats + 1):
        results = [evaluate_gate(a, gate) for a in sim.analyses(n, confidence, running)]
        stop = np.array([stop_decision(r)["decided"] or n == max_repeats for r in results])
        verdict[running[stop]] = [r.verdict for r, s in zip(results, stop) if s]
        used[running[stop]] = n
        running = running[~stop]
        if not running.size:
            break
    return {"cv": cv, "effect": effect, "min_repeats": min_repeats, "max_repeats": max_repeats, "spend": spend,
            "go": float(np.mean(verdict == GO)), "no_go": float(np.mean(verdict == NO_GO)),
            "inconclusive": float(np.mean((verdict != GO) & (verdict != NO_GO))),
            "median_repeats": float(np.median(used)), "mean_repeats": float(np.mean(used))}
