"""The GPUs this host has (NVML, through ``nvidia-ml-py``'s ``pynvml``) against the plan: count,
health, exact product, free memory, MIG mode.

Reads NVML per device — name, memory (total, free, used), peak memory bandwidth (bus width × max
memory clock), MIG mode, the compute processes holding
memory (named through ``psutil`` when their pid is visible here) — and, per device, any NVML error
(``NVMLError_GpuIsLost``, ``NVMLError_Unknown``: a GPU that fell off the bus) instead of raising;
the config (``triton.gpus``, the arms' TP×PP from :func:`pipeline.plan.gpu_layout.arm_gpu_need`, the
hardware profile) and the plan's memory estimate of its busiest GPU (validate's memory fit). Writes
nothing. Every outcome is a row: NVML failing to start, a lost GPU and an unexpected error each name
what happened and the likely fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import DeploymentConfig
from pipeline.errors import SpecdeployError
from pipeline.facts.hardware import PROFILES, HardwareProfile, get_profile
from pipeline.plan.gpu_layout import GpuInfo, arm_gpu_need, deployment_layout
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

MEMORY_TOLERANCE_GIB = 0.5  # NVML's total vs the profile's nvidia-smi figure: rounding only
BANDWIDTH_TOLERANCE = 0.10  # bus width × max memory clock vs the datasheet figure (H200: 4.9 vs 4.8 TB/s)
NVML_CLOCK_MEM = 2  # nvmlClockType_t NVML_CLOCK_MEM (nvml.h)
GIB = 1024**3
# Each GPU profile ↔ the product name NVML reports for it (nvmlDeviceGetName, as nvidia-smi prints
# it), with the total memory of hardware.py. A name outside this list is another product or variant:
# an H100 PCIe (2.0 TB/s) is not an H100 SXM (3.35 TB/s), an A100 PCIe not an A100 SXM, though each
# pair shares a family name and the memory size.
NVML_NAMES: dict[str, tuple[str, ...]] = {
    "h100-sxm-80gb": ("NVIDIA H100 80GB HBM3",),
    "h100-pcie-80gb": ("NVIDIA H100 PCIe",),
    "h200-141gb": ("NVIDIA H200",),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB",),
    "a100-40gb": ("NVIDIA A100-SXM4-40GB",),
    "l40s-48gb": ("NVIDIA L40S",),
    "b200-180gb": ("NVIDIA B200",),
}


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_gib: float | None
    name: str


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str = ""
    memory_gib: float = 0.0
    free_gib: float = 0.0
    mig: bool = False
    processes: tuple[GpuProcess, ...] | None = ()
    bandwidth_gbps: float | None = None  # peak memory bandwidth from NVML, None when not reported
    error: str = ""  # NVML's error for this device (lost, fallen off the bus): nothing else is known

    @property
    def readable(self) -> bool:
        return not self.error


@dataclass
class NvmlRead:
    gpus: list[NvmlGpu] | None = None
    problem: str = ""  # why NVML could not be read at all
    fix: str = ""
    notes: list[str] = field(default_factory=list)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _process_name(pid: int) -> str:
    try:
        import psutil  # noqa: PLC0415 - optional: psutil (the gpu-host/loadtest extras; the row says when it is absent)
    except ImportError:
        return "(psutil not installed: name unknown)"
    try:
        return psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "(not visible here: another container or the host)"


def _processes(pynvml, handle) -> tuple[GpuProcess, ...] | None:
    try:
        found = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the holders stay unnamed
        return None
    out = []
    for proc in found:
        used = getattr(proc, "usedGpuMemory", None)
        out.append(GpuProcess(int(proc.pid), used / GIB if isinstance(used, int) else None, _process_name(int(proc.pid))))
    return tuple(out)


def _bandwidth(pynvml, handle) -> float | None:
    """Peak memory bandwidth in GB/s: bus width (bits) × max memory clock (MHz) × 2 (double data
    rate) / 8 — 5120 × 2619 MHz gives the H100 SXM's 3.35 TB/s, 5120 × 1593 MHz the PCIe's 2.0."""
    try:
        width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
        clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported (older drivers, vGPU): the row says not checked
        return None
    return width * clock * 2 / 8 / 1000 if width and clock else None


def _device(pynvml, index: int) -> NvmlGpu:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:  # noqa: BLE001 - NVMLError_GpuIsLost / _Unknown: the device is gone, the row says so
        return NvmlGpu(index, error=_error(exc))
    try:
        mig = bool(pynvml.nvmlDeviceGetMigMode(handle)[0])
    except Exception:  # noqa: BLE001 - GPUs without MIG support raise NotSupported
        mig = False
    return NvmlGpu(index, name, memory.total / GIB, memory.free / GIB, mig, _processes(pynvml, handle),
                   _bandwidth(pynvml, handle))


def init_fix(error: str) -> str:
    if "LibraryNotFound" in error or "Driver Not Loaded" in error or "DriverNotLoaded" in error:
        return ("no NVIDIA driver is visible here: start the container with `docker run --gpus all` (NVIDIA Container "
                "Toolkit), or load the driver on the host (nvidia-smi must work there)")
    if "InsufficientPermissions" in error or "NoPermission" in error:
        return "run with access to /dev/nvidia* (docker --gpus all; not a rootless runtime without GPU support)"
    return "check `nvidia-smi` on the host; after a driver upgrade, reboot (driver/library version mismatch)"


def read_nvml() -> NvmlRead:
    """Every device NVML lists, each with its error if it cannot be read; or why NVML cannot start."""
    try:
        import pynvml  # noqa: PLC0415 - optional: pynvml (nvidia-ml-py, a GPU-host package of the trtllm extra)
    except ImportError:
        return NvmlRead(None, "pynvml not importable", "pip install nvidia-ml-py (the gpu-host extra has it)")
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses vary by driver
        return NvmlRead(None, f"NVML unavailable ({_error(exc)})", init_fix(_error(exc)))
    try:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - a driver in a bad state answers even the count with an error
            return NvmlRead(None, f"NVML cannot count the GPUs ({_error(exc)})", init_fix(_error(exc)))
        return NvmlRead([_device(pynvml, index) for index in range(count)])
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-broken NVML must not hide the answer
            pass


def planned_gpus(cfg: DeploymentConfig, readable: list[NvmlGpu] | None = None) -> tuple[tuple[int, ...], str]:
    """The GPUs the deployment will use: ``triton.gpus``; else the arms placed on the GPUs NVML
    reads (:func:`pipeline.plan.gpu_layout.deployment_layout`, as ``render`` places them); else the
    fewest the target's (and draft's) TP×PP need."""
    if cfg.triton.gpus is not None:
        return tuple(cfg.triton.gpus), "triton.gpus"
    if readable:
        try:
            layout = deployment_layout(cfg, [GpuInfo(g.index, g.memory_gib * 1024) for g in readable])
        except SpecdeployError:
            pass  # the arms do not fit these GPUs: validate's memory fit says why; count the fewest
        else:
            used = sorted({gpu for arm in layout.arms.values() for gpu in arm.gpus})
            if used:
                return tuple(used), f"the plan's placement ({layout.strategy}) on the GPUs NVML lists"
    arms = ("baseline", "speculative") if cfg.speculative else ("baseline",)
    need = max(arm_gpu_need(cfg, arm) for arm in arms)
    return tuple(range(need)), "the target's (and draft's) tp × pp"


def _bandwidth_ok(gpu: NvmlGpu, profile: HardwareProfile) -> bool:
    if gpu.bandwidth_gbps is None or not profile.bandwidth_gbps:
        return True  # not reported: the name and memory decide, and the row says bandwidth was not checked
    return abs(gpu.bandwidth_gbps - profile.bandwidth_gbps) <= BANDWIDTH_TOLERANCE * profile.bandwidth_gbps


def profile_of(gpu: NvmlGpu) -> HardwareProfile | None:
    """The profile whose NVML name, memory total and bandwidth this GPU has, if any."""
    for name, names in NVML_NAMES.items():
        profile = PROFILES[name]
        if gpu.name in names and abs(gpu.memory_gib - (profile.memory_gib or 0)) <= MEMORY_TOLERANCE_GIB \
                and _bandwidth_ok(gpu, profile):
            return profile
    return None


def _describe(profile: HardwareProfile) -> str:
    names = " or ".join(NVML_NAMES.get(profile.name, ("?",)))
    return f"{names}, {profile.memory_gib} GiB, {profile.bandwidth_gbps:.0f} GB/s"


def _model_row(cfg: DeploymentConfig, profile: HardwareProfile, used: list[NvmlGpu]) -> LiveCheck:
    expected = f"{profile.display_name}: {_describe(profile)}"
    source = f"hardware: {cfg.hardware} (pipeline/facts/hardware.py; NVML names in pipeline/validate/live/gpus.py)"
    found = "; ".join(f"{g.index}: {g.name}, {g.memory_gib:.1f} GiB, " + (
        f"{g.bandwidth_gbps:.0f} GB/s" if g.bandwidth_gbps else "bandwidth not reported (not checked)")
        for g in used) or "-"
    wrong = [g for g in used if profile_of(g) is not profile]
    if not wrong:
        return passed("GPU model", expected, source, found)
    other = profile_of(wrong[0])
    if other is not None:
        fix = (f"set hardware: {other.name} ({other.display_name}, {other.bandwidth_gbps:.0f} GB/s, {other.memory_gib} "
               "GiB: its formats, memory plan and forecast differ), or run on the planned GPUs")
    else:
        fix = (f"no hardware profile describes {wrong[0].name} with {wrong[0].memory_gib:.1f} GiB: run on "
               f"{profile.display_name} GPUs, or add its profile (bandwidth, memory, formats) to "
               "pipeline/facts/hardware.py and pipeline/validate/live/gpus.py")
    return failed("GPU model", expected, source, found, fix)


def _holders(gpu: NvmlGpu) -> str:
    if gpu.processes is None:
        return "the holders are not listed (NVML does not report processes here)"
    if not gpu.processes:
        return "no compute process listed (the driver or a graphics client holds it)"
    return ", ".join(f"pid {p.pid} {p.name}" + (f" ({p.used_gib:.1f} GiB)" if p.used_gib is not None else "")
                     for p in gpu.processes)


def _free_row(cfg: DeploymentConfig, used: list[NvmlGpu], need_gib: float | None, why: str) -> LiveCheck:
    name = "GPU free memory"
    source = "the plan's busiest GPU (validate's memory fit: weights, activations, KV cache, margin)"
    found = "; ".join(f"{g.index}: {g.free_gib:.1f} of {g.memory_gib:.1f} GiB free" for g in used) or "-"
    if need_gib is None:
        return skipped(name, "free memory for the plan", source, f"not checked: {why}; {found}")
    expected = f"≥ {need_gib:.1f} GiB free on each planned GPU"
    short = [g for g in used if g.free_gib < need_gib]
    if not short:
        return passed(name, expected, source, found)
    held = "; ".join(f"GPU {g.index}: {g.memory_gib - g.free_gib:.1f} GiB held by {_holders(g)}" for g in short)
    return failed(name, expected, source, f"{found}; {held}",
                  "stop what holds the memory (named above), or place the deployment on free GPUs (triton.gpus), "
                  "or lower build.max_batch_size / build.max_seq_len so the plan needs less")


def check_gpus(cfg: DeploymentConfig, need_gib: float | None = None, need_why: str = "") -> list[LiveCheck]:
    profile = get_profile(cfg.hardware)
    read = read_nvml()
    ids, ids_source = planned_gpus(cfg, [g for g in read.gpus or [] if g.readable])
    if read.gpus is None:
        return [failed("GPUs", f"{len(ids)} × {profile.display_name}", ids_source, read.problem, read.fix)]
    present = {g.index: g for g in read.gpus}
    missing = [i for i in ids if i not in present]
    expected = f"GPUs {list(ids)}"
    names = sorted({g.name for g in read.gpus if g.readable})
    found = f"{len(read.gpus)} GPU(s) ({', '.join(names) or 'none readable'})" if read.gpus else "no GPUs"
    out = []
    if missing:
        out.append(failed("GPU count", expected, ids_source, found,
                          f"give the container GPUs {missing} (CUDA_VISIBLE_DEVICES / --gpus), or lower tp / "
                          "triton.gpus"))
    else:
        out.append(passed("GPU count", expected, ids_source, found))
    planned = [present[i] for i in ids if i in present]
    # without triton.gpus, render and serve place the arms on every GPU nvidia-smi lists, and refuse
    # a GPU it cannot read (pipeline/plan/gpu_layout.py query_gpus): then any lost GPU matters
    scope = "each planned GPU" if cfg.triton.gpus is not None else "each GPU (render places the arms on all)"
    lost = [g for g in read.gpus if not g.readable and (cfg.triton.gpus is None or g.index in ids)]
    if lost:
        gone = "; ".join(f"GPU {g.index}: {g.error}" for g in lost)
        out.append(failed("GPU health", f"{scope} answers NVML", "NVML per device", gone,
                          "the GPU is lost or fell off the bus (dmesg: Xid 79): reset it (nvidia-smi -r -i "
                          f"{lost[0].index}, idle, as root) or reboot the host; or set triton.gpus to GPUs that answer"))
    else:
        out.append(passed("GPU health", f"{scope} answers NVML", "NVML per device",
                          f"{sum(g.readable for g in read.gpus)} of {len(read.gpus)} GPU(s) readable"))
    used = [g for g in planned if g.readable]
    if not used:
        why = "no planned GPU is readable"
        return out + [skipped(n, "-", "NVML", f"not checked: {why}") for n in ("GPU model", "GPU free memory",
                                                                              "GPU MIG mode")]
    model = _model_row(cfg, profile, used)
    out.append(model)
    if model.failed:  # the plan's memory was made for the profile's GPU, not this one
        out.append(skipped("GPU free memory", "free memory for the plan", "the plan's busiest GPU",
                           f"not checked: the plan is sized for {profile.display_name}, not these GPUs (row GPU model)"))
    else:
        out.append(_free_row(cfg, used, need_gib, need_why))
    mig = [g.index for g in used if g.mig]
    if mig:
        out.append(failed("GPU MIG mode", "disabled", "the plan places models on whole GPUs",
                          f"MIG enabled on GPU(s) {mig}", "nvidia-smi -i <id> -mig 0 (as root, GPU idle), or use "
                          "GPUs without MIG"))
    else:
        out.append(passed("GPU MIG mode", "disabled", "the plan places models on whole GPUs", "disabled"))
    return out
