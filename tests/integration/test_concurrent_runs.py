"""Two CI jobs on one runner: three `specdeploy run` of one config in one working directory, as
subprocesses — two started together on a fresh workdir, a third staggered, started while a run is
being measured (the retry a user starts while the first still runs). Real build, render, two real
tritonservers per run, Locust; the tiny draft-target config with one level, two repeats and 3 s
cells. A stored calibration stands in for the forecast's 100 s of microbenchmarks (the forecast
is not what this test is about).

Each run must measure into a directory of its own (pipeline/loadtest/ownership.py): none resumes
another's live run (one session each), no cell holds records of two writers (one Locust process
per cell, and the cell's record count equals what that Locust process says it sent), and each run
has every planned cell, valid, and a report. The staggered run says whose run it left alone. When
all have ended, no process of theirs is left. Before the fix, the staggered run resumed the live
run: it deleted the cell being measured (0 records, INVALID) and both wrote into the same cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.polling import wait_until

pytestmark = [pytest.mark.triton, pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
# the interleaved plan, counterbalanced (A B, then B A) so slow drift cancels in the pairs (issue 42)
PLANNED = ["baseline-c1-r0", "speculative-k5-c1-r0", "speculative-k5-c1-r1", "baseline-c1-r1"]


def write_config(workdir: Path) -> Path:
    cfg = yaml.safe_load((ROOT / "configs" / "tiny-cpu-draft-target.yaml").read_text())
    cfg["name"] = "twin"
    cfg["loadtest"].update(concurrency=[1], duration_s=3, warmup_s=0.5, repeats=2, max_tokens=16, stop_timeout_s=5,
                           prompts=str(ROOT / "prompts" / "tiny"))
    path = workdir / "twin.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def store_calibration(cfg_path: Path, home: Path) -> None:
    """A stored calibration for the config, so `run` reuses it instead of calibrating."""
    from pipeline.config import load_config
    from pipeline.forecast import cpu

    os.environ["SPECDEPLOY_FORECAST_HOME"] = str(home)  # cpu.store writes where `run` will read
    try:
        cpu.store({"schema": cpu.CALIBRATION_SCHEMA, "created": "2026-12-06T00:00:00Z", "prompts": "a stand-in"},
                  cpu.calibration_key(load_config(cfg_path, cfg_path.parent)))
    finally:
        del os.environ["SPECDEPLOY_FORECAST_HOME"]


class Run:
    def __init__(self, cfg_path: Path, tag: str, env: dict):
        self.log = cfg_path.parent / f"run-{tag}.log"
        self.started = time.monotonic()
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(cfg_path)],
                                         cwd=cfg_path.parent, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.seconds: float | None = None

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.seconds = time.monotonic() - self.started
        return code

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


def cells(run_dir: Path) -> list[dict]:
    """Per cell of ``runs.json``: its records, their writers (Locust process pids), what Locust sent
    (none when the run ended before writing it: the exit codes below then say why)."""
    out = []
    index = run_dir / "runs.json"
    for r in json.loads(index.read_text())["runs"] if index.is_file() else []:
        raw = run_dir / r["raw"]
        records = [json.loads(x) for x in raw.read_text().splitlines() if x.strip()] if raw.is_file() else []
        workers = json.loads((run_dir / r["workers"]).read_text()) if (run_dir / r["workers"]).is_file() else []
        out.append({"key": r["key"], "valid": r["valid"], "n_records": r["n_records"], "records": len(records),
                    "writers": sorted({x["worker_pid"] for x in records}), "run_ids": sorted({x["run_id"] for x in records}),
                    "sent": sum(w.get("sent", 0) for w in workers), "reasons": r["invalid_reasons"]})
    return out


def left_behind(workdir: Path) -> list[str]:
    """Processes still running whose command line names the workdir (servers, keepers, Locust)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(workdir) in cmdline and proc.pid != os.getpid():
            found.append(f"{proc.pid} {cmdline[:160]}")
    return found


def test_runs_started_together_and_staggered_each_measure_their_own_run(tmp_path):
    cfg_path = write_config(tmp_path)
    store_calibration(cfg_path, tmp_path / "forecast")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECDEPLOY_FORECAST_HOME": str(tmp_path / "forecast")}
    reports = tmp_path / "reports" / "twin"
    runs = {"a": Run(cfg_path, "a", env), "b": Run(cfg_path, "b", env)}  # together, on a fresh workdir
    def measuring() -> bool:  # a load test has started measuring
        assert all(r.proc.poll() is None for r in runs.values()), {t: r.output[-2000:] for t, r in runs.items()}
        return bool(list(reports.glob("*/run.json")))

    wait_until(measuring, "a load test measuring", 300, interval=0.2,
               detail=lambda: {t: r.output[-2000:] for t, r in runs.items()})
    runs["c"] = Run(cfg_path, "c", env)  # staggered: while a run is being measured
    codes = {tag: run.wait(timeout=900) for tag, run in runs.items()}
    deadline = time.monotonic() + 15  # the keepers stop what the runs left, then exit
    while left_behind(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = left_behind(tmp_path)

    run_dirs = sorted(p.parent for p in reports.glob("*/run.json"))
    summary = {"exit codes": codes, "seconds": {t: round(r.seconds or -1) for t, r in runs.items()},
               "processes left": len(left),
               "runs": {d.name: [(c["key"], c["records"], c["n_records"], c["sent"], len(c["writers"]))
                                 for c in cells(d)] for d in run_dirs}}
    print("concurrent runs:", json.dumps(summary))  # the closing note's numbers (-s)

    for tag, run in runs.items():
        assert codes[tag] in (0, 1, 3) and "Traceback" not in run.output, run.output[-3000:]
    assert "is being measured by pid" in runs["c"].output and "a new run directory of its own" in runs["c"].output, \
        runs["c"].output[-3000:]
    assert len(run_dirs) == 3, summary
    writers_seen: set[int] = set()
    for run_dir in run_dirs:
        meta = json.loads((run_dir / "run.json").read_text())
        assert len(meta.get("sessions", [])) == 1, (run_dir.name, meta.get("sessions"))  # nobody resumed it
        assert (run_dir / "report.json").is_file()
        got = cells(run_dir)
        assert [c["key"] for c in got] == PLANNED, (run_dir.name, summary)
        for c in got:
            assert c["valid"], (run_dir.name, c)
            assert len(c["writers"]) == 1, (run_dir.name, c)  # one Locust process wrote the cell
            assert c["run_ids"] == [meta["run_id"]], (run_dir.name, c)
            assert c["records"] == c["n_records"] == c["sent"] > 0, (run_dir.name, c)  # its own Locust's count
            assert not writers_seen & set(c["writers"]), (run_dir.name, c)  # and no other cell's
            writers_seen |= set(c["writers"])
    assert not left, left
