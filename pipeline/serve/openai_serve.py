"""Start the OpenAI-compatible frontend (:mod:`pipeline.serve.openai_frontend`) in front of a running arm.

Reads the config and the arm's deployment descriptor (its Triton model, extra inputs and the
tokenizer directory render took from the build manifest); writes the frontend's log to
``engines/NAME/logs/openai-<variant>.log``. The frontend runs under the process keeper
(:func:`pipeline.infra.processes.spawn`): it ends when its owner ends, however that ends.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.artefacts.deployment import load_arm
from pipeline.config import DeploymentConfig
from pipeline.errors import EXIT_USAGE, SpecdeployError
from pipeline.infra.processes import OwnedProcess, free_ports, spawn
from pipeline.paths import PROJECT_ROOT, logs_dir
from pipeline.serve.server import _stop_on_signals, start_deployment

STOP_S = 10.0


class FrontendError(SpecdeployError):
    """The OpenAI frontend did not come up."""


@dataclass
class RunningFrontend:
    proc: OwnedProcess
    host: str
    port: int
    model: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> None:
        self.proc.stop(STOP_S)

    def detach(self) -> None:
        self.proc.detach()


def frontend_argv(grpc_url: str, triton_model: str, served_name: str, tokenizer_dir: str | None,
                  extra_inputs: dict, host: str, port: int, default_max_tokens: int) -> list[str]:
    argv = [sys.executable, "-m", "pipeline.serve.openai_frontend", "--grpc-url", grpc_url, "--triton-model", triton_model,
            "--served-model-name", served_name, "--extra-inputs", json.dumps(extra_inputs),
            "--default-max-tokens", str(default_max_tokens), "--host", host, "--port", str(port)]
    return argv + (["--tokenizer", tokenizer_dir] if tokenizer_dir else [])


def start_frontend(cfg: DeploymentConfig, variant: str, grpc_url: str, *, port: int | None = None,
                   host: str | None = None, log_dir: Path | None = None, timeout_s: float = 120.0) -> RunningFrontend:
    """Start the frontend for arm ``variant`` of ``cfg`` (Triton at ``grpc_url``); return once
    ``/health`` answers 200 (the Triton model is ready through it)."""

    target = load_arm(cfg, variant)[1]  # what render recorded for the arm
    if cfg.llmapi_layout:  # the frontend speaks the ensemble's tensors, not the llmapi model's
        raise FrontendError("--frontend openai sends the ensemble's inputs; the llmapi layout's tensorrt_llm model "
                            "takes text_input / sampling_param_* (docs/reference-engine.md): serve it without "
                            "the frontend", exit_code=EXIT_USAGE)
    host = host or cfg.triton.host
    port = port or free_ports(1, host)[0]
    log_dir = log_dir or logs_dir(cfg)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"openai-{variant}.log"
    argv = frontend_argv(grpc_url, target.model_name, cfg.name, target.tokenizer_dir, target.extra_inputs, host, port,
                         cfg.loadtest.max_tokens)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = spawn(argv, stdout=log, stderr=log, cwd=str(PROJECT_ROOT), grace_s=STOP_S)
    frontend = RunningFrontend(proc, host, port, cfg.name, log_path)
    try:
        _wait_healthy(frontend, timeout_s)
    except BaseException:
        frontend.stop()
        raise
    return frontend


def _wait_healthy(frontend: RunningFrontend, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not frontend.alive():
            tail = frontend.log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise FrontendError(f"the OpenAI frontend exited; log {frontend.log_path}:\n{tail}")
        try:
            with urllib.request.urlopen(frontend.url + "/health", timeout=5) as resp:  # noqa: S310 - a loopback http URL
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise FrontendError(f"the OpenAI frontend at {frontend.url} was not healthy within {timeout_s:.0f}s "
                        f"(log {frontend.log_path})")


def serve_with_frontend(cfg: DeploymentConfig, variant: str, *, ports: dict, host: str | None, foreground: bool,
                        openai_port: int | None, out=sys.stdout) -> int:
    """``serve --frontend openai``: Triton as ``serve`` starts it, then the frontend in front of it.
    In the foreground both stop on Ctrl-C / SIGTERM / SIGHUP or when either dies; otherwise both
    are left running, detached, and the stop command is printed."""


    stop = threading.Event()
    with _stop_on_signals(stop) as started:
        server = start_deployment(cfg, variant, host=host, **ports)
        try:
            frontend = start_frontend(cfg, variant, server.grpc_url, port=openai_port or cfg.triton.http_port + 10,
                                      host=host, log_dir=server.log_path.parent)
        except BaseException:
            server.stop()
            raise
        started()
        print(f"serving {cfg.name} ({variant})\n  OpenAI  {frontend.url}/v1  (model '{frontend.model}')\n"
              f"  gRPC    {server.grpc_url}\n  log     {frontend.log_path}", file=out, flush=True)
        if not foreground:
            server.detach()
            frontend.detach()
            print(f"stop with: kill -TERM -- -{frontend.proc.pid} -{server.pid}", file=out, flush=True)
            return 0
        try:
            while server.alive() and frontend.alive() and not stop.wait(0.5):
                pass
            if not stop.is_set():
                raise FrontendError(f"{'tritonserver' if not server.alive() else 'the OpenAI frontend'} exited; "
                                    f"logs {server.log_path}, {frontend.log_path}")
            return 0
        finally:
            frontend.stop()
            server.stop()
            print("stopped", file=out, flush=True)
