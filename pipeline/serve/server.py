"""`specdeploy serve`: start ``tritonserver`` on a rendered repository and stop it cleanly.

Reads ``engines/NAME/model_repo/<variant>/`` and its deployment descriptor
``<variant>.render.json`` (both from ``specdeploy render``: config hash, placement, engine models,
the TensorRT-LLM version of the build); writes the server log to ``engines/NAME/logs/serve-<variant>.log``.

The command line and environment come from :mod:`pipeline.serve.command` (CPU: the
``nvidia-pytriton`` wheel's binary; GPU: the NGC container, one server, leader mode or orchestrator
mode, or the exact ``docker run`` line when ``tritonserver`` is absent). With
``reference.cpu_pinning`` the server runs on the CPUs the engines do not own and each engine's
decode thread on its own (:mod:`pipeline.infra.cpu_pinning`; the plan is the log's first line).
A GPU deployment is launched as the arm placement that ``render`` recorded says
(``pipeline.plan.gpu_layout``); the GPUs ``nvidia-smi`` lists must include the rendered ones.
The arm's facts (config hash, placement, engine models, the TensorRT-LLM version of the build)
come from its deployment descriptor, written by ``render``.

The server runs in its own session under a keeper (:mod:`pipeline.infra.processes`): it, its
Python-backend stubs and the engine workers end when the ``specdeploy`` process that started them
ends, however it ends. Before starting, a server of ours that nothing owns any more (found by its
``--model-repository``, or through the pid file ``logs/serve-<variant>.pid``) and a busy port are
named in the error, with how to stop the process. :meth:`RunningServer.stop` stops the whole tree
(:func:`pipeline.infra.processes.stop_tree`: SIGTERM, the exit timeout plus a grace period — the
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
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil

from pipeline.artefacts.deployment import ArmDeployment, load_arm
from pipeline.config import DeploymentConfig
from pipeline.errors import EXIT_USAGE, ServeError, UsageError
from pipeline.facts.hardware import get_profile
from pipeline.infra.cpu_pinning import CpuPlan, allowed_cpus, plan_pinning, spawn_on
from pipeline.infra.processes import OwnedProcess, free_ports, port_holder, port_in_use, spawn
from pipeline.infra.readiness import models_not_ready
from pipeline.paths import PROJECT_ROOT, logs_dir, served_repository_problem
from pipeline.plan.gpu_layout import ArmPlacement, GpuInfo, query_gpus
from pipeline.reference.api import ENGINE_PROCESS_ENV
from pipeline.serve.command import (
    DEFAULT_HOST,
    Ports,
    check_trtllm_version,
    cpu_server_argv,
    cpu_server_env,
    docker_argv,
    gpu_server_argv,
    gpu_server_env,
    installed_trtllm_version,
    prepare_cpu_server,
    repository_paths,
)
from pipeline.serve.llmapi_launch import llmapi_launch
from pipeline.serve.server_log import failure_report
from pipeline.serve.stale_server import check_no_stale_server

KILL_GRACE_S = 10.0
OWNER_GONE_GRACE_S = 2.0  # when specdeploy is gone nobody waits for results: stop soon after the exit timeout
PORT_ATTEMPTS = 3  # starts on freshly picked ports when others took the picked ones during model loading


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

    def listens_on(self, port: int) -> bool:
        """This server's own process (or one it started) listens on ``port``. tritonserver binds its
        ports only after loading every model, so until then the port is free for anyone: another
        server that took it would answer the readiness poll for models of the same names."""
        holder = port_holder(port)
        if holder is None:
            return False
        with contextlib.suppress(psutil.Error):
            return holder.pid in {proc.pid for proc in self.process.descendants()}
        return False

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

    def log_report(self, n: int = 40) -> str:
        """The log's first errors (a model's load failure is logged long before the tail), then
        its last ``n`` lines (:func:`pipeline.serve.server_log.failure_report`)."""
        try:
            return failure_report(self.log_path.read_text(errors="replace"), n)
        except OSError:
            return ""

    def family(self) -> list[int]:
        """The server and every descendant seen so far that still runs (stubs, engine workers)."""
        return sorted({self.pid, *(p.pid for p in self.process.descendants())})

    def stop(self, timeout: float | None = None) -> None:
        """Stop the server's whole tree: SIGTERM, wait ``timeout``, SIGKILL what is left."""
        self.process.stop(self.exit_timeout_s + KILL_GRACE_S if timeout is None else timeout)
        with contextlib.suppress(OSError, ValueError):
            if int(self.pid_file.read_text().split()[0]) == self.pid:
                self.pid_file.unlink()

    def detach(self) -> None:
        """Let the server outlive this process (``specdeploy serve`` without ``--foreground``)."""
        self.process.detach()


def death(status: int | None) -> str:
    """How the server ended, from its keeper's status (the server's own: the same exit code, or
    killed by the same signal; a keeper killed with the server ends the same way)."""
    if status is None:
        return "ended (its status is not known yet)"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name} (signal {-status})"
    return f"exited with status {status}"


def repository_models(repo: Path) -> list[str]:
    return sorted(p.parent.name for p in Path(repo).glob("*/config.pbtxt"))


class ServerDiedError(ServeError):
    """The server exited while starting (not: it was still loading at the timeout). Only this
    start is tried again on new ports: a slow start would otherwise cost the timeout once per try."""


def wait_ready(server: RunningServer, models: list[str], timeout_s: float, own_ports: bool = False) -> None:
    """Poll until every model is ready. ``own_ports``: ask only once the server's own process
    listens on its HTTP port (:meth:`RunningServer.listens_on`; the local tritonserver, whose
    process tree holds its sockets, unlike a container's)."""
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerDiedError(f"tritonserver {death(server.exit_status())} while starting; "
                             f"log {server.log_path}:\n{server.log_report()}")
        if own_ports and not server.listens_on(server.ports.http):
            time.sleep(0.5)
            continue
        pending = models_not_ready(server.http_url, pending)
        if not pending:
            return
        time.sleep(0.5)
    tail = server.log_report()
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
    (:mod:`pipeline.infra.cpu_pinning`); ``cpu_note`` says in the log why there is none.
    ``engine_process``: where the reference engines run (``reference.engine_process``). The
    server ends with this process at the latest (:mod:`pipeline.infra.processes`)."""
    repo_dir = Path(repo_dir).resolve()
    if not repo_dir.is_dir():
        raise ServeError(f"no model repository at {repo_dir}: run `specdeploy render` first", exit_code=EXIT_USAGE)
    problem = served_repository_problem(repo_dir)
    if problem:  # refused now, not after the startup timeout
        raise UsageError(problem)
    picked_all = not (http_port or grpc_port or metrics_port)
    log_path = Path(log_path or repo_dir.parent / f"serve-{repo_dir.name}.log")
    own_server = argv is None
    if own_server:
        server = prepare_cpu_server()
        env = cpu_server_env(server, env)
    extra = {**(cpu_plan.env() if cpu_plan is not None else {}),
             **({ENGINE_PROCESS_ENV: engine_process} if engine_process is not None else {})}
    if extra:
        env = {**(os.environ if env is None else env), **extra}
    pinning = cpu_plan.describe() if cpu_plan is not None else f"none ({cpu_note or 'not asked for'})"
    header = f"# cpu pinning: {pinning}\n"
    attempts = ""  # the earlier attempts' notes and logs, each written once, after the header
    for attempt in range(1, (PORT_ATTEMPTS if picked_all and own_server else 1) + 1):
        picked = iter(free_ports(3, host))
        ports = Ports(http_port or next(picked), grpc_port or next(picked), metrics_port or next(picked))
        if len({ports.http, ports.grpc, ports.metrics}) != 3:
            raise ServeError(f"http, grpc and metrics ports must differ, got {ports}", exit_code=EXIT_USAGE)
        check_no_stale_server(repo_dir, ports, host, log_path.with_suffix(".pid"))
        if own_server:
            argv = cpu_server_argv(server, repo_dir, ports, host, exit_timeout_s)
        process = _launch(argv, env, log_path, header + attempts, cpu_plan, exit_timeout_s)
        running = RunningServer(process, host, ports, log_path, repo_dir, exit_timeout_s, cpu_plan)
        running.pid_file.write_text(f"{running.pid}\n")
        if not wait:
            return running
        try:
            wait_ready(running, repository_models(repo_dir), startup_timeout_s, own_ports=own_server)
        except ServerDiedError as exc:
            running.stop()
            taken = [port for port in (ports.http, ports.grpc, ports.metrics) if port_in_use(port, host)]
            if not (taken and attempt < PORT_ATTEMPTS and picked_all and own_server):
                raise
            # the ports were free when picked; another process took them while the models loaded
            # (tritonserver binds last): start again on new ones, this attempt's log kept above
            earlier = ""
            with contextlib.suppress(OSError):
                earlier = log_path.read_text(errors="replace").removeprefix(header + attempts)
            attempts += (f"# attempt {attempt}: port(s) {taken} were taken by another process while the models "
                         f"loaded; started again on new ports. Its log:\n{earlier}# end of attempt {attempt}\n")
            print(f"specdeploy: tritonserver could not bind port(s) {taken}, taken by another process while its "
                  f"models loaded ({str(exc).splitlines()[0].split('; log ')[0]}): starting again on new ports",
                  file=sys.stderr)
            continue
        except BaseException:
            running.stop()
            raise
        running.family()  # remember the stubs and workers: stop() finds them even once orphaned
        return running
    raise AssertionError("unreachable: the last attempt returns or raises")


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


def _arm_placement(deployment: ArmDeployment) -> ArmPlacement:
    if deployment.placement is None:
        raise ServeError(f"the {deployment.arm} repository was rendered without a GPU placement: "
                         "re-run `specdeploy render`")
    return ArmPlacement.from_dict(deployment.placement)


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


def _deployment_launch(cfg: DeploymentConfig, deployment: ArmDeployment, repo: Path, ports: Ports,
                       host: str) -> tuple[list[str] | None, dict | None]:
    """argv/env for the deployment's backend (None → the CPU server)."""
    if cfg.backend == "reference":
        return None, None
    check_trtllm_version({"trtllm_version": deployment.trtllm_version}, installed_trtllm_version())
    variant = deployment.arm
    placement = _arm_placement(deployment)
    gpus = query_gpus()
    check_host_gpus(cfg, placement, gpus)
    if deployment.contract == "llmapi":  # the LLM-API runtime: one tritonserver, upstream's Python model
        return llmapi_launch(cfg, repo, placement, ports, host)
    gpu_count = len(gpus) if gpus else max(placement.gpus) + 1
    argv = gpu_server_argv(repo.resolve(), ports, placement.launch, placement.world_size, host,
                           cfg.triton.exit_timeout_s, gpu_count=gpu_count)
    env = gpu_server_env(placement)
    if shutil.which("tritonserver") is None:
        # The container does not inherit this shell: every variable the launch sets goes on the
        # line, also those the shell happens to hold already.
        launch_vars = gpu_server_env(placement, base={})
        raise ServeError(
            "tritonserver is not installed here; run the deployment inside the TensorRT-LLM container:\n"
            + shlex.join(docker_argv(cfg, argv, repository_paths(repo), launch_vars))
        )
    if argv[0] == "mpirun" and shutil.which("mpirun") is None:
        raise ServeError(f"the {placement.launch} launch ({variant}) needs mpirun, which is not on PATH")
    return argv, env


def start_deployment(cfg: DeploymentConfig, variant: str, *, http_port: int | None = None,
                     grpc_port: int | None = None, metrics_port: int | None = None,
                     host: str | None = None) -> RunningServer:
    """Start the server for one arm. Ports left as None are picked free; ``host`` (default
    ``triton.host``) is the address it binds."""
    repo, deployment = load_arm(cfg, variant)
    host = host or cfg.triton.host
    picked = iter(free_ports(3, host))
    ports = Ports(http_port or next(picked), grpc_port or next(picked), metrics_port or next(picked))
    argv, env = _deployment_launch(cfg, deployment, repo, ports, host)
    plan, note = deployment_cpu_plan(cfg, repo, deployment.engine_models)
    return start_server(
        repo, argv=argv, env=env, http_port=ports.http, grpc_port=ports.grpc, metrics_port=ports.metrics,
        host=host, log_path=(logs_dir(cfg) / f"serve-{variant}.log").resolve(),
        exit_timeout_s=cfg.triton.exit_timeout_s, startup_timeout_s=cfg.triton.startup_timeout_s,
        cpu_plan=plan, cpu_note=note,
        engine_process=cfg.reference.engine_process if cfg.backend == "reference" else None,
    )


def deployment_cpu_plan(cfg: DeploymentConfig, repo: Path, most: int) -> tuple[CpuPlan | None, str]:
    """The CPU pinning for one arm of a reference deployment (GPU engines: none); ``most``: the
    engine models of the arm with the most (the descriptor's ``engine_models``) decide whether both
    arms are pinned."""
    if cfg.backend != "reference":
        return None, "GPU backend"
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
                status = server.exit_status()
                server.stop()  # whatever of its tree is left, before the message is read
                raise ServeError(f"tritonserver (pid {server.pid}) died: {death(status)}; its processes are stopped "
                                 f"and its ports free. Log {server.log_path}:\n{server.log_report()}")
            return 0
        finally:
            server.stop()
            print("server stopped", file=out, flush=True)
