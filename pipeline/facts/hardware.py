"""Hardware profiles: what each GPU (or the CPU path) can run and how much memory it has.

Reads ``pipeline/facts/data/gpus.yaml`` (:data:`GPUS_FILE`, the one table of GPU datasheet figures:
memory bandwidth for every GPU, with its source; the forecast's roofline reads the same file for
its peaks) and writes nothing: a table keyed by the config's ``hardware`` name. Each profile
carries the compute capability, memory per device, memory bandwidth, devices per node and the
weight formats / KV-cache dtypes the TensorRT-LLM engine flow supports on that architecture
(TensorRT-LLM docs/source/reference/support-matrix.md). Preflight (``pipeline.validate.preflight``)
turns these facts into findings; the config validator uses :func:`profile_names` to reject unknown
names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

GPUS_FILE = Path(__file__).with_name("data") / "gpus.yaml"

# Formats by architecture (TensorRT-LLM docs/source/reference/support-matrix.md). sm80: no FP8 / W4A8 / NVFP4. sm89/sm90: no NVFP4.
# sm100 (Blackwell): NVFP4 yes; SmoothQuant and weight-only INT8/INT4 are not supported there.
_FORMATS_SM80 = ("none", "int8_sq", "int4_awq", "int8_wo", "int4_wo")
_FORMATS_SM89 = ("none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo")
_FORMATS_SM100 = ("none", "fp8", "int4_awq", "w4a8_awq", "nvfp4")
_KV_GPU = ("auto", "fp16", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class HardwareProfile:
    """One deployment target: a GPU model (or ``cpu`` for the reference engine)."""

    name: str
    display_name: str
    compute_capability: tuple[int, int] | None  # None for cpu
    memory_gib: float | None  # usable GiB per device as nvidia-smi reports it; None = host memory
    bandwidth_gbps: float | None  # GB/s memory bandwidth per device (gpus.yaml)
    devices_per_node: int
    weight_formats: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    model_dtypes: tuple[str, ...] = ("float16", "bfloat16", "float32")

    @property
    def is_gpu(self) -> bool:
        return self.compute_capability is not None

    @property
    def sm(self) -> int:
        """Compute capability as an integer, e.g. 90 for sm90; 0 for cpu."""
        if self.compute_capability is None:
            return 0
        major, minor = self.compute_capability
        return major * 10 + minor


def _bandwidths(path: Path = GPUS_FILE) -> dict[str, float]:
    """GB/s per GPU name, from the datasheet table every user of a GPU figure reads."""
    table = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {name: float(entry["hbm_bandwidth_gb_s"]) for name, entry in table.items()}


_BANDWIDTH = _bandwidths()


def _gpu(name, display, cc, mem, formats, kv=_KV_GPU, dtypes=("float16", "bfloat16", "float32")):
    return HardwareProfile(name, display, cc, mem, _BANDWIDTH[name], 8, formats, kv, dtypes)


PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _gpu("h100-sxm-80gb", "NVIDIA H100 SXM 80 GB", (9, 0), 79.6, _FORMATS_SM89),
        _gpu("h100-pcie-80gb", "NVIDIA H100 PCIe 80 GB", (9, 0), 79.6, _FORMATS_SM89),
        _gpu("h200-141gb", "NVIDIA H200 SXM 141 GB", (9, 0), 140.4, _FORMATS_SM89),
        _gpu("a100-80gb", "NVIDIA A100 SXM 80 GB", (8, 0), 80.0, _FORMATS_SM80),
        _gpu("a100-40gb", "NVIDIA A100 SXM 40 GB", (8, 0), 40.0, _FORMATS_SM80),
        _gpu("l40s-48gb", "NVIDIA L40S 48 GB", (8, 9), 45.0, _FORMATS_SM89),
        _gpu("b200-180gb", "NVIDIA B200 180 GB", (10, 0), 179.1, _FORMATS_SM100),
        HardwareProfile(
            name="cpu",
            display_name="CPU (PyTorch reference engine)",
            compute_capability=None,
            memory_gib=None,
            bandwidth_gbps=None,
            devices_per_node=1,
            weight_formats=("none", "int8_wo"),
            kv_cache_dtypes=("auto", "fp32"),
            model_dtypes=("float32", "float16", "bfloat16"),
        ),
    )
}


def profile_names() -> list[str]:
    return list(PROFILES)


def get_profile(name: str) -> HardwareProfile:
    """The profile for ``name``; KeyError naming the valid profiles otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown hardware profile '{name}'; valid: {', '.join(PROFILES)}") from None


def formats_supported_on(fmt: str) -> list[str]:
    """Names of the GPU profiles whose architecture runs weight format ``fmt``."""
    return [p.name for p in PROFILES.values() if p.is_gpu and fmt in p.weight_formats]
