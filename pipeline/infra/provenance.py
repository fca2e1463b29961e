"""Where a result came from: the checkout's git SHA and installed package versions, recorded by
``build`` (manifest) and ``loadtest`` (run.json). Reads git and the installed distributions'
metadata; writes nothing."""

from __future__ import annotations

import platform
import subprocess
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
    from importlib import metadata  # noqa: PLC0415

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
