"""Capacity and cost at an SLO, per arm: how much load one replica sustains within the SLOs, how
many replicas and GPUs a target rate (or a daily profile) needs, and what a million output tokens
costs — from a run's measured curves, or, for a config with no run yet, from the forecast.

Reads a run directory (``report.json`` for the arms, levels and SLOs the report used, ``runs.json``
and the raw records for each repeat's throughput and latency percentiles) or a forecast's inputs.
Writes nothing; :func:`measured_capacity` and :func:`forecast_capacity` return JSON-able dicts.

Glossary:

- *slack*: at one level of one repeat, the largest of (measured percentile ÷ SLO limit) over the
  SLOs set; ≤ 1 meets every SLO;
- *replica capacity*: the highest request rate one replica sustains with slack ≤ 1. Per repeat it
  is the throughput of the most loaded level that meets the SLOs, interpolated linearly (in slack)
  towards the first level that does not; when every level meets them it is the last level's
  throughput and only a lower bound ("at least": the run never reached the SLO);
- *interval*: per arm, a t interval over the repeats' capacities; speculative ÷ baseline, the
  paired t interval of :mod:`pipeline.report.intervals` (repeat r of both arms ran minutes apart);
- *replicas* = ceil(rate ÷ capacity); *GPUs* = replicas × GPUs per replica; *cost per million
  output tokens* = GPUs × price per GPU-hour ÷ (output tokens per hour served) × 10⁶ — at the
  target rate, so idle headroom is paid for; with a daily profile, replicas follow the hour.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import SpecdeployError, UsageError
from pipeline.report.intervals import paired_ci, t_quantile
from pipeline.report.stats import e2e_ms, load_runs, tpot_ms, ttft_ms

METRICS = {"ttft": ttft_ms, "tpot": tpot_ms, "e2e": e2e_ms}
CONFIDENCE = 0.95


class CapacityError(SpecdeployError):
    """A capacity question this run or config cannot answer (the message says why)."""

    exit_code = UsageError.exit_code


@dataclass(frozen=True)
class Slo:
    """Latency limits at one percentile (None: not set)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    percentile: float = 95.0

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "e2e": self.e2e_ms}.items() if v}

    def describe(self) -> dict:
        return {"percentile": self.percentile, **{f"{k}_ms": v for k, v in self.limits().items()}}


@dataclass(frozen=True)
class Demand:
    """A constant target rate, or 24 hourly rates (req/s) of a day."""

    rate_rps: float | None = None
    hourly_rps: tuple[float, ...] = ()

    def __post_init__(self):
        if (self.rate_rps is None) == (not self.hourly_rps):
            raise CapacityError("give a target request rate (--rate) or a daily profile (--daily-profile), one of them")
        if self.hourly_rps and len(self.hourly_rps) != 24:
            raise CapacityError(f"a daily profile has 24 hourly rates, got {len(self.hourly_rps)}")
        if any(r < 0 for r in self.hourly_rps) or (self.rate_rps is not None and self.rate_rps <= 0):
            raise CapacityError("request rates are positive")

    @property
    def peak(self) -> float:
        return self.rate_rps if self.rate_rps is not None else max(self.hourly_rps)

    def describe(self) -> dict:
        return {"rate_rps": self.rate_rps} if self.rate_rps is not None else {"hourly_rps": list(self.hourly_rps)}


@dataclass(frozen=True)
class Pricing:
    gpu_hour_usd: float | None = None
    gpus_per_replica: int = 1


@dataclass
class ArmCapacity:
    """One arm's replica capacity: point and interval (req/s), and output tokens/s at it."""

    arm: str
    rps: float
    rps_low: float | None
    rps_high: float | None
    output_tokens_per_s: float
    lower_bound: bool = False  # every measured level met the SLOs: the true capacity is higher
    per_repeat: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def tokens_per_request(self) -> float:
        return self.output_tokens_per_s / self.rps if self.rps > 0 else 0.0


def read_profile(path: Path) -> tuple[float, ...]:
    """24 hourly rates from a JSON/YAML list or a text file of one number per line."""
    text = path.read_text(encoding="utf-8")
    try:
        values = json.loads(text)
    except ValueError:
        values = [line.split("#")[0].strip() for line in text.splitlines()]
        values = [v for v in values if v]
    try:
        return tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise CapacityError(f"{path}: a daily profile is 24 numbers (req/s per hour), as a JSON list or one per line") from None


# ------------------------------------------------------------------------------------------------
# Measured


def _percentile(values: list[float], q: float) -> float | None:

    return float(np.percentile(values, q)) if values else None


def level_slack(records: list[dict], slo: Slo) -> tuple[float, dict[str, float | None]]:
    """(slack, percentile per metric) of one run's measured records."""
    ok = [r for r in records if r.get("stage") == "measure" and r.get("status") == "ok"]
    values = {name: _percentile([v for r in ok if (v := METRICS[name](r)) is not None], slo.percentile)
              for name in slo.limits()}
    slack = max(((v / slo.limits()[k]) if v is not None else math.inf) for k, v in values.items())
    return slack, values


def _capacity_of_curve(points: list[tuple[float, float, float]]) -> tuple[float, float, bool]:
    """(req/s, output tokens/s, lower bound?) of one repeat's curve [(slack, rps, tokens/s)] in load order."""
    best = None
    for i, (slack, rps, tps) in enumerate(points):
        if slack > 1.0:
            continue
        if best is None or rps >= best[0]:
            best = (rps, tps, i)
    if best is None:
        return 0.0, 0.0, False
    rps, tps, i = best
    following = [p for p in points[i + 1:] if p[0] > 1.0]
    if not following:
        return rps, tps, i == len(points) - 1
    s1, r1, t1 = points[i][0], rps, tps
    s2, r2, t2 = following[0]
    frac = (1.0 - s1) / (s2 - s1) if s2 > s1 else 0.0
    return r1 + frac * max(r2 - r1, 0.0), t1 + frac * max(t2 - t1, 0.0), False


def report_slo(report: dict, percentile: float | None = None) -> Slo:
    """The SLOs a report was made with (gate.slo), at ``percentile`` (default: the SLO's own, else p95)."""
    gate_slo = (report.get("gate_settings") or {}).get("slo") or {}
    return Slo(gate_slo.get("ttft_ms"), gate_slo.get("tpot_ms"), gate_slo.get("e2e_ms"),
               percentile or gate_slo.get("percentile") or 95.0)


def measured_capacity(run_dir: Path, slo: Slo | None = None, report: dict | None = None) -> dict[str, Any]:
    """Per arm (primary draft length), the replica capacity within ``slo`` (default: the SLOs the
    report was made with, at p95), its interval over repeats, and speculative ÷ baseline.
    ``report``: the report's data (default: the run's report.json)."""
    if report is None:
        report_file = run_dir / "report.json"
        if not report_file.is_file():
            raise CapacityError(f"{report_file} not found: run `specdeploy report {run_dir}` first")
        report = json.loads(report_file.read_text(encoding="utf-8"))
    if slo is None:
        slo = report_slo(report)
    if not slo.limits():
        raise CapacityError("no SLO to size against: give --ttft-ms, --tpot-ms or --e2e-ms")
    summaries = {r["key"]: r for r in report.get("runs", [])}
    primary = report.get("primary_draft_len")
    curves: dict[str, dict[int, list[tuple[int, float, float, float]]]] = {"baseline": {}, "speculative": {}}
    for run in load_runs(run_dir):
        info = run.info
        summary = summaries.get(info.get("key"))
        if summary is None or not summary.get("valid", True):
            continue
        arm = info.get("arm")
        if arm == "speculative" and info.get("draft_len") not in (None, primary):
            continue  # a draft-length sweep: the primary K is the one a rollout deploys
        if arm not in curves:
            continue
        slack, _ = level_slack(run.records, slo)
        load = info.get("target_rate") or info["concurrency"]  # an open loop's level is its rate
        curves[arm].setdefault(info.get("repeat", 0), []).append(
            (load, slack, summary["requests_per_s"], summary["output_tokens_per_s"]))
    per_arm = {}
    for arm, by_repeat in curves.items():
        if not by_repeat:
            raise CapacityError(f"{run_dir}: no valid {arm} runs to size from")
        per_arm[arm] = {rep: _capacity_of_curve([(s, r, t) for _, s, r, t in sorted(points)])
                        for rep, points in by_repeat.items()}
    arms = {arm: _arm(arm, per_repeat) for arm, per_repeat in per_arm.items()}
    pairs = [(spec[0], per_arm["baseline"][rep][0]) for rep, spec in per_arm["speculative"].items()
             if rep in per_arm["baseline"]]
    ratio = paired_ci(pairs, "ratio", CONFIDENCE)
    return {"source": "measured", "run_dir": str(run_dir), "slo": slo.describe(),
            "levels": sorted({load for pts in curves["baseline"].values() for load, *_ in pts}),
            "arms": {a: _arm_dict(c) for a, c in arms.items()},
            "capacity_ratio": {k: ratio.get(k) for k in ("point", "low", "high", "n_pairs", "method", "confidence_level")}}


def _arm(arm: str, per_repeat: dict[int, tuple[float, float, bool]]) -> ArmCapacity:
    values = [v[0] for v in per_repeat.values()]
    tokens = [v[1] for v in per_repeat.values()]
    n = len(values)
    mean = sum(values) / n
    low = high = None
    if n >= 2:
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t_quantile(CONFIDENCE, n - 1) * sd / math.sqrt(n)
        low, high = max(0.0, mean - half), mean + half
    lower_bound = any(v[2] for v in per_repeat.values())
    note = ("every measured level met the SLOs: the capacity is at least this (load-test higher levels)"
            if lower_bound else "" if mean > 0 else "no measured level meets the SLOs")
    return ArmCapacity(arm, mean, low, high, sum(tokens) / n, lower_bound, values, note)


def _arm_dict(c: ArmCapacity) -> dict:
    return {"rps": round(c.rps, 4), "rps_interval": [_r(c.rps_low), _r(c.rps_high)],
            "output_tokens_per_s": round(c.output_tokens_per_s, 2), "lower_bound": c.lower_bound,
            "per_repeat_rps": [round(v, 4) for v in c.per_repeat], "note": c.note}


def _r(value):
    return None if value is None else round(value, 4)


# ------------------------------------------------------------------------------------------------
# From capacity to GPUs and cost


def plan_fleet(capacity: dict[str, Any], demand: Demand, pricing: Pricing) -> dict[str, Any]:
    """Replicas, GPUs, tokens/s per GPU and cost per million output tokens per arm (each at the
    capacity's point and at its interval's ends), and the difference speculation makes."""
    out = {"demand": demand.describe(), "gpus_per_replica": pricing.gpus_per_replica,
           "gpu_hour_usd": pricing.gpu_hour_usd, "arms": {}}
    for arm, cap in capacity["arms"].items():
        low, high = cap["rps_interval"]
        tokens_per_request = cap["output_tokens_per_s"] / cap["rps"] if cap["rps"] > 0 else 0.0
        rows = {edge: _fleet(rps, tokens_per_request, demand, pricing)
                for edge, rps in (("point", cap["rps"]), ("worst", low), ("best", high)) if rps is not None}
        out["arms"][arm] = {**rows["point"], "tokens_per_request": round(tokens_per_request, 2),
                            "interval": {"gpus": [rows[e]["gpus"] for e in ("worst", "best") if e in rows],
                                         "cost_per_m_tokens_usd": [rows[e]["cost_per_m_tokens_usd"]
                                                                   for e in ("worst", "best") if e in rows]}}
    base, spec = out["arms"].get("baseline"), out["arms"].get("speculative")
    if base and spec and base["gpus"] is not None and spec["gpus"] is not None:
        out["speculation"] = {"gpus_saved": base["gpus"] - spec["gpus"],
                              "cost_change": _change(base["cost_per_m_tokens_usd"], spec["cost_per_m_tokens_usd"])}
    return out


def _fleet(rps: float, tokens_per_request: float, demand: Demand, pricing: Pricing) -> dict[str, Any]:
    if rps <= 0:
        return {"replicas": None, "gpus": None, "output_tokens_per_s_per_gpu": 0.0, "cost_per_m_tokens_usd": None,
                "why": "this arm meets the SLOs at no measured load"}
    rates = [demand.rate_rps] if demand.rate_rps is not None else list(demand.hourly_rps)
    replicas = [math.ceil(rate / rps) if rate > 0 else 0 for rate in rates]
    peak = max(replicas)
    gpu_hours = sum(r * pricing.gpus_per_replica for r in replicas)  # one hour per rate
    hours = len(rates)
    tokens = sum(rate * tokens_per_request * 3600 for rate in rates)
    cost = None
    if pricing.gpu_hour_usd is not None and tokens > 0:
        cost = gpu_hours * pricing.gpu_hour_usd / tokens * 1e6
    row = {"replica_rps": round(rps, 4), "replicas": peak, "gpus": peak * pricing.gpus_per_replica,
           "output_tokens_per_s_per_gpu": round(rps * tokens_per_request / pricing.gpus_per_replica, 2),
           "cost_per_m_tokens_usd": None if cost is None else round(cost, 4)}
    if demand.hourly_rps:
        row["gpu_hours_per_day"] = gpu_hours
        row["replicas_by_hour"] = replicas
        row["static_gpus"] = peak * pricing.gpus_per_replica
        row["hours"] = hours
    return row


def _change(base: float | None, spec: float | None) -> float | None:
    return None if base in (None, 0) or spec is None else round(spec / base - 1, 4)


# ------------------------------------------------------------------------------------------------
# Forecast only


def forecast_capacity(inp, slo: Slo, grid: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Per arm, the replica capacity the forecast gives (no run yet): at each concurrency c up to
    the deployment's limit, TPOT from the cost model, E2E = TTFT + (N − 1)·TPOT with TTFT one
    prefill forward of the prompt (queueing not modelled), and c ÷ E2E requests/s; the capacity is
    the most loaded c whose TPOT and E2E meet the SLOs — the forecast's means against the limits
    (a percentile is not forecast), over every corner of the band for the interval."""
    from pipeline.forecast.model import CROSSOVER_GRID, step_times  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; only a config without a run needs the forecast)
    from pipeline.forecast.uncertainty import corner_inputs, model_error, with_model_error  # noqa: PLC0415 - start-up: yaml (pipeline.forecast reads its tables; only a config without a run needs the forecast)

    if inp.requests is None:
        raise CapacityError("a capacity forecast needs the requests' prompt and output tokens")
    grid = grid or tuple(c for c in CROSSOVER_GRID if inp.limit is None or c <= inp.limit.sequences)

    def arm_rps(moved, edge: str) -> dict[str, tuple[float, float]]:
        req = moved.requests
        ttft = moved.device.forward(moved.target, 1, req.prompt_tokens, req.prompt_tokens // 2).seconds
        best = {"baseline": (0.0, 0.0), "speculative": (0.0, 0.0)}
        for c in grid:
            tau = moved.acceptance.tau_at(moved.plan.depth, edge, moved.plan.tree, c)
            for arm, tpot in zip(("baseline", "speculative"), step_times(moved, c, moved.plan, tau)):
                e2e = ttft + (req.output_tokens - 1) * tpot
                ok = (slo.tpot_ms is None or tpot * 1e3 <= slo.tpot_ms) and (slo.e2e_ms is None or e2e * 1e3 <= slo.e2e_ms)
                if ok and c / e2e > best[arm][0]:
                    best[arm] = (c / e2e, c / e2e * req.output_tokens)
        return best

    point = arm_rps(inp, "point")
    # the demand is counted in requests of the given shape, so the shape is not one of the band's inputs here
    corners = [arm_rps(moved, edge) for moved, edge in corner_inputs(inp, exclude=("request_shape",))]
    arms = {}
    for arm in ("baseline", "speculative"):
        values = [c[arm][0] for c in corners]
        at_limit = inp.limit is not None and point[arm][0] > 0
        arms[arm] = {"rps": round(point[arm][0], 4), "rps_interval": [round(min(values), 4), round(max(values), 4)],
                     "output_tokens_per_s": round(point[arm][1], 2), "lower_bound": False,
                     "note": "forecast: means against the SLO limits; TTFT is one prefill forward (queueing not modelled)"
                     + (f"; at most {inp.limit.sequences} sequences ({inp.limit.name})" if at_limit else "")}
    ratio = point["speculative"][0] / point["baseline"][0] if point["baseline"][0] > 0 else None
    ratios = [c["speculative"][0] / c["baseline"][0] for c in corners if c["baseline"][0] > 0]
    low = high = None
    if ratio is not None and ratios:
        low, high = with_model_error(min(ratios), max(ratios), model_error(getattr(inp.device, "kind", "gpu")))
    return {"source": "forecast", "slo": slo.describe(), "ttft_slo": "not forecast" if slo.ttft_ms else None,
            "band_method": "the forecast's band corners but the request shape (docs/forecast.md); the ratio's "
                           "band also divided by the model's recorded error", "arms": arms,
            "capacity_ratio": {"point": None if ratio is None else round(ratio, 4), "low": _r(low), "high": _r(high),
                               "method": "forecast band"}}


# ------------------------------------------------------------------------------------------------
# A prediction at one rate, to check against an open-loop run


def report_section(run_dir: Path, data: dict, settings, gpus_per_replica: int) -> dict[str, Any]:
    """The report's capacity section (config ``capacity:``): the measured capacity at gate.slo, the
    fleet and cost, and how far this method was off when last checked against an open-loop run."""
    capacity = measured_capacity(run_dir, report_slo(data, settings.percentile), data)
    demand = Demand(settings.rate_rps, tuple(settings.daily_profile))
    fleet = plan_fleet(capacity, demand, Pricing(settings.gpu_hour_usd, settings.gpus_per_replica or gpus_per_replica))
    return {"available": True, "capacity": capacity, "fleet": fleet, "last_check": last_check()}


CHECK_RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "capacity-check.json"


def last_check() -> dict[str, Any] | None:
    """The errors of the last prediction-vs-open-loop check (benchmarks/bench_capacity.py), if on record."""
    try:
        check = json.loads(CHECK_RESULTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {"created": check.get("created"), "commit": check.get("commit"), "rate_rps": check.get("rate_rps"),
            "comparison": check.get("comparison")}


def predict_at_rate(run_dir: Path, rate_rps: float, slo: Slo) -> dict[str, Any]:
    """Per arm, what one replica does at ``rate_rps`` by the run's measured curves: the chosen
    percentile of each SLO metric, interpolated linearly in throughput between the two levels
    around the rate (per repeat, then averaged), whether it meets the SLOs, and the output tokens/s
    (the rate × the run's tokens per request; None beyond the capacity, where the replica saturates)."""
    report = json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    summaries = {r["key"]: r for r in report.get("runs", [])}
    primary = report.get("primary_draft_len")
    points: dict[str, dict[int, list]] = {"baseline": {}, "speculative": {}}
    for run in load_runs(run_dir):
        info, summary = run.info, summaries.get(run.info.get("key"))
        if summary is None or info.get("arm") not in points:
            continue
        if info["arm"] == "speculative" and info.get("draft_len") not in (None, primary):
            continue
        _, values = level_slack(run.records, slo)
        points[info["arm"]].setdefault(info.get("repeat", 0), []).append(
            (summary["requests_per_s"], values, summary["output_tokens_per_s"]))
    out = {}
    for arm, by_repeat in points.items():
        per_metric: dict[str, list[float]] = {m: [] for m in slo.limits()}
        tokens_per_request = []
        beyond = False
        for curve in by_repeat.values():
            curve.sort(key=lambda p: p[0])
            tokens_per_request.extend(t / r for r, _, t in curve if r > 0)
            if rate_rps > curve[-1][0]:
                beyond = True
            for metric in per_metric:
                xs = [r for r, _, _ in curve]
                ys = [v[metric] for _, v, _ in curve]
                per_metric[metric].append(_interp(rate_rps, xs, ys))
        tpr = sum(tokens_per_request) / len(tokens_per_request)
        predicted = {m: sum(v) / len(v) for m, v in per_metric.items()}
        out[arm] = {"percentiles_ms": {m: round(v, 3) for m, v in predicted.items()},
                    "meets_slo": all(predicted[m] <= limit for m, limit in slo.limits().items()),
                    "output_tokens_per_s": None if beyond else round(rate_rps * tpr, 2),
                    "beyond_the_measured_levels": beyond}
    return out


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """Linear in ``xs`` (extended past the ends by the nearest segment)."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and xs[i] < x:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 if x1 == x0 else y0 + (x - x0) * (y1 - y0) / (x1 - x0)
