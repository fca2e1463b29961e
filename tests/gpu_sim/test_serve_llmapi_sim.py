"""``specdeploy serve`` on the LLM-API runtime (backend trtllm) on a simulated GPU host: the exact
server argv and environment of an arm (tritonserver under ``mpirun -n 1`` as upstream's
launch_triton_server.py starts it, the arm's GPUs), upstream's model.py / helpers.py copied into
the repository from this host's TensorRT-LLM, a clear refusal when they are nowhere, and the
``docker run`` line when tritonserver is not installed."""

from __future__ import annotations

import shlex

import pytest
from serve_tools import built_and_rendered, shipped_config

from pipeline.errors import ServeError

H100 = (81559, "NVIDIA H100 80GB HBM3")
CONFIG = "llama31-8b-eagle3-llmapi-h100"


@pytest.fixture()
def upstream_dir(tmp_path, monkeypatch):
    path = tmp_path / "trtllm" / "llmapi" / "tensorrt_llm" / "1"
    path.mkdir(parents=True)
    for name in ("model.py", "helpers.py"):
        (path / name).write_text(f"# upstream {name}\n")
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_DIR", str(path))
    return path


def _captured(monkeypatch) -> dict:
    seen: dict = {}

    def fake_start_server(repo, **kwargs):
        seen.update(kwargs, repo=repo)
        return "started"

    monkeypatch.setattr("pipeline.serve.server.start_server", fake_start_server)
    return seen


def test_llmapi_arm_is_served_with_the_exact_argv(gpu_host, upstream_dir, monkeypatch):
    from pipeline.serve.server import start_deployment

    host = gpu_host(1, *H100)
    cfg = shipped_config(CONFIG, host.root)
    repos = {arm: repo for arm, (repo, _) in built_and_rendered(cfg).items()}
    seen = _captured(monkeypatch)
    assert start_deployment(cfg, "speculative", http_port=18000, grpc_port=18001, metrics_port=18002) == "started"
    repo = repos["speculative"].resolve()
    assert seen["argv"] == [
        "mpirun", "--allow-run-as-root", "-n", "1", "tritonserver", f"--model-repository={repo}",
        "--http-address=127.0.0.1", "--http-port=18000", "--grpc-address=127.0.0.1", "--grpc-port=18001",
        "--allow-metrics=true", "--metrics-address=127.0.0.1", "--metrics-port=18002",
        f"--exit-timeout-secs={max(1, int(round(cfg.triton.exit_timeout_s)))}", "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_"]
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0" and seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for name in ("model.py", "helpers.py"):
        assert (repo / "tensorrt_llm" / "1" / name).read_text() == f"# upstream {name}\n"


def test_llmapi_arm_without_upstream_model_is_refused(gpu_host, tmp_path, monkeypatch):
    from pipeline.serve.server import start_deployment

    host = gpu_host(1, *H100)
    cfg = shipped_config(CONFIG, host.root)
    built_and_rendered(cfg)
    monkeypatch.setenv("TRTLLM_LLMAPI_MODEL_DIR", str(tmp_path / "nowhere"))
    _captured(monkeypatch)
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
