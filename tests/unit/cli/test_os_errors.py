"""Disk full, permission denied and the like end `build`, `render` and `report` with one line
naming the command and the path, and the environment-failure exit code (issue 44); they used to
print 52-67-line OSError tracebacks. Nothing is left half-written.

Disk full is simulated where every specdeploy file replacement goes through
(``pipeline.infra.atomic.write_text_atomic``): the write of the temporary file fails with ENOSPC
after writing half of it, as a full disk does (tests run as root, where permission bits deny
nothing, and no tiny filesystem is mountable here). The real case is a file where a directory
should be (ENOTDIR / EEXIST from the kernel)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.demo import ARTIFACTS_DIR
from pipeline.errors import EXIT_FAILURE
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
RUN_SMALL = ROOT / "tests" / "fixtures" / "run_small"


@pytest.fixture
def disk_full(monkeypatch):
    """Every temporary file the atomic writer writes fails half-way with ENOSPC."""
    original = Path.write_text

    def write_text(self, data, *args, **kwargs):
        if ".tmp-" not in self.name:
            return original(self, data, *args, **kwargs)
        original(self, data[: len(data) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")  # write() names no file

    monkeypatch.setattr(Path, "write_text", write_text)


def _config(workdir: Path) -> Path:
    path = workdir / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(ARTIFACTS_DIR / "tiny-target"), "dtype": "float32"},
        "speculation": {"method": "none"},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128}}))
    return path


def _error_line(result) -> str:
    """The one line the failed command printed (besides blank lines a progress display leaves)."""
    assert result.returncode == EXIT_FAILURE, (result.returncode, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _one_line_failure(result, stage: str, reason: str, path: Path) -> None:
    assert _error_line(result) == f"error: {stage}: {reason}: {path}"


def _half_written(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if ".tmp-" in p.name)


@pytest.mark.slow  # a build: a few CPU seconds
def test_build_on_a_full_disk(tmp_path, disk_full):
    config = _config(tmp_path)
    line = _error_line(specdeploy("build", config, "--workdir", tmp_path))
    assert line.startswith("error: build: No space left on device: ") and line.endswith(".json"), line
    assert Path(line.rsplit(": ", 1)[1]).parent.is_dir()
    assert _half_written(tmp_path) == []
    assert not (tmp_path / "engines/tiny/manifest.json").exists()


def test_build_where_a_file_stands_for_a_directory(tmp_path):
    config = _config(tmp_path)
    (tmp_path / "engines").write_text("not a directory")
    line = _error_line(specdeploy("build", config, "--workdir", tmp_path))
    assert line.startswith("error: build: Not a directory: " + str(tmp_path / "engines") + "/"), line


@pytest.fixture(scope="module")
def built_once(tmp_path_factory) -> tuple[Path, Path]:
    """One build for the render tests (they only read it); each test's render output is removed after it."""
    workdir = tmp_path_factory.mktemp("built")
    config = _config(workdir)
    assert specdeploy("build", config, "--workdir", workdir).returncode == 0
    return config, workdir


@pytest.fixture
def built(built_once):
    config, workdir = built_once
    yield config, workdir
    for leftover in [workdir / "engines/tiny/model_repo", *_half_written(workdir)]:  # the next test starts clean
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        elif leftover.exists() or leftover.is_symlink():
            leftover.unlink()


@pytest.mark.slow  # a build, then render
def test_render_on_a_full_disk(built, disk_full):
    config, workdir = built
    line = _error_line(specdeploy("render", config, "--workdir", workdir))
    assert line.startswith("error: render: No space left on device: " + str(workdir / "engines/tiny/model_repo")), line
    assert _half_written(workdir) == []


@pytest.mark.slow  # a build, then render
def test_render_where_a_file_stands_for_a_directory(built):
    config, workdir = built
    (workdir / "engines/tiny/model_repo").write_text("not a directory")
    line = _error_line(specdeploy("render", config, "--workdir", workdir))
    assert line == "error: render: File exists: " + str(workdir / "engines/tiny/model_repo")  # mkdir's EEXIST


@pytest.fixture
def run_dir(tmp_path) -> Path:
    return Path(shutil.copytree(RUN_SMALL, tmp_path / "run"))


@pytest.mark.slow  # the report's statistics and plots
def test_report_on_a_full_disk(run_dir, disk_full):
    _one_line_failure(specdeploy("report", run_dir), "report", "No space left on device", run_dir / "report.json")
    assert _half_written(run_dir) == [] and not (run_dir / "report.json").exists()


def test_report_where_a_file_stands_for_a_directory(run_dir, tmp_path):
    out = tmp_path / "a-file"
    out.write_text("not a directory")
    result = specdeploy("report", "--compare", run_dir, run_dir, "--out", out / "cmp")
    _one_line_failure(result, "report", "Not a directory", out / "cmp")
