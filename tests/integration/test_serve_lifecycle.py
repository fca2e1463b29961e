"""Server lifecycle on a real tritonserver: the `serve_deployment` context manager (EAGLE
deployment with the engine inside the stub, one greedy request equal to the reference) and `specdeploy serve --foreground`
stopped with Ctrl-C; neither leaves the server or a Python-backend stub behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import tiny_deploy
from conftest import MAX_TOKENS, PROMPTS, in_dir
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
    from pipeline.render import render
    from pipeline.serve import serve_deployment

    # the engine inside the stub (reference.engine_process: stub); every other served test runs
    # the default, a worker process per engine model
    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "eagle", reference={"engine_process": "stub"})
    with in_dir(serving_workdir):
        cfg = load_config(cfg_path)
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


def test_cli_serve_foreground_ctrl_c(serving_workdir, dt_cfg):
    from pipeline.serve import free_ports

    http, grpc, metrics = free_ports(3)
    cfg_path = serving_workdir / f"{dt_cfg.name}.yaml"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", str(cfg_path), "--variant", "baseline", "--foreground",
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        cwd=serving_workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    lines = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops it" in line:
            break
    text = "".join(lines)
    assert "Ctrl-C stops it" in text, text
    pid = int(re.search(r"pid (\d+)", text).group(1))
    family = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    assert any("pipeline.reference.worker" in psutil.Process(p).cmdline() for p in family)  # stopped with the rest
    status, body = http_generate(f"http://127.0.0.1:{http}", "ensemble", {"text_input": "hi", "max_tokens": 2})
    assert status == 200
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text + rest
    assert "server stopped" in rest
    assert _alive(family) == []
