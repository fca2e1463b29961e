"""Every command explains itself with --help, and user errors print one clean line (no traceback).
The help and error claims run the CLI in this process (``cli_inproc``: the console script's
``main``); the entry point itself (``python -m pipeline``: imports, exit code, stderr) is run as a
real subprocess once, in ``test_the_entry_point_runs_as_a_process``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.cli import app, run
from tests.unit.cli_inproc import specdeploy

COMMANDS = ["validate", "plan", "forecast", "build", "render", "serve", "loadtest", "report", "schedule", "run",
            "bench", "demo", "doctor", "schema"]


def _cli(*args: str):
    return specdeploy(*args)


def test_the_entry_point_runs_as_a_process(tmp_path):
    """``python -m pipeline`` (what the console script calls): a user error is one line on
    stderr with exit code 2 (a missing config is a usage error, never NO-GO's 1), and a bad
    invocation exits 2; neither shows a traceback."""
    def run_module(*args):
        return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=120)

    missing = run_module("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "no such config file" in missing.stderr
    assert "Traceback" not in missing.stderr
    usage = run_module("validate")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


def test_all_commands_registered():
    names = {cmd.name for cmd in app.registered_commands} | {grp.name for grp in app.registered_groups}
    assert set(COMMANDS) <= names


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help_explains_itself(command):
    proc = _cli(command, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage: specdeploy " + command in proc.stdout
    # a sentence of help text beyond the usage line
    body = proc.stdout.split("\n", 2)[-1]
    assert len(body.strip()) > 40


def test_top_level_help_lists_pipeline():
    proc = _cli("--help")
    assert proc.returncode == 0
    for command in COMMANDS:
        assert command in proc.stdout


def test_missing_config_is_one_clean_error_line(tmp_path):
    proc = _cli("validate", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "no such config file" in proc.stderr


def test_run_raises_for_user_errors(tmp_path):
    from pipeline.errors import SpecdeployError

    with pytest.raises(SpecdeployError):
        run(["validate", str(tmp_path / "nope.yaml")])


def test_usage_error_exit_code_is_2():
    proc = _cli("validate")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
