"""Published cases reproduced from their reported inputs.

Reads ``pipeline/forecast/data/published.yaml`` (each case's hardware, engine, shapes, plan, τ,
batch sizes, published speedups and where each figure comes from). Writes nothing. For every
case and batch: the forecast speedup, the published one and the relative error (and, where the
source reports it, a speculative step's cost relative to a plain step, forecast and published); a case whose
baseline speed is reported sets its stack's per-step overhead from it; a case without a
published τ has τ fitted at one batch (``fit_tau_at_batch``) and the others forecast from it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from pipeline.facts.model_shapes import KNOWN_MODELS, ModelShape
from pipeline.forecast.acceptance import Acceptance
from pipeline.forecast.figures import ForecastInputError, engine_figures, gpu_figures
from pipeline.forecast.model import Inputs, step_times
from pipeline.forecast.proposers import DraftPlan
from pipeline.forecast.roofline import GpuDevice, model_cost

CASES_FILE = Path(__file__).with_name("data") / "published.yaml"
TOLERANCE = 0.25
_BYTES = {"float16": 2.0, "bfloat16": 2.0, "fp8": 1.0}


@lru_cache(maxsize=2)
def load_cases(path: Path = CASES_FILE) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _shape(name: str, table: dict) -> ModelShape:
    if name in table:
        fields = {k: v for k, v in table[name].items() if k != "source"}
        return ModelShape(**fields, source=table[name]["source"])
    if name in KNOWN_MODELS:
        return KNOWN_MODELS[name]
    raise ForecastInputError(f"published case model {name!r}: no shape in {CASES_FILE} or the known models")


def case_inputs(case: dict, table: dict, tau: float | None = None) -> Inputs:
    gpu = gpu_figures(case["hardware"])
    device = GpuDevice(gpu, engine_figures(case["engine"]))
    t = case["target"]
    shape = _shape(t["model"], table)
    dense = _BYTES[t["dtype"]]
    target = model_cost("target", shape, dense, dense, dense, 1, t["dtype"])
    draft = None
    if case.get("draft"):
        d = case["draft"]
        draft = model_cost("draft", _shape(d["model"], table), _BYTES[d["dtype"]], _BYTES[d["dtype"]],
                           _BYTES[d["dtype"]], 1, d["dtype"])
    p = case["plan"]
    plan = DraftPlan(case["method"], p["depth"], p["verify_width"], bool(p.get("tree")), tuple(p.get("level_widths", ())),
                     params={"num_heads": p.get("num_heads")})
    tau = tau if tau is not None else case.get("acceptance_length") or 1.0
    acc = Acceptance(f"published: {case['id']}", tau=tau, tau_low=tau, tau_high=tau, at_depth=p["depth"])
    inp = Inputs(device, target, draft, plan, acc, shape.vocab_size, dense, case.get("context", 512), 0.0)
    if case.get("baseline_tokens_per_s"):
        reported = 1.0 / case["baseline_tokens_per_s"]
        bare = device.with_overhead(0.0).forward(target, 1, 1, inp.context).seconds
        inp.device = device.with_overhead(max(0.0, reported - bare) * 1e3)
    return inp


def _speedup(inp: Inputs, batch: int) -> float:
    base, spec = step_times(inp, batch, inp.plan, inp.acceptance.tau)
    return base / spec


def _fit_tau(case: dict, table: dict, batch: int, target_speedup: float) -> float:
    low, high = 1.0, float(case["plan"]["verify_width"])
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _speedup(case_inputs(case, table, mid), batch) < target_speedup else (low, mid)
    return (low + high) / 2


def reproduce(case: dict, table: dict) -> dict:
    """One case: forecast vs published speedup per batch, the τ used and where it came from."""
    points = case["points"]
    tau, tau_origin, implied = case.get("acceptance_length"), "published", None
    fit_at = case.get("fit_tau_at_batch")
    if tau is None and fit_at is None:
        fit_at = points[0]["batch"]
    if tau is None:
        anchor = next((p for p in points if p["batch"] == fit_at), points[0])
        implied = _fit_tau(case, table, anchor["batch"], anchor["published_speedup"])
        tau, tau_origin = implied, f"fitted to the published speedup at batch {anchor['batch']}"
    inp = case_inputs(case, table, tau)
    rows = []
    for p in points:
        # a source that reports τ (and the context) per concurrency level: each level uses its own
        point_inp = inp
        if p.get("acceptance_length") is not None or p.get("context") is not None:
            point_case = {**case, "context": p.get("context", case.get("context", 512))}
            point_inp = case_inputs(point_case, table, p.get("acceptance_length", tau))
            if case.get("baseline_tokens_per_s"):
                point_inp.device = inp.device  # the stack's overhead comes from the case's baseline, once
        forecast = _speedup(point_inp, p["batch"])
        error = forecast / p["published_speedup"] - 1
        fitted = fit_at is not None and p["batch"] == fit_at
        row = {"batch": p["batch"], "published_speedup": p["published_speedup"], "forecast_speedup": round(forecast, 3),
               "tau": round(point_inp.acceptance.tau, 3), "context": point_inp.context,
               "error": round(error, 3), "fitted": fitted, "within_tolerance": abs(error) <= TOLERANCE}
        if p.get("published_step_cost_ratio") is not None:
            # a source that reports a speculative step's cost ÷ a plain step's pins where an error comes from
            row["published_step_cost_ratio"] = p["published_step_cost_ratio"]
            row["forecast_step_cost_ratio"] = round(point_inp.acceptance.tau / forecast, 3)
        rows.append(row)
    checked = [r for r in rows if not r["fitted"]]
    return {"id": case["id"], "source": case["source"], "provenance": case["provenance"],
            "hardware": case["hardware"], "engine": case["engine"], "method": case["method"],
            "tau": round(tau, 3), "tau_origin": tau_origin,
            "step_overhead_ms": round(inp.device.engine.step_overhead_ms, 3),
            "reproduce": case.get("reproduce", True), "why_not": case.get("why_not"), "points": rows,
            "reproduced": bool(checked) and all(r["within_tolerance"] for r in checked) and case.get("reproduce", True)}


def reproduce_all(path: Path = CASES_FILE) -> list[dict]:
    data = load_cases(path)
    return [reproduce(case, data.get("shapes", {})) for case in data["cases"]]
