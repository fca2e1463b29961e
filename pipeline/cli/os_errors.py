"""One line for an operating-system error that ends a command: disk full, permission denied, a
file where a directory should be. ``pipeline.cli.main`` prints it instead of the traceback (which
says where in specdeploy the write was, what the user cannot act on) with the environment-failure
exit code; the path and the reason are what they can act on. Reads and writes nothing."""

from __future__ import annotations

from typing import Iterable, Sequence


def stage_of(argv: Sequence[str], commands: Iterable[str]) -> str:
    """The command ``argv`` runs (its first word naming one of ``commands``)."""
    names = set(commands)
    return next((a for a in argv if a in names), "specdeploy")


def os_error_line(stage: str, exc: OSError) -> str:
    """``<stage>: <reason>: <path>[ -> <path2>]`` (no path when the error names none)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{stage}: {reason}" + (f": {' -> '.join(paths)}" if paths else "")
