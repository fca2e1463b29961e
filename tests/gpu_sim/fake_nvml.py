"""Stand-in for ``pynvml`` (nvidia-ml-py) on the simulated GPU host: the calls the live preflight
and ``doctor`` make, with NVML's error classes (``NVMLError_GpuIsLost`` …: one subclass per error
code, ``str()`` giving NVML's error string, as nvidia-ml-py generates them), and ``nvidia-smi
--query-gpu=index,memory.total`` over the same GPUs (:func:`smi_main`).

The GPUs come from ``$GPU_SIM_NVML_JSON`` (a list of ``{"name", "mib", "used_mib", "mig", "lost",
"processes": [{"pid", "mib"}], "mem_clock", "bus_width"}``; ``lost`` is an error class name such as ``GpuIsLost``), else
``$GPU_SIM_NVML`` (``count:MiB:name[:mig]``; ``none`` = driver not loaded, ``nolib`` = no NVML
library), else ``$GPU_SIM_SM``: 80 → eight A100 SXM4 80 GB, otherwise eight H100 80 GB HBM3 (the
names and totals NVML reports for them). An idle GPU shows ``IDLE_USED_MIB`` used, as a real one does
(the driver's reservation).
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

IDLE_USED_MIB = 512
# memory bus width (bits) and max memory clock (MHz) NVML reports per product, as `nvidia-smi -q`
# shows them (their product × 2 / 8 is the datasheet bandwidth: H100 SXM 3.35 TB/s, H100 PCIe and
# A100 80 GB 2.0 TB/s, A100 40 GB 1.55 TB/s)
MEMORY_BUS = {"NVIDIA H100 80GB HBM3": (5120, 2619), "NVIDIA H100 PCIe": (5120, 1593), "NVIDIA H100 NVL": (6144, 2619),
              "NVIDIA A100-SXM4-80GB": (5120, 1593), "NVIDIA A100-SXM4-40GB": (5120, 1215)}


class NVMLError(Exception):
    value = 999
    text = "Unknown Error"

    def __str__(self) -> str:
        return self.text


def _error(name: str, value: int, text: str) -> type:
    return type(f"NVMLError_{name}", (NVMLError,), {"value": value, "text": text})


NVMLError_NotSupported = _error("NotSupported", 3, "Not Supported")
NVMLError_DriverNotLoaded = _error("DriverNotLoaded", 9, "Driver Not Loaded")
NVMLError_LibraryNotFound = _error("LibraryNotFound", 12, "NVML Shared Library Not Found")
NVMLError_GpuIsLost = _error("GpuIsLost", 15, "GPU is lost")
NVMLError_Unknown = _error("Unknown", 999, "Unknown Error")
NVMLError_InvalidArgument = _error("InvalidArgument", 2, "Invalid Argument")
_ERRORS = {"GpuIsLost": NVMLError_GpuIsLost, "Unknown": NVMLError_Unknown}


def _gpus() -> list[dict]:
    spec_json = os.environ.get("GPU_SIM_NVML_JSON")
    if spec_json:
        return json.loads(spec_json)
    spec = os.environ.get("GPU_SIM_NVML")
    if spec and spec not in ("none", "nolib"):
        parts = spec.split(":")
        one = {"name": parts[2], "mib": int(parts[1]), "mig": len(parts) > 3 and parts[3] == "mig"}
        return [dict(one) for _ in range(int(parts[0]))]
    if os.environ.get("GPU_SIM_SM") == "80":
        return [{"name": "NVIDIA A100-SXM4-80GB", "mib": 81920} for _ in range(8)]
    return [{"name": "NVIDIA H100 80GB HBM3", "mib": 81559} for _ in range(8)]


def _gpu(handle: int) -> dict:
    gpu = _gpus()[handle]
    if gpu.get("lost"):
        raise _ERRORS[gpu["lost"]]()
    return gpu


def nvmlInit() -> None:
    if os.environ.get("GPU_SIM_NVML") == "none":
        raise NVMLError_DriverNotLoaded()
    if os.environ.get("GPU_SIM_NVML") == "nolib":
        raise NVMLError_LibraryNotFound()


def nvmlShutdown() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if index >= len(_gpus()):
        raise NVMLError_InvalidArgument()
    _gpu(index)
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _gpu(handle)["name"]


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpu(handle)
    total = gpu["mib"] * 1024 * 1024
    used = (gpu.get("used_mib", IDLE_USED_MIB) + sum(p["mib"] for p in gpu.get("processes", []))) * 1024 * 1024
    return SimpleNamespace(total=total, free=total - used, used=used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["mib"] * 1024 * 1024) for p in _gpu(handle).get("processes", [])]


def nvmlDeviceGetMemoryBusWidth(handle: int) -> int:
    gpu = _gpu(handle)
    if gpu["name"] not in MEMORY_BUS:
        raise NVMLError_NotSupported()
    return gpu.get("bus_width", MEMORY_BUS[gpu["name"]][0])


def nvmlDeviceGetMaxClockInfo(handle: int, clock_type: int) -> int:
    gpu = _gpu(handle)
    if clock_type != 2 or gpu["name"] not in MEMORY_BUS:  # NVML_CLOCK_MEM
        raise NVMLError_NotSupported()
    return gpu.get("mem_clock", MEMORY_BUS[gpu["name"]][1])


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    mig = int(bool(_gpu(handle).get("mig")))
    return mig, mig


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    return (8, 0) if "A100" in _gpu(handle)["name"] else (9, 0)


def nvmlSystemGetDriverVersion() -> str:
    return "580.95.05"


def smi_main(argv: list[str]) -> int:
    """``nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits``: a GPU it cannot
    read prints its error in the fields, as nvidia-smi prints ``[GPU is lost]``."""
    if os.environ.get("GPU_SIM_NVML") in ("none", "nolib"):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        return 9
    for index, gpu in enumerate(_gpus()):
        if gpu.get("lost"):
            print(f"{index}, [{_ERRORS[gpu['lost']].text}]")
        else:
            print(f"{index}, {gpu['mib']}")
    return 0


if __name__ == "__main__":
    sys.exit(smi_main(sys.argv[1:]))
