"""A fake container root with the layout of NGC ``tritonserver:26.04-trtllm-python-py3`` (TRT-LLM 1.2.1).

What the image holds, per tensorrtllm_backend@r26.04 ``dockerfile/Dockerfile.triton.trt_llm_backend``:
``/app/{scripts,all_models,client,tools,examples}`` copied from the TensorRT-LLM checkout, the
``tensorrt_llm`` wheel in the interpreter's site-packages, and its console scripts
(``trtllm-build``) on PATH. :func:`make_container` lays that out under a temporary directory:

- ``<root>/app/examples/…``: a stand-in script at every path the project's plans run (and each
  example's ``requirements.txt``), each forwarding to :mod:`build_tools`;
- ``<root>/usr/local/bin``: ``trtllm-build`` and ``python3`` (the image's interpreter; here the
  test interpreter, which has torch, as the image's has); the serve side adds ``mpirun``,
  ``tritonserver`` and ``nvidia-smi`` with :meth:`FakeContainer.install_command`;
- ``<root>/site-packages``: a ``tensorrt_llm`` package and dist-info reporting the version, with
  ``llmapi/llm_args.py`` from :mod:`trtllm_llm_args` (the LLM-args classes the live preflight loads
  ``model.yaml`` into), and a ``pynvml`` stand-in (:mod:`fake_nvml`) reporting the simulated GPUs;
- ``<root>/opt/tritonserver``: ``bin/tritonserver`` and the ``backends/{tensorrtllm,python}``
  directories the image has; :meth:`FakeContainer.environ` sets ``NVIDIA_TRITON_SERVER_VERSION``
  as the image does.

Every stand-in appends one JSON line per call to :attr:`FakeContainer.log`. Reads nothing of the
host but the interpreter path; writes only under the given directory.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

GPU_SIM_DIR = Path(__file__).resolve().parent
IMAGE_APP_DIRS = ("scripts", "all_models", "client", "tools", "examples")
# examples/<path> the project's 1.2.x plans run → the build_tools stand-in behind it
EXAMPLE_SCRIPTS = {
    "quantization/quantize.py": "quantization/quantize.py",
    "models/core/llama/convert_checkpoint.py": "models/core/llama/convert_checkpoint.py",
    "medusa/convert_checkpoint.py": "medusa/convert_checkpoint.py",
    "eagle/convert_checkpoint.py": "eagle/convert_checkpoint.py",
    "eagle/quantize.py": "eagle/quantize.py",
}

_SCRIPT = '''#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM {version} {what} (GPU-host simulation, tests/gpu_sim)."""
import sys

sys.path.insert(0, {gpu_sim!r})
from build_tools import main  # noqa: E402 - after the sys.path set-up above

sys.exit(main({tool!r}, sys.argv[1:]))
'''


@dataclass
class FakeContainer:
    root: Path  # stands for the container's /
    version: str = "1.2.1"
    triton_tag: str = "26.04"

    @property
    def app(self) -> Path:
        return self.root / "app"

    @property
    def examples(self) -> Path:
        return self.app / "examples"

    @property
    def bin_dir(self) -> Path:
        return self.root / "usr" / "local" / "bin"

    @property
    def site_dir(self) -> Path:
        return self.root / "site-packages"

    @property
    def log(self) -> Path:
        return self.root / "gpu-sim.jsonl"

    def records(self, tool: str | None = None) -> list[dict]:
        if not self.log.is_file():
            return []
        entries = [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line]
        return [e for e in entries if tool is None or e["tool"] == tool]

    def install_command(self, name: str, text: str) -> Path:
        """An executable at ``usr/local/bin/<name>`` (for the serve-side stand-ins too)."""
        path = self.bin_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def tool_launcher(self, tool: str, what: str) -> str:
        return _SCRIPT.format(version=self.version, what=what, gpu_sim=str(GPU_SIM_DIR), tool=tool)

    @property
    def backends(self) -> Path:
        return self.root / "opt" / "tritonserver" / "backends"

    def environ(self) -> dict[str, str]:
        """Variables a test sets so ``specdeploy`` on this host sees the image's tools (the child
        interpreters of the live preflight find ``tensorrt_llm`` through PYTHONPATH, as the image's
        interpreter finds it in its site-packages)."""
        return {"PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "GPU_SIM_LOG": str(self.log),
                "GPU_SIM_TRTLLM_VERSION": self.version, "PYTHONPATH": str(self.site_dir),
                "SPECDEPLOY_TRITON_BACKENDS": str(self.backends), "SPECDEPLOY_TRITONSERVER":
                str(self.root / "opt" / "tritonserver" / "bin" / "tritonserver"),
                "NVIDIA_TRITON_SERVER_VERSION": self.triton_tag}

    def apply(self, monkeypatch, *, examples_root_env: bool = True) -> None:
        """Enter the container for the rest of a test: PATH, the tensorrt_llm package, the log and
        (unless turned off) ``$SPECDEPLOY_TRTLLM_ROOT`` pointing at the image's /app."""
        for key, value in self.environ().items():
            monkeypatch.setenv(key, value)
        monkeypatch.syspath_prepend(str(self.site_dir))
        if examples_root_env:
            monkeypatch.setenv("SPECDEPLOY_TRTLLM_ROOT", str(self.app))
        else:
            monkeypatch.delenv("SPECDEPLOY_TRTLLM_ROOT", raising=False)


def _install_examples(box: FakeContainer, omit: tuple[str, ...]) -> None:
    for relative, tool in EXAMPLE_SCRIPTS.items():
        path = box.examples / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "requirements.txt").write_text("# stand-in: the image's example requirements\n")
        if relative not in omit:
            path.write_text(box.tool_launcher(tool, f"examples/{relative}"), encoding="utf-8")


def _install_wheel(box: FakeContainer) -> None:
    package = box.site_dir / "tensorrt_llm"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(f'"""Stand-in for the tensorrt_llm wheel (GPU-host simulation)."""\n'
                                         f'__version__ = "{box.version}"\n')
    dist = box.site_dir / f"tensorrt_llm-{box.version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {box.version}\n")
    (package / "llmapi").mkdir(exist_ok=True)
    (package / "llmapi" / "__init__.py").write_text("")
    shutil.copyfile(GPU_SIM_DIR / "trtllm_llm_args.py", package / "llmapi" / "llm_args.py")
    shutil.copyfile(GPU_SIM_DIR / "fake_nvml.py", box.site_dir / "pynvml.py")


_TRITONSERVER = """#!/bin/sh
echo "stand-in for the tritonserver of NGC {tag}-trtllm-python-py3: the live preflight does not run it" >&2
exit 1
"""


def _install_triton(box: FakeContainer) -> None:
    for backend, library in (("tensorrtllm", "libtriton_tensorrtllm.so"), ("python", "libtriton_python.so")):
        (box.backends / backend).mkdir(parents=True, exist_ok=True)
        (box.backends / backend / library).write_bytes(b"stand-in\n")
    binary = box.root / "opt" / "tritonserver" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text(_TRITONSERVER.format(tag=box.triton_tag), encoding="utf-8")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_container(base: Path, *, omit: tuple[str, ...] = (), version: str = "1.2.1") -> FakeContainer:
    """Lay out the image under ``base`` (``omit``: example scripts to leave out, as in an image
    whose /app lacks them)."""
    box = FakeContainer(Path(base), version)
    for name in IMAGE_APP_DIRS:
        (box.app / name).mkdir(parents=True, exist_ok=True)
    _install_examples(box, omit)
    _install_wheel(box)
    _install_triton(box)
    box.install_command("trtllm-build", f"#!{sys.executable}\n" + box.tool_launcher("trtllm-build", "trtllm-build")
                        .split("\n", 1)[1])
    box.install_command("python3", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    return box
