"""The installed software against the config: ``tensorrt_llm.__version__``, the Triton install
and its release, and the Triton backend directories.

Reads the child interpreter's ``tensorrt_llm`` (:mod:`.probe`), looks for ``tritonserver``
(``$SPECDEPLOY_TRITONSERVER``, PATH, then ``/opt/tritonserver/bin``), reads
``$NVIDIA_TRITON_SERVER_VERSION`` / ``$TRITON_SERVER_VERSION`` (set in NGC Triton images) and lists
``/opt/tritonserver/backends`` (``$SPECDEPLOY_TRITON_BACKENDS`` overrides). Runs nothing but the
child interpreter; writes nothing.
"""

from __future__ import annotations

import os
import shutil
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
    """The binary exists and is executable; the image's Triton release is
    ``$NVIDIA_TRITON_SERVER_VERSION`` (and the server's own version ``$TRITON_SERVER_VERSION``),
    which the NGC image sets (triton-inference-server/server ``build.py``: ``ENV
    NVIDIA_TRITON_SERVER_VERSION ${TRITON_CONTAINER_VERSION}``). ``tritonserver`` itself has no
    ``--version`` option (it answers "unrecognized option '--version'" and its usage), so it is not run."""
    name = "tritonserver"
    tag = versions.image_tag(cfg.triton.container_image)
    expected = f"Triton {tag} (NVIDIA_TRITON_SERVER_VERSION)" if tag else "a tritonserver"
    source = "triton.container_image"
    binary = _tritonserver()
    if binary is None or not os.access(binary, os.X_OK):
        return failed(name, expected, source, f"no tritonserver ({binary or 'PATH, /opt/tritonserver/bin'})",
                      f"run inside {cfg.triton.container_image}")
    release = os.environ.get("NVIDIA_TRITON_SERVER_VERSION")
    server = os.environ.get("TRITON_SERVER_VERSION")
    found = f"{binary}; NVIDIA_TRITON_SERVER_VERSION={release or 'unset'}" + (f", TRITON_SERVER_VERSION={server}"
                                                                              if server else "")
    if tag and release is None:
        return skipped(name, expected, source, found + " (not an NGC Triton image: its release is unknown)")
    if tag and release != tag:
        return failed(name, expected, source, found, f"run inside {cfg.triton.container_image}, or set "
                      f"triton.container_image to the {release} image (and trtllm_version to what it carries)")
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
