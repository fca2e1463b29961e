"""The lint policy the code follows (pyproject.toml [tool.ruff]): a rule is switched off for a whole
area only in ``per-file-ignores``, with the reason in a comment above the entry; anywhere else a
``  # noqa: CODE - `` carries its reason after the code (``# noqa: PLC0415 - torch is optional here``).
This test is the check: a reason-less marker, or an area ignore without a reason, fails it.

A function-level import (``PLC0415``) stays inside its function for one of two reasons only, and its
reason says which, naming the library: ``start-up: <library> (<what loads it>)`` keeps a heavy
library off the import of a module that start-up paths load (the CLI, the Locust processes, a
command that may not need it); ``optional: <library>`` is a package an install may lack. Anything
else ("only this path needs it", "as above") is no reason: the import goes to module level."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.paths import PROJECT_ROOT

AREAS = ("pipeline", "locustfiles", "benchmarks", "scripts", "tests")
NOQA = re.compile(r"#\s*noqa\b(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?(?P<rest>.*)$")


# the heavy libraries a start-up reason may name (importing one costs tens of ms or more)
STARTUP_LIBRARIES = frozenset({
    "torch", "scipy", "matplotlib", "numpy", "psutil", "tritonclient", "grpc", "jinja2", "rich", "yaml",
    "pydantic", "transformers", "safetensors", "tokenizers", "prometheus_client", "starlette", "uvicorn",
    "locust", "pyarrow", "google.protobuf"})
DEFERRED = re.compile(r"^(?:(?P<startup>start-up): (?P<lib>[\w.]+) \(\S.*\)|(?P<optional>optional): [\w.]+(?: \(\S.*\))?)$")


def deferred_import_problem(line: str) -> str | None:
    """Why this line's ``noqa: PLC0415`` reason is not ``start-up: <library> (...)`` or
    ``optional: <library>``, or None."""
    match = NOQA.search(line)
    if match is None or "PLC0415" not in (match.group("codes") or ""):
        return None
    reason = DEFERRED.match(match.group("rest").strip().removeprefix("- ").strip())
    if reason is None:
        return "a function-level import says `start-up: <library> (<what loads it>)` or `optional: <library>`"
    if reason.group("startup") and reason.group("lib") not in STARTUP_LIBRARIES:
        return f"start-up names {reason.group('lib')!r}, not a heavy library of STARTUP_LIBRARIES"
    return None


def noqa_problems(line: str) -> str | None:
    """Why this line's noqa breaks the policy, or None (no marker, or a marker with its reason)."""
    match = NOQA.search(line)
    if match is None:
        return None
    if not match.group("codes"):
        return "a bare noqa silences every rule: name the code"
    rest = match.group("rest").strip()
    if not rest.startswith("- ") or len(rest[2:].split()) < 2:
        return "no reason after the code (`# noqa: CODE - why`)"
    return None


def _python_files():
    for area in AREAS:  # this file quotes the markers it checks
        yield from (p for p in (PROJECT_ROOT / area).rglob("*.py") if ".venv" not in p.parts and p != Path(__file__))


def test_every_noqa_says_why():
    found = [f"{path.relative_to(PROJECT_ROOT)}:{number}: {problem}"
             for path in _python_files()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "noqa" in line and (problem := noqa_problems(line))]
    assert found == []


def test_every_function_level_import_says_start_up_or_optional():
    found = [f"{path.relative_to(PROJECT_ROOT)}:{number}: {problem}"
             for path in (PROJECT_ROOT / "pipeline").rglob("*.py")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "PLC0415" in line and (problem := deferred_import_problem(line))]
    assert found == []


@pytest.mark.parametrize("line,ok", [
    ("import torch  # noqa: PLC0415 - start-up: torch (pipeline.reference.engine)", True),
    ("import pyarrow  # noqa: PLC0415, F401 - optional: pyarrow (the loadtest extra)", True),
    ("from pipeline.demo import x  # noqa: PLC0415 - optional: pipeline.demo", True),
    ("from x import y  # noqa: PLC0415 - only this path needs it", False),
    ("from x import y  # noqa: PLC0415 - as above", False),
    ("import numpy  # noqa: PLC0415 - start-up: numpy", False),  # what loads it is missing
    ("import json  # noqa: PLC0415 - start-up: json (the CLI)", False),  # not a heavy library
    ("import torch  # noqa: PLC0415 - imports torch", False),
    ("x = 1  # noqa: E501 - a long literal the test compares byte for byte", True),  # not PLC0415
])
def test_the_deferred_import_check_itself(line, ok):
    assert (deferred_import_problem(line) is None) is ok


@pytest.mark.parametrize("line,ok", [
    ("import torch  # noqa: PLC0415 - torch is an optional extra", True),
    ("import torch  # noqa: PLC0415 - ", False),
    ("import torch  # noqa", False),
    ("import torch  # noqa: PLC0415 - ", False),
    ("x = 1", True),
])
def test_the_check_itself(line, ok):
    assert (noqa_problems(line) is None) is ok


def test_every_area_ignore_has_its_reason_beside_it():
    text = (PROJECT_ROOT / "pyproject.toml").read_text()
    block = text.split("[tool.ruff.lint.per-file-ignores]", 1)[1].split("\n[", 1)[0].splitlines()
    entries = [i for i, line in enumerate(block) if re.match(r'^"[^"]+"\s*=', line)]
    assert entries, "no per-file-ignores found: the parser above no longer reads pyproject.toml"
    unexplained = [block[i] for i in entries if not (i and block[i - 1].strip().startswith("#"))]
    assert unexplained == []
