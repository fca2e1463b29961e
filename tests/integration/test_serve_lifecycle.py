"""Server lifecycle on a real tritonserver: the `serve_deployment` context manager (EAGLE
deployment with the engine inside the stub, one greedy request equal to the reference) and
`specdeploy serve --foreground` stopped with Ctrl-C (SIGINT), with SIGINT and SIGTERM although it
started with them ignored, and killed with SIGKILL: none leaves the server, a Python-backend stub
or an engine worker behind, nor a port held. Ctrl-C is checked on the start with SIGINT ignored:
``serve`` installs the same stop handler whatever disposition it inherited, so one start proves
both. A server nobody owns and a busy port are named at start-up."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

import tiny_deploy
from conftest import MAX_TOKENS, PROMPTS
from tests.polling import wait_until
from triton_clients import http_generate

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_serve_deployment_context_manager_eagle(serving_workdir, tiny_models, reference_outputs):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import serve_deployment

    # the engine inside the stub (reference.engine_process: stub); every other served test runs
    # the default, a worker process per engine model
    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "eagle", reference={"engine_process": "stub"})
    cfg = load_config(cfg_path, serving_workdir)
    render(cfg)
    with serve_deployment(cfg, "speculative") as server:
        assert server.alive()
        family = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
        assert len(family) >= 5  # the server + one stub per Python model instance
        assert not [p for p in family if "pipeline.reference.worker" in psutil.Process(p).cmdline()]
        status, body = http_generate(server.http_url, "ensemble",
                                     {"text_input": PROMPTS[0], "max_tokens": MAX_TOKENS, "top_k": 1,
                                      "return_perf_metrics": True})
        assert status == 200 and body["text_output"] == reference_outputs[PROMPTS[0]]["text"]
        assert body["total_draft_tokens"] > 0
        assert server.log_path.is_file() and "tensorrt_llm" in server.log_tail(200)
    assert not server.alive()
    assert _alive(family) == []


@pytest.fixture(scope="module")
def lean_cfg(serving_workdir, tiny_models):
    """The draft-target deployment with one BLS instance (the shared ``dt_cfg`` renders one per
    batch slot, four stubs): these tests stop and kill a server, they send at most one request,
    so three more stubs to start and stop would only cost time."""
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name="tiny-lifecycle",
                                           triton={"bls_instance_count": 1})
    cfg = load_config(cfg_path, serving_workdir)
    render(cfg)
    return cfg


class ForegroundServe:
    """``specdeploy serve CONFIG --variant baseline --foreground`` in a subprocess, its output read
    by a thread (a wait for a line never blocks past its deadline)."""

    def __init__(self, workdir, cfg, preexec_fn=None):
        from pipeline.infra.processes import free_ports

        self.ports = free_ports(3)
        http, grpc, metrics = self.ports
        self.http_url = f"http://127.0.0.1:{http}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", str(workdir / f"{cfg.name}.yaml"), "--variant", "baseline",
             "--foreground", "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
             "--workdir", str(workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONPATH": ROOT}, preexec_fn=preexec_fn,
        )
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()
        self.family: list[int] = []

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, needle: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"no {needle!r} from `specdeploy serve`:\n{self.text}")
            self.text += line
        return self.text

    def wait_serving(self) -> list[int]:
        """Until the server is up; returns (and remembers) every process it started."""
        self.wait_for("Ctrl-C stops it")
        self.family = [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        cmdlines = [" ".join(psutil.Process(p).cmdline()) for p in self.family]
        assert any("tritonserver" in c for c in cmdlines) and any("pipeline.reference.worker" in c for c in cmdlines)
        return self.family

    def rest(self, timeout: float = 120) -> str:
        self.proc.wait(timeout=timeout)
        while (line := self.lines.get(timeout=30)) is not None:
            self.text += line
        return self.text

    def cleanup(self) -> None:
        """Whatever happens in the test, leave nothing running (on the old code SIGKILL did)."""
        from pipeline.infra.processes import stop_processes

        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        stop_processes([psutil.Process(p) for p in _alive(self.family)], 5)


def wait_gone(pids, ports, timeout: float = 120) -> float:
    """Poll until none of ``pids`` runs and every port is free; the seconds it took."""
    from pipeline.infra.processes import port_in_use

    started = time.monotonic()
    wait_until(lambda: not _alive(pids) and not any(port_in_use(p) for p in ports), "the processes gone, the ports free",
               timeout, interval=0.1,
               detail=lambda: f"still running: {[' '.join(psutil.Process(p).cmdline())[:120] for p in _alive(pids)]}; "
                              f"ports in use: {[p for p in ports if port_in_use(p)]}")
    return time.monotonic() - started


def _ignore_stop_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serve_foreground_stops_on_a_signal_it_was_started_ignoring(serving_workdir, lean_cfg, sig):
    """A background job of a shell script starts with SIGINT ignored (we ignore SIGTERM too);
    `serve --foreground` must still stop cleanly on either. The SIGINT case is Ctrl-C too (it
    was a test of its own, started with SIGINT not ignored): ``serve`` installs its one stop
    handler for SIGINT whatever it inherited (pipeline/serve/server.py, ``STOP_SIGNALS``), so a
    plain start runs the same path, and a server of its own only cost another start."""
    serve = ForegroundServe(serving_workdir, lean_cfg, preexec_fn=_ignore_stop_signals)
    try:
        family = serve.wait_serving()
        status, body = http_generate(serve.http_url, "ensemble", {"text_input": "hi", "max_tokens": 2})
        assert status == 200, body
        serve.proc.send_signal(sig)
        text = serve.rest()
        assert serve.proc.returncode == 0 and "server stopped" in text, text
        if sig == signal.SIGINT:  # Ctrl-C: everything is gone by the time `serve` returns
            assert _alive(family) == []
        wait_gone(family, serve.ports)
    finally:
        serve.cleanup()


def test_cli_serve_foreground_killed_leaves_nothing_behind(serving_workdir, lean_cfg):
    """SIGKILL (a CI timeout, the OOM killer): tritonserver, every stub and the engine worker end
    within seconds and the ports are free."""
    serve = ForegroundServe(serving_workdir, lean_cfg)
    try:
        family = serve.wait_serving()
        serve.proc.kill()
        serve.proc.wait()
        seconds = wait_gone(family, serve.ports)
        print(f"{len(family)} processes gone {seconds:.1f} s after SIGKILL")
    finally:
        serve.cleanup()


def test_a_server_nobody_owns_and_a_busy_port_are_named(tmp_path):
    """A tritonserver of ours left running without an owner (as the old code left them), and a
    port someone else holds: the start fails naming the process and how to stop it."""
    from pipeline.errors import ServeError
    from pipeline.infra.processes import free_ports, port_in_use
    from pipeline.serve.command import Ports, cpu_server_argv, cpu_server_env, prepare_cpu_server
    from pipeline.serve.server import start_server

    repo = tmp_path / "repo"
    repo.mkdir()  # an empty repository: a server with no models starts in a second
    ports = Ports(*free_ports(3))
    cpu = prepare_cpu_server()
    stale = subprocess.Popen(cpu_server_argv(cpu, repo, ports), env=cpu_server_env(cpu), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            assert stale.poll() is None, "the stale server exited"
            return port_in_use(ports.http)

        wait_until(listening, "the stale server listens", 120, interval=0.1)
        with pytest.raises(ServeError) as info:
            start_server(repo, startup_timeout_s=60).stop()  # stopped, should it start after all
        message = str(info.value)
        assert f"still serves {repo.resolve()} and nothing owns it any more: pid {stale.pid} (" in message
        assert f"stop it with `kill -TERM -- -{stale.pid}`" in message
        other = tmp_path / "other"
        other.mkdir()
        with pytest.raises(ServeError, match=rf"http port {ports.http} is held by a tritonserver: pid {stale.pid} "):
            start_server(other, http_port=ports.http, startup_timeout_s=60).stop()  # another repository, the same port
    finally:
        stale.terminate()
        stale.wait(timeout=60)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports.grpc))
        listener.listen()
        with pytest.raises(ServeError, match=rf"grpc port {ports.grpc} is held by another process: pid {os.getpid()} "):
            start_server(repo, grpc_port=ports.grpc, startup_timeout_s=60).stop()
