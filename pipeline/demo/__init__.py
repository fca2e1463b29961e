"""The built-in demo models: ``builtin:tiny-target`` / ``tiny-draft`` / ``tiny-medusa`` / ``tiny-eagle`` /
``tiny-eagle3``.

Reads the shipped artifacts (``artifacts/<name>/`` + ``artifacts/SHA256SUMS.txt``) or, where a shipped
directory is missing, a cache (``$SPECDEPLOY_CACHE`` or ``~/.cache/specdeploy/demo``) that is
filled by training the full recipe on first use. :func:`resolve_builtin` returns a checkpoint
directory only after every file's sha256 matched the recorded one; a mismatch raises a
:class:`SpecdeployError` naming the file and how to restore or retrain it. Nothing here imports
torch unless training is needed.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from pipeline.errors import SpecdeployError, UsageError

BUILTIN_NAMES = ("tiny-target", "tiny-draft", "tiny-medusa", "tiny-eagle", "tiny-eagle3")
ARTIFACTS_DIR = Path(__file__).resolve().parent / "artifacts"
SUMS_FILE = "SHA256SUMS.txt"  # .txt: shipped as package data (pyproject globs)
WEIGHT_FILES = {
    "tiny-target": "model.safetensors",
    "tiny-draft": "model.safetensors",
    "tiny-medusa": "medusa_lm_head.safetensors",
    "tiny-eagle": "model.safetensors",
    "tiny-eagle3": "model.safetensors",
}

_verified: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) → sha256, per process


def cache_dir() -> Path:
    """Where demo models trained on first use go."""
    env = os.environ.get("SPECDEPLOY_CACHE")
    return Path(env).expanduser() / "demo" if env else Path.home() / ".cache" / "specdeploy" / "demo"


def _normalise(name: str) -> str:
    bare = name.removeprefix("builtin:").strip()
    if bare not in BUILTIN_NAMES:
        raise UsageError(f"unknown demo model 'builtin:{bare}'; built-in models: " + ", ".join(f"builtin:{n}" for n in BUILTIN_NAMES))
    return bare


def read_sums(root: Path) -> dict[str, str]:
    """``root/SHA256SUMS.txt`` → {"tiny-target/model.safetensors": sha256, …} ({} when absent)."""
    path = root / SUMS_FILE
    if not path.is_file():
        return {}
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, rel = line.split(None, 1)
            sums[rel.strip().lstrip("*")] = digest
    return sums


def _sha256(path: Path) -> str:
    from pipeline.demo.saving import sha256_file

    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _verified:
        _verified[key] = sha256_file(path)
    return _verified[key]


def _retrain_hint(root: Path) -> str:
    if root == ARTIFACTS_DIR:
        return f"restore it with `git checkout -- {root}` or retrain with `specdeploy demo train --out {root}`"
    return f"delete {root} to retrain on next use, or run `specdeploy demo train --out {root}`"


def verify_artifact(name: str, root: Path | None = None) -> Path:
    """Check every recorded file of ``name`` under ``root`` (default: the shipped artifacts)
    against its sha256; returns the model directory."""
    name = _normalise(name)
    root = ARTIFACTS_DIR if root is None else root
    model_dir = root / name
    sums = {rel: d for rel, d in read_sums(root).items() if rel.startswith(f"{name}/")}
    if f"{name}/{WEIGHT_FILES[name]}" not in sums:
        raise SpecdeployError(f"demo model '{name}': no recorded sha256 for its weights in {root / SUMS_FILE}; {_retrain_hint(root)}")
    for rel, expected in sorted(sums.items()):
        path = root / rel
        if not path.is_file():
            raise SpecdeployError(f"demo model '{name}' is incomplete: {path} is missing; {_retrain_hint(root)}")
        actual = _sha256(path)
        if actual != expected:
            raise SpecdeployError(
                f"demo model '{name}' is corrupted: {path} has sha256 {actual[:16]}…, recorded {expected[:16]}…; "
                + _retrain_hint(root)
            )
    return model_dir


def _train_into_cache(root: Path) -> None:
    from pipeline.demo import train

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be training the same cache
        if all((root / n / WEIGHT_FILES[n]).is_file() for n in BUILTIN_NAMES) and (root / SUMS_FILE).is_file():
            return
        print(f"specdeploy: demo models not shipped; training them into {root} (a few minutes, once)", file=sys.stderr)
        train.train_all(root, train.FULL, show_progress=sys.stderr.isatty())
    shipped = read_sums(ARTIFACTS_DIR)
    if shipped and any(shipped.get(rel) not in (None, digest) for rel, digest in read_sums(root).items()):
        print(
            "specdeploy: note: the demo models trained here differ bit-wise from the recorded ones "
            "(another CPU type or library version); they are verified against their own SHA256SUMS.txt",
            file=sys.stderr,
        )


def resolve_builtin(name: str) -> Path:
    """Checkpoint directory of a ``builtin:`` demo model (with or without the prefix), hash-verified."""
    name = _normalise(name)
    if (ARTIFACTS_DIR / name).is_dir():
        return verify_artifact(name, ARTIFACTS_DIR)
    root = cache_dir()
    if not (root / name / WEIGHT_FILES[name]).is_file() or not (root / SUMS_FILE).is_file():
        _train_into_cache(root)
    return verify_artifact(name, root)
