"""A fake container root with the layout of NGC ``tritonserver:YY.MM-trtllm-python-py3`` (26.04 …
26.07: TensorRT-LLM 1.2.1), as the live preflight and the build see it.

What the image holds, per tensorrtllm_backend@rYY.MM ``dockerfile/Dockerfile.triton.trt_llm_backend``
and triton-inference-server/server@rYY.MM ``build.py`` (figures with sources: ``ngc_images.yaml``):

- ``/opt/venv-tritonserver`` — the interpreter first on PATH, whose site-packages hold the
  ``tensorrt_llm`` wheel (dist-info with the wheel's ``Requires-Dist``), torch copied from the
  PyTorch 25.12 image, transformers and the other packages at the image's versions, and what
  ``pip install -e .[gpu-host]`` adds (``specdeploy``'s dist-info generated from this checkout's
  pyproject.toml, tritonclient). Here ``bin/python3`` runs the test interpreter with ``-S`` and
  that site-packages (plus the test venv's modules, without their metadata), so package metadata
  read in it is the image's, not this machine's; ``bin/trtllm-build`` is the wheel's console script;
- ``/app/examples/…``: a stand-in script at every path the project's plans run, each forwarding to
  :mod:`build_tools` after ``import tensorrt_llm`` (as upstream's scripts do);
- ``/opt/tritonserver``: ``bin/tritonserver``, ``TRITON_VERSION`` and the ``backends/{tensorrtllm,python}``
  files Triton loads (ELF stand-ins); :meth:`FakeContainer.environ` puts ``bin`` on PATH and sets
  ``TRITON_SERVER_VERSION`` / ``NVIDIA_TRITON_SERVER_VERSION`` as the image does;
- ``/usr/lib/x86_64-linux-gnu/libcuda.so.1``, which the NVIDIA Container Toolkit mounts under
  ``--gpus all``; the ``tensorrt_llm`` stand-in fails to import without it, with the real message;
- a ``pynvml`` stand-in (:mod:`fake_nvml`) reporting the simulated GPUs, and ``nvidia-smi`` (from the
  same GPUs) and ``mpirun`` in ``/usr/local/bin``.

Every build stand-in appends one JSON line per call to :attr:`FakeContainer.log`. Reads this
checkout's pyproject.toml and ``ngc_images.yaml``; writes only under the given directory (and a
per-process directory of symlinks to the test venv's modules under the temp directory).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tomllib
import yaml

GPU_SIM_DIR = Path(__file__).resolve().parent
PYPROJECT = GPU_SIM_DIR.parents[1] / "pyproject.toml"
IMAGES = yaml.safe_load((GPU_SIM_DIR / "ngc_images.yaml").read_text(encoding="utf-8"))
SUPPORTED_TAGS = tuple(tag for tag in IMAGES["images"] if tag != "source")
IMAGE_APP_DIRS = ("scripts", "all_models", "client", "tools", "examples")
# examples/<path> the project's 1.2.x plans run → the build_tools stand-in behind it
EXAMPLE_SCRIPTS = {
    "quantization/quantize.py": "quantization/quantize.py",
    "models/core/llama/convert_checkpoint.py": "models/core/llama/convert_checkpoint.py",
    "medusa/convert_checkpoint.py": "medusa/convert_checkpoint.py",
    "eagle/convert_checkpoint.py": "eagle/convert_checkpoint.py",
    "eagle/quantize.py": "eagle/quantize.py",
}
ELF_STAND_IN = b"\x7fELF stand-in\n"

_SCRIPT = '''#!/usr/bin/env python3
"""Stand-in for TensorRT-LLM {version} {what} (GPU-host simulation, tests/gpu_sim)."""
import sys

sys.path.insert(0, {gpu_sim!r})
import tensorrt_llm  # noqa: E402, F401 - upstream's scripts import it before parsing their arguments
from build_tools import main  # noqa: E402 - after the sys.path set-up above

sys.exit(main({tool!r}, sys.argv[1:]))
'''

_TRTLLM_INIT = '''"""Stand-in for the tensorrt_llm wheel (GPU-host simulation)."""
import os

# as the real wheel: loading its CUDA libraries needs the driver library the NVIDIA Container
# Toolkit mounts (--gpus all); without it the import dies with the loader's message
if not os.path.exists({libcuda!r}):
    raise ImportError("libcuda.so.1: cannot open shared object file: No such file or directory")
__version__ = "{version}"
'''

_PYTHON = '''#!/bin/sh
# the image's interpreter: its own site-packages only (the test venv's modules, without their
# metadata, stand for the image's torch/pydantic/numpy code)
PYTHONPATH="{site}:{modules}" exec "{python}" -S "$@"
'''

_TRITONSERVER = """#!/bin/sh
echo "stand-in for the tritonserver of NGC {tag}-trtllm-python-py3: the live preflight does not run it" >&2
exit 1
"""

# Model-Optimizer examples/llm_ptq/hf_ptq.py's parser, for the flags the LLM-API plan passes
# (pipeline/plan/llmapi.py hf_ptq_argv); the script does not import tensorrt_llm
_HF_PTQ = """import argparse
parser = argparse.ArgumentParser(description="stand-in for Model-Optimizer examples/llm_ptq/hf_ptq.py")
for flag in ("--pyt_ckpt_path", "--export_path", "--qformat", "--kv_cache_qformat", "--calib_size", "--dataset",
             "--export_fmt", "--batch_size", "--device"):
    parser.add_argument(flag)
parser.add_argument("--trust_remote_code", action="store_true")
parser.parse_args()
raise SystemExit("stand-in: the live preflight reads this parser only")
"""

_NVIDIA_SMI = '''#!{python}
"""Stand-in for nvidia-smi --query-gpu=index,memory.total (GPU-host simulation): the GPUs of fake_nvml."""
import sys

sys.path.insert(0, {gpu_sim!r})
import fake_nvml  # noqa: E402 - after the sys.path set-up above

sys.exit(fake_nvml.smi_main(sys.argv[1:]))
'''


@lru_cache(maxsize=1)
def host_modules() -> Path:
    """A directory of symlinks to the test venv's importable modules, without any distribution
    metadata (made once per process): the image's interpreter imports the same code, but its
    package metadata comes only from the image's site-packages. Removed when the process exits."""
    site = Path(sysconfig.get_paths()["purelib"])
    out = Path(tempfile.mkdtemp(prefix="gpu-sim-modules-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    for entry in site.iterdir():
        if entry.suffix in (".pth",) or entry.name.endswith((".dist-info", ".egg-info")) or \
                entry.name.startswith(("__editable__", "__pycache__", "_distutils_hack")):
            continue
        (out / entry.name).symlink_to(entry)
    return out


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_dist(site: Path, name: str, version: str, requires: list[str] = (), extras: list[str] = ()) -> Path:
    """A ``<name>-<version>.dist-info`` with METADATA as pip writes it."""
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {r}" for r in requires]
    (dist / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dist


def specdeploy_requires() -> tuple[list[str], list[str]]:
    """(Requires-Dist, Provides-Extra) of this checkout, as pip would write them."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    requires = list(project["dependencies"])
    requires += [f'{req}; extra == "{extra}"' for extra, reqs in extras.items() for req in reqs]
    return requires, list(extras)


@dataclass
class FakeContainer:
    root: Path  # stands for the container's /
    version: str = "1.2.1"
    triton_tag: str = "26.04"

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.triton_tag}-trtllm-python-py3"

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
    def venv(self) -> Path:
        return self.root / "opt" / "venv-tritonserver"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python3"

    @property
    def site_dir(self) -> Path:
        return self.venv / "lib" / "python3.12" / "site-packages"

    @property
    def triton_root(self) -> Path:
        return self.root / "opt" / "tritonserver"

    @property
    def backends(self) -> Path:
        return self.triton_root / "backends"

    @property
    def libcuda(self) -> Path:
        return self.root / "usr" / "lib" / "x86_64-linux-gnu" / "libcuda.so.1"

    @property
    def modelopt(self) -> Path:
        """A Model-Optimizer checkout, as docs/gpu-llmapi.md has the user clone one for hf_ptq.py."""
        return self.root / "opt" / "Model-Optimizer"

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
        return _executable(self.bin_dir / name, text)

    def tool_launcher(self, tool: str, what: str) -> str:
        return _SCRIPT.format(version=self.version, what=what, gpu_sim=str(GPU_SIM_DIR), tool=tool)

    def install_trtllm_build(self, redirect: str = "") -> Path:
        """The wheel's console script (``redirect``: a shell redirection, e.g. ``1>&2`` for a wrapper
        that leaves the help on stderr)."""
        launcher = self.venv / "lib" / "trtllm_build_launcher.py"
        launcher.write_text(self.tool_launcher("trtllm-build", "trtllm-build"), encoding="utf-8")
        return _executable(self.venv / "bin" / "trtllm-build",
                           f'#!/bin/sh\nexec "{self.python}" "{launcher}" "$@" {redirect}\n')

    def environ(self) -> dict[str, str]:
        """Variables a test sets so ``specdeploy`` on this host sees the image's tools: PATH as the
        image's ENV lines order it, Triton's release variables, the simulation's log."""
        path = os.pathsep.join([str(self.venv / "bin"), str(self.triton_root / "bin"), str(self.bin_dir),
                                os.environ.get("PATH", "")])
        return {"PATH": path, "GPU_SIM_LOG": str(self.log), "GPU_SIM_TRTLLM_VERSION": self.version,
                "SPECDEPLOY_TRITON_BACKENDS": str(self.backends),
                "TRITON_SERVER_VERSION": IMAGES["images"][self.triton_tag]["triton"],
                "NVIDIA_TRITON_SERVER_VERSION": self.triton_tag, "SPECDEPLOY_MODELOPT_ROOT": str(self.modelopt)}

    def apply(self, monkeypatch, *, examples_root_env: bool = True) -> None:
        """Enter the container for the rest of a test: PATH, the variables, this process's view of
        the image (tensorrt_llm, pynvml) and (unless turned off) ``$SPECDEPLOY_TRTLLM_ROOT`` pointing at /app."""
        for key, value in self.environ().items():
            monkeypatch.setenv(key, value)
        for key in ("SPECDEPLOY_TRITONSERVER", "SPECDEPLOY_TRTLLM_PYTHON"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.syspath_prepend(str(self.root / "process-site"))
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


def _install_venv(box: FakeContainer) -> None:
    site = box.site_dir
    package = site / "tensorrt_llm"
    (package / "llmapi").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(_TRTLLM_INIT.format(libcuda=str(box.libcuda), version=box.version))
    (package / "llmapi" / "__init__.py").write_text("")
    shutil.copyfile(GPU_SIM_DIR / "trtllm_llm_args.py", package / "llmapi" / "llm_args.py")
    wheel = IMAGES["tensorrt_llm"].get(box.version) or IMAGES["tensorrt_llm"]["1.2.1"]
    write_dist(site, "tensorrt_llm", box.version, wheel["requires_dist"])
    write_dist(site, "torch", IMAGES["images"][box.triton_tag]["torch"])
    for name, entry in {**IMAGES["packages"], **IMAGES["gpu_host_adds"]}.items():
        write_dist(site, name, entry["version"], entry.get("requires_dist", []))
    requires, extras = specdeploy_requires()
    write_dist(site, "specdeploy", "0.1.0", requires, extras)
    _executable(box.python, _PYTHON.format(site=site, modules=host_modules(), python=sys.executable))
    box.install_trtllm_build()
    # the NVML binding, in the image's interpreter and in this process's view of it (process-site:
    # the tensorrt_llm package and pynvml, which specdeploy running inside the image finds; not the
    # image's other metadata, which would shadow this machine's for the rest of the test process)
    process_site = box.root / "process-site"
    process_site.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(GPU_SIM_DIR / "fake_nvml.py", site / "pynvml.py")
    shutil.copyfile(GPU_SIM_DIR / "fake_nvml.py", process_site / "pynvml.py")
    (process_site / "tensorrt_llm").symlink_to(package)
    write_dist(process_site, "tensorrt_llm", box.version)


def _install_triton(box: FakeContainer) -> None:
    for backend, files in (("tensorrtllm", ("libtriton_tensorrtllm.so", "trtllmExecutorWorker")),
                           ("python", ("libtriton_python.so", "triton_python_backend_stub"))):
        for name in files:
            _executable(box.backends / backend / name, "").write_bytes(ELF_STAND_IN)
    (box.backends / "python" / "triton_python_backend_utils.py").write_text("# stand-in\n")
    _executable(box.triton_root / "bin" / "tritonserver", _TRITONSERVER.format(tag=box.triton_tag))
    (box.triton_root / "TRITON_VERSION").write_text(IMAGES["images"][box.triton_tag]["triton"] + "\n")


def make_container(base: Path, *, omit: tuple[str, ...] = (), version: str = "1.2.1",
                   tag: str = "26.04") -> FakeContainer:
    """Lay out the image ``tag`` under ``base`` (``omit``: example scripts to leave out, as in an
    image whose /app lacks them; ``version``: the TensorRT-LLM it carries, to simulate another)."""
    box = FakeContainer(Path(base), version, tag)
    for name in IMAGE_APP_DIRS:
        (box.app / name).mkdir(parents=True, exist_ok=True)
    _install_examples(box, omit)
    _install_venv(box)
    _install_triton(box)
    (box.modelopt / "examples" / "llm_ptq").mkdir(parents=True, exist_ok=True)
    (box.modelopt / "examples" / "llm_ptq" / "hf_ptq.py").write_text(_HF_PTQ, encoding="utf-8")
    box.libcuda.parent.mkdir(parents=True, exist_ok=True)
    box.libcuda.write_bytes(ELF_STAND_IN)
    box.install_command("mpirun", "#!/bin/sh\necho 'stand-in for Open MPI mpirun: the live preflight does not run it' >&2\n"
                        "exit 1\n")
    box.install_command("nvidia-smi", _NVIDIA_SMI.format(python=sys.executable, gpu_sim=str(GPU_SIM_DIR)))
    return box
