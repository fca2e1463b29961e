"""How ``specdeploy serve`` starts an arm of a GPU (``backend: trtllm``) deployment on the LLM-API
runtime: the Triton ``llmapi`` repository ``render`` wrote (``engines/NAME/model_repo/<arm>/``,
its deployment descriptor saying ``contract: llmapi``).

Reads the repository (``tensorrt_llm/1/model.yaml``: the checkpoint paths the model loads), the
arm's placement, and where this host's TensorRT-LLM keeps upstream's ``model.py`` / ``helpers.py``
(``pipeline.render.llmapi.upstream_model_dir``); copies those two files into the
repository when they are absent and present here, as the rendered ``<arm>.launch.sh`` does.
Returns the argv and environment of the server: ``tritonserver`` under ``mpirun -n 1``, as
upstream's ``launch_triton_server.py --world_size 1`` starts it (the LLM API spawns its own
workers for TP/PP), with the project's usual flags and ports; or, without ``tritonserver`` here,
the ``docker run`` line that does the same in the TensorRT-LLM image.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import yaml

from pipeline.errors import ServeError
from pipeline.render.llmapi import upstream_model_dir
from pipeline.serve.command import server_flags

MODEL_NAME = "tensorrt_llm"
UPSTREAM_FILES = ("model.py", "helpers.py")
GPU_ORDER_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def llmapi_server_argv(repo: Path, ports, host: str, exit_timeout_s: float, tritonserver: str = "tritonserver") -> list[str]:

    return ["mpirun", "--allow-run-as-root", "-n", "1", tritonserver, *server_flags(repo, ports, host, exit_timeout_s),
            "--backend-config=python,shm-region-prefix-name=prefix0_"]


def llmapi_server_env(gpus: list[int] | tuple[int, ...], base: dict | None = None) -> dict[str, str]:
    """The arm's GPUs, numbered as nvidia-smi numbers them (the rendered launcher sets the same)."""
    env = dict(os.environ if base is None else base)
    env.update(GPU_ORDER_ENV)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def model_paths(repo: Path) -> list[Path]:
    """The host paths the model reads: the repository and model.yaml's checkpoints."""
    data = yaml.safe_load((repo / MODEL_NAME / "1" / "model.yaml").read_text()) or {}
    found = [repo.resolve()]
    for value in (data.get("model"), (data.get("speculative_config") or {}).get("speculative_model")):
        if isinstance(value, str) and value.startswith("/"):
            found.append(Path(value))
    return found


def missing_upstream_files(repo: Path) -> list[str]:
    return [name for name in UPSTREAM_FILES if not (repo / MODEL_NAME / "1" / name).is_file()]


def copy_upstream_files(repo: Path, upstream_dir: Path) -> list[str]:
    """Copy upstream's files the repository lacks from ``upstream_dir``; returns those still missing."""
    for name in missing_upstream_files(repo):
        if (upstream_dir / name).is_file():
            shutil.copy2(upstream_dir / name, repo / MODEL_NAME / "1" / name)
    return missing_upstream_files(repo)


def docker_llmapi_argv(image: str, server_argv: list[str], repo: Path, upstream_dir: str, mounts: list[Path],
                       env: dict[str, str]) -> list[str]:
    """The container line: the repository mounted writable (the image's model.py and helpers.py are
    copied into it when absent, as the rendered launcher does), the checkpoints read-only."""
    target = f"{repo}/{MODEL_NAME}/1"
    copy = f'for f in {" ".join(UPSTREAM_FILES)}; do [ -f {shlex.quote(target)}/$f ] || ' \
           f'cp {shlex.quote(upstream_dir)}/$f {shlex.quote(target)}/$f; done'
    volumes = []
    for path in mounts:
        volumes += ["-v", f"{path}:{path}" if path == repo else f"{path}:{path}:ro"]
    variables = [arg for key, value in sorted(env.items()) for arg in ("-e", f"{key}={value}")]
    return ["docker", "run", "--rm", "--gpus", "all", "--net", "host", "--ipc", "host",
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", *volumes, *variables, image,
            "sh", "-c", f"{copy}; exec {shlex.join(server_argv)}"]


def llmapi_launch(cfg, repo: Path, placement, ports, host: str) -> tuple[list[str], dict[str, str]]:
    """argv and env of one llmapi arm's server; a ServeError with the docker line (or what is
    missing) when it cannot run here."""

    repo = repo.resolve()
    upstream = upstream_model_dir(cfg)
    argv = llmapi_server_argv(repo, ports, host, cfg.triton.exit_timeout_s)
    env = llmapi_server_env(placement.gpus)
    if shutil.which("tritonserver") is None:
        line = docker_llmapi_argv(cfg.triton.container_image, argv, repo, upstream, model_paths(repo),
                                  llmapi_server_env(placement.gpus, base={}))
        raise ServeError("tritonserver is not installed here; run the deployment inside the TensorRT-LLM container:\n"
                         + shlex.join(line))
    missing = copy_upstream_files(repo, Path(os.environ.get("TRTLLM_LLMAPI_MODEL_DIR", upstream)))
    if missing:
        raise ServeError(f"{repo / MODEL_NAME / '1'} lacks upstream's llmapi {', '.join(missing)} and {upstream} "
                         "has none: set TRTLLM_LLMAPI_MODEL_DIR to TensorRT-LLM's "
                         "triton_backend/all_models/llmapi/tensorrt_llm/1 (or trtllm_root)")
    if shutil.which("mpirun") is None:
        raise ServeError("the llmapi launch needs mpirun, which is not on PATH")
    return argv, env
