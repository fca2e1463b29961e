"""Run a short Python snippet in a child interpreter (the one that has TensorRT-LLM) and read the
one JSON line it prints after a marker.

Importing ``tensorrt_llm`` loads CUDA libraries and prints a banner on stdout; doing it in a child
keeps this process clean and lets a broken install fail as a message rather than a crash.
Reads the child's stdout; writes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

MARKER = "SPECDEPLOY-LIVE-JSON:"
PROBE_TIMEOUT_S = 300.0  # a first tensorrt_llm import on a cold container can take a minute


def python_executable() -> str:
    """The interpreter that runs TensorRT-LLM: ``$SPECDEPLOY_TRTLLM_PYTHON``, else this one."""
    return os.environ.get("SPECDEPLOY_TRTLLM_PYTHON") or sys.executable


def run_probe(code: str, payload: Any = None) -> tuple[dict[str, Any] | None, str]:
    """(the JSON the snippet printed, or None; the last stderr/stdout lines for a message)."""
    try:
        proc = subprocess.run([python_executable(), "-c", code], input=json.dumps(payload), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):]), ""
    tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-3:]
    return None, " | ".join(tail) or f"exit {proc.returncode}"
