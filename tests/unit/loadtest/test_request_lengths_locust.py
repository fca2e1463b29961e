"""Per-request output lengths reach the server through the real Locust users (issue 46.2): each
prompt's drawn ``max_tokens`` is what its request asks for, and its record keeps it. The fake
``generate_stream`` server (locustfiles/fake_server.py) generates exactly the ``max_tokens`` asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_each_request_asks_for_its_own_max_tokens(tmp_path):
    prompts = [{"id": f"p{i}", "category": "c", "prompt": f"prompt number {i}", "max_tokens": 3 + 4 * i}
               for i in range(6)]
    server = subprocess.Popen([sys.executable, str(ROOT / "locustfiles" / "fake_server.py"), "--port", "0",
                               "--ttft-ms", "5", "--tpot-ms", "2", "--tokens-per-chunk", "1", "--max-tokens-cap", "64"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        settings = {"run_id": "t", "arm": "baseline", "repeat": 0, "endpoint": f"http://127.0.0.1:{port}",
                    "model_name": "ensemble", "transport": "http", "mode": "closed", "concurrency": 2,
                    "prompts": prompts, "max_tokens": 50, "sampling": {"top_k": 1, "seed": 0},
                    "output_prefix": str(tmp_path / "raw" / "cell"), "duration_s": 2, "stop_timeout_s": 10,
                    "request_timeout_s": 60}
        (tmp_path / "settings.json").write_text(json.dumps(settings))
        argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "locustfile.py"), "--headless",
                "-u", "2", "-r", "2", "-t", "2s", "--stop-timeout", "10", "--only-summary", "--loglevel", "WARNING",
                "--exit-code-on-error", "0", "HttpStreamUser"]
        proc = subprocess.run(argv, env={**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(tmp_path / "settings.json")},
                              capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=10)
    records = [json.loads(line) for f in (tmp_path / "raw").glob("cell.*.jsonl") for line in f.read_text().splitlines()]
    done = [r for r in records if r["status"] == "ok"]
    # a loaded machine may finish few requests in 2 s: two prompts of different lengths suffice
    assert len({r["prompt_id"] for r in done}) >= 2, [(r["status"], r["error"]) for r in records][:6]
    wanted = {p["id"]: p["max_tokens"] for p in prompts}
    for r in done:
        assert r["osl"] == r["max_tokens"] == wanted[r["prompt_id"]]  # not the run's 50
        assert r["hit_max_tokens"] is True
