"""Options several commands share."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def workdir_option() -> Optional[Path]:
    """``--workdir``: the output root of a command that writes (or reads) ``engines/NAME/`` and
    ``reports/NAME/``; the same directory must be given to every stage of one deployment."""
    return typer.Option(
        None, "--workdir", file_okay=False,
        help="Output root: engines/NAME/ and reports/NAME/ go under it (default: the current directory).")
