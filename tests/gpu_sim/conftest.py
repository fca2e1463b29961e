"""Fixtures of the serve-side GPU-host simulation (``serve_tools``): a host with N simulated GPUs
(``nvidia-smi``, ``mpirun`` and ``tritonserver`` stand-ins first on PATH, a shared GPU-memory
ledger, a JSONL log of every command) and the shipped GPU configs with their checkpoints under the
test's directory instead of ``/models``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import serve_tools


@dataclass
class SimHost:
    root: Path
    bin_dir: Path
    log: Path

    def records(self, tool: str | None = None, event: str | None = None) -> list[dict]:
        return [r for r in serve_tools.read_log(self.log)
                if (tool is None or r["tool"] == tool) and (event is None or r.get("event") == event)]


@pytest.fixture()
def gpu_host(tmp_path, monkeypatch):
    """``gpu_host(count, mib)``: this test runs on a simulated GPU host in ``tmp_path/work``."""
    def make(count: int = 1, mib: int = 81559, name: str = "NVIDIA H100 80GB HBM3", tritonserver: bool = True) -> SimHost:
        bin_dir = serve_tools.install(tmp_path / "bin")
        if not tritonserver:
            (bin_dir / "tritonserver").unlink()
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("SIM_GPUS", f"{count}:{mib}:{name}")
        monkeypatch.setenv("SIM_LOG", str(tmp_path / "sim.jsonl"))
        monkeypatch.setenv("SIM_LEDGER", str(tmp_path / "gpu-ledger.json"))
        for key in ("CUDA_VISIBLE_DEVICES", "TRTLLM_ORCHESTRATOR", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"):
            monkeypatch.delenv(key, raising=False)
        (tmp_path / "work").mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / "work")
        return SimHost(tmp_path, bin_dir, tmp_path / "sim.jsonl")

    return make


STAND_IN_MODULES = ("pynvml", "tensorrt_llm")  # imported from a simulated container's site directory


@pytest.fixture(autouse=True)
def _container_modules_do_not_leak():
    """A test inside the simulated container imports its pynvml / tensorrt_llm stand-ins; forget them
    afterwards, so later tests (doctor's GPU row, say) see this machine's packages, not 8 fake H100s."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in STAND_IN_MODULES:
            del sys.modules[name]
