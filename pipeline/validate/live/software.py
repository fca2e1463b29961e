"""The installed software against the config: ``tensorrt_llm`` in the interpreter that runs it, the
``tritonserver`` that ``serve`` will launch, and the files Triton loads from each backend directory.

Reads the child interpreter's ``import tensorrt_llm`` (:mod:`.probe`); resolves ``tritonserver`` as
the GPU launch does (the first one on PATH: ``pipeline/serve/server.py`` runs ``tritonserver`` by
name) and reads the ``TRITON_VERSION`` file of its install root (triton-inference-server/server
``build.py``, r26.04: the install tree with ``bin/tritonserver``, ``lib/libtritonserver.so`` and
``TRITON_VERSION`` is copied to ``/opt/tritonserver``; ``tritonserver`` itself has no ``--version``),
beside ``$TRITON_SERVER_VERSION`` / ``$NVIDIA_TRITON_SERVER_VERSION`` (the image's ``ENV`` lines, same
file); lists the backend directory Triton uses by default (``/opt/tritonserver/backends``: the GPU
launch passes no ``--backend-directory``; ``$SPECDEPLOY_TRITON_BACKENDS`` overrides). Runs nothing but
the child interpreter; writes nothing.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.trtllm import versions
from pipeline.validate.live.probe import MARKER, python_executable, python_source, run_probe
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

BACKENDS_DIR = Path("/opt/tritonserver/backends")
# The Triton server release each tritonserver:YY.MM image carries: triton-inference-server/server,
# file TRITON_VERSION on branch rYY.MM (read 2026-12-06), which build.py copies into /opt/tritonserver.
TRITON_RELEASES = {"25.09": "2.61.0", "25.10": "2.62.0", "25.11": "2.63.0", "25.12": "2.64.0", "26.01": "2.65.0",
                   "26.02": "2.66.0", "26.03": "2.67.0", "26.04": "2.68.0", "26.05": "2.69.0", "26.06": "2.70.0",
                   "26.07": "2.71.0"}
# What Triton loads from each backend directory. The library is libtriton_<backend>.so
# (triton-inference-server/backend README, "Backends": the shared library's name); the python
# backend also runs triton_python_backend_stub and imports triton_python_backend_utils.py
# (python_backend CMakeLists.txt install rules); the tensorrtllm model's rendered
# executor_worker_path names trtllmExecutorWorker (orchestrator mode).
BACKEND_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    "tensorrtllm": (("libtriton_tensorrtllm.so", "library"), ("trtllmExecutorWorker", "executable")),
    "python": (("libtriton_python.so", "library"), ("triton_python_backend_stub", "executable"),
               ("triton_python_backend_utils.py", "file")),
}
ELF_MAGIC = b"\x7fELF"
_VERSION_CODE = f"""
import json
try:
    import tensorrt_llm
except BaseException as exc:
    print({MARKER!r} + json.dumps({{"error": f"{{type(exc).__name__}}: {{exc}}"}}))
else:
    print({MARKER!r} + json.dumps({{"version": str(tensorrt_llm.__version__), "file": tensorrt_llm.__file__}}))
"""


@dataclass(frozen=True)
class Trtllm:
    """``tensorrt_llm`` in the interpreter that runs it: its version, or why it does not import."""

    version: str | None
    found: str
    fix: str = ""


def import_fix(error: str, image: str) -> str:
    """The likely fix for a failed ``import tensorrt_llm``, from its message."""
    if "libcuda.so" in error or "libnvidia-ml.so" in error:
        return ("the container sees no NVIDIA driver library (libcuda.so.1 is mounted by the NVIDIA Container "
                "Toolkit, not installed by pip): start it with `docker run --gpus all …` on a host with the "
                "toolkit configured (nvidia-ctk runtime configure --runtime=docker), and keep "
                "NVIDIA_DRIVER_CAPABILITIES including compute (the image sets compute,utility)")
    if "No module named 'tensorrt_llm'" in error:
        return (f"run inside {image} (its python3 has tensorrt_llm), or set SPECDEPLOY_TRTLLM_PYTHON to the "
                "interpreter that has it")
    return (f"this interpreter's tensorrt_llm is broken (the error above); use the one in {image} rather than "
            "repairing it with pip")


def installed_trtllm(image: str = "the TensorRT-LLM image") -> Trtllm:
    data, problem = run_probe(_VERSION_CODE)
    python = python_executable()
    if data is None:
        return Trtllm(None, f"the probe failed in {python}: {problem}",
                      "set SPECDEPLOY_TRTLLM_PYTHON to the interpreter that runs TensorRT-LLM")
    if "error" in data:
        return Trtllm(None, f"`import tensorrt_llm` fails in {python}: {data['error']}", import_fix(data["error"], image))
    return Trtllm(data["version"], f"{data['version']} ({data['file']})")


def check_trtllm_version(cfg: DeploymentConfig, trtllm: Trtllm) -> LiveCheck:
    name, source = "tensorrt_llm version", f"config trtllm_version; interpreter: {python_source()}"
    if trtllm.version is None:
        return failed(name, cfg.trtllm_version, source, trtllm.found, trtllm.fix)
    if versions.same_version(trtllm.version, cfg.trtllm_version):
        return passed(name, cfg.trtllm_version, source, trtllm.found)
    wrong = ""
    carried = versions.image_trtllm(cfg.triton.container_image)
    in_image = os.environ.get("NVIDIA_TRITON_SERVER_VERSION") == versions.image_tag(cfg.triton.container_image)
    if carried is not None and in_image and not versions.same_version(carried, trtllm.version):
        wrong = (f"recorded fact '{cfg.triton.container_image} carries TensorRT-LLM {carried}' "
                 f"(pipeline/trtllm/versions.yaml) is wrong for this install")
    return failed(name, cfg.trtllm_version, source, trtllm.found,
                  f"set trtllm_version: \"{trtllm.version}\" and run validate again (its facts then apply), or use "
                  f"the image that carries {cfg.trtllm_version}", wrong)


def tritonserver_release(binary: Path) -> tuple[str | None, Path]:
    """(the release in the TRITON_VERSION file of ``binary``'s install root, or None; that file)."""
    version_file = binary.resolve().parent.parent / "TRITON_VERSION"
    try:
        return version_file.read_text(encoding="utf-8").strip() or None, version_file
    except OSError:
        return None, version_file


def check_tritonserver(cfg: DeploymentConfig) -> LiveCheck:
    """The ``tritonserver`` first on PATH — the one the GPU launch runs — asked for its own release
    (its install's ``TRITON_VERSION``), against the release of ``triton.container_image``."""
    name, image = "tritonserver", cfg.triton.container_image
    tag = versions.image_tag(image)
    release = TRITON_RELEASES.get(tag) if tag else None
    expected = f"Triton {release} (the {tag} image's)" if release else "a tritonserver on PATH"
    source = (f"triton.container_image; TRITON_VERSION of server r{tag}" if release else "triton.container_image")
    found_on_path = shutil.which("tritonserver")
    if found_on_path is None:
        return failed(name, expected, source, "no tritonserver on PATH (serve runs `tritonserver` from PATH)",
                      f"run inside {image} (it puts /opt/tritonserver/bin on PATH)")
    binary = Path(found_on_path)
    own, version_file = tritonserver_release(binary)
    claims = {k: os.environ.get(k) for k in ("TRITON_SERVER_VERSION", "NVIDIA_TRITON_SERVER_VERSION")}
    said = ", ".join(f"{k}={v or 'unset'}" for k, v in claims.items())
    where = f"{binary}" + (f" → {binary.resolve()}" if binary.resolve() != binary else "")
    if own is None:
        return skipped(name, expected, source, f"not checked: {where} has no {version_file} to say its release "
                       f"(not the NGC layout); the environment says {said}, which nothing ties to this binary")
    found = f"{where}: {version_file.name} {own}; {said}"
    env_disagrees = claims["TRITON_SERVER_VERSION"] not in (None, own)
    if release is None:
        return skipped(name, expected, source, f"not checked: no Triton release is recorded for {image}; {found}")
    if own != release:
        lie = (f"; the variable claims {claims['TRITON_SERVER_VERSION']}, but the binary that runs is {own}"
               if env_disagrees or claims["TRITON_SERVER_VERSION"] == release else "")
        return failed(name, expected, source, found + lie,
                      f"another tritonserver comes first on PATH: remove it or put the image's /opt/tritonserver/bin "
                      f"first; or set triton.container_image to the image that carries Triton {own}")
    if env_disagrees:
        found += f" (the variable differs from the binary; the binary is what runs, and it is {own})"
    return passed(name, expected, source, found)


def check_mpirun(cfg: DeploymentConfig) -> LiveCheck:
    """``mpirun`` on PATH when serve launches through it: the LLM-API model always, the engine
    runtime with several TensorRT-LLM models per arm (orchestrator mode) or TP×PP > 1 (one rank per
    GPU): :func:`pipeline.serve.command.gpu_server_argv`, ``pipeline/serve/llmapi_launch.py``, as
    upstream's ``launch_triton_server.py`` wraps ``tritonserver`` in ``mpirun``."""
    name = "mpirun"
    if cfg.runs_llm_api:
        why = "the LLM-API launch (mpirun -n 1 tritonserver)"
    elif cfg.draft is not None or cfg.target.world_size > 1:
        why = "orchestrator or leader mode (a draft model, or TP×PP > 1)"
    else:
        return skipped(name, "not used", "one model on one GPU: serve runs tritonserver directly", "not needed")
    found = shutil.which("mpirun")
    if found is None:
        return failed(name, "mpirun on PATH", why, "no mpirun on PATH",
                      f"run inside {cfg.triton.container_image} (it ships Open MPI), or install Open MPI")
    return passed(name, "mpirun on PATH", why, found)


def backend_dirs() -> Path:
    return Path(os.environ.get("SPECDEPLOY_TRITON_BACKENDS") or BACKENDS_DIR)


def _file_problem(path: Path, kind: str) -> str | None:
    if not path.is_file():
        return f"{path.name} absent"
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
    except OSError as exc:
        return f"{path.name} unreadable ({exc.strerror})"
    if kind in ("library", "executable") and head != ELF_MAGIC:
        return f"{path.name} is not an ELF binary"
    if kind == "executable" and not os.access(path, os.X_OK):
        return f"{path.name} not executable"
    if kind == "file" and not head:
        return f"{path.name} empty"
    return None


def check_backends(cfg: DeploymentConfig) -> list[LiveCheck]:
    """``python`` serves every repository (pre/post-processing, BLS, the llmapi model);
    ``tensorrtllm`` serves engines on the engine runtime."""
    root = backend_dirs()
    needed = {"python": "pre/post-processing, BLS and the llmapi model"}
    if cfg.runtime == "engine":
        needed["tensorrtllm"] = "the engine runtime's tensorrt_llm model"
    out = []
    for backend, files in BACKEND_FILES.items():
        path = root / backend
        name = f"backend {backend}"
        expected = f"{path}: " + ", ".join(f for f, _ in files)
        problems = [p for p in (_file_problem(path / f, kind) for f, kind in files) if p]
        found = f"{path}: " + ("; ".join(problems) if problems else "each present and loadable (ELF, executable)")
        if backend not in needed:
            out.append(skipped(name, "not used", f"trtllm_runtime {cfg.runtime}", found))
        elif not problems:
            out.append(passed(name, expected, needed[backend], found))
        else:
            out.append(failed(name, expected, needed[backend], found,
                              f"run inside {cfg.triton.container_image} (its backends are complete), or set "
                              "SPECDEPLOY_TRITON_BACKENDS to the backends directory of this Triton install"))
    return out
