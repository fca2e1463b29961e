"""Paths from a model's config as this process's file functions can open them. Reads and writes
nothing.

The Python backend's stub embeds an interpreter initialised isolated (``PyConfig_InitIsolatedConfig``:
it never calls ``setlocale`` and ignores ``LANG``/``LC_ALL``/``PYTHONUTF8``), so ``LC_CTYPE`` stays
"C" and ``sys.getfilesystemencoding()`` is ``ascii`` inside every stub, whatever the server's
environment says (observed with the nvidia-pytriton wheel's Triton 2.51 stub; docs/operations.md).
A checkpoint path such as ``/models/模型 dir/ü`` then fails every ``os.stat`` with
UnicodeEncodeError, which ``Path.is_dir()`` reports as "does not exist". Linux paths are bytes and
the config holds them as UTF-8 text, so :func:`fs_path` re-encodes the text to those bytes and
decodes them the way this interpreter's ``os`` functions encode names (``os.fsdecode``:
surrogate escapes under ASCII), which names the same file. Under a UTF-8 filesystem encoding
(every ordinary Python, the engine worker, the tests) it is the identity."""

from __future__ import annotations

import os
from pathlib import Path


def fs_path(path: str | Path) -> Path:
    """``path`` (UTF-8 text, as config.pbtxt and engine.json hold it) as a Path this process's
    ``os`` functions reach."""
    text = str(path)
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # already surrogate-escaped: in this process's encoding
        return Path(text)
    return Path(os.fsdecode(raw))


def read_text(path: Path) -> str:
    """A UTF-8 file read by Python's own ``open``: libraries that take a path and open it natively
    (HF ``tokenizers``' Rust ``from_file``) refuse a surrogate-escaped name."""
    return Path(path).read_text(encoding="utf-8")
