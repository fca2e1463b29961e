"""Where each load-test arm's TensorRT-LLM models run on the GPU host, and how much KV cache each gets.

Reads the config, its hardware profile, the model shapes (a checkpoint's ``config.json``, else the
known-model table of ``pipeline.validate.model_shapes``) and the GPUs the host offers (``triton.gpus``, else
``nvidia-smi``); writes nothing. ``render`` bakes the result into the repositories (``gpu_device_ids``,
``kv_cache_free_gpu_mem_fraction``, ``max_tokens_in_paged_kv_cache``) and its stamp, ``serve`` turns
it into the launch (``CUDA_VISIBLE_DEVICES``, leader or orchestrator mode), ``loadtest`` records it
in the run's provenance, ``validate`` prints the memory of the busiest GPU.

The load test compares a baseline and a speculative server. Started side by side with the runtime's
default KV fraction each, the second one runs out of memory; with fractions that merely fit, the
two KV pools differ in size and the comparison is biased at high concurrency. So:

- **split**: enough GPUs for both arms: each arm gets its own GPUs.
- **shared**: both arms on the same GPUs when everything co-resident fits at full capacity.
- **sequential**: only one arm fits at a time: the load test restarts the servers between runs
  (the A B A B interleaving is kept; the provenance says so).

In every strategy every TensorRT-LLM model of both arms gets the same KV capacity in tokens
(``max_tokens_in_paged_kv_cache``: the runtime allocates the smaller of it and the fraction), and
the fractions of the models sharing a GPU add up to ``triton.kv_cache_free_gpu_mem_fraction``, split
so that each reaches that capacity even when it allocates last (docs/gpu-serving.md).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.config import DeploymentConfig, ModelSpec
from pipeline.errors import EXIT_FAILURE, EXIT_USAGE, SpecdeployError
from pipeline.validate.hardware import HardwareProfile, get_profile
from pipeline.validate.memory_fit import (
    ExecutorMemory,
    MemoryEstimate,
    baseline_executor,
    device_memory_gib,
    estimate_memory,
    gpu_estimate,
    speculative_executors,
)
from pipeline.validate.model_shapes import ModelShape, known_shape, read_config_json, shape_from_config

ARMS = ("baseline", "speculative")
KV_TOKEN_GRANULE = 128  # a whole number of KV blocks for every tokens_per_block the builder offers


class LayoutError(SpecdeployError):
    """The arms cannot be placed on the GPUs the host offers: the config asks for more (exit 2)."""

    exit_code = EXIT_USAGE


class GpuLostError(LayoutError):
    """nvidia-smi lists a GPU it cannot read (lost, fallen off the bus)."""

    exit_code = EXIT_FAILURE


@dataclass(frozen=True)
class ModelPlacement:
    """One ``tensorrt_llm`` model of one arm."""

    model_name: str
    gpus: tuple[int, ...]  # nvidia-smi indexes of its ranks, in rank order
    kv_cache_free_gpu_mem_fraction: float
    max_tokens_in_paged_kv_cache: int | None


@dataclass(frozen=True)
class ArmPlacement:
    """One arm's server: its GPUs, how it is launched and its TensorRT-LLM models."""

    arm: str
    gpus: tuple[int, ...]
    launch: str  # single (one tritonserver), leader (mpirun, one per rank), orchestrator, cpu
    world_size: int  # mpirun ranks (orchestrator mode: 1, the workers are spawned per model)
    models: tuple[ModelPlacement, ...]

    @property
    def cuda_visible_devices(self) -> str | None:
        """Leader and single mode see only the arm's GPUs; orchestrator mode names them per model
        (``gpu_device_ids``) and keeps every GPU visible, as upstream's multi-instance guide does."""
        if self.launch in ("single", "leader"):
            return ",".join(str(g) for g in self.gpus)
        return None

    def model(self, name: str) -> ModelPlacement | None:
        return next((m for m in self.models if m.model_name == name), None)

    def to_dict(self) -> dict:
        return {**asdict(self), "cuda_visible_devices": self.cuda_visible_devices}

    @classmethod
    def from_dict(cls, data: dict) -> "ArmPlacement":
        models = tuple(ModelPlacement(m["model_name"], tuple(m["gpus"]), m["kv_cache_free_gpu_mem_fraction"],
                                      m["max_tokens_in_paged_kv_cache"]) for m in data["models"])
        return cls(data["arm"], tuple(data["gpus"]), data["launch"], data["world_size"], models)


@dataclass
class ArmLayout:
    strategy: str  # split | shared | sequential | single-arm | cpu
    reason: str
    host_gpus: tuple[int, ...]
    gpus_source: str
    kv_tokens: int | None
    arms: dict[str, ArmPlacement] = field(default_factory=dict)
    estimate: MemoryEstimate | None = None  # the busiest GPU

    def summary(self, arm: str) -> dict:
        """What the run's provenance records for one arm."""
        placement = self.arms[arm]
        return {"strategy": self.strategy, "reason": self.reason, "host_gpus": list(self.host_gpus),
                "gpus_source": self.gpus_source, "kv_tokens": self.kv_tokens, **placement.to_dict()}


# ----------------------------------------------------------------------------------------------
# The host's GPUs


@dataclass(frozen=True)
class GpuInfo:
    index: int
    memory_mib: float


def query_gpus(nvidia_smi: str | None = None) -> list[GpuInfo] | None:
    """The GPUs ``nvidia-smi`` lists (index, total memory); None when it is not installed."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if binary is None:
        return None
    argv = [binary, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise LayoutError(f"`{' '.join(argv)}` failed: {exc}", exit_code=EXIT_FAILURE) from None  # the host, not the config
    gpus = []
    for line in filter(None, (raw.strip() for raw in out.splitlines())):
        parts = [part.strip() for part in line.split(",")]
        try:
            gpus.append(GpuInfo(int(parts[0]), float(parts[1])))
        except (IndexError, ValueError):
            # a GPU nvidia-smi cannot read prints "[GPU is lost]" / "[Unknown Error]" in its fields,
            # or a message instead of the row: say which, not a traceback
            raise GpuLostError(f"nvidia-smi cannot read a GPU: {line!r} — a GPU lost or fallen off the bus (dmesg: "
                               "Xid 79); reset it (nvidia-smi -r -i N, idle, as root) or reboot the host, or leave "
                               "it out with triton.gpus") from None
    return gpus


def arm_gpu_need(cfg: DeploymentConfig, arm: str) -> int:
    """GPUs one arm's server occupies: the target's TP×PP (a draft sits on the target's first GPUs)."""
    need = cfg.target.world_size
    if arm == "speculative" and cfg.draft is not None:
        need = max(need, cfg.draft.world_size)
    return need


def host_gpus(cfg: DeploymentConfig, detected: list[GpuInfo] | None) -> tuple[tuple[int, ...], str]:
    """The GPUs the deployment may use and where that list came from."""
    if cfg.triton.gpus is not None:
        return tuple(cfg.triton.gpus), "triton.gpus"
    if detected:
        return tuple(g.index for g in detected), "nvidia-smi"
    arms = ARMS if cfg.speculative else ("baseline",)
    return tuple(range(max(arm_gpu_need(cfg, a) for a in arms))), "no nvidia-smi: the fewest the deployment needs"


# ----------------------------------------------------------------------------------------------
# Model shapes


def _shape_of(spec: ModelSpec) -> ModelShape | None:
    directory = Path(spec.checkpoint)
    if not spec.is_builtin and (directory / "config.json").is_file():
        try:
            return shape_from_config(read_config_json(directory), f"{directory}/config.json")
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None if spec.is_builtin else known_shape(spec.checkpoint)


def model_shapes(cfg: DeploymentConfig) -> tuple[ModelShape | None, ModelShape | None]:
    return _shape_of(cfg.target), (_shape_of(cfg.draft) if cfg.draft is not None else None)


# ----------------------------------------------------------------------------------------------
# Which model sits on which GPU


@dataclass
class _Slot:
    """A TensorRT-LLM model of one arm placed on GPUs, with its memory when the shapes are known."""

    arm: str
    model_name: str
    gpus: tuple[int, ...]
    memory: ExecutorMemory | None


def _arm_models(cfg: DeploymentConfig, arm: str) -> list[tuple[str, ModelSpec]]:
    if arm == "speculative" and cfg.draft is not None:
        return [("tensorrt_llm", cfg.target), ("tensorrt_llm_draft", cfg.draft)]
    return [("tensorrt_llm", cfg.target)]


def _memories(cfg: DeploymentConfig, profile: HardwareProfile, shapes, arm: str) -> dict[str, ExecutorMemory]:
    target, draft = shapes
    if target is None or (cfg.draft is not None and draft is None):
        return {}
    if arm == "baseline":
        executor = baseline_executor(cfg, profile, target, prefix="baseline " if cfg.speculative else "")
        return {"tensorrt_llm": executor}
    return {e.model_name: e for e in speculative_executors(cfg, profile, target, draft)}


def _slots(cfg: DeploymentConfig, profile: HardwareProfile, shapes, arms: tuple[str, ...],
           gpus: tuple[int, ...], strategy: str) -> list[list[_Slot]]:
    """The slots of each co-residency scope: one scope with every arm when they share GPUs, one
    scope per arm otherwise (split GPUs, or arms that never run at the same time)."""
    scopes, offset = [], 0
    for arm in arms:
        need = arm_gpu_need(cfg, arm)
        pool = gpus[offset:offset + need] if strategy == "split" else gpus[:need]
        offset += need if strategy == "split" else 0
        memories = _memories(cfg, profile, shapes, arm)
        scopes.append([_Slot(arm, name, pool[:spec.world_size], memories.get(name)) for name, spec in _arm_models(cfg, arm)])
    return [[s for scope in scopes for s in scope]] if strategy == "shared" else scopes


def _by_gpu(scope: list[_Slot]) -> dict[int, list[_Slot]]:
    groups: dict[int, list[_Slot]] = {}
    for slot in scope:
        for gpu in slot.gpus:
            groups.setdefault(gpu, []).append(slot)
    return groups


# ----------------------------------------------------------------------------------------------
# Equal KV capacity


def _needed_fractions(scopes: list[list[_Slot]], tokens: int, device_gib: float) -> tuple[dict, float] | None:
    """The KV fraction each model needs to allocate ``tokens`` even when every other pool on its
    GPUs was allocated first (the fraction applies to the memory free at that moment), and the
    largest sum of them on one GPU; None when a GPU cannot hold them at all."""
    needed: dict[tuple[str, str], float] = {}
    worst = 0.0
    for scope in scopes:
        for members in _by_gpu(scope).values():
            free = device_gib - sum(m.memory.non_kv_gib for m in members)
            pools = {(m.arm, m.model_name): m.memory.kv_per_token_gib * tokens for m in members}
            for key, own in pools.items():
                rest = free - (sum(pools.values()) - own)
                if rest <= own:
                    return None
                needed[key] = max(needed.get(key, 0.0), own / rest)
    for scope in scopes:
        for members in _by_gpu(scope).values():
            worst = max(worst, sum(needed[(m.arm, m.model_name)] for m in members))
    return needed, worst


def _equal_tokens(scopes: list[list[_Slot]], fraction: float, device_gib: float, low: int, high: int) -> int | None:
    """The largest KV capacity (tokens, the same for every model) in [low, high] whose fractions
    fit in ``fraction`` on every GPU; None when even ``low`` does not."""
    def fits(tokens: int) -> bool:
        result = _needed_fractions(scopes, tokens, device_gib)
        return result is not None and result[1] <= fraction

    if fits(high):
        return high
    if not fits(low):
        return None
    lo, hi = low, high
    while hi - lo > KV_TOKEN_GRANULE:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return max(low, lo // KV_TOKEN_GRANULE * KV_TOKEN_GRANULE)


def _fractions(scopes: list[list[_Slot]], fraction: float, device_gib: float, tokens: int | None) -> dict:
    """Each model's KV fraction: what it needs at ``tokens``, scaled so that the models of the
    fullest GPU of its scope add up to ``fraction``; without shapes (or a token cap), an even split."""
    out = {}
    for scope in scopes:
        known = tokens and all(s.memory for s in scope)
        result = _needed_fractions([scope], tokens, device_gib) if known else None
        groups = _by_gpu(scope)
        for slot in scope:
            key = (slot.arm, slot.model_name)
            if result is not None and result[1] > 0:
                out[key] = int(result[0][key] * fraction / result[1] * 1000) / 1000
            else:
                out[key] = int(fraction / max(len(groups[g]) for g in slot.gpus) * 1000) / 1000
    return out


# ----------------------------------------------------------------------------------------------
# Choosing the strategy


@dataclass
class _Attempt:
    strategy: str
    scopes: list[list[_Slot]]
    kv_tokens: int | None
    estimate: MemoryEstimate | None


def _busiest(cfg: DeploymentConfig, profile: HardwareProfile, attempt: _Attempt) -> MemoryEstimate | None:
    """The memory of the GPU with the least headroom under ``attempt``."""
    estimates = []
    for scope in attempt.scopes:
        for gpu, members in sorted(_by_gpu(scope).items()):
            if not all(m.memory for m in members):
                return None
            who = " + ".join(f"{m.arm} {m.model_name}" for m in members)
            estimates.append(gpu_estimate(cfg, profile, [m.memory for m in members], attempt.kv_tokens,
                                          f"GPU {gpu}: {who} ({attempt.strategy})"))
    return min(estimates, key=lambda e: e.headroom_gib) if estimates else None


def _attempt(cfg: DeploymentConfig, profile: HardwareProfile, shapes, arms: tuple[str, ...],
             gpus: tuple[int, ...], strategy: str) -> _Attempt | str:
    """The placement under ``strategy`` with its equal KV capacity, or why there is none."""
    need = sum(arm_gpu_need(cfg, a) for a in arms) if strategy == "split" else max(arm_gpu_need(cfg, a) for a in arms)
    if len(gpus) < need:
        return f"needs {need} GPU(s), {len(gpus)} available ({', '.join(map(str, gpus))})"
    scopes = _slots(cfg, profile, shapes, arms, gpus, strategy)
    explicit, fraction = cfg.triton.max_tokens_in_paged_kv_cache, cfg.triton.kv_cache_free_gpu_mem_fraction
    if not all(s.memory for scope in scopes for s in scope):
        if explicit is None and len(arms) > 1:
            return ("the model shapes are unknown (no readable config.json, not a known model), so the equal KV "
                    "capacity cannot be sized: set triton.max_tokens_in_paged_kv_cache")
        return _Attempt(strategy, scopes, explicit, None)
    device = device_memory_gib(profile)
    mains = [s.memory for scope in scopes for s in scope if s.model_name == "tensorrt_llm"]
    if explicit is not None:
        result = _needed_fractions(scopes, explicit, device)
        if result is None or result[1] > fraction:
            return (f"triton.max_tokens_in_paged_kv_cache {explicit} needs more than the KV fraction "
                    f"{fraction} leaves on a GPU")
        tokens = explicit
    elif len(arms) == 1:
        tokens = None  # nothing to compare against: the runtime sizes the pool from the fraction
    else:
        low = max(m.full_tokens // cfg.build.max_batch_size for m in mains)
        tokens = _equal_tokens(scopes, fraction, device, low, max(m.full_tokens for m in mains))
        if tokens is None:
            return f"the KV fraction {fraction} cannot give every model one full sequence ({low} tokens)"
    attempt = _Attempt(strategy, scopes, tokens, None)
    attempt.estimate = _busiest(cfg, profile, attempt)
    return attempt


def _candidates(cfg: DeploymentConfig, arms: tuple[str, ...]) -> list[str]:
    if len(arms) == 1:
        return ["single-arm"]
    return ["split", "shared", "sequential"] if cfg.triton.arm_placement == "auto" else [cfg.triton.arm_placement]


def _choose(cfg: DeploymentConfig, profile: HardwareProfile, shapes, arms, gpus) -> tuple[_Attempt, str]:
    auto = cfg.triton.arm_placement == "auto" and len(arms) > 1
    failures = []
    for strategy in _candidates(cfg, arms):
        outcome = _attempt(cfg, profile, shapes, arms, gpus, "split" if strategy == "single-arm" else strategy)
        if isinstance(outcome, str):
            failures.append(f"{strategy}: {outcome}")
            continue
        outcome.strategy = strategy
        outcome.estimate = _busiest(cfg, profile, outcome)  # titled with the strategy chosen
        full = _busiest(cfg, profile, _Attempt(strategy, outcome.scopes, None, None))
        if auto and strategy == "shared" and full is not None and not full.fits:
            failures.append(f"shared: both arms at full capacity need {full.total_gib:.1f} of {full.device_gib:.1f} GiB")
            continue
        picked = f"triton.arm_placement: {strategy}" if not auto and len(arms) > 1 else \
            "; ".join([*failures, f"{strategy}: fits"])
        return outcome, picked
    raise LayoutError(f"cannot place the {' and '.join(arms)} arm(s) on GPUs {list(gpus)}: " + "; ".join(failures))


# ----------------------------------------------------------------------------------------------
# The layout


def _launch(cfg: DeploymentConfig, slots: list[_Slot]) -> tuple[str, int]:
    if cfg.backend == "reference":
        return "cpu", 1
    if len(slots) > 1:
        return "orchestrator", 1  # upstream's --multi-model: world size 1, workers spawned per model
    world = cfg.target.world_size
    return ("leader", world) if world > 1 else ("single", 1)


def _placements(cfg: DeploymentConfig, scopes: list[list[_Slot]], fractions: dict, tokens: int | None) -> dict:
    arms: dict[str, ArmPlacement] = {}
    for arm in ARMS:
        slots = [s for scope in scopes for s in scope if s.arm == arm]
        if not slots:
            continue
        launch, world = _launch(cfg, slots)
        models = tuple(ModelPlacement(s.model_name, s.gpus, fractions[(arm, s.model_name)], tokens) for s in slots)
        gpus = tuple(dict.fromkeys(g for s in slots for g in s.gpus))  # the target's ranks first
        arms[arm] = ArmPlacement(arm, gpus, launch, world, models)
    return arms


def plan_layout(cfg: DeploymentConfig, profile: HardwareProfile, shapes, gpus: tuple[int, ...],
                gpus_source: str = "triton.gpus") -> ArmLayout:
    """Place the arms (LayoutError when they cannot be)."""
    arms = ARMS if cfg.speculative else ("baseline",)
    fraction = cfg.triton.kv_cache_free_gpu_mem_fraction
    if cfg.backend == "reference":
        scopes = [[_Slot(a, name, (), None) for a in arms for name, _ in _arm_models(cfg, a)]]
        fractions = {(s.arm, s.model_name): fraction for s in scopes[0]}
        return ArmLayout("cpu", "CPU reference engine: both arms in host memory", (), "cpu",
                         cfg.triton.max_tokens_in_paged_kv_cache,
                         _placements(cfg, scopes, fractions, cfg.triton.max_tokens_in_paged_kv_cache))
    attempt, reason = _choose(cfg, profile, shapes, arms, gpus)
    fractions = _fractions(attempt.scopes, fraction, device_memory_gib(profile), attempt.kv_tokens)
    return ArmLayout(attempt.strategy, reason, tuple(gpus), gpus_source, attempt.kv_tokens,
                     _placements(cfg, attempt.scopes, fractions, attempt.kv_tokens), attempt.estimate)


def deployment_layout(cfg: DeploymentConfig, detected: list[GpuInfo] | None | bool = False) -> ArmLayout:
    """The layout of ``cfg`` on this host (``detected``: the GPUs nvidia-smi lists; False = ask it)."""
    if cfg.backend == "reference":
        return plan_layout(cfg, get_profile(cfg.hardware), (None, None), ())
    gpus = query_gpus() if detected is False else detected
    ids, source = host_gpus(cfg, gpus)
    return plan_layout(cfg, get_profile(cfg.hardware), model_shapes(cfg), ids, source)


def validate_estimate(cfg: DeploymentConfig, profile: HardwareProfile, target: ModelShape, draft: ModelShape | None,
                      detected: list[GpuInfo] | None | bool = False) -> tuple[MemoryEstimate, ArmLayout | None, str | None]:
    """What ``validate`` shows: the memory of the busiest GPU as the arms will be placed (both
    arms when they share it), the layout, and why the arms cannot be placed (None when they can)."""
    shapes = (target, draft)
    if cfg.backend == "reference" or not profile.is_gpu:
        executors = [baseline_executor(cfg, profile, target, prefix="baseline " if cfg.speculative else "")]
        if cfg.speculative:
            executors += speculative_executors(cfg, profile, target, draft)
        return gpu_estimate(cfg, profile, executors, None, "host memory: both arms" if cfg.speculative else ""), None, None
    try:
        gpus = query_gpus() if detected is False else detected
        ids, source = host_gpus(cfg, gpus)
        layout = plan_layout(cfg, profile, shapes, ids, source)
    except LayoutError as exc:
        return estimate_memory(cfg, profile, target, draft), None, str(exc)
    return layout.estimate or estimate_memory(cfg, profile, target, draft), layout, None
