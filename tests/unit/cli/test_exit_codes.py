"""One exit-code table for every command (pipeline/errors.py, docs/ci.md): each command is driven
to each code it can return here, through the console script's ``main`` in this process (what a CI
job sees). Codes a unit test cannot reach cheaply are driven elsewhere, named at the end."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import socket
from pathlib import Path

import pytest
import yaml

import pipeline
from pipeline.cli import app
from pipeline.errors import (
    EXIT_CODE_TABLE,
    EXIT_FAILURE,
    EXIT_GO,
    EXIT_INCONCLUSIVE,
    EXIT_NO_GO,
    EXIT_USAGE,
    SpecdeployError,
)
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"
TINY = ROOT / "configs" / "tiny-cpu-ngram.yaml"
GPU = ROOT / "configs" / "llama31-8b-baseline-h100.yaml"
GPU_SPEC = ROOT / "configs" / "llama31-8b-draft1b-fp8-h100.yaml"  # a GPU forecast needs no CPU calibration
COMMANDS = sorted([cmd.name for cmd in app.registered_commands]
                  + [f"{grp.name} {cmd.name}" for grp in app.registered_groups for cmd in grp.typer_instance.registered_commands]
                  + [grp.name for grp in app.registered_groups])


def _all_error_classes() -> set[type]:
    """Every SpecdeployError subclass in the codebase: import each module that declares an error
    class (found by its source, so a new module is not missed and the rest is not imported)."""
    declares = re.compile(r"^class \w+\((\w+Error|\w+Stopped|\w+Interrupted)\b", re.M)
    builtin = {"ValueError", "RuntimeError", "TypeError", "OSError", "KeyError"}
    for path in sorted(Path(pipeline.__file__).parent.rglob("*.py")):
        if "triton_models" in path.parts:  # run inside Triton's Python stub, not by the CLI
            continue
        if set(declares.findall(path.read_text())) - builtin:
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    seen: set[type] = set()
    todo = [SpecdeployError]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        todo.extend(cls.__subclasses__())
    return seen


def test_the_table_has_distinct_codes_and_a_failure_is_never_no_go():
    assert len(set(EXIT_CODE_TABLE)) == len(EXIT_CODE_TABLE) == 7
    assert SpecdeployError("x").exit_code == EXIT_FAILURE
    assert SpecdeployError("x", exit_code=EXIT_USAGE).exit_code == EXIT_USAGE
    # only a measurement says NO-GO: no error class of the codebase may exit with its code
    classes = _all_error_classes()
    assert {"LoadTestStopped", "BuildInterrupted", "ReportError", "LayoutError"} <= {c.__name__ for c in classes}
    wrong = {cls.__qualname__: cls.exit_code for cls in classes if cls.exit_code in (EXIT_GO, EXIT_NO_GO)}
    assert wrong == {}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_commands_help_carries_the_table(command):
    proc = specdeploy(*command.split(), "--help")
    assert proc.returncode == 0
    lines = [" ".join(line.split()) for line in proc.stdout.splitlines()]
    for code, text in EXIT_CODE_TABLE.items():
        assert f"{code} {text}" in lines, (command, code)


def test_a_crash_is_a_failure_never_no_go(monkeypatch):
    import pipeline.cli as cli

    def crash(argv):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "run", crash)
    proc = specdeploy("report", "x")
    assert proc.returncode == EXIT_FAILURE and "RuntimeError: a bug" in proc.stderr


def test_docs_ci_md_carries_the_same_table():
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", (ROOT / "docs" / "ci.md").read_text(), re.M))
    assert {int(code): text for code, text in rows.items()} == EXIT_CODE_TABLE


def test_readme_points_at_the_table():
    readme = (ROOT / "README.md").read_text()
    assert "docs/ci.md" in readme
    assert all(f"{code} " in readme for code in (EXIT_GO, EXIT_NO_GO, EXIT_USAGE, EXIT_INCONCLUSIVE, EXIT_FAILURE))


def _config(tmp_path: Path, source: Path = TINY, **changes) -> Path:
    data = yaml.safe_load(source.read_text())
    data.update(changes)
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(data))
    return path


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# validate / plan / forecast / schema / bench / demo: 0 and 2 -------------------------------------------

@pytest.mark.parametrize("command", ["validate", "plan", "forecast", "build", "render", "serve", "loadtest",
                                     "bench", "run", "doctor"])
def test_an_unknown_config_field_is_a_usage_error(command, tmp_path):
    proc = specdeploy(command, _config(tmp_path, nmae="x"))  # refused before anything is written
    assert proc.returncode == EXIT_USAGE, (command, proc.stderr)
    assert "nmae: unknown field" in proc.stderr


@pytest.mark.parametrize("command", ["validate", "plan", "forecast", "build", "render", "serve", "loadtest",
                                     "report", "run", "bench", "doctor", "schema"])
def test_a_bad_flag_is_a_usage_error(command):
    assert specdeploy(command, "--no-such-flag").returncode == EXIT_USAGE


def test_validate_plan_forecast_schema_succeed(tmp_path):
    assert specdeploy("validate", TINY, "--offline").returncode == EXIT_GO
    assert specdeploy("plan", TINY, "--workdir", tmp_path).returncode == EXIT_GO
    assert specdeploy("forecast", GPU_SPEC, "--acceptance", "0.7").returncode == EXIT_GO
    assert specdeploy("schema").returncode == EXIT_GO
    assert specdeploy("doctor").returncode == EXIT_GO


def test_usage_errors_of_single_commands(tmp_path):
    assert specdeploy("validate", tmp_path / "nope.yaml").returncode == EXIT_USAGE  # missing path
    assert specdeploy("forecast", GPU_SPEC).returncode == EXIT_USAGE  # no acceptance source
    assert specdeploy("schema", "nope").returncode == EXIT_USAGE  # unknown artefact
    assert specdeploy("bench", TINY, "--peer", "x").returncode == EXIT_USAGE
    assert specdeploy("demo", "nope").returncode == EXIT_USAGE  # unknown demo subcommand


# build / render / serve / run: 2 for stage order and flags, 5 for the environment ---------------------------

def test_render_and_serve_before_build_are_usage_errors(tmp_path):
    render = specdeploy("render", TINY, "--workdir", tmp_path)
    assert render.returncode == EXIT_USAGE and "specdeploy build" in render.stderr
    serve = specdeploy("serve", TINY, "--variant", "speculative", "--workdir", tmp_path)
    assert serve.returncode == EXIT_USAGE and "specdeploy render" in serve.stderr


def test_serve_variant_both_is_a_usage_error(tmp_path):
    proc = specdeploy("serve", TINY, "--variant", "both", "--workdir", tmp_path)
    assert proc.returncode == EXIT_USAGE and "--variant" in proc.stderr


def test_a_build_the_host_cannot_run_is_a_failure(tmp_path):
    from pipeline.build.builder import trtllm_missing_reason

    if trtllm_missing_reason() is None:
        pytest.skip("TensorRT-LLM is installed here")
    build = specdeploy("build", GPU, "--workdir", tmp_path)
    assert build.returncode == EXIT_FAILURE and "TensorRT-LLM is not installed" in build.stderr
    # `run` on this host stops at validate's preflight (checkpoint, examples root): a config error
    run = specdeploy("run", GPU, "--workdir", tmp_path, "--skip-live")
    assert run.returncode == EXIT_USAGE and "preflight failed" in run.stderr


def test_doctor_of_a_config_whose_checkpoints_are_elsewhere_is_a_config_error():
    # doctor CONFIG runs validate's findings first (one preflight with validate --live): the GPU config's
    # checkpoints are not on this host, a path error (2) that outranks the live rows' host failures (5);
    # a live failure alone exits 5: tests/gpu_sim/test_live_preflight.py
    pytest.importorskip("yaml")
    proc = specdeploy("doctor", GPU)
    if proc.returncode == EXIT_GO:
        pytest.skip("this host has the checkpoints and GPUs the config asks for")
    assert proc.returncode == EXIT_USAGE and "live preflight" in proc.stderr


# loadtest: 2 for the invocation, 5 for an unreachable endpoint -----------------------------------------------

def _lt_file(tmp_path: Path) -> Path:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "chat.jsonl").write_text(json.dumps({"id": "c0", "prompt": "hi"}) + "\n")
    path = tmp_path / "lt.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "loadtest": {"prompts": "prompts", "concurrency": [1],
                                                              "duration_s": 3, "warmup_s": 0.5,
                                                              "repeats": 1}}))
    return path


def test_loadtest_usage_errors(tmp_path):
    lt = _lt_file(tmp_path)
    url = f"http://127.0.0.1:{_closed_port()}"
    no_model = specdeploy("loadtest", "--loadtest-file", lt, "--endpoint-baseline", url, "--endpoint-speculative", url)
    assert no_model.returncode == EXIT_USAGE and "--model" in no_model.stderr
    both = specdeploy("loadtest", TINY, "--loadtest-file", lt)
    assert both.returncode == EXIT_USAGE
    neither = specdeploy("loadtest")
    assert neither.returncode == EXIT_USAGE
    levels = specdeploy("loadtest", TINY, "--concurrency", "one")
    assert levels.returncode == EXIT_USAGE


def test_loadtest_against_an_unreachable_endpoint_is_a_failure(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    proc = specdeploy("loadtest", "--loadtest-file", _lt_file(tmp_path), "--endpoint-baseline", url,
                      "--endpoint-speculative", url, "--model", "m", "--out", tmp_path / "run", "--no-progress")
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    assert "is the server up" in proc.stderr


def test_loadtest_of_a_config_against_an_unreachable_endpoint_is_a_failure_not_no_go(tmp_path):
    """Measured, the dead endpoint was a cell with "server died": NO-GO, exit 1 (before this change)."""
    url = f"127.0.0.1:{_closed_port()}"
    proc = specdeploy("loadtest", TINY, "--endpoint-baseline", url, "--endpoint-speculative", url,
                      "--out", tmp_path / "run", "--no-progress", "--workdir", tmp_path)
    assert proc.returncode == EXIT_FAILURE, proc.stdout + proc.stderr
    assert "--endpoint-baseline" in proc.stderr and "is not ready" in proc.stderr
    assert not (tmp_path / "run" / "runs.json").exists()  # nothing was measured


# report: every verdict's code, 2 for a wrong path, 5 for a run that holds nothing --------------------------

def _gated(run_dir: Path, tmp_path: Path, **gate) -> Path:
    snapshot = json.loads((run_dir / "run.json").read_text())["config"]
    snapshot["gate"].update(gate)
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(snapshot))
    return path


@pytest.mark.slow  # three reports of the fixture run
def test_report_returns_each_verdicts_code(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    assert specdeploy("report", run_dir).returncode == EXIT_GO
    # the library agrees with the CLI: report.json holds make_report's own verdict and gate.exit_code
    # (read back rather than re-rendering the run a fourth time)
    written = json.loads((run_dir / "report.json").read_text())
    assert (written["verdict"], written["exit_code"]) == ("GO", EXIT_GO)
    no_go = specdeploy("report", run_dir, "--config", _gated(run_dir, tmp_path, peak_throughput_ratio_min=2.0))
    assert no_go.returncode == EXIT_NO_GO, no_go.stdout
    assert json.loads((run_dir / "report.json").read_text())["verdict"] == "NO-GO"  # the files follow --config's gate
    unsure = specdeploy("report", run_dir, "--config", _gated(run_dir, tmp_path, min_runs=5))
    assert unsure.returncode == EXIT_INCONCLUSIVE, unsure.stdout
    assert "INCONCLUSIVE" in unsure.stdout  # what the console script prints (was test_report_render's)


def test_report_usage_errors_and_failures(tmp_path):
    assert specdeploy("report", tmp_path / "nope").returncode == EXIT_USAGE
    assert specdeploy("report", tmp_path).returncode == EXIT_USAGE  # not a run directory
    run_dir = tmp_path / "empty-run"
    run_dir.mkdir()
    shutil.copy(FIXTURE / "run.json", run_dir / "run.json")
    listing = json.loads((FIXTURE / "runs.json").read_text())
    (run_dir / "runs.json").write_text(json.dumps({**listing, "runs": []}))
    proc = specdeploy("report", run_dir)
    assert proc.returncode == EXIT_FAILURE and "lists no runs" in proc.stderr


# Driven elsewhere (each needs a real server or a signal):
# - 4 (stopped early): tests/unit/loadtest/test_openai_real_servers.py (loadtest against a server refusing every request)
# - 130 (interrupted): tests/unit/build/test_build_runner.py (SIGTERM during a build step)
# - loadtest / run verdicts 0, 1, 3 through a served deployment: tests/integration/test_run_cli.py,
#   tests/integration/test_loadtest_e2e.py (same make_report as `report` above)
