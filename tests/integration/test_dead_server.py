"""Nothing of a server outlives it, whoever kills what, on a real tritonserver hosting two CPU
engines (draft-target drafting in the engine: ``tensorrt_llm`` and ``tensorrt_llm_draft`` each in a
Python-backend stub with an engine worker):

- SIGKILL to the process keeper and tritonserver together (a supervisor, ``kill -9`` on a process
  list): every stub, engine worker and guard ends by itself and the ports are free;
- SIGKILL to tritonserver alone, under ``specdeploy serve --foreground``: the same, and ``serve``
  says the server died, how (the signal) and shows the log's last lines;
- SIGKILL to one engine worker, then to one engine stub: the model restarts its worker, the
  stub's worker ends with the stub, and once the server is stopped as ``serve`` says (``kill -TERM
  -- -PGID``) nothing is left.

Every wait polls with a bound (no fixed sleeps); the bound is far above what it takes. Each test
kills its own server (three terminal events, three servers); the deployment has one BLS instance
(``lean_dt_engine_cfg``), not one per batch slot: the claims are about the engine models' stubs
and workers, and three more BLS stubs of the same kind only cost start-up time."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import tiny_deploy
from tests.polling import wait_until

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = "pipeline.reference.worker"
BOUND_S = 60.0  # a stub left behind stayed for minutes; a clean exit takes a few seconds


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            pass
    return out


def cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def wait_gone(procs: list[psutil.Process], ports: list[int], bound_s: float = BOUND_S) -> float:
    """Poll until none of ``procs`` runs and no port is bound; the seconds it took."""
    from pipeline.infra.processes import port_in_use

    started = time.monotonic()
    wait_until(lambda: not running(procs) and not any(port_in_use(p) for p in ports), "the processes gone, the ports free",
               bound_s, interval=0.1, detail=lambda: f"still running: {[cmdline(p)[:160] for p in running(procs)]}; "
                                                     f"ports bound: {[p for p in ports if port_in_use(p)]}")
    return time.monotonic() - started


def engine_stub(server_pid: int) -> psutil.Process:
    """The stub hosting the ``tensorrt_llm`` engine (its worker's parent)."""
    for proc in psutil.Process(server_pid).children(recursive=True):
        parent = proc.parent()
        if WORKER in cmdline(proc) and parent is not None and "/tensorrt_llm/1/model.py" in cmdline(parent):
            return parent
    pytest.fail("no stub with an engine worker under the server")


def family(server_pid: int) -> list[psutil.Process]:
    members = [psutil.Process(server_pid), *psutil.Process(server_pid).children(recursive=True)]
    workers = [p for p in members if WORKER in cmdline(p)]
    assert len(workers) == 2, [cmdline(p)[:120] for p in members]  # tensorrt_llm and tensorrt_llm_draft
    return members


@pytest.fixture(scope="module")
def lean_dt_engine_cfg(serving_workdir, tiny_models):
    """Draft-target drafting in the engine (``dt_engine_cfg``'s layout: ``tensorrt_llm`` and
    ``tensorrt_llm_draft`` with an engine worker each) with one BLS instance instead of four."""
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name="tiny-dead-server",
                                           orchestration="engine", triton={"bls_instance_count": 1})
    cfg = load_config(cfg_path, serving_workdir)
    render(cfg)
    return cfg


def test_keeper_and_server_killed_together_leave_nothing(lean_dt_engine_cfg):
    from pipeline.serve.server import start_deployment

    server = start_deployment(lean_dt_engine_cfg, "speculative")
    members = []
    try:
        members = [psutil.Process(server.process.keeper.pid), *family(server.pid)]
        for proc in members[:2]:  # the keeper, then tritonserver
            proc.send_signal(signal.SIGKILL)
        seconds = wait_gone(members, [server.ports.http, server.ports.grpc, server.ports.metrics])
        print(f"{len(members)} processes gone {seconds:.1f} s after SIGKILL of the keeper and tritonserver")
    finally:
        server.stop()


class ForegroundServe:
    """``specdeploy serve CONFIG --variant speculative --foreground``, its output read by a thread."""

    def __init__(self, workdir, cfg):
        from pipeline.infra.processes import free_ports

        self.ports = free_ports(3)
        http, grpc, metrics = self.ports
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", str(workdir / f"{cfg.name}.yaml"), "--variant", "speculative",
             "--foreground", "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
             "--workdir", str(workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": ROOT})
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, needle: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"no {needle!r} from `specdeploy serve`:\n{self.text}")
            self.text += line

    def rest(self, timeout: float = 120) -> str:
        self.proc.wait(timeout=timeout)
        while (line := self.lines.get(timeout=30)) is not None:
            self.text += line
        return self.text


def test_server_killed_alone_leaves_nothing_and_serve_says_how_it_died(serving_workdir, lean_dt_engine_cfg):
    from pipeline.infra.processes import stop_processes

    serve = ForegroundServe(serving_workdir, lean_dt_engine_cfg)
    members: list[psutil.Process] = []
    try:
        serve.wait_for("Ctrl-C stops it")
        server = next(p for p in psutil.Process(serve.proc.pid).children(recursive=True)
                      if os.path.basename(cmdline(p).split(" ")[0]) == "tritonserver")
        members = family(server.pid)
        server.send_signal(signal.SIGKILL)
        seconds = wait_gone(members, serve.ports)
        text = serve.rest()
        assert serve.proc.returncode != 0
        assert f"tritonserver (pid {server.pid}) died: killed by SIGKILL (signal 9)" in text, text
        assert "last lines:" in text and "tensorrt_llm" in text.split("last lines:")[1], text
        print(f"{len(members)} processes gone {seconds:.1f} s after SIGKILL of tritonserver")
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait()
        stop_processes(running(members), 5)


def test_a_killed_worker_and_a_killed_stub_leave_nothing_once_the_server_stops(lean_dt_engine_cfg):
    from pipeline.serve.server import start_deployment

    server = start_deployment(lean_dt_engine_cfg, "speculative")
    try:
        members = family(server.pid)
        stub = engine_stub(server.pid)
        worker = next(p for p in stub.children() if WORKER in cmdline(p))
        worker.send_signal(signal.SIGKILL)
        restarted = wait_until(  # the model starts another worker (after its back-off)
            lambda: [p for p in stub.children() if WORKER in cmdline(p) and p.pid != worker.pid],
            "the model restarted its engine worker", BOUND_S, interval=0.1)
        members += restarted
        stub.send_signal(signal.SIGKILL)
        wait_gone([stub, *restarted], [])  # the stub's worker ends with the stub
        assert server.alive()
        os.killpg(server.pid, signal.SIGTERM)  # what `specdeploy serve` says to run
        seconds = wait_gone(members, [server.ports.http, server.ports.grpc, server.ports.metrics])
        print(f"{len(members)} processes gone {seconds:.1f} s after the server was stopped")
    finally:
        server.stop()
