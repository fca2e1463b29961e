"""GPU and engine figures for the forecast's roofline.

Reads ``pipeline/facts/data/gpus.yaml`` (the facts library's table of GPU datasheet figures,
each with its source; the hardware profiles take their bandwidth from it too) and
``data/engines.yaml`` (an engine's efficiency per regime, fixed per-step overhead, all-reduce
latency: stated assumptions). Writes nothing. A missing figure is a
:class:`ForecastInputError` naming the profile, the field and the file to add it to — never a
silent default.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from pipeline.errors import EXIT_USAGE, SpecdeployError
from pipeline.facts.hardware import GPUS_FILE

DATA = Path(__file__).with_name("data")
ENGINES_FILE = DATA / "engines.yaml"

# weight / activation format → the tensor-core dtype whose peak applies
PEAK_DTYPE = {"none": None, "fp8": "fp8", "int8_sq": "int8", "int8_wo": None, "int4_awq": None,
              "int4_wo": None, "w4a8_awq": "fp8", "nvfp4": "fp8"}


class ForecastInputError(SpecdeployError):
    """An input the forecast needs is missing or unreadable; the message says how to provide it (exit 2)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class GpuFigures:
    name: str
    hbm_bandwidth_gb_s: float
    peak_dense_tflops: dict[str, float]
    interconnect_gb_s: float
    source: str

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for ``dtype``; ForecastInputError when the profile lacks it."""
        if dtype not in self.peak_dense_tflops:
            raise ForecastInputError(
                f"hardware profile {self.name!r} has no dense peak for {dtype!r} in {GPUS_FILE} "
                f"(has: {', '.join(self.peak_dense_tflops)}); add peak_dense_tflops.{dtype} from the datasheet")
        return self.peak_dense_tflops[dtype] * 1e12

    @property
    def bandwidth(self) -> float:
        return self.hbm_bandwidth_gb_s * 1e9


@dataclass(frozen=True)
class EngineFigures:
    name: str
    memory_efficiency: float
    compute_efficiency: float
    step_overhead_ms: float
    allreduce_latency_us: float
    band: float
    bls_round_trip_ms: float
    note: str = ""
    overhead_range: tuple[float, float] = (0.5, 2.0)  # the band moves step_overhead_ms × this (an assumption)


_GPU_FIELDS = ("hbm_bandwidth_gb_s", "peak_dense_tflops", "interconnect_gb_s", "source")
_ENGINE_FIELDS = ("memory_efficiency", "compute_efficiency", "step_overhead_ms", "allreduce_latency_us", "band",
                  "bls_round_trip_ms")


@lru_cache(maxsize=4)
def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ForecastInputError(f"{path}: not a mapping of profile name → figures")
    return data


def gpu_figures(name: str, path: Path = GPUS_FILE) -> GpuFigures:
    """The roofline figures of GPU profile ``name``; ForecastInputError naming what is missing."""
    table = _load(path)
    if name not in table:
        raise ForecastInputError(
            f"no roofline figures for hardware {name!r} in {path} (has: {', '.join(table)}); "
            f"add its HBM bandwidth, dense peak per dtype and NVLink bandwidth with the datasheet as source")
    entry = table[name] or {}
    missing = [f for f in _GPU_FIELDS if entry.get(f) in (None, "", {})]
    if missing:
        raise ForecastInputError(f"hardware {name!r} in {path} lacks {', '.join(missing)}; add them from the datasheet")
    return GpuFigures(name, float(entry["hbm_bandwidth_gb_s"]), {k: float(v) for k, v in entry["peak_dense_tflops"].items()},
                      float(entry["interconnect_gb_s"]), str(entry["source"]))


def engine_figures(name: str, path: Path = ENGINES_FILE) -> EngineFigures:
    table = _load(path)
    if name not in table:
        raise ForecastInputError(f"no engine figures for {name!r} in {path} (has: {', '.join(table)})")
    entry = table[name] or {}
    missing = [f for f in _ENGINE_FIELDS if entry.get(f) is None]
    if missing:
        raise ForecastInputError(f"engine {name!r} in {path} lacks {', '.join(missing)}")
    low, high = entry.get("overhead_range", (0.5, 2.0))
    return EngineFigures(name, **{f: float(entry[f]) for f in _ENGINE_FIELDS}, note=str(entry.get("note", "")),
                         overhead_range=(float(low), float(high)))
