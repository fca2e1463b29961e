"""Simulated GPU hosts for the live preflight: an honest one (the NGC image as
``container.py`` lays it out, the GPUs of the config's hardware profile idle, the checkpoints the
config names as their repositories ship them) and the realistic mistakes a host can carry, each a
function that breaks one thing the way it breaks on a real host.

:class:`Host` is entered for one test (PATH, the image's variables, NVML's GPUs); :data:`MISTAKES`
maps a mistake to (how to make it, the row that must fail, words its found column and fix must
hold). Reads the shipped configs; writes under the test's directory.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from pipeline.config import DeploymentConfig, load_config
from pipeline.paths import PROJECT_ROOT
from tests.gpu_sim import checkpoints as ck
from tests.gpu_sim.container import IMAGES, FakeContainer, make_container, write_dist

CONFIGS = PROJECT_ROOT / "configs"
GPU_CONFIGS = sorted(p.stem for p in CONFIGS.glob("*.yaml") if not p.stem.startswith("tiny-cpu-"))
ENGINE = "llama31-8b-draft1b-fp8-h100"  # quantize.py + trtllm-build, target and draft checkpoints
EAGLE3 = "llama31-8b-eagle3-llmapi-h100"  # LLM API, speculative_model + Eagle3
TP2 = "llama31-70b-draft8b-llmapi-h100"  # two GPUs, triton.gpus [0, 1]
A100 = "llama31-70b-draft8b-int4awq-tp4-a100"
# NVML's name and total (MiB) of the GPU each profile of the shipped configs describes
IMAGES_TRITON = {tag: entry["triton"] for tag, entry in IMAGES["images"].items() if tag != "source"}
PROFILE_GPU = {"h100-sxm-80gb": ("NVIDIA H100 80GB HBM3", 81559), "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920)}


@dataclass
class Host:
    box: FakeContainer
    tmp: Path
    monkeypatch: object
    gpus: list[dict] = field(default_factory=list)
    sleeper: subprocess.Popen | None = None

    def use_gpus(self, hardware: str, count: int = 8) -> None:
        name, mib = PROFILE_GPU[hardware]
        self.gpus = [{"name": name, "mib": mib} for _ in range(count)]
        self.sync()

    def sync(self) -> None:
        self.monkeypatch.setenv("GPU_SIM_NVML_JSON", json.dumps(self.gpus))
        self.monkeypatch.setenv("GPU_SIM_SM", "80" if "A100" in self.gpus[0]["name"] else "90")

    def config_path(self, name: str, **changes) -> Path:
        data = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text(encoding="utf-8"))
        data.setdefault("triton", {})["container_image"] = self.box.image
        for key, value in changes.items():
            data[key] = value
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(ck.localise(data, self.tmp / "models")), encoding="utf-8")
        return path

    def config(self, name: str, **changes) -> DeploymentConfig:
        return load_config(self.config_path(name, **changes), self.tmp)

    def other_process(self) -> int:
        """A real process on this machine (``sleep``) to stand for one holding GPU memory."""
        if self.sleeper is None:
            self.sleeper = subprocess.Popen(["sleep", "600"])
        return self.sleeper.pid

    def close(self) -> None:
        if self.sleeper is not None:
            self.sleeper.kill()
            self.sleeper.wait()


def enter(tmp_path: Path, monkeypatch, tag: str = "26.04", hardware: str = "h100-sxm-80gb", **kwargs) -> Host:
    box = make_container(tmp_path / f"image-{tag}", tag=tag, **kwargs)
    box.apply(monkeypatch)
    for key in ("GPU_SIM_NVML", "GPU_SIM_LLM_ARGS_BUILD", "SPECDEPLOY_TRTLLM_PYTHON"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    host = Host(box, tmp_path, monkeypatch)
    host.use_gpus(hardware)
    return host


# ----------------------------------------------------------------------------------------------
# The mistakes: each breaks one thing as it breaks on a real host


def _gpu_variant(name: str, mib: int) -> Callable[[Host], None]:
    def apply(host: Host) -> None:
        for gpu in host.gpus:
            gpu.update(name=name, mib=mib)
        host.sync()
    return apply


def memory_held(host: Host) -> None:
    """Another process (a notebook, a stale server) holds 60 GiB of GPU 0."""
    host.gpus[0]["processes"] = [{"pid": host.other_process(), "mib": 61440}]
    host.sync()


def mig_enabled(host: Host) -> None:
    host.gpus[0]["mig"] = True
    host.sync()


def lost_gpu(host: Host) -> None:
    """GPU 7 fell off the bus: NVML answers NVMLError_GpuIsLost for it (not a GPU the plan uses)."""
    host.gpus[7]["lost"] = "GpuIsLost"
    host.sync()


def fallen_off_planned_gpu(host: Host) -> None:
    host.gpus[1]["lost"] = "Unknown"
    host.sync()


def one_gpu(host: Host) -> None:
    host.gpus = host.gpus[:1]
    host.sync()


def no_driver(host: Host) -> None:
    host.monkeypatch.setenv("GPU_SIM_NVML", "none")
    host.monkeypatch.delenv("GPU_SIM_NVML_JSON")


def tritonserver_of_another_release(host: Host) -> None:
    """A 25.12 tritonserver (2.64.0) installed under /usr/local/tritonserver, first on PATH; the
    environment still says the image's release."""
    other = host.box.root / "usr" / "local" / "tritonserver"
    (other / "bin").mkdir(parents=True, exist_ok=True)
    binary = other / "bin" / "tritonserver"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(0o755)
    (other / "TRITON_VERSION").write_text("2.64.0\n")
    host.monkeypatch.setenv("PATH", f"{other / 'bin'}:{host.box.environ()['PATH']}")


def no_mpirun(host: Host) -> None:
    (host.box.bin_dir / "mpirun").unlink()


def backend_without_library(host: Host) -> None:
    (host.box.backends / "tensorrtllm" / "libtriton_tensorrtllm.so").unlink()


def python_backend_without_stub(host: Host) -> None:
    (host.box.backends / "python" / "triton_python_backend_stub").unlink()


def _replace_dist(site: Path, name: str, version: str) -> None:
    """``pip install name==version`` over the image's: the new release's metadata (its requirements
    kept: transformers 5.x still requires tokenizers and safetensors)."""
    requires = []
    for old in site.glob(f"{name}-*.dist-info"):
        requires = [line.removeprefix("Requires-Dist: ") for line in (old / "METADATA").read_text().splitlines()
                    if line.startswith("Requires-Dist: ")]
        for item in old.iterdir():
            item.unlink()
        old.rmdir()
    write_dist(site, name, version, requires)


def transformers_replaced(host: Host) -> None:
    """`pip install -e .[serving]` (the CPU path's extra) in the image: transformers 5.x replaced 4.57.1."""
    _replace_dist(host.box.site_dir, "transformers", "5.2.0")


def serving_extra_installed(host: Host) -> None:
    """`.[serving]` installed with --no-deps-like care: nvidia-pytriton present, transformers left at 4.57.1."""
    write_dist(host.box.site_dir, "nvidia-pytriton", "0.7.0")


def packages_in_another_interpreter(host: Host) -> None:
    """SPECDEPLOY_TRTLLM_PYTHON names another venv (with TensorRT-LLM) whose transformers is 5.x;
    this process (specdeploy's own interpreter) sees the image's 4.57.1."""
    other = make_container(host.tmp / "other-venv")
    _replace_dist(other.site_dir, "transformers", "5.2.0")
    host.monkeypatch.setenv("SPECDEPLOY_TRTLLM_PYTHON", str(other.python))


def no_libcuda(host: Host) -> None:
    """The container started without the driver's compute library (no --gpus all, or
    NVIDIA_DRIVER_CAPABILITIES=utility): NVML works, libcuda.so.1 is absent."""
    host.box.libcuda.unlink()


def another_tensorrt_llm(host: Host) -> None:
    init = host.box.site_dir / "tensorrt_llm" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "1.2.1"', '__version__ = "1.2.0"'))


def examples_missing(host: Host) -> None:
    """An image without /app/examples (older NGC images: tensorrtllm_backend#721, #739)."""
    (host.box.examples / "quantization" / "quantize.py").unlink()


def renamed_flag(host: Host) -> None:
    """quantize.py of a TensorRT-LLM whose parser calls --qformat --quant_format."""
    (host.box.examples / "quantization" / "quantize.py").write_text(
        "import argparse\np = argparse.ArgumentParser()\n"
        + "".join(f"p.add_argument('--{f}')\n" for f in ("model_dir", "output_dir", "dtype", "quant_format",
                                                         "kv_cache_dtype", "calib_size", "calib_dataset",
                                                         "tp_size", "pp_size"))
        + "p.parse_args()\n")


def draft_of_another_family(host: Host) -> None:
    """The draft directory holds a Qwen2.5 checkpoint (vocabulary 152064) instead of Llama-3.2-1B."""
    draft = host.tmp / "models" / "Llama-3.2-1B-Instruct"
    (draft / "config.json").write_text(json.dumps(ck.QWEN25_CODER_7B))


@dataclass(frozen=True)
class Mistake:
    make: Callable[[Host], None]
    row: str  # the one row that fails
    found: str  # words its found column holds
    fix: str  # words its fix holds
    config: str = ENGINE


MISTAKES: dict[str, Mistake] = {
    "an H100 PCIe for the H100 SXM profile": Mistake(_gpu_variant("NVIDIA H100 PCIe", 81559), "GPU model",
                                                     "NVIDIA H100 PCIe, 79.6 GiB", "set hardware: h100-pcie-80gb"),
    "A100 40 GB for the A100 80 GB profile": Mistake(_gpu_variant("NVIDIA A100-SXM4-40GB", 40960), "GPU model",
                                                     "NVIDIA A100-SXM4-40GB, 40.0 GiB", "set hardware: a100-40gb", A100),
    "an H100 NVL, which no profile describes": Mistake(_gpu_variant("NVIDIA H100 NVL", 95830), "GPU model",
                                                       "NVIDIA H100 NVL, 93.6 GiB", "no hardware profile describes"),
    "GPU memory held by another process": Mistake(memory_held, "GPU free memory", "held by pid", "stop what holds"),
    "MIG enabled": Mistake(mig_enabled, "GPU MIG mode", "MIG enabled on GPU(s) [0]", "-mig 0"),
    "a GPU lost (NVMLError_GpuIsLost)": Mistake(lost_gpu, "GPU health", "GPU 7: NVMLError_GpuIsLost: GPU is lost",
                                                "nvidia-smi -r -i 7"),
    "a planned GPU fallen off the bus": Mistake(fallen_off_planned_gpu, "GPU health", "GPU 1: NVMLError_Unknown",
                                                "Xid 79", TP2),
    "too few GPUs visible": Mistake(one_gpu, "GPU count", "1 GPU(s)", "give the container GPUs [1]", TP2),
    "no NVIDIA driver visible": Mistake(no_driver, "GPUs", "NVMLError_DriverNotLoaded", "--gpus all"),
    "a tritonserver of another release first on PATH": Mistake(tritonserver_of_another_release, "tritonserver",
                                                               "the variable claims 2.68.0, but the binary that runs is 2.64.0",
                                                               "another tritonserver comes first on PATH"),
    "no mpirun for the orchestrator launch": Mistake(no_mpirun, "mpirun", "no mpirun on PATH", "Open MPI"),
    "a tensorrtllm backend without its library": Mistake(backend_without_library, "backend tensorrtllm",
                                                         "libtriton_tensorrtllm.so absent", "SPECDEPLOY_TRITON_BACKENDS"),
    "a python backend without its stub": Mistake(python_backend_without_stub, "backend python",
                                                 "triton_python_backend_stub absent", "run inside"),
    "transformers replaced by pip": Mistake(transformers_replaced, "package transformers", "5.2.0",
                                            "install 'transformers==4.57.1'"),
    "the serving extra in the TensorRT-LLM interpreter": Mistake(serving_extra_installed, "package transformers",
                                                                 "4.57.1", "install .[gpu-host] there"),
    "packages of the interpreter SPECDEPLOY_TRTLLM_PYTHON names": Mistake(packages_in_another_interpreter,
                                                                          "package transformers", "5.2.0",
                                                                          "other-venv/opt/venv-tritonserver/bin/python3"),
    "import tensorrt_llm fails for want of libcuda.so.1": Mistake(no_libcuda, "tensorrt_llm version",
                                                                  "libcuda.so.1: cannot open shared object file",
                                                                  "docker run --gpus all"),
    "another TensorRT-LLM in the image": Mistake(another_tensorrt_llm, "tensorrt_llm version", "1.2.0",
                                                 'set trtllm_version: "1.2.0"'),
    "no example scripts in the image": Mistake(examples_missing, "parser examples/quantization/quantize.py",
                                               "no such file", "--trtllm-root"),
    "a script whose parser renamed a flag": Mistake(renamed_flag, "parser examples/quantization/quantize.py",
                                                    "--qformat is not an option", "use the TensorRT-LLM"),
    "a draft checkpoint of another family": Mistake(draft_of_another_family, "checkpoint draft", "152064",
                                                    "pick a draft from the target's model family"),
}
# a broken thing that hides another from view: the scripts' parsers cannot be asked without tensorrt_llm
MASKS = {"import tensorrt_llm fails for want of libcuda.so.1": {"parser examples/quantization/quantize.py",
                                                               "parser trtllm-build"}}
