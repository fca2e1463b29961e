"""Acceptance inputs of the forecast, each named, and the tokens a step gains from them.

Reads, depending on the source: nothing (a user-given α or τ), an earlier run's ``report.json``
(measured τ per concurrency and the pooled acceptance rate), a ``specdeploy bench`` JSON (τ and
tokens per target pass), or ``pipeline/forecast/data/published.yaml`` (acceptance lengths papers
report). Writes nothing. No source → :class:`ForecastInputError` saying how to give one.

τ (tokens per verify step, bonus included) for i.i.d. acceptance α over K drafts is
``(1 − α^(K+1)) / (1 − α)``; with measured per-position acceptance ``a_i`` (fraction of steps
whose i-th draft was accepted) it is ``1 + Σ a_i``. A measured τ at one K gives the α that
explains it (bisection), which the K sweep extrapolates from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from pipeline.forecast.figures import ForecastInputError

DEFAULT_ALPHA_BAND = 0.05  # ± on α when the source gives no spread of its own


def tau_iid(alpha: float, k: int) -> float:
    """Expected tokens per verify step for i.i.d. acceptance α and K drafts."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    alpha = max(alpha, 0.0)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def tau_positions(accepted_fraction: list[float]) -> float:
    """τ from per-position acceptance: 1 + Σ (steps whose i-th draft was accepted / steps)."""
    return 1.0 + sum(accepted_fraction)


def alpha_for_tau(tau: float, k: int) -> float:
    """The i.i.d. α whose τ at K drafts is ``tau`` (clipped to [0, 1])."""
    if tau <= 1.0:
        return 0.0
    if tau >= k + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if tau_iid(mid, k) < tau else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Acceptance:
    """Acceptance as a forecast input: α (per-draft, i.i.d.) with a band, or a measured τ at a
    known depth; ``source`` names where it came from."""

    source: str
    alpha: float | None = None
    alpha_low: float | None = None
    alpha_high: float | None = None
    tau: float | None = None  # measured τ at depth ``at_depth`` (trees: their τ)
    tau_low: float | None = None
    tau_high: float | None = None
    at_depth: int | None = None
    per_level: dict[int, float] | None = None  # measured τ per concurrency (an earlier run)
    coverage: float = 1.0  # fraction of steps that carry drafts (n-gram finds no match on some steps)

    def tau_at(self, k: int, edge: str = "point", tree: bool = False, level: int | None = None) -> float:
        """τ at draft depth ``k``; ``edge`` 'low' / 'high' gives the band's ends."""
        if self.per_level and level in self.per_level and (self.at_depth in (None, k) or tree):
            point = self.per_level[level]
            spread = (self.tau_high - self.tau) if (self.tau and self.tau_high) else 0.0
            return {"point": point, "low": max(1.0, point - spread), "high": point + spread}[edge]
        if self.tau is not None and (tree or self.alpha is None or self.at_depth == k):
            return {"point": self.tau, "low": self.tau_low or self.tau, "high": self.tau_high or self.tau}[edge]
        alpha = {"point": self.alpha, "low": self.alpha_low, "high": self.alpha_high}[edge]
        return tau_iid(alpha if alpha is not None else self.alpha, k)

    def describe(self) -> dict:
        return {k: v for k, v in {
            "source": self.source, "alpha": _r(self.alpha), "alpha_band": [_r(self.alpha_low), _r(self.alpha_high)],
            "tau": _r(self.tau), "tau_band": [_r(self.tau_low), _r(self.tau_high)], "at_depth": self.at_depth,
            "tau_per_concurrency": {str(c): _r(t) for c, t in (self.per_level or {}).items()} or None,
            "draft_coverage": _r(self.coverage) if self.coverage < 1.0 else None,
        }.items() if v not in (None, [None, None])}


def _r(value):
    return round(value, 4) if isinstance(value, float) else value


def from_alpha(alpha: float, source: str = "user-given --acceptance", band: float = DEFAULT_ALPHA_BAND) -> Acceptance:
    if not 0.0 <= alpha <= 1.0:
        raise ForecastInputError(f"--acceptance {alpha}: an acceptance rate α is between 0 and 1 (e.g. --acceptance 0.7)")
    return Acceptance(source, alpha, max(0.0, alpha - band), min(1.0, alpha + band))


def from_tau(tau: float, depth: int, source: str, spread: float = 0.1) -> Acceptance:
    """A measured or published mean acceptance length τ at depth K (± ``spread`` relative)."""
    if tau < 1.0:
        raise ForecastInputError(f"acceptance length {tau}: τ counts the bonus token, so it is ≥ 1")
    alpha = alpha_for_tau(tau, depth)
    return Acceptance(source, alpha, alpha_for_tau(tau * (1 - spread), depth), alpha_for_tau(tau * (1 + spread), depth),
                      tau, max(1.0, tau * (1 - spread)), tau * (1 + spread), depth)


def from_report(path: Path) -> Acceptance:
    """Measured acceptance of an earlier run: τ per concurrency of the speculative arm (its
    primary draft length), the band from the spread across levels."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ForecastInputError(f"--from-report {path}: cannot read it ({exc}); give a run's report.json") from None
    rows = [r for r in data.get("rows", []) if r.get("arm") == "speculative" and r.get("mean_acceptance_length")]
    depth = data.get("primary_draft_len") or next((r.get("speculation_length") for r in rows), None)
    if not rows or not depth:
        raise ForecastInputError(f"--from-report {path}: no measured acceptance (no speculative rows with a mean "
                                 f"acceptance length); give --acceptance 0.7 instead")
    per_level = {int(r["concurrency"]): float(r["mean_acceptance_length"]) for r in rows
                 if r.get("speculation_length") in (None, depth)}
    taus = list(per_level.values())
    tau = sum(taus) / len(taus)
    source = f"report {path} ({data.get('acceptance_source') or 'measured'})"
    acc = from_tau(tau, int(depth), source, spread=max(0.05, (max(taus) - min(taus)) / (2 * tau)))
    return replace(acc, per_level=per_level)


def from_bench(path: Path, method: str | None = None, depth: int | None = None) -> Acceptance:
    """τ from a ``specdeploy bench`` JSON (summary rows, scope 'all', batch 1) at the config's
    draft depth (None: τ as measured, no K sweep)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ForecastInputError(f"--from-bench {path}: cannot read it ({exc})") from None
    rows = [r for r in data.get("summary", []) if r.get("scope") == "all" and (method is None or r["method"] == method)]
    if not rows:
        raise ForecastInputError(f"--from-bench {path}: no summary rows for {method or 'any method'}")
    row = min(rows, key=lambda r: r["batch"])
    tau = float(row["mean_acceptance_length"])
    if depth is None:  # trees and unknown depth: τ as measured
        return Acceptance(f"bench {path}", tau=tau, tau_low=tau * 0.95, tau_high=tau * 1.05)
    return from_tau(tau, int(depth), f"bench {path}", spread=0.05)


def missing_acceptance_message(config_name: str) -> str:
    return (f"{config_name}: the forecast needs an acceptance source and none was given. Give one of: "
            f"--acceptance 0.7 (α per draft token, i.i.d.), --acceptance-length 3.2 (τ measured elsewhere, e.g. "
            f"a server's mean acceptance length), --from-report RUN_DIR/report.json (an earlier run), "
            f"--from-bench bench.json (specdeploy bench --output), or --published CASE (a published pair)")
