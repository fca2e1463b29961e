"""One run, one writer (pipeline/infra/owner_lock.py, pipeline/loadtest/ownership.py): a run
directory is owned by the live process measuring it. The owner is another real process here (a
Python child that claims the directory and waits), so the kernel's lock is what is tested: it names
its owner while that owner lives, and is free the moment the owner is SIGKILLed. ``--resume`` of
a live run and ``report`` into a live run refuse with the owner's pid and command (exit 5); a new
run never shares a directory with another started in the same second; the lock never outlives its
owner through a forked child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from pipeline.errors import EXIT_FAILURE
from pipeline.infra import owner_lock
from pipeline.infra.owner_lock import DirectoryBusy
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"

# claims argv[1] (lock file argv[3], default the run lock), says so, then waits for stdin to close (or
# for its SIGKILL); with argv[2] == "fork" it forks a child that does not exec and outlives it, then exits
# (the child says "forked PID" once it runs, so the test never looks before the child closed its copy)
HOLDER = """
import os, sys, time
from pipeline.infra import owner_lock
with owner_lock.holding():
    owner_lock.claim(sys.argv[1], "measuring a load test", name=(sys.argv[3:] or [owner_lock.LOCK_NAME])[0])
    if len(sys.argv) > 2 and sys.argv[2] == "fork":
        if os.fork() == 0:  # the child speaks: os.fork returns here only after its at-fork hooks ran
            print("forked", os.getpid(), flush=True)
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    print("claimed", flush=True)
    sys.stdin.read()
"""


class Holder:
    """Another process owning ``directory``."""

    def __init__(self, directory: Path, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory), *extra], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.said = self.proc.stdout.readline().strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def holder(tmp_path):
    made: list[Holder] = []

    def start(directory: Path, *extra: str) -> Holder:
        made.append(Holder(directory, *extra))
        assert made[-1].said.split()[0] in ("claimed", "forked"), made[-1].said
        return made[-1]

    yield start
    for h in made:
        h.kill()


def test_the_lock_names_its_owner_while_it_lives_and_dies_with_it(tmp_path, holder):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = holder(run_dir)
    owner = owner_lock.owner_of(run_dir)
    assert owner is not None and owner.pid == other.proc.pid and "measuring" in owner.doing
    assert owner.command.startswith(f"{sys.executable} -c ")  # its command line, on one line
    with owner_lock.holding(), pytest.raises(DirectoryBusy) as busy:
        owner_lock.claim(run_dir, "measuring a load test")
    assert busy.value.exit_code == EXIT_FAILURE and f"pid {other.proc.pid}" in str(busy.value)

    other.kill()  # SIGKILL: no clean-up ran, the pid record is still in the file
    assert json.loads((run_dir / owner_lock.LOCK_NAME).read_text())["pid"] == other.proc.pid
    assert owner_lock.owner_of(run_dir) is None  # the lock, not the record, decides
    with owner_lock.holding():
        owner_lock.claim(run_dir, "measuring a load test")
        assert owner_lock.owner_of(run_dir).pid == os.getpid()
        owner_lock.claim(run_dir, "writing the report")  # this process owns it already: no conflict
    assert owner_lock.owner_of(run_dir) is None


def test_a_scope_that_hands_up_keeps_the_directory_until_the_outer_scope_ends(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    probe = [sys.executable, "-c", "import sys; from pipeline.infra.owner_lock import owner_of; "
             "o = owner_of(sys.argv[1]); print(o.pid if o else 'free')", str(run_dir)]

    def seen_from_outside() -> str:
        return subprocess.run(probe, cwd=ROOT, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.strip()

    @owner_lock.holding(hand_up=True)
    def measure() -> None:
        owner_lock.claim(run_dir, "measuring a load test")

    with owner_lock.holding():
        measure()
        assert seen_from_outside() == str(os.getpid())  # the report is still to be written
    assert seen_from_outside() == "free"
    measure()  # no scope around: released when it returns
    assert seen_from_outside() == "free"


def test_a_forked_child_does_not_keep_its_parents_lock(tmp_path, holder):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    parent = holder(run_dir, "fork")  # claims, forks a sleeping child without exec, exits
    child = int(parent.said.split()[1])
    try:
        parent.proc.wait(timeout=10)
        assert psutil.pid_exists(child)  # the child lives on, with its copy of the descriptor closed
        assert owner_lock.owner_of(run_dir) is None
    finally:
        os.kill(child, signal.SIGKILL)


def test_two_new_runs_in_one_second_get_two_directories(tmp_path):
    from pipeline.loadtest.ownership import new_run_dir

    created = datetime(2026, 12, 6, 10, 0, 0, tzinfo=timezone.utc)
    with owner_lock.holding():
        first = new_run_dir(tmp_path, None, created)
        second = new_run_dir(tmp_path, None, created)
    assert (first.name, second.name) == ("20261206T100000Z", "20261206T100000Z-2")
    assert sorted([second.name, first.name], reverse=True)[0] == second.name  # the newest sorts first


def test_out_dir_owned_by_a_live_run_is_refused(tmp_path, holder):
    from pipeline.loadtest.ownership import new_run_dir

    out = tmp_path / "out"
    out.mkdir()
    other = holder(out)
    with owner_lock.holding(), pytest.raises(DirectoryBusy, match=f"pid {other.proc.pid}"):
        new_run_dir(tmp_path, out, datetime.now(timezone.utc))
    other.kill()
    with owner_lock.holding():  # a dead owner's lock file alone does not make it "not empty"
        assert new_run_dir(tmp_path, out, datetime.now(timezone.utc)) == out.resolve()


def _resume_cfg(tmp_path: Path):
    from test_loadtest_resume import PLANNED, _fake_run, write_cfg

    from pipeline.config import load_config

    cfg_path = write_cfg(tmp_path)
    return cfg_path, _fake_run(tmp_path, "run", load_config(cfg_path, tmp_path), PLANNED[:3], PLANNED[:2])


def test_resume_of_a_live_run_refuses_with_its_owner_and_deletes_nothing(tmp_path, holder):
    cfg_path, run_dir = _resume_cfg(tmp_path)
    other = holder(run_dir)
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    proc = specdeploy("loadtest", cfg_path, "--resume", run_dir, "--endpoint-baseline", "127.0.0.1:9",
                      "--endpoint-speculative", "127.0.0.1:9", "--no-progress", "--workdir", tmp_path)
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    assert f"pid {other.proc.pid}" in proc.stderr and "-c" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    # the cut-short third cell is the owner's to measure again: nothing of it was removed
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == before


@pytest.mark.slow  # a whole report (statistics, plots)
def test_report_into_a_live_run_refuses_and_into_a_dead_ones_writes(tmp_path, holder):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, run_dir)
    other = holder(run_dir)
    proc = specdeploy("report", run_dir)
    assert proc.returncode == EXIT_FAILURE and f"pid {other.proc.pid}" in proc.stderr, proc.stderr
    assert not (run_dir / "report.json").exists()
    other.kill()
    proc = specdeploy("report", run_dir)
    assert proc.returncode in (0, 1, 3), proc.stderr
    assert (run_dir / "report.json").is_file()


def test_run_waits_for_a_concurrent_build_and_build_alone_refuses_naming_it(tmp_path, holder, capsys):
    import threading

    from pipeline.build.builder import build_lock
    from pipeline.errors import BuildError

    root = tmp_path / "engines" / "dtm"
    root.mkdir(parents=True)
    other = holder(root, "-", ".build.lock")
    with pytest.raises(BuildError, match=f"pid {other.proc.pid}"):  # `specdeploy build`: refuses
        with build_lock(root):
            pass
    events: list[str] = []

    def run_build() -> None:  # `specdeploy run`: waits
        with build_lock(root, wait=True):
            events.append("built")

    waiter = threading.Thread(target=run_build)
    waiter.start()
    while f"by pid {other.proc.pid}" not in capsys.readouterr().out:  # it said whom it waits for
        assert waiter.is_alive() and not events
        waiter.join(0.05)
    events.append("owner gone")
    other.kill()
    waiter.join(60)
    assert events == ["owner gone", "built"]
