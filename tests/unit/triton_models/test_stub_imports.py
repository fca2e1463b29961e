"""What a served Python model loads at start-up: every model of the CPU repository imports its code
in a fresh interpreter (as Triton's stub does, with the real ``triton_python_backend_utils``)
without torch. Only the engine worker process loads the engine and torch; an engine stub that
imported it too paid about two CPU seconds per engine model at every server start."""

from __future__ import annotations

import subprocess
import sys

from pipeline.paths import PROJECT_ROOT
from pipeline.serve.tritonserver_install import find_tritonserver

STUB_MODULES = ["pipeline.triton_models.llm", "pipeline.triton_models.bls", "pipeline.triton_models.preprocessing",
                "pipeline.triton_models.postprocessing", "pipeline.reference.worker"]


def loaded(modules: list[str]) -> set[str]:
    """Of torch, transformers and pydantic, the ones importing ``modules`` loads."""
    backend_utils = find_tritonserver().backend_dir / "python"  # triton_python_backend_utils.py
    code = ("import importlib, sys\n"
            f"for name in {modules!r}: importlib.import_module(name)\n"
            "print(' '.join(m for m in ('torch', 'transformers', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={"PYTHONPATH": str(backend_utils), "PATH": "/usr/bin:/bin"}, cwd=PROJECT_ROOT)
    return set(out.stdout.split())


def test_no_stub_module_imports_torch():
    assert loaded(STUB_MODULES) == set()


def test_the_check_sees_a_heavy_import():
    """Negative control: the engine descriptor's module loads pydantic (torch would cost the
    quick tier's whole per-test budget to show the same)."""
    assert loaded(["pipeline.artefacts.engine"]) == {"pydantic"}
