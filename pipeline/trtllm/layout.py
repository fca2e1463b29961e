"""Where TensorRT-LLM's example scripts live on the build host, and whether the plan's are there.

Reads the environment (``SPECDEPLOY_TRTLLM_ROOT``) and the filesystem (does ``<root>/examples``
exist; does each script a plan runs exist); writes nothing.

The NGC ``tritonserver:<yy.mm>-trtllm-python-py3`` images for TensorRT-LLM 1.2.x copy the
checkout's ``examples/`` to ``/app/examples`` (tensorrtllm_backend@r26.04
``dockerfile/Dockerfile.triton.trt_llm_backend``: ``WORKDIR /app`` … ``COPY …/examples
examples``), so the root is the directory that *holds* ``examples/``: ``/app`` in the image, the
checkout itself for ``git clone --branch v1.2.1``. Older images have no ``/app`` at all
(tensorrtllm_backend#721, #739), which is why a missing script is reported before any step runs.

Precedence, first set wins: ``--trtllm-root`` on the command line, ``trtllm_root`` in the config,
``$SPECDEPLOY_TRTLLM_ROOT``, then ``/app`` when ``/app/examples`` exists. With none of them the
root stays ``/app`` and :func:`missing_scripts` names what to install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

ENV_VAR = "SPECDEPLOY_TRTLLM_ROOT"
NGC_ROOT = "app"  # relative to the container's / (``prefix`` in tests)
UPSTREAM_REPO = "https://github.com/NVIDIA/TensorRT-LLM"


@dataclass(frozen=True)
class TrtllmRoot:
    path: str
    source: str  # cli | config | env | ngc-image | default


def resolve_trtllm_root(
    cli: str | None = None,
    configured: str | None = None,
    environ: Mapping[str, str] | None = None,
    prefix: str | Path = "/",
) -> TrtllmRoot:
    """The examples root by the precedence in the module docstring. ``prefix`` stands for the
    container's ``/`` so the image layout can be detected in a test without writing to /app."""
    environ = os.environ if environ is None else environ
    for value, source in ((cli, "cli"), (configured, "config"), (environ.get(ENV_VAR), "env")):
        if value:
            return TrtllmRoot(str(Path(value).expanduser()), source)
    image_root = Path(prefix) / NGC_ROOT
    source = "ngc-image" if (image_root / "examples").is_dir() else "default"
    return TrtllmRoot(str(image_root), source)


@dataclass(frozen=True)
class MissingScript:
    step: str
    path: str


def plan_scripts(steps: Iterable, root: str) -> list[tuple[str, str]]:
    """(step name, script path) of every step that runs a script under ``root``."""
    prefix = str(Path(root)) + os.sep
    found = []
    for step in steps:
        scripts = [arg for arg in step.argv[1:2] if arg.startswith(prefix) and arg.endswith(".py")]
        found += [(step.name, script) for script in scripts]
    return found


def missing_scripts(steps: Iterable, root: str) -> list[MissingScript]:
    return [MissingScript(step, path) for step, path in plan_scripts(steps, root) if not Path(path).is_file()]


def example_dirs(paths: Iterable[str], root: str) -> list[str]:
    """``examples/<…>`` directories of ``paths`` (each has its own requirements.txt upstream)."""
    dirs = []
    for path in paths:
        relative = Path(path).relative_to(root).parent.as_posix()
        if relative not in dirs:
            dirs.append(relative)
    return dirs


def missing_scripts_fix(missing: list[MissingScript], root: str, version: str) -> str:
    """The commands that provide the scripts: a checkout of the pinned tag, pointed at with the
    environment variable, and each example's requirements."""
    requirements = " && ".join(
        f"pip install -r TensorRT-LLM/{d}/requirements.txt" for d in example_dirs([m.path for m in missing], root))
    return (f"git clone --branch v{version} {UPSTREAM_REPO} && {requirements} && "
            f"export {ENV_VAR}=$PWD/TensorRT-LLM (or pass --trtllm-root / set trtllm_root); "
            f"inside the NGC 1.2.x image the scripts are under /app/examples")


def missing_scripts_message(missing: list[MissingScript], root: TrtllmRoot) -> str:
    where = {"cli": "--trtllm-root", "config": "trtllm_root", "env": f"${ENV_VAR}",
             "ngc-image": "the NGC image layout", "default": "the default (no /app/examples here)"}[root.source]
    lines = [f"{m.path} (step {m.step})" for m in missing]
    return f"TensorRT-LLM examples root {root.path} (from {where}) lacks scripts the plan runs: " + "; ".join(lines)
