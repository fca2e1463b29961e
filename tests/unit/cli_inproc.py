"""Run the specdeploy CLI in this process, as the console script does (``pipeline.cli.main``: its
error printing and exit codes), and return what a user would see. A subprocess costs a Python
start and the CLI's imports (about a CPU second) per call; a claim about what a command prints or
returns does not need one. ``tests/unit/cli/test_cli_help.py`` keeps real ``python -m pipeline`` runs
for the entry point itself."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from pipeline.cli import main


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def specdeploy(*argv: str) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
        else:  # main always exits; a return would be a bug in it
            raise AssertionError("pipeline.cli.main returned without exiting")
    return CliResult(code if isinstance(code, int) else (0 if code is None else 1), out.getvalue(), err.getvalue())
