"""What ``serve`` runs: the ``tritonserver`` command line and environment, CPU and GPU.

- CPU (backend ``reference``): the ``tritonserver`` binary of the ``nvidia-pytriton`` wheel
  (located by :mod:`pipeline.serve.tritonserver_install`), with the Python-backend stub for the running
  Python placed in ``backends/python/`` (or, if the wheel is read-only, a backend directory of
  symlinks under ``.cache/specdeploy/``), ``PYTHONPATH`` = site-packages + project root, one torch
  thread per stub, bound to 127.0.0.1. ``SPECDEPLOY_TRITON_MALLOC`` picks the allocator the
  server tree runs on (:func:`malloc_env`).
- GPU (backend ``trtllm``): ``tritonserver`` inside the NGC TensorRT-LLM container, as one server,
  leader mode (``mpirun``, one server per rank) or orchestrator mode (upstream's
  ``--multi-model``), and the exact ``docker run`` line that mounts every path the repository
  references. Engines built by another TensorRT-LLM version are refused.

Reads the wheel's install tree, the rendered repository's paths and the engines' ``config.json``;
writes only the symlinked backend directory. Nothing here starts a process: :mod:`pipeline.serve.server`
does.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.errors import EXIT_USAGE, ServeError
from pipeline.infra.provenance import package_version
from pipeline.paths import PROJECT_ROOT
from pipeline.plan.gpu_layout import ArmPlacement

STUB_NAME = "triton_python_backend_stub"
DEFAULT_HOST = "127.0.0.1"


# ----------------------------------------------------------------------------------------------
# Locating the CPU server


@dataclass(frozen=True)
class CpuServer:
    binary: Path
    backend_dir: Path
    library_dirs: tuple[Path, ...] = ()


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.is_file() and b.is_file() and a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def prepare_cpu_server(cache_root: Path | None = None) -> CpuServer:
    """Find the wheel's tritonserver and make ``backends/python`` hold this Python's stub."""
    from pipeline.serve.tritonserver_install import find_tritonserver  # noqa: PLC0415 - only this path needs it

    install = find_tritonserver()
    if install.stub_path is None:
        raise ServeError(
            f"the tritonserver in {install.binary.parent.parent} has no Python-backend stub for "
            f"Python {install.python_version} (available: {', '.join(install.available_stub_versions) or 'none'})"
        )
    python_dir = install.backend_dir / "python"
    placed = python_dir / STUB_NAME
    if _same_file(install.stub_path, placed):
        return CpuServer(install.binary, install.backend_dir, tuple(install.library_dirs))
    if os.access(python_dir, os.W_OK):
        tmp = python_dir / f".{STUB_NAME}.{os.getpid()}"
        shutil.copy2(install.stub_path, tmp)
        os.replace(tmp, placed)
        return CpuServer(install.binary, install.backend_dir, tuple(install.library_dirs))
    # read-only wheel: a backend directory of symlinks under the cache
    cache_root = cache_root or PROJECT_ROOT / ".cache" / "specdeploy" / f"triton-backends-py{install.python_version}"
    target = cache_root / "python"
    target.mkdir(parents=True, exist_ok=True)
    for item in python_dir.iterdir():
        if item.name != STUB_NAME and not (target / item.name).exists():
            (target / item.name).symlink_to(item.resolve())
    link = target / STUB_NAME
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(install.stub_path.resolve())
    return CpuServer(install.binary, cache_root, tuple(install.library_dirs))


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def cpu_server_env(server: CpuServer, base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    paths = [str(site_packages()), str(PROJECT_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    libs = [str(p) for p in server.library_dirs]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
    # The stub's embedded Python ignores PYTHONPATH (isolated init) but derives sys.prefix from
    # the first `python3` on PATH: the venv's bin first makes it load the venv's site-packages.
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "RAYON_NUM_THREADS": "1"})
    env.update(malloc_env(env.get(MALLOC_ENV, DEFAULT_MALLOC), env))
    return env


# The allocator the CPU server tree runs on: Triton suggests preloading tcmalloc or jemalloc when
# its memory grows without a leak (triton-inference-server/server docs/user_guide/model_management.md,
# "Model Control Mode EXPLICIT"); docs/operations.md says what this project saw with each.
MALLOC_ENV = "SPECDEPLOY_TRITON_MALLOC"
MALLOC_LIBRARIES = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
MALLOC_PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}  # Debian's
MALLOC_CHOICES = ("auto", "glibc", *MALLOC_LIBRARIES)
# glibc's own: the preloaded allocators did not change the server's growth under load
# (docs/operations.md, "Memory of the CPU tritonserver")
DEFAULT_MALLOC = "glibc"
LIBRARY_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib64"),
                Path("/usr/lib"), Path("/lib/x86_64-linux-gnu"), Path("/lib64"))


def find_malloc_library(name: str, dirs: tuple[Path, ...] | None = None) -> Path | None:
    """The shared object of allocator ``name`` (a key of :data:`MALLOC_LIBRARIES`), or None."""
    dirs = LIBRARY_DIRS if dirs is None else dirs
    return next((d / MALLOC_LIBRARIES[name] for d in dirs if (d / MALLOC_LIBRARIES[name]).is_file()), None)


def malloc_env(choice: str, base: dict, dirs: tuple[Path, ...] | None = None) -> dict[str, str]:
    """What ``choice`` adds to the server's environment: ``LD_PRELOAD`` with the allocator first
    (``{}`` for glibc). ``auto`` falls back to glibc when no allocator is installed; naming one that
    is missing is an error."""
    dirs = LIBRARY_DIRS if dirs is None else dirs
    if choice not in MALLOC_CHOICES:
        raise ServeError(f"{MALLOC_ENV}={choice!r}: expected one of {', '.join(MALLOC_CHOICES)}", exit_code=EXIT_USAGE)
    names = [n for n in MALLOC_LIBRARIES if choice in ("auto", n)]
    found = next(filter(None, (find_malloc_library(n, dirs) for n in names)), None)
    if found is None and choice not in ("auto", "glibc"):
        raise ServeError(f"{MALLOC_ENV}={choice}: {MALLOC_LIBRARIES[choice]} is not installed in "
                         f"{', '.join(map(str, dirs))} (Debian: apt-get install {MALLOC_PACKAGES[choice]}), "
                         f"or set {MALLOC_ENV}=glibc")
    if found is None:
        return {}
    preload = [str(found), *(p for p in base.get("LD_PRELOAD", "").split(":") if p and p != str(found))]
    return {"LD_PRELOAD": ":".join(preload)}


def malloc_in_env(env: dict) -> str:
    """Which allocator an environment built by :func:`cpu_server_env` preloads."""
    first = env.get("LD_PRELOAD", "").split(":")[0]
    return next((n for n, lib in MALLOC_LIBRARIES.items() if Path(first).name == lib), "glibc")


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int


def server_flags(repo: Path, ports: Ports, host: str, exit_timeout_s: float) -> list[str]:
    return [
        f"--model-repository={repo}",
        f"--http-address={host}", f"--http-port={ports.http}",
        f"--grpc-address={host}", f"--grpc-port={ports.grpc}",
        "--allow-metrics=true", f"--metrics-address={host}", f"--metrics-port={ports.metrics}",
        f"--exit-timeout-secs={max(1, int(round(exit_timeout_s)))}",
        "--disable-auto-complete-config",
    ]


# Without CUDA the pinned-memory pool cannot be created and every tensor copy logs a fallback to
# non-pinned memory; a zero-sized pool says so once.
CPU_ONLY_FLAGS = [
    "--pinned-memory-pool-byte-size=0",
]


def cpu_server_argv(server: CpuServer, repo: Path, ports: Ports, host: str = DEFAULT_HOST,
                    exit_timeout_s: float = 5.0) -> list[str]:
    return [str(server.binary), *server_flags(repo, ports, host, exit_timeout_s),
            f"--backend-directory={server.backend_dir}", *CPU_ONLY_FLAGS]


# ----------------------------------------------------------------------------------------------
# GPU launch (pure functions; tested by exact argv)

# Upstream's launcher with --multi-model (tensorrtllm_backend@r25.05 scripts/launch_triton_server.py,
# __main__ and add_multi_model_config): the backend's orchestrator spawns one worker process per
# model rank itself, so the MPI world is 1 and the server gives up the CUDA pools those workers
# would contend for.
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
# CUDA numbers devices fastest-first unless told otherwise; nvidia-smi, triton.gpus and
# gpu_device_ids use the PCI order.
GPU_ORDER_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
CONTAINER_PATHS = ("/opt/tritonserver",)  # referenced by the repository, provided by the image


def orchestrator_flags(gpu_count: int) -> list[str]:
    return ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
            *[f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(gpu_count)]]


def _shm_prefix(rank: int) -> str:
    return f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"


def gpu_server_argv(repo: Path, ports: Ports, launch: str = "single", world_size: int = 1,
                    host: str = DEFAULT_HOST, exit_timeout_s: float = 5.0, tritonserver: str = "tritonserver",
                    gpu_count: int = 1) -> list[str]:
    """The server command of one arm (``ArmPlacement.launch``):

    - ``single``: one tritonserver (one TensorRT-LLM model on one GPU);
    - ``leader``: one tritonserver per rank under mpirun (one model, TP×PP > 1), as upstream's
      launcher does: rank 0 serves every model, the other ranks load only ``tensorrt_llm``;
    - ``orchestrator``: one tritonserver under ``mpirun -n 1`` with upstream's --multi-model flags
      (several TensorRT-LLM models, e.g. a TP4 target and a TP1 draft); ``gpu_count`` is how many
      GPUs the host lists (one CUDA pool flag each), the environment comes from :func:`gpu_server_env`.
    """
    flags = server_flags(repo, ports, host, exit_timeout_s)
    if launch == "orchestrator":
        return ["mpirun", "--allow-run-as-root", "-n", "1", tritonserver, *flags,
                *orchestrator_flags(gpu_count), _shm_prefix(0)]
    if launch == "single" or world_size <= 1:
        return [tritonserver, *flags]
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += ["-n", "1", tritonserver, *flags, _shm_prefix(rank)]
        if rank:
            argv += ["--model-control-mode=explicit", "--load-model=tensorrt_llm"]
    return argv


def gpu_server_env(placement: ArmPlacement, base: dict | None = None) -> dict[str, str]:
    """The environment of one arm's server: its GPUs (leader/single) or the orchestrator switch."""
    env = dict(os.environ if base is None else base)
    env.update(GPU_ORDER_ENV)
    if placement.launch == "orchestrator":
        env.pop("CUDA_VISIBLE_DEVICES", None)  # gpu_device_ids are nvidia-smi indexes
        env.update(ORCHESTRATOR_ENV)
    else:
        for key in ORCHESTRATOR_ENV:
            env.pop(key, None)
        env["CUDA_VISIBLE_DEVICES"] = placement.cuda_visible_devices or ""
    return env


def repository_paths(repo: Path) -> list[Path]:
    """Every host path the repository's models read: the repository itself and each absolute path
    in a model parameter (engines, tokenizer and checkpoint dirs), nested ones folded into their
    parents; paths the container image provides are left out."""
    from pipeline.render.triton_rules import parse_config_file  # noqa: PLC0415 - only this path needs it

    found = {Path(repo).resolve()}
    for config_path in Path(repo).glob("*/config.pbtxt"):
        for param in parse_config_file(config_path).parameters.values():
            value = param.string_value
            if value.startswith("/") and not value.startswith(CONTAINER_PATHS):
                found.add(Path(value))
    ordered = sorted(found, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return sorted(kept)


def docker_argv(cfg: DeploymentConfig, server_argv: list[str], mounts: list[Path] | tuple = (),
                env: dict[str, str] | None = None) -> list[str]:
    """The container line to run when tritonserver is not installed here: every path the
    repository references mounted read-only at the same path, the arm's environment passed in."""
    volumes = [arg for path in mounts for arg in ("-v", f"{path}:{path}:ro")]
    variables = [arg for key, value in sorted((env or {}).items()) for arg in ("-e", f"{key}={value}")]
    return [
        "docker", "run", "--rm", "--gpus", "all", "--net", "host", "--ipc", "host",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", *volumes, *variables,
        cfg.triton.container_image, *server_argv,
    ]


def installed_trtllm_version() -> str | None:
    return package_version("tensorrt_llm", "tensorrt-llm")


def check_trtllm_version(manifest: dict, installed: str | None) -> None:
    built = manifest.get("trtllm_version")
    if installed is None or built is None:
        return
    if installed.split("+")[0] != str(built).split("+")[0]:
        raise ServeError(
            f"the engines were built by TensorRT-LLM {built} but {installed} is installed here; "
            "use the container with the same TensorRT-LLM or re-run `specdeploy build`"
        )
