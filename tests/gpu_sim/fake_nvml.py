"""Stand-in for ``pynvml`` (nvidia-ml-py) on the simulated GPU host: the calls the live preflight
makes (``pipeline.validate.live.gpus``). The GPUs come from ``$GPU_SIM_NVML``
(``count:MiB:name[:mig]``), else from ``$GPU_SIM_SM``: 80 → eight A100 SXM4 80 GB, otherwise eight
H100 80 GB HBM3 (the sizes NVML reports for them)."""

from __future__ import annotations

import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


def _gpus() -> tuple[int, int, str, bool]:
    spec = os.environ.get("GPU_SIM_NVML")
    if spec:
        parts = spec.split(":")
        return int(parts[0]), int(parts[1]), parts[2], len(parts) > 3 and parts[3] == "mig"
    if os.environ.get("GPU_SIM_SM") == "80":
        return 8, 81920, "NVIDIA A100-SXM4-80GB", False
    return 8, 81559, "NVIDIA H100 80GB HBM3", False


def nvmlInit() -> None:
    if os.environ.get("GPU_SIM_NVML") == "none":
        raise NVMLError("Driver Not Loaded")


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return _gpus()[0]


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if index >= _gpus()[0]:
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _gpus()[2]


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    total = _gpus()[1] * 1024 * 1024
    return SimpleNamespace(total=total, free=total, used=0)


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    mig = int(_gpus()[3])
    return mig, mig


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    return (8, 0) if "A100" in _gpus()[2] else (9, 0)


def nvmlSystemGetDriverVersion() -> str:
    return "580.00 (stand-in)"
