"""`specdeploy serve` without starting a server: exact argv for the CPU and GPU launches, the
docker line, the TensorRT-LLM version check, the stub environment and the read-only-wheel
backend directory, and the errors for missing repositories / variants."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.config import parse_config
from pipeline.errors import ServeError, SpecdeployError, StaleInputError
from pipeline.infra.processes import free_ports
from pipeline.serve.command import (
    CpuServer,
    Ports,
    check_trtllm_version,
    cpu_server_argv,
    cpu_server_env,
    docker_argv,
    gpu_server_argv,
    gpu_server_env,
)
from pipeline.serve.server import start_deployment

PORTS = Ports(8000, 8001, 8002)
COMMON = [
    "--model-repository=/repo", "--http-address=127.0.0.1", "--http-port=8000",
    "--grpc-address=127.0.0.1", "--grpc-port=8001", "--allow-metrics=true",
    "--metrics-address=127.0.0.1", "--metrics-port=8002", "--exit-timeout-secs=5",
    "--disable-auto-complete-config",
]


def test_cpu_argv():
    server = CpuServer(Path("/w/bin/tritonserver"), Path("/w/backends"))
    assert cpu_server_argv(server, Path("/repo"), PORTS) == [
        "/w/bin/tritonserver", *COMMON, "--backend-directory=/w/backends", "--pinned-memory-pool-byte-size=0"]


def test_gpu_argv_single_rank():
    assert gpu_server_argv(Path("/repo"), PORTS) == ["tritonserver", *COMMON]


def test_gpu_argv_leader_mode_one_server_per_rank():
    argv = gpu_server_argv(Path("/repo"), PORTS, "leader", 2)
    assert argv == [
        "mpirun", "--allow-run-as-root",
        "-n", "1", "tritonserver", *COMMON, "--backend-config=python,shm-region-prefix-name=prefix0_",
        ":", "-n", "1", "tritonserver", *COMMON, "--backend-config=python,shm-region-prefix-name=prefix1_",
        "--model-control-mode=explicit", "--load-model=tensorrt_llm",
    ]


def test_gpu_argv_orchestrator_mode_is_upstreams_multi_model_launch():
    # tensorrtllm_backend@r25.05 scripts/launch_triton_server.py --multi-model: world size 1 under
    # mpirun, no pinned pool, no peer access, a zero CUDA pool on every GPU nvidia-smi lists
    argv = gpu_server_argv(Path("/repo"), PORTS, "orchestrator", 1, gpu_count=4)
    assert argv == [
        "mpirun", "--allow-run-as-root", "-n", "1", "tritonserver", *COMMON,
        "--pinned-memory-pool-byte-size=0", "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0", "--cuda-memory-pool-byte-size=1:0",
        "--cuda-memory-pool-byte-size=2:0", "--cuda-memory-pool-byte-size=3:0",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
    ]


def _placement(launch, gpus, models):
    from pipeline.plan.gpu_layout import ArmPlacement, ModelPlacement

    return ArmPlacement("speculative", tuple(gpus), launch, len(gpus) if launch == "leader" else 1,
                        tuple(ModelPlacement(name, tuple(g), 0.3, 4096) for name, g in models))


def test_gpu_env_orchestrator_and_leader():
    orchestrator = _placement("orchestrator", [4, 5, 6, 7], [("tensorrt_llm", [4, 5, 6, 7]), ("tensorrt_llm_draft", [4])])
    env = gpu_server_env(orchestrator, {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "2"})
    assert env == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TRTLLM_ORCHESTRATOR": "1",
                   "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    leader = _placement("leader", [4, 5, 6, 7], [("tensorrt_llm", [4, 5, 6, 7])])
    env = gpu_server_env(leader, {"PATH": "/bin", "TRTLLM_ORCHESTRATOR": "1"})
    assert env == {"PATH": "/bin", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}


def test_docker_line_mounts_what_the_repository_references():
    cfg = parse_config({"name": "x", "target": {"checkpoint": "/m"}})
    argv = docker_argv(cfg, ["tritonserver", "--model-repository=/p/engines/x/model_repo/baseline"],
                       [Path("/models/llama"), Path("/p/engines/x")], {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert argv == [
        "docker", "run", "--rm", "--gpus", "all", "--net", "host", "--ipc", "host",
        "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-v", "/models/llama:/models/llama:ro", "-v", "/p/engines/x:/p/engines/x:ro",
        "-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "-e", "CUDA_VISIBLE_DEVICES=1", cfg.triton.container_image,
        "tritonserver", "--model-repository=/p/engines/x/model_repo/baseline",
    ]


def test_trtllm_version_mismatch_is_refused():
    check_trtllm_version({"trtllm_version": "1.2.1"}, "1.2.1")
    check_trtllm_version({"trtllm_version": "1.2.1"}, None)  # nothing installed here: nothing to compare
    with pytest.raises(ServeError, match="built by TensorRT-LLM 1.2.0 but 1.2.1 is installed"):
        check_trtllm_version({"trtllm_version": "1.2.0"}, "1.2.1")


def test_stub_environment():
    server = CpuServer(Path("/w/bin/tritonserver"), Path("/w/backends"), (Path("/w/libs"),))
    env = cpu_server_env(server, {"PATH": "/usr/bin", "PYTHONPATH": "/extra"})
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(os.sys.executable).parent)
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[-1] == "/extra" and any(p.endswith("site-packages") for p in parts)
    assert env["LD_LIBRARY_PATH"] == "/w/libs"


def test_read_only_wheel_gets_symlinked_backend_dir(tmp_path, monkeypatch):
    from pipeline.serve import command as serve
    from pipeline.serve import tritonserver_install

    wheel = tmp_path / "pytriton" / "tritonserver"
    (wheel / "bin").mkdir(parents=True)
    (wheel / "bin" / "tritonserver").write_text("")
    python_dir = wheel / "backends" / "python"
    python_dir.mkdir(parents=True)
    (python_dir / "libtriton_python.so").write_text("lib")
    stub = wheel / "python_backend_stubs" / "3.11" / "triton_python_backend_stub"
    stub.parent.mkdir(parents=True)
    stub.write_text("stub")
    install = tritonserver_install.TritonInstall(wheel / "bin" / "tritonserver", wheel / "backends", stub, "pytriton")
    monkeypatch.setattr(tritonserver_install, "find_tritonserver", lambda: install)
    monkeypatch.setattr(serve.os, "access", lambda path, mode: False)  # as if the wheel were read-only
    server = serve.prepare_cpu_server(cache_root=tmp_path / "cache")
    assert server.backend_dir == tmp_path / "cache"
    placed = tmp_path / "cache" / "python"
    assert (placed / "triton_python_backend_stub").resolve() == stub.resolve()
    assert (placed / "libtriton_python.so").read_text() == "lib"
    assert not (python_dir / "triton_python_backend_stub").exists()


def test_free_ports_distinct():
    ports = free_ports(3)
    assert len(set(ports)) == 3


def test_missing_repository_and_variant(tmp_path):
    cfg = parse_config({"name": "x", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "/m"}}, workdir=tmp_path)
    with pytest.raises(StaleInputError, match="run `specdeploy render` first"):
        start_deployment(cfg, "baseline")
    with pytest.raises(SpecdeployError, match="variant 'speculative' does not exist for speculation method 'none'"):
        start_deployment(cfg, "speculative")


def test_repository_rendered_from_another_config_is_refused(tmp_path):
    import json

    from pipeline.config import config_hash
    from pipeline.render.renderer import render

    data = {"name": "x", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "/m"}}
    cfg = parse_config(data, workdir=tmp_path)
    manifest = {"format": "specdeploy-manifest/1", "config_hash": config_hash(cfg), "engines": {"baseline": "/e"},
                "tokenizer_dir": "/m"}
    (tmp_path / "engines" / "x").mkdir(parents=True)
    (tmp_path / "engines" / "x" / "manifest.json").write_text(json.dumps(manifest))
    render(cfg)
    changed = parse_config({**data, "triton": {"decoupled": False}}, workdir=tmp_path)
    with pytest.raises(StaleInputError, match="rendered from another config: re-run `specdeploy render`"):
        start_deployment(changed, "baseline")
