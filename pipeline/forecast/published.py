"""Published cases reproduced from their reported inputs, and how far each reproduction can be trusted.

Reads ``pipeline/forecast/data/published.yaml`` (each case's hardware, engine, shapes, plan, τ,
batch sizes, published speedups and where each figure comes from). Writes nothing. For every
case and batch: the forecast speedup, the published one and the relative error (and, where the
source reports it, a speculative step's cost relative to a plain step, forecast and published); a case whose
baseline speed is reported sets its stack's per-step overhead from it; a case without a
published τ has τ fitted at one batch (``fit_tau_at_batch``) and the others forecast from it.

Each case gets a **standing** (:data:`STANDINGS`):

- ``refused``: the setup cannot be what the source ran — its weights and KV do not fit in the
  GPU's memory, the reported baseline is faster than the roofline allows for its own forward
  (the per-step overhead would have to be negative), or τ had to be fitted at its bound (every
  draft accepted: the fit absorbed an error instead of measuring acceptance);
- ``not reproduced``: within reach, but a checked point misses the tolerance;
- ``consistent``: every point within tolerance, but the case does not *test* the model: moving a
  physical input it depends on by :data:`SENSITIVITY`× still reproduces it (the baseline-fitted
  overhead or the batch-2 τ fit absorbs the change), so agreement is no evidence for that input;
- ``reproduced``: within tolerance, and each input it depends on, moved by 2× either way, breaks it.

The inputs a case depends on are the model's own: memory bandwidth always, the compute rate where
a checked point's verify forward is compute-bound, the proposer's cost where it is not free.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import yaml

from pipeline.facts.hardware import get_profile
from pipeline.facts.memory_fit import GIB, RUNTIME_MARGIN_GIB
from pipeline.facts.model_shapes import KNOWN_MODELS, ModelShape
from pipeline.forecast.acceptance import Acceptance
from pipeline.forecast.figures import ForecastInputError, engine_figures, gpu_figures
from pipeline.forecast.model import Inputs, step_times
from pipeline.forecast.proposers import DraftPlan
from pipeline.forecast.roofline import GpuDevice, model_cost

CASES_FILE = Path(__file__).with_name("data") / "published.yaml"
TOLERANCE = 0.25
SENSITIVITY = 2.0  # how far a physical input is moved to see whether a reproduction depends on it
STANDINGS = ("reproduced", "consistent", "not reproduced", "refused")
AT_BOUND = 1e-3  # a fitted τ this close to its bound (K + 1: every draft accepted) is a failed fit
_BYTES = {"float16": 2.0, "bfloat16": 2.0, "fp8": 1.0}


class CaseRefused(ValueError):
    """A published setup the model refuses to reproduce (the message says why)."""


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


def case_inputs(case: dict, table: dict, tau: float | None = None, moved: dict | None = None) -> Inputs:
    """The forecast's inputs for ``case``. ``moved``: physical inputs × a factor (``bandwidth``,
    ``compute``, ``proposer``), for the sensitivity check. CaseRefused when the reported baseline
    is faster than the roofline's own forward."""
    moved = moved or {}
    gpu = gpu_figures(case["hardware"])
    gpu = replace(gpu, hbm_bandwidth_gb_s=gpu.hbm_bandwidth_gb_s * moved.get("bandwidth", 1.0),
                  peak_dense_tflops={k: v * moved.get("compute", 1.0) for k, v in gpu.peak_dense_tflops.items()})
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
    inp = Inputs(device, target, draft, plan, acc, shape.vocab_size, dense, case.get("context", 512), 0.0,
                 proposer_scale=moved.get("proposer", 1.0))
    if case.get("baseline_tokens_per_s"):
        reported = 1.0 / case["baseline_tokens_per_s"]
        bare = device.with_overhead(0.0).forward(target, 1, 1, inp.context).seconds
        if reported < bare:
            raise CaseRefused(f"the reported baseline ({case['baseline_tokens_per_s']} tok/s, {reported * 1e3:.2f} ms a "
                              f"token) is faster than the roofline's own batch-1 forward ({bare * 1e3:.2f} ms) on "
                              f"{case['hardware']}: the setup modelled cannot be the one that ran (more GPUs, another "
                              f"format?), and a negative per-step overhead is not clamped to 0")
        inp.device = device.with_overhead((reported - bare) * 1e3)
    return inp


def memory_refusal(case: dict, table: dict) -> str | None:
    """Why the case's setup does not fit in one GPU (weights + the KV of its largest batch at its
    context + the runtime margin), or None. The GPU's memory: its hardware profile, else the
    case's ``gpu_memory_gb`` (with its source)."""
    try:
        memory_gib = get_profile(case["hardware"]).memory_gib
    except (KeyError, ValueError):
        memory_gib = None
    if memory_gib is None:
        if case.get("gpu_memory_gb") is None:
            return None
        memory_gib = case["gpu_memory_gb"] * 1e9 / GIB
    inp = case_inputs({**case, "baseline_tokens_per_s": None}, table, tau=1.0)
    batch = max(p["batch"] for p in case["points"])
    models = [inp.target] + ([inp.draft] if inp.draft is not None else [])
    weights = sum(m.weight_bytes for m in models) / GIB
    kv = sum(batch * (inp.context + inp.plan.verify_width) * m.kv_bytes_per_ctx_token for m in models) / GIB
    need = weights + kv + RUNTIME_MARGIN_GIB
    if need <= memory_gib:
        return None
    return (f"does not fit: {weights:.1f} GiB of weights + {kv:.1f} GiB of KV (batch {batch}, context {inp.context}) + "
            f"{RUNTIME_MARGIN_GIB:.0f} GiB runtime margin = {need:.1f} GiB > {memory_gib:.1f} GiB on one "
            f"{case['hardware']}; the source must have used more GPUs or another format")


def _speedup(inp: Inputs, batch: int) -> float:
    base, spec = step_times(inp, batch, inp.plan, inp.acceptance.tau)
    return base / spec


def tau_bound(case: dict) -> float:
    """The most tokens a step can gain: every draft of the deepest path accepted, plus the bonus token."""
    return float(case["plan"]["depth"] + 1)


def _fit_tau(case: dict, table: dict, batch: int, target_speedup: float, moved: dict | None = None) -> float:
    """τ in [1, K + 1] whose forecast speedup at ``batch`` is the published one (the bound when even
    every draft accepted falls short)."""
    low, high = 1.0, tau_bound(case)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _speedup(case_inputs(case, table, mid, moved), batch) < target_speedup else (low, mid)
    return (low + high) / 2


def _points(case: dict, table: dict, moved: dict | None = None) -> tuple[float, str, list[dict], Inputs]:
    """(τ, its origin, per-point rows, the case's inputs) with the physical inputs ``moved``; τ
    refitted when the case fits it (the fit is part of the procedure being checked)."""
    points = case["points"]
    tau, tau_origin = case.get("acceptance_length"), "published"
    fit_at = case.get("fit_tau_at_batch")
    if tau is None and fit_at is None:
        fit_at = points[0]["batch"]
    if tau is None:
        anchor = next((p for p in points if p["batch"] == fit_at), points[0])
        tau = _fit_tau(case, table, anchor["batch"], anchor["published_speedup"], moved)
        tau_origin = f"fitted to the published speedup at batch {anchor['batch']}"
    inp = case_inputs(case, table, tau, moved)
    rows = []
    for p in points:
        # a source that reports τ (and the context) per concurrency level: each level uses its own
        point_inp = inp
        if p.get("acceptance_length") is not None or p.get("context") is not None:
            point_case = {**case, "context": p.get("context", case.get("context", 512))}
            point_inp = case_inputs(point_case, table, p.get("acceptance_length", tau), moved)
            if case.get("baseline_tokens_per_s"):
                point_inp.device = inp.device  # the stack's overhead comes from the case's baseline, once
        forecast = _speedup(point_inp, p["batch"])
        error = forecast / p["published_speedup"] - 1
        fitted = fit_at is not None and p["batch"] == fit_at
        verify = point_inp.device.forward(point_inp.target, p["batch"], point_inp.plan.verify_width, point_inp.context)
        row = {"batch": p["batch"], "published_speedup": p["published_speedup"], "forecast_speedup": round(forecast, 3),
               "tau": round(point_inp.acceptance.tau, 3), "context": point_inp.context,
               "error": round(error, 3), "fitted": fitted, "within_tolerance": abs(error) <= TOLERANCE,
               "verify_regime": verify.regime}
        if p.get("published_step_cost_ratio") is not None:
            # a source that reports a speculative step's cost ÷ a plain step's pins where an error comes from
            row["published_step_cost_ratio"] = p["published_step_cost_ratio"]
            row["forecast_step_cost_ratio"] = round(point_inp.acceptance.tau / forecast, 3)
        rows.append(row)
    return tau, tau_origin, rows, inp


def _within(rows: list[dict]) -> bool:
    checked = [r for r in rows if not r["fitted"]]
    return bool(checked) and all(r["within_tolerance"] for r in checked)


def depends_on(case: dict, rows: list[dict], inp: Inputs) -> list[str]:
    """The physical inputs the model says this case depends on: bandwidth always; compute where a
    checked point's verify is compute-bound; the proposer's cost where the method's is not free."""
    inputs = ["bandwidth"]
    if any(r["verify_regime"] == "compute" for r in rows if not r["fitted"]):
        inputs.append("compute")
    free = _speedup(inp, rows[0]["batch"]) == _speedup(replace(inp, proposer_scale=0.0), rows[0]["batch"])
    if not free:
        inputs.append("proposer")
    return inputs


def sensitivity(case: dict, table: dict, inputs: list[str]) -> dict[str, dict]:
    """Per input: does moving it by :data:`SENSITIVITY`× (either way) stop the case reproducing?"""
    out = {}
    for name in inputs:
        broken_by = []
        for factor in (SENSITIVITY, 1 / SENSITIVITY):
            try:
                tau, _, rows, _ = _points(case, table, {name: factor})
                broke = not _within(rows) or (tau_bound(case) - tau < AT_BOUND and case.get("acceptance_length") is None)
            except CaseRefused:
                broke = True
            if broke:
                broken_by.append(factor)
        out[name] = {"breaks_it": bool(broken_by), "factors_that_break_it": broken_by}
    return out


def reproduce(case: dict, table: dict) -> dict:
    """One case: forecast vs published speedup per batch, the τ used and where it came from, and
    the case's standing with its reason."""
    base = {"id": case["id"], "source": case["source"], "provenance": case["provenance"],
            "hardware": case["hardware"], "engine": case["engine"], "method": case["method"],
            "assumptions": case.get("assumptions", []),
            "reproduce": case.get("reproduce", True), "why_not": case.get("why_not")}
    refusal = memory_refusal(case, table)
    try:
        tau, tau_origin, rows, inp = _points(case, table)
    except CaseRefused as exc:
        return {**base, "tau": None, "tau_origin": None, "step_overhead_ms": None, "points": [],
                "standing": "refused", "standing_reason": refusal or str(exc), "reproduced": False}
    result = {**base, "tau": round(tau, 3), "tau_origin": tau_origin,
              "step_overhead_ms": round(inp.device.engine.step_overhead_ms, 3), "points": rows}
    if refusal is None and case.get("acceptance_length") is None and tau_bound(case) - tau < AT_BOUND:
        refusal = (f"τ fitted at its bound K + 1 = {tau_bound(case):.0f} (every draft accepted): the fit absorbed "
                   f"an error of the model instead of measuring acceptance")
    if refusal is not None:
        return {**result, "standing": "refused", "standing_reason": refusal, "reproduced": False}
    if not (_within(rows) and case.get("reproduce", True)):
        missed = [r["batch"] for r in rows if not r["fitted"] and not r["within_tolerance"]]
        reason = case.get("why_not") or f"outside ±{TOLERANCE:.0%} at batch {', '.join(map(str, missed))}"
        return {**result, "standing": "not reproduced", "standing_reason": reason, "reproduced": False}
    inputs = depends_on(case, rows, inp)
    checks = sensitivity(case, table, inputs)
    survived = [name for name, check in checks.items() if not check["breaks_it"]]
    result["depends_on"], result["sensitivity"] = inputs, checks
    if survived:
        reason = (f"within ±{TOLERANCE:.0%}, but still within it with {' and '.join(survived)} moved "
                  f"{SENSITIVITY:g}× either way: the agreement does not test {'them' if len(survived) > 1 else 'it'}")
        return {**result, "standing": "consistent", "standing_reason": reason, "reproduced": False}
    reason = f"within ±{TOLERANCE:.0%}, and moving {', '.join(inputs)} {SENSITIVITY:g}× breaks it"
    return {**result, "standing": "reproduced", "standing_reason": reason, "reproduced": True}


def reproduce_all(path: Path = CASES_FILE) -> list[dict]:
    data = load_cases(path)
    return [reproduce(case, data.get("shapes", {})) for case in data["cases"]]
