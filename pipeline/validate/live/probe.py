"""Run a short Python snippet in a child interpreter (the one that runs TensorRT-LLM) and read the
one JSON line it prints after a marker.

Which interpreter: ``$SPECDEPLOY_TRTLLM_PYTHON`` when set, else the ``python3`` first on PATH —
the one the build plan runs (:data:`pipeline.trtllm.commands.PYTHON`) and, in the NGC image, the one
whose site-packages hold ``tensorrt_llm`` (``/opt/venv-tritonserver/bin/python3``) — else this
process's own. Importing ``tensorrt_llm`` loads CUDA libraries and prints a banner on stdout; doing it
in a child keeps this process clean and lets a broken install fail as a message rather than a crash.
Reads the child's stdout; writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

from pipeline.trtllm.commands import PYTHON

MARKER = "SPECDEPLOY-LIVE-JSON:"
PROBE_TIMEOUT_S = 300.0  # a first tensorrt_llm import on a cold container can take a minute
ENV_PYTHON = "SPECDEPLOY_TRTLLM_PYTHON"


def python_executable() -> str:
    """The interpreter that runs TensorRT-LLM (see the module docstring for the order)."""
    return os.environ.get(ENV_PYTHON) or shutil.which(PYTHON) or sys.executable


def python_source() -> str:
    """Where :func:`python_executable` came from, for a row's "from" column."""
    if os.environ.get(ENV_PYTHON):
        return f"${ENV_PYTHON}"
    return f"{PYTHON} on PATH" if shutil.which(PYTHON) else "this interpreter"


def run_probe(code: str, payload: Any = None) -> tuple[dict[str, Any] | None, str]:
    """(the JSON the snippet printed, or None; the last stderr/stdout lines for a message)."""
    try:
        proc = subprocess.run([python_executable(), "-c", code], input=json.dumps(payload), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{python_executable()} does not run: {exc}"
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):]), ""
    tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-3:]
    return None, " | ".join(tail) or f"exit {proc.returncode}"
