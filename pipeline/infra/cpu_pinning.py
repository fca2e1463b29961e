"""CPU pinning for served reference engines: which cores the engines' decode threads own, and
which cores everything else (tritonserver, the pre/post-processing and BLS stubs, the load
generator) runs on.

On a small CPU host the engine's single decode thread shares the cores with Triton's frontends,
the other Python models and the client; the scheduler moves them around and the decode thread
loses time to them. Pinning the decode thread to a core of its own and the rest to the other
cores is the CPU analogue of giving a GPU engine its device (served ÷ in-process tokens/s, pinned
and not: benchmarks/results/served-worker-*.json).

Reads the allowed CPU set (``os.sched_getaffinity``); writes nothing. :func:`plan_pinning` is
pure; :func:`pinning_problems` runs it for every arm so ``validate`` refuses what ``serve`` would.
``serve`` applies a plan: it starts tritonserver on :attr:`CpuPlan.other_cpus` (the model
stubs inherit that set) and hands each engine model its cores in :data:`ENV_VAR` (JSON
``{model: [cpu, ...]}``), as ``CUDA_VISIBLE_DEVICES`` hands GPUs to a process; each engine's
decode thread pins itself (:func:`pin_this_thread`). ``loadtest`` starts Locust on the other
cores too (:func:`spawn_on`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

ENV_VAR = "SPECDEPLOY_ENGINE_CPUS"
FIELD = "reference.cpu_pinning"
ENGINE_MODELS = ("tensorrt_llm", "tensorrt_llm_draft")  # the models that run a reference engine


@dataclass(frozen=True)
class CpuPlan:
    engine_cpus: dict[str, tuple[int, ...]]  # engine model name → its decode thread's CPUs
    other_cpus: tuple[int, ...]  # tritonserver, the other models' stubs, the load generator

    def env(self) -> dict[str, str]:
        return {ENV_VAR: json.dumps({model: list(cpus) for model, cpus in self.engine_cpus.items()})}

    def describe(self) -> str:
        engines = ", ".join(f"{model} → {list(cpus)}" for model, cpus in self.engine_cpus.items())
        return f"engine decode threads: {engines}; tritonserver, other models, load generator → {list(self.other_cpus)}"

    def as_dict(self) -> dict:
        return {"engine_cpus": {m: list(c) for m, c in self.engine_cpus.items()}, "other_cpus": list(self.other_cpus)}


def allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0))


def plan_pinning(mode: str | list[int], engine_models: Iterable[str], threads: int,
                 allowed: Iterable[int], most_engines: int = 0) -> tuple[CpuPlan | None, str]:
    """``auto``: each engine model gets ``threads`` CPUs of its own (the highest allowed ones)
    when at least one CPU is left over for everything else — for the deployment's arm with the
    most engine models (``most_engines``: the speculative arm of a BLS draft-target deployment
    has two), so that both arms of a load test run under the same policy; otherwise nothing is
    pinned (engines sharing cores would contend whenever their requests overlap). Only the
    engines the arm decodes with are pinned: with ``most_engines`` given, the first that many of
    :data:`ENGINE_MODELS` in the repository — a draft-target repository orchestrated in the engine
    keeps ``tensorrt_llm_draft`` for BLS calls, an engine its load test leaves idle, which must not
    take a core (nor unpin that arm while the baseline stays pinned). A list names the engines'
    CPUs (``threads`` per engine model, in order); an unusable list is a :class:`ValueError`.
    Returns the plan (None = no pinning) and a one-line reason."""
    models = decoding_models(engine_models, most_engines)
    cpus = sorted(set(allowed))
    if mode == "off":
        return None, "reference.cpu_pinning is off"
    if not models:
        return None, "no reference engine model in the repository"
    needed = len(models) * threads
    if mode == "auto":
        engines = max(len(models), most_engines)
        if len(cpus) < engines * threads + 1:
            return None, (f"{len(cpus)} CPU(s) allowed; pinning {engines} engine model(s) × {threads} "
                          "thread(s) needs one more for the server (both arms run unpinned)")
        reserved = cpus[-needed:]
    else:
        reserved = list(dict.fromkeys(int(c) for c in mode))
        outside = [c for c in reserved if c not in cpus]
        if outside:
            raise ValueError(f"{FIELD}: CPU(s) {outside} are not allowed here; this process may run on "
                             f"CPUs {format_cpus(cpus)} only (its affinity mask)")
        if len(reserved) < needed:
            raise ValueError(f"{FIELD}: lists {len(reserved)} CPU(s); {len(models)} engine model(s) "
                             f"× {threads} thread(s) need {needed}")
        if len(reserved) >= len(cpus):
            raise ValueError(f"{FIELD}: takes every allowed CPU ({cpus}); leave one for the server")
        reserved = reserved[:needed]
    engine = {model: tuple(reserved[i * threads:(i + 1) * threads]) for i, model in enumerate(models)}
    return CpuPlan(engine, tuple(c for c in cpus if c not in reserved)), "pinned"


def decoding_models(repository_models: Iterable[str], most_engines: int = 0) -> list[str]:
    """The repository's engine models, in :data:`ENGINE_MODELS` order; with ``most_engines``, at
    most that many (the ones the deployment's arms decode with)."""
    present = set(repository_models)
    models = [m for m in ENGINE_MODELS if m in present]
    return models[:most_engines] if most_engines > 0 else models


def format_cpus(cpus: Iterable[int]) -> str:
    """CPU ids in the kernel's cpulist form (``0-3,8``), short even for a large host."""
    ids, runs = sorted(set(cpus)), []
    for cpu in ids:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def pinning_problems(mode: str | list[int], arms: Mapping[str, Iterable[str]], threads: int,
                     allowed: Iterable[int], most_engines: int = 0) -> list[str]:
    """What ``serve`` would refuse for any arm (``arms``: arm → the model names of its repository),
    checked before anything is built: one line per distinct problem, without the field prefix."""
    problems: list[str] = []
    allowed = set(allowed)
    for models in arms.values():
        try:
            plan_pinning(mode, models, threads, allowed, most_engines)
        except ValueError as exc:
            problem = str(exc).removeprefix(f"{FIELD}: ")
            if problem not in problems:
                problems.append(problem)
    return problems


def engine_cpus_from_env(model_name: str, environ: Mapping[str, str] = os.environ) -> tuple[int, ...] | None:
    """The CPUs ``serve`` assigned to this engine model (None: not pinned, or an unreadable value)."""
    raw = environ.get(ENV_VAR)
    if not raw:
        return None
    try:
        cpus = json.loads(raw).get(model_name)
        return tuple(int(c) for c in cpus) if cpus else None
    except (ValueError, TypeError, AttributeError):
        print(f"specdeploy: ignoring unreadable {ENV_VAR}={raw!r}", file=sys.stderr)
        return None


def pin_this_thread(cpus: Iterable[int]) -> bool:
    """Pin the calling thread (Linux affinity is per thread); threads it starts later inherit the
    set. False (and a line on stderr) when the OS refuses, e.g. a CPU outside the cgroup."""
    try:
        os.sched_setaffinity(0, set(cpus))
        return True
    except OSError as exc:
        print(f"specdeploy: cannot pin to CPUs {sorted(cpus)}: {exc}; running unpinned", file=sys.stderr)
        return False


@contextlib.contextmanager
def spawn_on(cpus: Iterable[int] | None) -> Iterator[None]:
    """Processes started inside the block run on ``cpus`` (a child inherits the affinity of the
    thread that forks it): the calling thread is pinned for the block and restored after."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
