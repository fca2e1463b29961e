"""The one way specdeploy replaces a file: write a sibling ``<name>.tmp-<pid>`` and rename it over
the target, so a reader never sees half a file and a killed writer leaves the old one in place.
Reads nothing; writes the path it is given."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename is None or exc.filename == str(tmp):
            # a failed write() names no file, a failed open the temporary one: name the file meant
            exc.filename, exc.filename2 = str(path), None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any, *, indent: int = 2,
                      default: Callable[[Any], Any] | None = None) -> None:
    write_text_atomic(path, json.dumps(data, indent=indent, default=default) + "\n")
