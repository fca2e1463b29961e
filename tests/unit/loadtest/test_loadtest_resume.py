"""An interrupted load test resumes: `specdeploy loadtest` against two fake servers of known timing
(real Locust subprocesses), SIGKILLed after some cells; `loadtest --resume RUN_DIR` keeps every
complete cell, measures only the others in the plan's order, never uses the cell that was cut
short, and the report names the sessions. `specdeploy run` picks the newest unfinished run of its
config (same hash) to resume, and starts afresh with --fresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.config import config_hash, load_config
from pipeline.loadtest.resume import PreviousRuns, cell_complete, kept_results, planned_keys, previous_runs
from tests.polling import wait_until
from tests.unit.cli_inproc import specdeploy
from tests.unit.fake_servers import Fake

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ROOT / "tests" / "fixtures" / "prompts_small.jsonl"
# four cells are enough for every claim: two kept, one cut short, and it plus one more measured again
PLANNED = ["baseline-c1-r0", "speculative-k3-c1-r0", "baseline-c2-r0", "speculative-k3-c2-r0"]


def write_cfg(workdir: Path, **loadtest) -> Path:
    path = workdir / "resume.yaml"
    path.write_text(yaml.safe_dump({
        "name": "resume", "backend": "reference",
        "target": {"checkpoint": "builtin:tiny-target", "dtype": "float32"},
        "speculation": {"method": "draft_target", "num_draft_tokens": 3, "orchestration": "bls",
                        "draft": {"checkpoint": "builtin:tiny-draft", "dtype": "float32"}},
        "loadtest": {"transport": "http", "concurrency": [1, 2], "duration_s": 2, "warmup_s": 0.2, "repeats": 1,
                     "max_tokens": 7, "prompts": str(PROMPTS), "stop_timeout_s": 5, **loadtest},
        "gate": {"bootstrap_resamples": 200},
    }))
    return path


@pytest.fixture()
def fakes():
    base = Fake("--ttft-ms", "30", "--tpot-ms", "6", "--max-tokens-cap", "7")
    spec = Fake("--ttft-ms", "35", "--tpot-ms", "3", "--tokens-per-chunk", "3", "--max-tokens-cap", "7")
    yield base, spec
    base.close()
    spec.close()


def loadtest_argv(cfg_path: Path, base, spec, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "loadtest", str(cfg_path), "--endpoint-baseline", base.url,
            "--endpoint-speculative", spec.url, "--no-progress", "--workdir", str(cfg_path.parent), *extra]


def finished_keys(run_dir: Path) -> list[str]:
    try:
        return [r["key"] for r in json.loads((run_dir / "runs.json").read_text())["runs"]]
    except (OSError, ValueError, KeyError):
        return []


def kill_after(proc: subprocess.Popen, run_dir: Path, cells: int, timeout: float = 300) -> list[str]:
    """SIGKILL ``proc`` once ``cells`` cells are recorded and the next one has started writing."""
    def recorded_and_next_started() -> list[str] | None:
        assert proc.poll() is None, "the load test ended before it could be killed"
        done = finished_keys(run_dir)
        started = len(done) >= cells and any((run_dir / "raw" / "parts").glob(f"{PLANNED[len(done)]}.*.jsonl"))
        return done if started else None

    done = wait_until(recorded_and_next_started, f"{cells} cells recorded and the next one started", timeout)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return done


@pytest.mark.slow
def test_a_killed_load_test_resumes_with_only_the_missing_cells(tmp_path, fakes):
    base, spec = fakes
    cfg_path = write_cfg(tmp_path)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(loadtest_argv(cfg_path, base, spec, "--out", str(run_dir)), env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = kill_after(proc, run_dir, cells=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    cut_short = PLANNED[len(done)]
    assert done == PLANNED[:len(done)] and len(done) < len(PLANNED) - 1  # kept, cut short, and one never begun
    assert not (run_dir / "report.json").exists()
    before = {r["key"]: r for r in json.loads((run_dir / "runs.json").read_text())["runs"]}
    killed_at = time.time()

    # the resume in this process (the CLI's own main): only the killed session needs a process of its own
    out = specdeploy(*loadtest_argv(cfg_path, base, spec, "--resume", str(run_dir))[3:])
    assert out.returncode in (0, 1, 3), out.stdout + out.stderr
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert sorted(r["key"] for r in runs) == sorted(PLANNED)  # every cell once
    kept = [r for r in runs if r["session"] == 1]
    rerun = [r for r in runs if r["session"] == 2]
    assert [r["key"] for r in kept] == done and len(rerun) == len(PLANNED) - len(done)
    assert [r["key"] for r in rerun] == PLANNED[len(done):]  # the plan's A/B order
    for r in kept:  # the very records of session 1, untouched
        assert r["started_unix"] == before[r["key"]]["started_unix"]
    cut = next(r for r in rerun if r["key"] == cut_short)
    assert cut["started_unix"] >= killed_at and cell_complete(run_dir, cut)  # measured again, whole
    meta = json.loads((run_dir / "run.json").read_text())
    assert [s["session"] for s in meta["sessions"]] == [1, 2] and meta["sessions"][1]["gap_s"] >= 0
    report = json.loads((run_dir / "report.json").read_text())
    assert report["sessions"]["resumed"] is True
    assert [s["cells"] for s in report["sessions"]["sessions"]] == [done, PLANNED[len(done):]]
    assert "Resumed run" in (run_dir / "report.md").read_text()


def _fake_run(root: Path, name: str, cfg, keys: list[str], complete: list[str]) -> Path:
    """A run directory with ``keys`` in runs.json, those in ``complete`` with whole records."""
    run_dir = root / name
    (run_dir / "raw").mkdir(parents=True)
    meta = {"config": cfg.model_dump(mode="json"), "config_hash": config_hash(cfg), "concurrency": [1, 2],
            "repeats": 1, "sweep_draft_len": [], "created": "2026-12-01T00:00:00+00:00"}
    (run_dir / "run.json").write_text(json.dumps(meta))
    runs = []
    for key in keys:
        n = 3
        lines = [json.dumps({"status": "ok"})] * (n if key in complete else n - 1)  # a record short: cut
        (run_dir / "raw" / f"{key}.jsonl").write_text("\n".join(lines) + "\n")
        (run_dir / "raw" / f"{key}.workers.json").write_text(json.dumps([{"sent": n}]))
        runs.append({"key": key, "raw": f"raw/{key}.jsonl", "workers": f"raw/{key}.workers.json",
                     "server_alive": True, "valid": True, "n_records": n, "started_unix": 0.0, "seconds": 1.0})
    (run_dir / "runs.json").write_text(json.dumps({"runs": runs}))
    return run_dir


def test_run_picks_the_newest_unfinished_run_of_its_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(write_cfg(tmp_path), tmp_path)
    root = tmp_path / "reports" / "resume"
    assert planned_keys({"config": cfg.model_dump(mode="json"), "concurrency": [1, 2], "repeats": 1}) == PLANNED
    finished = _fake_run(root, "20261201T000000Z", cfg, PLANNED, PLANNED)
    assert previous_runs(cfg) == PreviousRuns(resume=finished)  # finished, no report yet: make it
    (finished / "report.json").write_text("{}")
    assert previous_runs(cfg) == PreviousRuns(reuse=finished)  # finished and reported: `run` reuses it
    newer = _fake_run(root, "20261202T000000Z", cfg, PLANNED[:3], PLANNED[:2])  # killed in its third cell
    assert previous_runs(cfg) == PreviousRuns(resume=newer, reuse=finished)
    assert [r["key"] for r in kept_results(newer)] == PLANNED[:2]  # the third is not whole: measured again
    other = load_config(write_cfg(tmp_path, max_tokens=8), tmp_path)  # another config hash
    assert previous_runs(other) == PreviousRuns()


def test_resume_refuses_a_run_of_another_config(tmp_path):
    from pipeline.errors import SpecdeployError
    from pipeline.loadtest.runner import run_loadtest

    cfg = load_config(write_cfg(tmp_path), tmp_path)
    run_dir = _fake_run(tmp_path, "run", cfg, PLANNED[:1], PLANNED[:1])
    other = load_config(write_cfg(tmp_path, max_tokens=8), tmp_path)
    with pytest.raises(SpecdeployError, match="config hash"):
        run_loadtest(other, endpoint_baseline="x", endpoint_speculative="y", progress=False, resume=run_dir)
