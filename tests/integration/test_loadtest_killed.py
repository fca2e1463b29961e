"""`specdeploy loadtest` killed with SIGKILL mid-run (a CI timeout, the OOM killer): its
tritonserver, every Python-backend stub, the engine worker and the Locust master with its worker
processes all end within seconds, and the server's ports are free. Real server, real Locust."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

import tiny_deploy
from tests.polling import wait_until

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS = os.path.join(ROOT, "tests", "fixtures", "prompts_small.jsonl")


def running(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def cmdline(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def server_ports(pids) -> list[int]:
    flags = ("--http-port=", "--grpc-port=", "--metrics-port=")
    servers = [pid for pid in pids if os.path.basename(cmdline(pid).split(" ")[0]) == "tritonserver"]
    return [int(arg.split("=", 1)[1]) for pid in servers for arg in cmdline(pid).split() if arg.startswith(flags)]


def wait_for_locust_workers(proc: subprocess.Popen, workers: int, timeout: float = 300) -> list[int]:
    """Poll until Locust's master and ``workers`` worker processes run under ``proc``; every
    process ``proc`` started then."""
    def started() -> list[int] | None:
        assert proc.poll() is None, "loadtest ended before Locust started"
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        locusts = sum("locust" in cmdline(p) and "processes.py" not in cmdline(p) for p in family)
        return family if locusts >= 1 + workers else None

    return wait_until(started, "Locust runs with all its worker processes", timeout, interval=0.2)


def test_loadtest_killed_mid_run_leaves_nothing_behind(serving_workdir, tiny_models, tmp_path):
    from pipeline.infra.processes import port_in_use, stop_processes

    cfg_path = tiny_deploy.make_deployment(
        serving_workdir, tiny_models, "draft_target", name="tiny-loadtest-killed",
        loadtest={"processes": 2, "prompts": PROMPTS, "warmup_s": 0},
        triton={"bls_instance_count": 1})  # not one per batch slot: the run is killed, not measured
    from pipeline.config import load_config
    from pipeline.render.renderer import render

    render(load_config(cfg_path, serving_workdir))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "loadtest", str(cfg_path), "--arm", "baseline", "--concurrency", "2",
         "--duration", "120s", "--repeats", "1", "--no-progress", "--out", str(tmp_path / "run"), "--workdir", str(serving_workdir)],
        env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    family: list[int] = []
    try:
        family = wait_for_locust_workers(proc, workers=2)
        ports = server_ports(family)
        assert len(ports) == 3 and any("pipeline.reference.worker" in cmdline(p) for p in family)
        proc.kill()
        proc.wait()
        started, left = time.monotonic(), running(family)
        while left or any(port_in_use(p) for p in ports):
            if time.monotonic() - started > 120:
                pytest.fail(f"still running 120 s after SIGKILL: {[cmdline(p)[:100] for p in left]}")
            time.sleep(0.1)
            left = running(family)
        print(f"{len(family)} processes gone {time.monotonic() - started:.1f} s after SIGKILL")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_processes([psutil.Process(p) for p in running(family)], 5)  # on the old code they stayed
