"""Load from more than one Locust process, for real: ``loadtest.processes: 2`` through the
orchestrator (Locust's ``--processes``: a master and two forked workers), and a master plus two
workers started as separate ``locust`` processes the way a multi-host run starts them (workers
given the master's address, the same settings file). Against the fake server's OpenAI mode, whose
timing is known (a served CPU deployment on two shared cores would measure the machine, not the
load tester): every worker's raw records are merged into one run, ``completed + incomplete ==
sent`` across workers, prompts are striped without overlap, and TTFT/TPOT match one process at the
same total concurrency within the load tester's bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "locustfiles"))

from test_endpoints_loadtest import write_lt_file  # noqa: E402 - after the sys.path set-up above
from test_loadtest_fake_server import PROMPTS, FakeServer, close_to  # noqa: E402 - after the sys.path set-up above

from pipeline.infra.processes import free_ports, spawn  # noqa: E402 - after the sys.path set-up above

LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "locustfile.py")]
TTFT_MS, TPOT_MS = 300.0, 30.0


@pytest.fixture(scope="module")
def server():
    fake = FakeServer("--ttft-ms", f"{TTFT_MS:g}", "--tpot-ms", f"{TPOT_MS:g}", "--tokens-per-chunk", "2",
                      "--max-tokens-cap", "16")
    yield fake
    fake.close()


def settings_file(tmp: Path, port: int, users: int, workers: int, name: str) -> Path:
    settings = {"run_id": "d", "arm": "baseline", "repeat": 0, "endpoint": f"http://127.0.0.1:{port}",
                "model_name": "fake", "transport": "openai", "mode": "closed", "concurrency": users,
                "prompts": PROMPTS, "max_tokens": 16, "sampling": {"top_k": 1}, "output_prefix": str(tmp / "raw" / name),
                "warmup_s": 0.5, "duration_s": 5, "stop_timeout_s": 10, "request_timeout_s": 60, "num_workers": workers}
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(settings))
    return path


def headless(users: int) -> list[str]:
    return ["--headless", "-u", str(users), "-r", str(users), "-t", "5s", "--stop-timeout", "10", "--only-summary",
            "--loglevel", "WARNING", "--exit-code-on-error", "0"]


def collect(tmp: Path, name: str) -> tuple[list[dict], list[dict]]:
    records = [json.loads(line) for f in sorted((tmp / "raw").glob(f"{name}.*.jsonl")) for line in f.read_text().splitlines()]
    metas = [json.loads(f.read_text()) for f in sorted((tmp / "raw").glob(f"{name}.*.meta.json"))]
    return records, metas


def timing(records: list[dict]) -> tuple[float, float]:
    ok = [r for r in records if r["status"] == "ok" and r["stage"] == "measure"]
    ttft = float(np.median([(r["t_first_token"] - r["t_sent"]) / 1e6 for r in ok]))
    tpot = float(np.median([(r["t_last"] - r["t_first_token"]) / 1e6 / (r["osl"] - 1) for r in ok]))
    return ttft, tpot


def check_run(records: list[dict], metas: list[dict], workers: int) -> None:
    writers = {r["worker_pid"] for r in records}
    assert len(writers) == workers, writers  # every worker's records are there
    assert sum(m["sent"] for m in metas) == len(records) == sum(m["written"] for m in metas)
    assert {r["status"] for r in records} <= {"ok", "incomplete_at_stop"}
    by_worker = {pid: {r["prompt_index"] for r in records if r["worker_pid"] == pid} for pid in writers}
    if workers > 1:  # prompt positions are striped: no two workers start on the same prompt
        firsts = [min((r for r in records if r["worker_pid"] == pid), key=lambda r: r["t_sent"])["prompt_index"]
                  for pid in writers]
        assert len(set(firsts)) == workers, (firsts, by_worker)


@pytest.mark.slow
def test_master_and_two_separate_workers_match_one_process(tmp_path, server):
    single = settings_file(tmp_path, server.port, users=8, workers=1, name="single")
    proc = subprocess.run([*LOCUST, *headless(8), "OpenAIStreamUser"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(single)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    one, one_metas = collect(tmp_path, "single")
    check_run(one, one_metas, workers=1)

    shared = settings_file(tmp_path, server.port, users=8, workers=2, name="multi")
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(shared)}
    port = free_ports(1)[0]
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("master", "worker0", "worker1")]
    try:
        master = spawn([*LOCUST, *headless(8), "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port",
                        str(port), "--expect-workers", "2", "--expect-workers-max-wait", "60", "OpenAIStreamUser"],
                       env=env, stdout=logs[0], stderr=subprocess.STDOUT)
        workers = [spawn([*LOCUST, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port),
                          "--loglevel", "WARNING", "OpenAIStreamUser"], env=env, stdout=log, stderr=subprocess.STDOUT)
                   for log in logs[1:]]
        assert master.wait(timeout=180) == 0, (tmp_path / "master.log").read_text()[-2000:]
        for worker in workers:
            assert worker.wait(timeout=60) == 0, "a worker did not end with its master"
    finally:
        for log in logs:
            log.close()
    multi, metas = collect(tmp_path, "multi")
    check_run(multi, metas, workers=2)  # the master runs no users: its meta (if any) counts nothing

    ttft_1, tpot_1 = timing(one)
    ttft_2, tpot_2 = timing(multi)
    for measured in (ttft_1, ttft_2):
        assert close_to(measured, TTFT_MS), measured
    for measured in (tpot_1, tpot_2):
        assert close_to(measured, TPOT_MS, early=0.1), measured
    assert len(multi) >= 0.8 * len(one)  # two workers × 4 users keep up the same request rate


@pytest.mark.slow
def test_processes_2_through_the_orchestrator(tmp_path, server):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest

    lt = write_lt_file(tmp_path, processes=2, concurrency=[4], duration_s=4, warmup_s=0.5)
    run_dir, _ = run_endpoint_loadtest(lt, endpoint_baseline=f"127.0.0.1:{server.port}", endpoint_speculative=None,
                                       model="fake", arm="baseline", out_dir=tmp_path / "run", progress=False)
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert len(runs) == 1 and runs[0]["valid"], runs[0]["invalid_reasons"]
    assert "--processes" in runs[0]["command"]
    records = [json.loads(line) for line in (run_dir / runs[0]["raw"]).read_text().splitlines()]
    metas = json.loads((run_dir / runs[0]["workers"]).read_text())
    assert len({r["worker_pid"] for r in records}) == 2
    assert runs[0]["sent"] == len(records) == runs[0]["n_records"] == sum(m["written"] for m in metas)
    ttft, tpot = timing(records)
    assert close_to(ttft, TTFT_MS) and close_to(tpot, TPOT_MS, early=0.1), (ttft, tpot)
