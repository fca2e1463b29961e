"""The GPUs this host has (NVML, through ``nvidia-ml-py``'s ``pynvml``) against the plan's
placement: count, model, memory per device, MIG mode.

Reads NVML (count, name, total memory, MIG mode per device) and the config (``triton.gpus``, the
arms' TP×PP from :func:`pipeline.plan.gpu_layout.arm_gpu_need`, the hardware profile's GPU model and
memory). Writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import DeploymentConfig
from pipeline.plan.gpu_layout import arm_gpu_need
from pipeline.validate.hardware import get_profile
from pipeline.validate.live.result import LiveCheck, failed, passed

MEMORY_TOLERANCE_GIB = 0.5  # NVML's total vs the profile's nvidia-smi figure: rounding only


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    memory_gib: float
    mig: bool


def read_nvml() -> tuple[list[NvmlGpu] | None, str]:
    """(the GPUs, or None; why not)."""
    try:
        import pynvml  # noqa: PLC0415 - nvidia-ml-py is a GPU-host package
    except ImportError:
        return None, "pynvml not importable (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses vary by driver
        return None, f"NVML unavailable ({exc})"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            try:
                mig = bool(pynvml.nvmlDeviceGetMigMode(handle)[0])
            except Exception:  # noqa: BLE001 - GPUs without MIG support raise NotSupported
                mig = False
            gpus.append(NvmlGpu(index, name.decode() if isinstance(name, bytes) else str(name),
                                pynvml.nvmlDeviceGetMemoryInfo(handle).total / 1024**3, mig))
        return gpus, ""
    finally:
        pynvml.nvmlShutdown()


def planned_gpus(cfg: DeploymentConfig) -> tuple[tuple[int, ...], str]:
    arms = ("baseline", "speculative") if cfg.speculative else ("baseline",)
    if cfg.triton.gpus is not None:
        return tuple(cfg.triton.gpus), "triton.gpus"
    need = max(arm_gpu_need(cfg, arm) for arm in arms)
    return tuple(range(need)), "the target's (and draft's) tp × pp"


def _model_key(profile_name: str) -> str:
    return profile_name.split("-")[0].upper()  # h100-sxm-80gb → H100


def check_gpus(cfg: DeploymentConfig) -> list[LiveCheck]:
    profile = get_profile(cfg.hardware)
    ids, ids_source = planned_gpus(cfg)
    gpus, why = read_nvml()
    if gpus is None:
        return [failed("GPUs", f"{len(ids)} × {profile.display_name}", ids_source, why,
                       "run with the GPUs visible (docker run --gpus all), and pip install nvidia-ml-py")]
    out = []
    present = {g.index: g for g in gpus}
    missing = [i for i in ids if i not in present]
    expected = f"GPUs {list(ids)}"
    names = sorted({g.name for g in gpus})
    found = f"{len(gpus)} GPU(s) ({', '.join(names)})" if gpus else "no GPUs"
    if missing:
        out.append(failed("GPU count", expected, ids_source, found,
                          f"give the container GPUs {missing} (CUDA_VISIBLE_DEVICES / --gpus), or lower tp / "
                          "triton.gpus"))
    else:
        out.append(passed("GPU count", expected, ids_source, found))
    used = [present[i] for i in ids if i in present]
    key = _model_key(profile.name)
    wrong_model = [g for g in used if key not in g.name.upper()]
    model_found = "; ".join(f"{g.index}: {g.name}" for g in used) or "-"
    if wrong_model:
        out.append(failed("GPU model", f"{profile.display_name} ({key})", f"hardware: {cfg.hardware}", model_found,
                          "set hardware to this GPU's profile (its formats and memory differ), or run on the planned GPUs"))
    else:
        out.append(passed("GPU model", f"{profile.display_name} ({key})", f"hardware: {cfg.hardware}", model_found))
    small = [g for g in used if profile.memory_gib and g.memory_gib + MEMORY_TOLERANCE_GIB < profile.memory_gib]
    memory_found = "; ".join(f"{g.index}: {g.memory_gib:.1f} GiB" for g in used) or "-"
    memory_expected = f"≥ {profile.memory_gib} GiB each"
    if small:
        out.append(failed("GPU memory", memory_expected, f"hardware profile {cfg.hardware} (memory fit, KV sizing)",
                          memory_found, "set hardware to the profile of this GPU so the memory plan uses its size",
                          f"recorded fact '{cfg.hardware} has {profile.memory_gib} GiB' "
                          "(pipeline/validate/hardware.py) is wrong for this install" if not wrong_model else ""))
    else:
        out.append(passed("GPU memory", memory_expected, f"hardware profile {cfg.hardware}", memory_found))
    mig = [g.index for g in used if g.mig]
    if mig:
        out.append(failed("GPU MIG mode", "disabled", "the plan places models on whole GPUs",
                          f"MIG enabled on GPU(s) {mig}", "nvidia-smi -i <id> -mig 0 (as root, GPU idle), or use "
                          "GPUs without MIG"))
    else:
        out.append(passed("GPU MIG mode", "disabled", "the plan places models on whole GPUs", "disabled"))
    return out
