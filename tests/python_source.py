"""Parsed Python source, cached per test process: the guard tests (tests/unit/methods/test_methods.py,
tests/unit/project/test_import_cycles.py, tests/unit/facts/test_facts.py) each walk every module of pipeline/, and parsing was most
of their cost. Keyed by the file's text, so a file that changed (the planted violations) is parsed
again. The walks only read the trees."""

from __future__ import annotations

import ast
import functools
from pathlib import Path


@functools.cache
def parsed(text: str) -> ast.Module:
    return ast.parse(text)


def tree(path: Path) -> ast.Module:
    return parsed(path.read_text(encoding="utf-8"))
