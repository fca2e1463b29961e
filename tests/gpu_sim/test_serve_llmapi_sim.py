"""``specdeploy serve`` on the LLM-API runtime (backend trtllm) on a simulated GPU host
(tests/gpu_sim/serve_tools.py: stand-in ``mpirun`` and ``tritonserver`` on PATH, each recording
its argv and environment). What this checks: the exact server argv and environment of an arm
(tritonserver under ``mpirun -n 1`` as upstream's launch_triton_server.py starts it, the arm's
GPUs), that upstream's model.py / helpers.py are copied into the repository from this host's
TensorRT-LLM and that the rendered repository holds what that model reads at load (helpers.py
beside it, model.yaml with its triton_config), a clear refusal when the files are nowhere, and the
``docker run`` line when tritonserver is not installed. What it does not check: upstream's model
serving a request — that needs TensorRT-LLM; tests/integration/test_llmapi_cpu_triton.py serves the
same repository layout with the CPU engine behind it."""

from __future__ import annotations

import shlex

import pytest
from serve_tools import built_and_rendered, served, shipped_config

from pipeline.errors import ServeError
from pipeline.infra.processes import free_ports

H100 = (81559, "NVIDIA H100 80GB HBM3")
CONFIG = "llama31-8b-eagle3-llmapi-h100"


# Stand-ins for the two upstream files with upstream's start-up shape (v1.2.1 model.py: helpers
# imported from beside it, model.yaml read from the version directory); the simulated tritonserver
# checks that shape against the repository, it runs no Python model.
MODEL_PY = '''"""Stand-in for TensorRT-LLM's llmapi model.py (start-up shape only)."""
import os

import triton_python_backend_utils as pb_utils
import yaml
from helpers import get_input_tensor_by_name

CONFIG = os.environ.get("LLM_CONFIG_PATH", "model.yaml")
'''
HELPERS_PY = '''"""Stand-in for TensorRT-LLM's llmapi helpers.py."""


def get_input_tensor_by_name(request, name):
    return None
'''


@pytest.fixture()
def upstream_dir(tmp_path, monkeypatch):
    path = tmp_path / "trtllm" / "llmapi" / "tensorrt_llm" / "1"
    path.mkdir(parents=True)
    (path / "model.py").write_text(MODEL_PY)
    (path / "helpers.py").write_text(HELPERS_PY)
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_DIR", str(path))
    return path


@pytest.mark.slow  # the simulated launcher's subprocesses (about 0.7-1 CPU s): full tier
def test_llmapi_arm_is_served_with_the_exact_argv(gpu_host, upstream_dir):
    host = gpu_host(1, *H100)
    cfg = shipped_config(CONFIG, host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    http, grpc, metrics = free_ports(3)
    ports = {"speculative": {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}}
    with served(cfg, "speculative", ports=ports) as servers:
        assert servers["speculative"].alive()
    repo = repos["speculative"].resolve()
    (launched,) = [r for r in host.records("mpirun") if f"--model-repository={repo}" in r["argv"]]
    assert launched["argv"] == [
        "--allow-run-as-root", "-n", "1", "tritonserver", f"--model-repository={repo}",
        "--http-address=127.0.0.1", f"--http-port={http}", "--grpc-address=127.0.0.1", f"--grpc-port={grpc}",
        "--allow-metrics=true", "--metrics-address=127.0.0.1", f"--metrics-port={metrics}",
        f"--exit-timeout-secs={max(1, int(round(cfg.triton.exit_timeout_s)))}", "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_"]
    assert launched["env"]["CUDA_VISIBLE_DEVICES"] == "0" and launched["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert [r["error"] for r in host.records() if r.get("error")] == []
    assert (repo / "tensorrt_llm" / "1" / "model.py").read_text() == MODEL_PY
    assert (repo / "tensorrt_llm" / "1" / "helpers.py").read_text() == HELPERS_PY


@pytest.mark.slow  # the simulated launcher's subprocesses (about 0.7-1 CPU s): full tier
def test_llmapi_repository_without_model_yaml_fails_to_load(gpu_host, upstream_dir):
    """The negative control of the check above: upstream's model cannot start without model.yaml."""
    host = gpu_host(1, *H100)
    cfg = shipped_config(CONFIG, host.root)
    repo = built_and_rendered(cfg)["speculative"][0]
    (repo / "tensorrt_llm" / "1" / "model.yaml").unlink()
    with pytest.raises(ServeError), served(cfg, "speculative"):
        pass
    assert any("model.yaml" in (r.get("error") or "") for r in host.records())


def test_llmapi_arm_without_upstream_model_is_refused(gpu_host, tmp_path, monkeypatch):
    from pipeline.serve.server import start_deployment

    host = gpu_host(1, *H100)
    cfg = shipped_config(CONFIG, host.root)
    built_and_rendered(cfg)
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ServeError, match="lacks upstream's llmapi model.py, helpers.py.*TRTLLM_LLMAPI_MODEL_DIR"):
        start_deployment(cfg, "baseline")


def test_llmapi_docker_line(gpu_host, monkeypatch):
    from pipeline.render.llmapi import upstream_model_dir
    from pipeline.serve.server import start_deployment

    host = gpu_host(1, *H100, tritonserver=False)
    cfg = shipped_config(CONFIG, host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    with pytest.raises(ServeError) as info:
        start_deployment(cfg, "speculative", http_port=18000, grpc_port=18001, metrics_port=18002)
    argv = shlex.split(str(info.value).splitlines()[-1])
    repo = repos["speculative"].resolve()
    image = argv.index(cfg.triton.container_image)
    volumes = [v for flag, v in zip(argv, argv[1:image]) if flag == "-v"]
    assert f"{repo}:{repo}" in volumes  # writable: the image's model.py is copied in
    assert f"{cfg.target.checkpoint}:{cfg.target.checkpoint}:ro" in volumes
    assert f"{cfg.speculation.head_dir}:{cfg.speculation.head_dir}:ro" in volumes
    assert "-e" in argv and "CUDA_VISIBLE_DEVICES=0" in argv
    assert argv[image + 1:image + 3] == ["sh", "-c"]
    script = argv[image + 3]
    assert f"cp {upstream_model_dir(cfg)}/$f {repo}/tensorrt_llm/1/$f" in script
    assert script.split("; exec ", 1)[1].startswith(f"mpirun --allow-run-as-root -n 1 tritonserver --model-repository={repo} ")
