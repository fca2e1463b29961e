"""`specdeploy serve`: start ``tritonserver`` on a rendered repository and stop it cleanly.

Reads ``engines/NAME/model_repo/<variant>/`` (from ``specdeploy render``) and the build manifest;
writes the server log to ``engines/NAME/logs/serve-<variant>.log``.

- CPU (backend ``reference``): the ``tritonserver`` binary of the ``nvidia-pytriton`` wheel
  (located by :mod:`pipeline.tritonserver_install`), with the Python-backend stub for the running
  Python placed in ``backends/python/`` (or, if the wheel is read-only, a backend directory of
  symlinks under ``.cache/specdeploy/``), ``PYTHONPATH`` = site-packages + project root, one torch
  thread per stub, bound to 127.0.0.1; with ``reference.cpu_pinning`` the server runs on the CPUs
  the engines do not own and each engine's decode thread on its own (:mod:`pipeline.cpu_pinning`;
  the plan is the log's first line).
- GPU (backend ``trtllm``): ``tritonserver`` on PATH inside the NGC TensorRT-LLM container, launched
  as the arm placement that ``render`` recorded says (``pipeline.gpu_layout``): one server for one
  single-GPU model, leader mode (``mpirun``, one server per rank) for one model with TP×PP > 1,
  orchestrator mode (upstream's ``--multi-model``) for several TensorRT-LLM models in one server
  (draft-target); the arm's GPUs through ``CUDA_VISIBLE_DEVICES`` or ``gpu_device_ids``. The
  GPUs ``nvidia-smi`` lists must include the rendered ones. When ``tritonserver`` is absent the
  exact ``docker run`` line is shown instead, mounting every path the repository references.
  Engines built by another TensorRT-LLM version are refused.

The server runs in its own session under a keeper (:mod:`pipeline.processes`): it, its
Python-backend stubs and the engine workers end when the ``specdeploy`` process that started them
ends, however it ends. Before starting, a server of ours that nothing owns any more (found by its
``--model-repository``, or through the pid file ``logs/serve-<variant>.pid``) and a busy port are
named in the error, with how to stop the process. :meth:`RunningServer.stop` stops the whole tree
(:func:`pipeline.processes.stop_tree`: SIGTERM, the exit timeout plus a grace period — the
bundled server sometimes ignores SIGTERM with a decoupled model loaded —, then SIGKILL).
:func:`serve_deployment` is the context manager ``loadtest`` and the tests use.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from pipeline.config import DeploymentConfig
from pipeline.cpu_pinning import CpuPlan, allowed_cpus, plan_pinning, spawn_on
from pipeline.gpu_layout import ArmPlacement, GpuInfo, query_gpus
from pipeline.hardware import get_profile
from pipeline.reference.api import ENGINE_PROCESS_ENV
from pipeline.errors import ServeError
from pipeline.paths import PROJECT_ROOT, logs_dir
from pipeline.processes import OwnedProcess, free_ports, spawn
from pipeline.stale_server import check_no_stale_server

STUB_NAME = "triton_python_backend_stub"
DEFAULT_HOST = "127.0.0.1"
KILL_GRACE_S = 10.0
OWNER_GONE_GRACE_S = 2.0  # when specdeploy is gone nobody waits for results: stop soon after the exit timeout


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
    from pipeline.tritonserver_install import find_tritonserver  # noqa: PLC0415

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
    return env


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
    from pipeline.render import parse_config_file  # noqa: PLC0415

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
    from importlib import metadata  # noqa: PLC0415

    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_trtllm_version(manifest: dict, installed: str | None) -> None:
    built = manifest.get("trtllm_version")
    if installed is None or built is None:
        return
    if installed.split("+")[0] != str(built).split("+")[0]:
        raise ServeError(
            f"the engines were built by TensorRT-LLM {built} but {installed} is installed here; "
            "use the container with the same TensorRT-LLM or re-run `specdeploy build`"
        )


# ----------------------------------------------------------------------------------------------
# A running server


@dataclass
class RunningServer:
    process: OwnedProcess
    host: str
    ports: Ports
    log_path: Path
    repo: Path
    exit_timeout_s: float = 5.0
    cpu_plan: CpuPlan | None = None  # the CPU pinning the server runs under (None: unpinned)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def pid_file(self) -> Path:
        return self.log_path.with_suffix(".pid")

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    def alive(self) -> bool:
        return self.process.alive()

    def exit_status(self) -> int | None:
        """The server's exit status once it ended (None while its keeper still cleans up)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout=KILL_GRACE_S)
        return None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def family(self) -> list[int]:
        """The server and every descendant seen so far that still runs (stubs, engine workers)."""
        return sorted({self.pid, *(p.pid for p in self.process.descendants())})

    def leftover_processes(self) -> list[int]:
        return [p.pid for p in self.process.descendants()]

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server's whole tree: SIGTERM, wait ``timeout``, SIGKILL what is left."""
        self.process.stop(self.exit_timeout_s + KILL_GRACE_S if timeout is None else timeout)
        with contextlib.suppress(OSError, ValueError):
            if int(self.pid_file.read_text().split()[0]) == self.pid:
                self.pid_file.unlink()

    def detach(self) -> None:
        """Let the server outlive this process (``specdeploy serve`` without ``--foreground``)."""
        self.process.detach()


def repository_models(repo: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(repo).glob("*/config.pbtxt"))


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(server: RunningServer, models: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServeError(f"tritonserver exited with status {server.exit_status()} while starting; "
                             f"log {server.log_path}:\n{server.log_tail()}")
        if _http_ok(f"{server.http_url}/v2/health/ready"):
            pending = [m for m in pending if not _http_ok(f"{server.http_url}/v2/models/{m}/ready")]
            if not pending:
                return
        time.sleep(0.5)
    tail = server.log_tail()
    server.stop()
    raise ServeError(f"tritonserver not ready within {timeout_s:.0f} s (models not ready: "
                     f"{', '.join(pending) or 'server health'}); log {server.log_path}:\n{tail}")


def start_server(repo_dir: Path, *, argv: list[str] | None = None, env: dict | None = None,
                 http_port: int | None = None, grpc_port: int | None = None, metrics_port: int | None = None,
                 host: str = DEFAULT_HOST, log_path: Path | None = None, exit_timeout_s: float = 5.0,
                 startup_timeout_s: float = 180.0, wait: bool = True, cpu_plan: CpuPlan | None = None,
                 cpu_note: str = "", engine_process: str | None = None) -> RunningServer:
    """Start a server on ``repo_dir`` (the CPU tritonserver unless ``argv`` is given) and wait
    until it and every model in the repository are ready. ``cpu_plan``: the server runs on its
    ``other_cpus`` and the engine models learn theirs from the environment
    (:mod:`pipeline.cpu_pinning`); ``cpu_note`` says in the log why there is none.
    ``engine_process``: where the reference engines run (``reference.engine_process``). The
    server ends with this process at the latest (:mod:`pipeline.processes`)."""
    repo_dir = Path(repo_dir).resolve()
    if not repo_dir.is_dir():
        raise ServeError(f"no model repository at {repo_dir}: run `specdeploy render` first")
    picked = iter(free_ports(3, host))
    ports = Ports(http_port or next(picked), grpc_port or next(picked), metrics_port or next(picked))
    if len({ports.http, ports.grpc, ports.metrics}) != 3:
        raise ServeError(f"http, grpc and metrics ports must differ, got {ports}")
    log_path = Path(log_path or repo_dir.parent / f"serve-{repo_dir.name}.log")
    check_no_stale_server(repo_dir, ports, host, log_path.with_suffix(".pid"))
    if argv is None:
        server = prepare_cpu_server()
        argv = cpu_server_argv(server, repo_dir, ports, host, exit_timeout_s)
        env = cpu_server_env(server, env)
    extra = {**(cpu_plan.env() if cpu_plan is not None else {}),
             **({ENGINE_PROCESS_ENV: engine_process} if engine_process is not None else {})}
    if extra:
        env = {**(os.environ if env is None else env), **extra}
    pinning = cpu_plan.describe() if cpu_plan is not None else f"none ({cpu_note or 'not asked for'})"
    process = _launch(argv, env, log_path, f"# cpu pinning: {pinning}\n", cpu_plan, exit_timeout_s)
    running = RunningServer(process, host, ports, log_path, repo_dir, exit_timeout_s, cpu_plan)
    running.pid_file.write_text(f"{running.pid}\n")
    if wait:
        try:
            wait_ready(running, repository_models(repo_dir), startup_timeout_s)
        except BaseException:
            running.stop()
            raise
        running.family()  # remember the stubs and workers: stop() finds them even once orphaned
    return running


def _launch(argv: list[str], env: dict | None, log_path: Path, header: str, cpu_plan: CpuPlan | None,
            exit_timeout_s: float) -> OwnedProcess:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        log.write((header + "$ " + shlex.join(argv) + "\n").encode())
        log.flush()
        try:
            with spawn_on(cpu_plan.other_cpus if cpu_plan is not None else None):
                # if this process dies, the keeper gives the server its exit timeout, then SIGKILL
                return spawn(argv, env=env, cwd=str(PROJECT_ROOT), stdout=log, stderr=subprocess.STDOUT,
                             grace_s=exit_timeout_s + OWNER_GONE_GRACE_S)
        except OSError as exc:
            raise ServeError(f"cannot start {argv[0]}: {exc}") from None


# ----------------------------------------------------------------------------------------------
# Deployment-level entry points


def _arm_placement(cfg: DeploymentConfig, variant: str) -> ArmPlacement:
    from pipeline.render import rendered_placement  # noqa: PLC0415

    data = rendered_placement(cfg, variant)
    if data is None:
        raise ServeError(f"the {variant} repository was rendered without a GPU placement: re-run `specdeploy render`")
    return ArmPlacement.from_dict(data)


def check_host_gpus(cfg: DeploymentConfig, placement: ArmPlacement, gpus: list[GpuInfo] | None) -> None:
    """The GPUs the repository was rendered for exist here, with the memory of the profile."""
    if gpus is None:
        return  # no nvidia-smi here: the docker line is printed instead
    listed = {g.index: g for g in gpus}
    missing = [g for g in placement.gpus if g not in listed]
    if missing:
        raise ServeError(f"the {placement.arm} arm was rendered for GPUs {list(placement.gpus)} but nvidia-smi lists "
                         f"{sorted(listed)}: set triton.gpus or re-run `specdeploy render` on this host")
    want = get_profile(cfg.hardware).memory_gib or 0
    small = [g for g in placement.gpus if listed[g].memory_mib / 1024 < 0.95 * want]
    if small:
        raise ServeError(f"hardware: {cfg.hardware} has {want:.0f} GiB per GPU but GPU(s) {small} report "
                         f"{listed[small[0]].memory_mib / 1024:.0f} GiB: set hardware to this host's GPU")


def _deployment_launch(cfg: DeploymentConfig, variant: str, repo: Path, ports: Ports,
                       host: str) -> tuple[list[str] | None, dict | None]:
    """argv/env for the deployment's backend (None → the CPU server)."""
    if cfg.backend == "reference":
        return None, None
    from pipeline.render import load_manifest  # noqa: PLC0415

    check_trtllm_version(load_manifest(cfg), installed_trtllm_version())
    placement = _arm_placement(cfg, variant)
    gpus = query_gpus()
    check_host_gpus(cfg, placement, gpus)
    gpu_count = len(gpus) if gpus else max(placement.gpus) + 1
    argv = gpu_server_argv(repo.resolve(), ports, placement.launch, placement.world_size, host,
                           cfg.triton.exit_timeout_s, gpu_count=gpu_count)
    env = gpu_server_env(placement)
    if shutil.which("tritonserver") is None:
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        raise ServeError(
            "tritonserver is not installed here; run the deployment inside the TensorRT-LLM container:\n"
            + shlex.join(docker_argv(cfg, argv, repository_paths(repo), changed))
        )
    if argv[0] == "mpirun" and shutil.which("mpirun") is None:
        raise ServeError(f"the {placement.launch} launch ({variant}) needs mpirun, which is not on PATH")
    return argv, env


def _check_repo(cfg: DeploymentConfig, variant: str) -> Path:
    from pipeline.render import check_rendered  # noqa: PLC0415

    return check_rendered(cfg, variant)


def start_deployment(cfg: DeploymentConfig, variant: str, *, http_port: int | None = None,
                     grpc_port: int | None = None, metrics_port: int | None = None,
                     host: str | None = None) -> RunningServer:
    """Start the server for one arm. Ports left as None are picked free; ``host`` (default
    ``triton.host``) is the address it binds."""
    repo = _check_repo(cfg, variant)
    if cfg.uses_llm_api:
        launcher = repo.with_name(f"{variant}.launch.sh").absolute()
        raise ServeError(f"serving the LLM-API runtime's llmapi repository is not wired into `specdeploy serve` / "
                         f"`loadtest` yet: start it with {launcher} (or trtllm-serve: "
                         f"{(repo.parent.parent / 'trtllm-serve' / variant / 'launch.sh').absolute()}), see docs/gpu-llmapi.md")
    host = host or cfg.triton.host
    picked = iter(free_ports(3, host))
    ports = Ports(http_port or next(picked), grpc_port or next(picked), metrics_port or next(picked))
    argv, env = _deployment_launch(cfg, variant, repo, ports, host)
    plan, note = deployment_cpu_plan(cfg, repo)
    return start_server(
        repo, argv=argv, env=env, http_port=ports.http, grpc_port=ports.grpc, metrics_port=ports.metrics,
        host=host, log_path=(logs_dir(cfg) / f"serve-{variant}.log").resolve(),
        exit_timeout_s=cfg.triton.exit_timeout_s, startup_timeout_s=cfg.triton.startup_timeout_s,
        cpu_plan=plan, cpu_note=note,
        engine_process=cfg.reference.engine_process if cfg.backend == "reference" else None,
    )


def deployment_cpu_plan(cfg: DeploymentConfig, repo: Path) -> tuple[CpuPlan | None, str]:
    """The CPU pinning for one arm of a reference deployment (GPU engines: none); the arm with the
    most engine models decides whether both are pinned."""
    if cfg.backend != "reference":
        return None, "GPU backend"
    from pipeline.render import drafts_in_engine  # noqa: PLC0415

    most = 2 if cfg.method == "draft_target" and not drafts_in_engine(cfg) else 1  # BLS: draft + target
    try:
        return plan_pinning(cfg.reference.cpu_pinning, repository_models(repo), cfg.reference.threads,
                            allowed_cpus(), most)
    except ValueError as exc:
        raise ServeError(str(exc)) from None


@contextlib.contextmanager
def serve_deployment(cfg: DeploymentConfig, variant: str, *, http_port: int | None = None,
                     grpc_port: int | None = None, metrics_port: int | None = None) -> Iterator[RunningServer]:
    """``with serve_deployment(cfg, "speculative") as server: ...`` — started, ready, stopped."""
    server = start_deployment(cfg, variant, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port)
    try:
        yield server
    finally:
        server.stop()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator:
    """SIGINT, SIGTERM and SIGHUP stop the server whatever this process inherited: a background
    job of a shell script starts with SIGINT ignored, and Python then never raises
    KeyboardInterrupt. Until ``started()`` is called a signal interrupts the start
    (KeyboardInterrupt: ``start_server`` stops what it began); after, it only sets ``stop``, so
    a second Ctrl-C cannot cut the clean stop short."""
    state = {"started": False}

    def handler(signum, frame):
        if not state["started"]:
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield lambda: state.update(started=True)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_foreground(cfg: DeploymentConfig, variant: str, *, http_port: int | None = None,
                     grpc_port: int | None = None, metrics_port: int | None = None, out=sys.stdout,
                     host: str | None = None) -> int:
    """Run until Ctrl-C / SIGTERM / SIGHUP or until the server dies; stop it cleanly either way."""
    stop = threading.Event()
    with _stop_on_signals(stop) as started:
        server = start_deployment(
            cfg, variant,
            http_port=http_port or cfg.triton.http_port, grpc_port=grpc_port or cfg.triton.grpc_port,
            metrics_port=metrics_port or cfg.triton.metrics_port, host=host,
        )
        started()
        print(f"serving {cfg.name} ({variant}) pid {server.pid}\n  HTTP    {server.http_url}\n"
              f"  gRPC    {server.grpc_url}\n  metrics {server.metrics_url}\n  log     {server.log_path}\n"
              f"  cpus    {server.cpu_plan.describe() if server.cpu_plan else 'not pinned (the log says why)'}\n"
              "Ctrl-C stops it.", file=out, flush=True)
        try:
            while server.alive() and not stop.wait(0.5):
                pass
            if not stop.is_set():
                raise ServeError(f"tritonserver exited with status {server.exit_status()}; log {server.log_path}:\n"
                                 f"{server.log_tail()}")
            return 0
        finally:
            server.stop()
            print("server stopped", file=out, flush=True)
