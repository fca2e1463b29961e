"""The lint policy the code follows (pyproject.toml [tool.ruff]): a rule is switched off for a whole
area only in ``per-file-ignores``, with the reason in a comment above the entry; anywhere else a
``  # noqa: CODE - `` carries its reason after the code (``# noqa: PLC0415 - torch is optional here``).
This test is the check: a reason-less marker, or an area ignore without a reason, fails it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.paths import PROJECT_ROOT

AREAS = ("pipeline", "locustfiles", "benchmarks", "scripts", "tests")
NOQA = re.compile(r"#\s*noqa\b(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?(?P<rest>.*)$")


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
