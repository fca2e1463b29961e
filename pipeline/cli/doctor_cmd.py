"""`specdeploy doctor [CONFIG]`: what this machine can run; with CONFIG, the live preflight.

Reads installed package metadata (never imports torch or TensorRT-LLM), the tritonserver install
(``pipeline.serve.tritonserver_install.find_tritonserver``) and GPUs through NVML (``pynvml`` when
importable). Prints a table, or JSON with ``--json``; writes nothing. Without CONFIG it always
exits 0: missing pieces are reported, not raised. With CONFIG it runs the live preflight of that
config after the table — :func:`pipeline.cli.validate_cmd.report_host_preflight`, the one function
``validate CONFIG --live`` runs too (validate's findings, checkpoints included, and the live rows) —
and exits 2 when the config itself is wrong, 5 (an environment failure, docs/ci.md) when a
host check fails.
"""

from __future__ import annotations

import json
import platform
import sys
from importlib import metadata
from typing import Optional

import typer

PACKAGES = (
    ("torch", ("torch",)),
    ("tritonclient", ("tritonclient",)),
    ("locust", ("locust",)),
    ("TensorRT-LLM", ("tensorrt-llm", "tensorrt_llm")),
    ("nvidia-pytriton", ("nvidia-pytriton",)),
    ("tokenizers", ("tokenizers",)),
    ("transformers", ("transformers",)),
    ("pydantic", ("pydantic",)),
)
NOT_INSTALLED = "not installed"


def register(app: typer.Typer) -> None:
    @app.command("doctor", help="Show versions, where tritonserver comes from, and GPUs.")
    def doctor_command(
        config: Optional[str] = typer.Argument(None, help="A deployment config: also run its live preflight."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        trtllm_root: Optional[str] = typer.Option(None, "--trtllm-root", help="Directory holding TensorRT-LLM's "
                                                  "examples/ (as for validate)."),
    ) -> int:
        report = collect()
        if config is not None:
            return _doctor_config(config, report, as_json, trtllm_root)
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            _print(report)
        return 0


def _doctor_config(config: str, report: dict, as_json: bool, trtllm_root: str | None) -> int:
    """The machine report, then the host preflight of ``config``: the very function and printing
    of ``validate CONFIG --live``."""
    from pipeline.cli.validate_cmd import report_host_preflight
    from pipeline.config import load_config

    return report_host_preflight(load_config(config), trtllm_root, as_json, extra=report, print_extra=_print)


def package_version(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return NOT_INSTALLED


def triton_report() -> dict:
    from pipeline.errors import SpecdeployError
    from pipeline.serve.tritonserver_install import find_tritonserver

    try:
        install = find_tritonserver()
    except SpecdeployError as exc:
        return {"found": False, "problem": str(exc)}
    return {
        "found": True,
        "source": install.source,
        "binary": str(install.binary),
        "backend_dir": str(install.backend_dir),
        "python_version": install.python_version,
        "stub_for_this_python": str(install.stub_path) if install.stub_path else None,
        "stub_versions": install.available_stub_versions,
        "stub_placed": str(install.placed_stub),
        "stub_in_place": install.stub_in_place,
        "stub_matches_python": install.placed_stub_matches,
        "library_dirs": [str(p) for p in install.library_dirs],
    }


def gpu_report() -> dict:
    try:
        import pynvml
    except ImportError:
        return {"nvml": "pynvml not installed", "gpus": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses vary by driver
        return {"nvml": f"unavailable ({exc})", "gpus": []}
    try:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - a driver in a bad state fails even the count
            return {"nvml": f"unavailable ({type(exc).__name__}: {exc})", "gpus": []}
        return {"nvml": "ok", "driver": _driver(pynvml), "gpus": [_gpu(pynvml, index) for index in range(count)]}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a half-broken NVML must not hide the report
            pass


def _gpu(pynvml, index: int) -> dict:
    """One GPU's row; a GPU NVML cannot read (NVMLError_GpuIsLost, _Unknown: fallen off the bus)
    is reported with its error instead of raising."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses are generated per error code
        return {"index": index, "error": f"{type(exc).__name__}: {exc}"}
    return {"index": index, "name": name.decode() if isinstance(name, bytes) else name,
            "compute_capability": f"{major}.{minor}", "memory_gib": round(memory.total / 1024**3, 1)}


def _driver(pynvml) -> str:
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # noqa: BLE001 - NVMLError subclasses are generated per error code
        return f"unknown ({type(exc).__name__})"
    return version.decode() if isinstance(version, bytes) else version


def collect() -> dict:
    from pipeline.validate.served_packages import doctor_report

    return {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "packages": {label: package_version(names) for label, names in PACKAGES},
        "served_model_packages": doctor_report(),
        "tritonserver": triton_report(),
        "gpus": gpu_report(),
    }


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=160)
    table = Table(title="specdeploy doctor", show_header=False)
    table.add_column("item", style="bold", no_wrap=True)  # labels stay whole; long values fold
    table.add_column("value", overflow="fold")
    table.add_row("Python", f"{report['python']['version']} ({report['python']['executable']})")
    table.add_row("platform", report["platform"])
    for label, version in report["packages"].items():
        table.add_row(label, version)
    from pipeline.validate.served_packages import doctor_rows

    for label, value in doctor_rows(report["served_model_packages"]):
        table.add_row(label, value)
    triton = report["tritonserver"]
    if triton["found"]:
        table.add_row("tritonserver", f"{triton['binary']} (from {triton['source']})")
        table.add_row("backends", triton["backend_dir"])
        stub = triton["stub_for_this_python"] or f"missing for Python {triton['python_version']} (have: {', '.join(triton['stub_versions']) or 'none'})"
        table.add_row(f"python stub {triton['python_version']}", stub)
        if triton["stub_matches_python"]:
            placed = f"present, built for Python {triton['python_version']}"
        elif triton["stub_in_place"]:
            placed = f"present but NOT the Python {triton['python_version']} stub (serve replaces it)"
        else:
            placed = "not yet placed (serve copies it)"
        table.add_row("backends/python stub", f"{triton['stub_placed']}: {placed}")
    else:
        table.add_row("tritonserver", triton["problem"])
    gpus = report["gpus"]
    if gpus["gpus"]:
        for gpu in gpus["gpus"]:
            if "error" in gpu:
                table.add_row(f"GPU {gpu['index']}", f"unreadable: {gpu['error']} (lost or fallen off the bus: "
                              "dmesg shows Xid 79; reset it with nvidia-smi -r or reboot)")
            else:
                table.add_row(f"GPU {gpu['index']}", f"{gpu['name']}, sm {gpu['compute_capability']}, {gpu['memory_gib']} GiB")
    else:
        table.add_row("GPUs", f"none ({gpus['nvml']})")
    console.print(table)
