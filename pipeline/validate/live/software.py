"""The installed software against the config: ``tensorrt_llm.__version__``, ``tritonserver
--version`` and the Triton backend directories.

Reads the child interpreter's ``tensorrt_llm`` (:mod:`.probe`), runs ``tritonserver --version``
(``$SPECDEPLOY_TRITONSERVER``, PATH, then ``/opt/tritonserver/bin``), reads
``$NVIDIA_TRITON_SERVER_VERSION`` (set in NGC Triton images) and lists ``/opt/tritonserver/backends``
(``$SPECDEPLOY_TRITON_BACKENDS`` overrides). Writes nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.trtllm import versions
from pipeline.validate.live.probe import MARKER, python_executable, run_probe
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

TRITON_BIN = Path("/opt/tritonserver/bin/tritonserver")
BACKENDS_DIR = Path("/opt/tritonserver/backends")
_VERSION_CODE = f"""
import json
try:
    import tensorrt_llm
except Exception as exc:
    print({MARKER!r} + json.dumps({{"error": f"{{type(exc).__name__}}: {{exc}}"}}))
else:
    print({MARKER!r} + json.dumps({{"version": str(tensorrt_llm.__version__), "file": tensorrt_llm.__file__}}))
"""


def installed_trtllm() -> tuple[str | None, str]:
    """(``tensorrt_llm.__version__`` or None, what was found / why not)."""
    data, problem = run_probe(_VERSION_CODE)
    if data is None:
        return None, f"the probe failed: {problem}"
    if "error" in data:
        return None, f"`import tensorrt_llm` fails in {python_executable()}: {data['error']}"
    return data["version"], f"{data['version']} ({data['file']})"


def check_trtllm_version(cfg: DeploymentConfig, installed: str | None, found: str) -> LiveCheck:
    name, source = "tensorrt_llm version", "config trtllm_version"
    if installed is None:
        return failed(name, cfg.trtllm_version, source, found,
                      "run inside the TensorRT-LLM container (docs/gpu-runbook.md), or pip install "
                      f"tensorrt_llm=={cfg.trtllm_version} in this interpreter")
    if versions.same_version(installed, cfg.trtllm_version):
        return passed(name, cfg.trtllm_version, source, found)
    wrong = ""
    carried = versions.image_trtllm(cfg.triton.container_image)
    in_image = os.environ.get("NVIDIA_TRITON_SERVER_VERSION") == versions.image_tag(cfg.triton.container_image)
    if carried is not None and in_image and not versions.same_version(carried, installed):
        wrong = (f"recorded fact '{cfg.triton.container_image} carries TensorRT-LLM {carried}' "
                 f"(pipeline/trtllm/versions.yaml) is wrong for this install")
    return failed(name, cfg.trtllm_version, source, found,
                  f"set trtllm_version: \"{installed}\" and run validate again (its facts then apply), or use the "
                  f"image that carries {cfg.trtllm_version}", wrong)


def _tritonserver() -> str | None:
    explicit = os.environ.get("SPECDEPLOY_TRITONSERVER")
    if explicit:
        return explicit
    return shutil.which("tritonserver") or (str(TRITON_BIN) if TRITON_BIN.is_file() else None)


def check_tritonserver(cfg: DeploymentConfig) -> LiveCheck:
    name = "tritonserver version"
    tag = versions.image_tag(cfg.triton.container_image)
    expected = f"Triton {tag}" if tag else "a tritonserver"
    source = "triton.container_image"
    binary = _tritonserver()
    if binary is None:
        return failed(name, expected, source, "no tritonserver (PATH, /opt/tritonserver/bin)",
                      f"run inside {cfg.triton.container_image}")
    try:
        proc = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
        printed = " ".join((proc.stdout + proc.stderr).split())[:120] or f"exit {proc.returncode}, no output"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return failed(name, expected, source, f"{binary} does not run: {exc}", "fix the Triton install")
    image_env = os.environ.get("NVIDIA_TRITON_SERVER_VERSION")
    found = f"{printed} ({binary}" + (f", NVIDIA_TRITON_SERVER_VERSION={image_env})" if image_env else ")")
    if tag and image_env and image_env != tag:
        return failed(name, expected, source, found, f"run inside {cfg.triton.container_image}, or set "
                      f"triton.container_image to the {image_env} image (and trtllm_version to what it carries)")
    return passed(name, expected, source, found)


def backend_dirs() -> Path:
    return Path(os.environ.get("SPECDEPLOY_TRITON_BACKENDS") or BACKENDS_DIR)


def check_backends(cfg: DeploymentConfig) -> list[LiveCheck]:
    """``python`` serves every repository (pre/post-processing, BLS, the llmapi model);
    ``tensorrtllm`` (``libtriton_tensorrtllm.so``) serves engines on the engine runtime."""
    root = backend_dirs()
    needed = {"python": "pre/post-processing, BLS and the llmapi model"}
    if cfg.runtime == "engine":
        needed["tensorrtllm"] = "the engine runtime's tensorrt_llm model"
    out = []
    for backend in ("tensorrtllm", "python"):
        path = root / backend
        name = f"backend {backend}"
        have = path.is_dir() and any(path.iterdir())
        found = f"{path} ({', '.join(sorted(p.name for p in path.iterdir())[:3])})" if have else f"{path}: absent"
        if backend not in needed:
            out.append(skipped(name, "not used", f"trtllm_runtime {cfg.runtime}", found))
        elif have:
            out.append(passed(name, f"{path} present", needed[backend], found))
        else:
            out.append(failed(name, f"{path} present", needed[backend], found,
                              f"run inside {cfg.triton.container_image}, or set SPECDEPLOY_TRITON_BACKENDS to the "
                              "backends directory of this Triton install"))
    return out
