"""Where a result came from: the checkout's git SHA and installed package versions, recorded by
``build`` (manifest) and ``loadtest`` (run.json). Reads git and the installed distributions'
metadata; writes nothing."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def git_sha(root: Path = PROJECT_ROOT) -> str | None:
    """HEAD of the checkout, or None outside a git checkout (an installed wheel)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=str(root), capture_output=True, text=True,
                                timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed (a distribution can go by
    two spellings, e.g. tensorrt_llm / tensorrt-llm); None when none is."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions(dists: tuple[str, ...]) -> dict[str, str | None]:
    """``{"python": ..., dist: version or None, ...}``."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    out.update({dist: package_version(dist) for dist in dists})
    return out


def result_provenance(argv: list[str] | None = None, root: Path = PROJECT_ROOT) -> dict:
    """The ``provenance`` block every benchmark result records: the command that wrote it, the
    checkout it ran on (HEAD and whether the tree had changes), when, and on what machine. A
    result file without it cannot be reproduced (tests/unit/benchmarks/test_benchmark_results.py)."""
    argv = list(sys.argv if argv is None else argv)
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {
        "command": shlex.join(argv),
        "commit": git_sha(root),
        "commit_of": "the checkout the command ran in",
        "tree_dirty": None if status is None else bool(status.strip()),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.machine(),
                    "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": [round(x, 2) for x in os.getloadavg()]},
    }


def _git(root: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=str(root), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None
