"""The forecast's band: every input it rests on, moved over its stated range, and the model's own
error as measured on the cases it was checked against.

Reads the model's recorded checks for its error: the published cases as
``benchmarks/forecast_published.py`` last reproduced them (``benchmarks/results/forecast-published.json``,
GPU; a test keeps that file equal to a fresh reproduction) and the CPU checks
(``benchmarks/results/forecast-cpu.json``). Writes nothing. Imports nothing of the forecast, so
the model can use it without a cycle.

Glossary:

- *input range*: one input × [low, high] — acceptance (its own band), the engine's efficiencies
  (``band`` in engines.yaml, or the CPU calibration's drift), the per-step overhead
  (``overhead_range`` in engines.yaml: an assumption on a GPU, since no case here measures it
  directly), the proposer's modelled cost (:data:`PROPOSER_RANGE`), and the request shape
  (prompt ÷ output tokens: :data:`MEASURED_SHAPE_RANGE` when a run measured it, else
  :data:`DEFAULT_SHAPE_RANGE`);
- *corners*: every combination of the ranges' ends; the speedup is monotone in each input, so
  the lowest and highest corner bound it (a box, not a probability: the band claims no coverage
  beyond "every input within its range");
- *model error*: forecast ÷ measured − 1 on the checked points (the published cases the model
  claims to cover; the CPU checks); the band divides its ends by (1 + the largest and smallest
  error), so a model that over-forecast by 24 % somewhere widens every band by that much;
- *known miss*: a published case the model does not reproduce, on the same GPU at or beyond the
  batch where it started to miss: the forecast says so and widens that level's band by the miss.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product

from pipeline.paths import PROJECT_ROOT

PROPOSER_RANGE = (0.5, 2.0)  # the proposer's modelled cost: a roofline of small kernels, the least certain term
MEASURED_SHAPE_RANGE = (0.8, 1.25)  # a run's own means: another day's mix moves them about this much
DEFAULT_SHAPE_RANGE = (0.5, 2.0)  # the config's defaults (half the max input, max tokens): a guess
DEFAULT_OVERHEAD_RANGE = (0.5, 2.0)
MISS_TREND = 0.2  # a known miss's regime: the checked points that err its way by at least this much
RESULTS = PROJECT_ROOT / "benchmarks" / "results"
CPU_RESULTS = RESULTS / "forecast-cpu.json"
PUBLISHED_RESULTS = RESULTS / "forecast-published.json"


@dataclass(frozen=True)
class InputRange:
    name: str
    low: float
    high: float
    why: str

    def describe(self) -> dict:
        return {"input": self.name, "range": [round(self.low, 3), round(self.high, 3)], "why": self.why}


@dataclass(frozen=True)
class ModelError:
    low: float  # the most negative forecast ÷ measured − 1 (under-forecast)
    high: float  # the most positive (over-forecast)
    points: int
    source: str

    def describe(self) -> dict:
        return {"range": [round(self.low, 3), round(self.high, 3)], "points": self.points, "source": self.source}


def input_ranges(inp) -> list[InputRange]:
    """The ranges the band moves ``inp``'s inputs over (acceptance is the Acceptance's own band)."""
    ranges = [InputRange("efficiency", 1 - inp.band, 1 + inp.band,
                         "the engine's efficiencies ± its band (engines.yaml)" if inp.device.kind == "gpu"
                         else "the CPU calibration's drift between processes")]
    if inp.device.kind == "gpu":
        low, high = getattr(inp.device.engine, "overhead_range", None) or DEFAULT_OVERHEAD_RANGE
        ranges.append(InputRange("step_overhead", low, high,
                                 f"the engine's per-step overhead {inp.device.engine.step_overhead_ms:g} ms × "
                                 f"[{low:g}, {high:g}] (an assumption: engines.yaml)"))
        ranges.append(InputRange("proposer_cost", *PROPOSER_RANGE, "the proposer's modelled cost (roofline of small kernels)"))
    if inp.requests is not None:
        measured = "config's default" not in inp.requests.source
        low, high = MEASURED_SHAPE_RANGE if measured else DEFAULT_SHAPE_RANGE
        ranges.append(InputRange("request_shape", low, high,
                                 ("a run's measured" if measured else "the config's default") +
                                 " prompt ÷ output tokens, moved both ways"))
    return ranges


def _moved(inp, name: str, factor: float):
    if name == "efficiency":
        return replace(inp, device=inp.device.scaled(factor))
    if name == "step_overhead":
        return replace(inp, device=inp.device.with_overhead(inp.device.engine.step_overhead_ms * factor))
    if name == "proposer_cost":
        return replace(inp, proposer_scale=inp.proposer_scale * factor)
    if name == "request_shape":
        req = inp.requests
        prompt, output = max(1, round(req.prompt_tokens * factor)), max(2, round(req.output_tokens / factor))
        return replace(inp, requests=replace(req, prompt_tokens=prompt, output_tokens=output))
    raise KeyError(name)


def corner_inputs(inp, exclude: tuple[str, ...] = ()) -> list[tuple]:
    """(inputs, acceptance edge) for every corner of the ranges (but those named in ``exclude``)."""
    ranges = [r for r in input_ranges(inp) if r.name not in exclude]
    corners = []
    for ends in product(*[(r.low, r.high) for r in ranges]):
        moved = inp
        for r, factor in zip(ranges, ends):
            moved = _moved(moved, r.name, factor)
        corners.extend((moved, edge) for edge in ("low", "high"))
    return corners


def speedup_range(speedup, corners: list[tuple]) -> tuple[float, float]:
    """Lowest and highest of ``speedup(inputs, edge)`` over the corners (before the model's error)."""
    values = [speedup(moved, edge) for moved, edge in corners]
    return min(values), max(values)


def with_model_error(low: float, high: float, error: ModelError | None) -> tuple[float, float]:
    """The band's ends divided by (1 + the model's largest over- and under-forecast)."""
    if error is None:
        return low, high
    return low / (1 + max(error.high, 0.0)), high / (1 + min(error.low, 0.0))


@lru_cache(maxsize=1)
def _published() -> tuple:
    try:
        return tuple(json.loads(PUBLISHED_RESULTS.read_text(encoding="utf-8"))["cases"])
    except (OSError, ValueError, KeyError):
        return ()


def model_error(device_kind: str) -> ModelError | None:
    """The model's error range on its checks: on a GPU the checked (not fitted) points of every
    published case the model claims to cover; on the CPU the CPU checks' rows. None when there is
    no check on record (a checkout without benchmarks/results)."""
    if device_kind == "gpu":
        errors = [p["error"] for case in _published() if case.get("standing") in ("reproduced", "consistent")
                  for p in case["points"] if not p["fitted"]]
        source = (f"the published cases the model reproduces or is consistent with "
                  f"({PUBLISHED_RESULTS.relative_to(PROJECT_ROOT)})")
    else:
        try:
            rows = json.loads(CPU_RESULTS.read_text(encoding="utf-8"))["configs"]
        except (OSError, ValueError, KeyError):
            return None
        errors = [r["error"] for cfg in rows for r in cfg["rows"] if r.get("error") is not None]
        source = f"the CPU checks of {CPU_RESULTS.relative_to(PROJECT_ROOT)}"
    if not errors:
        return None
    return ModelError(min(errors), max(errors), len(errors), source)


def known_misses(hardware: str | None) -> list[dict]:
    """Published cases on ``hardware`` the model does not reproduce, with the batch from which it
    misses and by how much: the tail of checked points that err the same way as the worst miss by
    at least :data:`MISS_TREND` (the trend that ends in the miss, not only the points past the
    tolerance)."""
    misses = []
    for case in _published():
        if case["hardware"] != hardware or case.get("standing") != "not reproduced":
            continue
        checked = [p for p in case["points"] if not p["fitted"]]
        if not any(not p["within_tolerance"] for p in checked):
            continue
        worst = max(checked, key=lambda p: abs(p["error"]))
        tail = []
        for p in reversed(checked):
            if p["error"] * worst["error"] <= 0 or abs(p["error"]) < MISS_TREND:
                break
            tail.append(p)
        errors = [p["error"] for p in tail]
        misses.append({"case": case["id"], "method": case["method"], "engine": case["engine"],
                       "from_batch": min(p["batch"] for p in tail),
                       "error": [round(min(errors), 3), round(max(errors), 3)], "why": case["standing_reason"]})
    return misses


def validated_batches(hardware: str | None) -> int | None:
    """The largest batch a reproduced or consistent published case checks on ``hardware``."""
    batches = [p["batch"] for case in _published() if case["hardware"] == hardware
               and case.get("standing") in ("reproduced", "consistent") for p in case["points"]]
    return max(batches) if batches else None
