"""The gRPC streaming Locust user against a REAL tritonserver with a tiny decoupled Python model
that sleeps (first token after D, then k tokens per chunk every k·t): measured TTFT ≈ D, TPOT ≈ t,
inter-chunk ≈ k·t; requests in flight at stop are recorded; the Locust run ends on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.triton  # starts a real tritonserver

ROOT = Path(__file__).resolve().parents[2]
TTFT_MS, TPOT_MS, K, MAX_TOKENS = 400, 40, 2, 9  # chunks [1, 2, 2, 2, 2]

CONFIG = """
name: "fake_stream"
backend: "python"
max_batch_size: 1
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_perf_metrics" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "top_k" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "top_p" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "temperature" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "seed" data_type: TYPE_UINT64 dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "acceptance_rate" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "total_draft_tokens" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "total_accepted_draft_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

MODEL = f'''
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TTFT, TPOT, K = {TTFT_MS / 1000}, {TPOT_MS / 1000}, {K}


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._stream, args=(request,), daemon=True).start()
        return None

    def _stream(self, request):
        sender = request.get_response_sender()
        total = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
        plan, left = [1], total - 1
        while left > 0:
            plan.append(min(K, left))
            left -= plan[-1]
        deadline = time.monotonic() + TTFT
        drafted = accepted = 0
        for i, n in enumerate(plan):
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if i:
                drafted, accepted = drafted + K, accepted + n - 1
            outputs = [
                pb_utils.Tensor("text_output", np.array([[(" t" * n).encode()]], dtype=object)),
                pb_utils.Tensor("num_output_tokens", np.array([[n]], dtype=np.int32)),
                pb_utils.Tensor("acceptance_rate", np.array([[accepted / drafted if drafted else 0.0]], dtype=np.float32)),
                pb_utils.Tensor("total_draft_tokens", np.array([[drafted]], dtype=np.int32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([[accepted]], dtype=np.int32)),
            ]
            final = i == len(plan) - 1
            sender.send(pb_utils.InferenceResponse(output_tensors=outputs),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
            if not final:
                deadline += TPOT * plan[i + 1]
'''


@pytest.fixture(scope="module")
def fake_triton(tmp_path_factory):
    from pipeline.serve.server import start_server

    repo = tmp_path_factory.mktemp("fake_repo") / "repo"
    (repo / "fake_stream" / "1").mkdir(parents=True)
    (repo / "fake_stream" / "config.pbtxt").write_text(CONFIG)
    (repo / "fake_stream" / "1" / "model.py").write_text(MODEL)
    server = start_server(repo, startup_timeout_s=120)
    yield server
    server.stop()


def run_grpc_locust(tmp: Path, server, users: int, duration_s: int, stop_timeout_s: float) -> tuple[list, list]:
    tmp.mkdir(parents=True, exist_ok=True)
    settings = {"run_id": "g", "arm": "speculative", "repeat": 0, "endpoint": server.grpc_url, "model_name": "fake_stream",
                "transport": "grpc", "concurrency": users, "max_tokens": MAX_TOKENS,
                "prompts": [{"id": f"p{i}", "category": "c", "prompt": f"prompt {i}"} for i in range(5)],
                "sampling": {"top_k": 1, "seed": 0}, "output_prefix": str(tmp / "raw"), "warmup_s": 0.5,
                "duration_s": duration_s, "stop_timeout_s": stop_timeout_s}
    (tmp / "s.json").write_text(json.dumps(settings))
    argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"), "--headless",
            "-u", str(users), "-r", str(users), "-t", f"{duration_s}s", "--stop-timeout", f"{stop_timeout_s:g}",
            "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0", "GrpcStreamUser"]
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(tmp / "s.json")}
    # the run must end on its own (a hung stream shutdown would hit this timeout)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=duration_s + stop_timeout_s + 45)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for f in tmp.glob("raw.*.jsonl") for line in f.read_text().splitlines()]
    metas = [json.loads(f.read_text()) for f in tmp.glob("raw.*.meta.json")]
    return records, metas


def close_to(measured: float, expected: float, early: float = 0.0) -> bool:
    """The client measured ``expected``. On a loaded machine a sleep-timed send by the server is
    only ever late, so little is allowed below (``early``: the share a late first chunk can take
    off a per-token or per-chunk average) and 15 % above, still short of what a wrong definition
    gives (the header time, a chunk taken for a token, a token for a chunk, the second chunk)."""
    return expected * (1 - early) - 1.0 <= measured <= expected * 1.15 + 1.0


@pytest.mark.slow
def test_grpc_stream_user_timing(tmp_path, fake_triton):
    records, metas = run_grpc_locust(tmp_path, fake_triton, users=8, duration_s=5, stop_timeout_s=5)
    ok = [r for r in records if r["status"] == "ok" and r["stage"] == "measure"]
    assert len(ok) >= 3, [r["error"] for r in records if r["status"] != "ok"][:3]  # enough for medians
    assert all(r["osl"] == MAX_TOKENS and r["osl_source"] == "server" and r["tokens_per_chunk"] == [1, 2, 2, 2, 2] for r in ok)
    assert all(r["draft_tokens"] == 8 and r["accepted_tokens"] == 4 for r in ok)  # cumulative perf outputs kept
    ttft = np.median([(r["t_first_token"] - r["t_sent"]) / 1e6 for r in ok])
    tpot = np.median([(r["t_last"] - r["t_first_token"]) / 1e6 / (r["osl"] - 1) for r in ok])
    gaps = np.median([(b - a) / 1e6 for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:])])
    assert close_to(ttft, TTFT_MS), ttft
    assert close_to(tpot, TPOT_MS, early=0.1), tpot
    assert close_to(gaps, K * TPOT_MS, early=0.1), gaps
    assert sum(m["sent"] for m in metas) == len(records)
    assert fake_triton.alive()


@pytest.mark.slow
def test_grpc_inflight_at_stop_recorded_and_run_terminates(tmp_path, fake_triton):
    records, metas = run_grpc_locust(tmp_path, fake_triton, users=4, duration_s=1, stop_timeout_s=0)
    assert sum(m["sent"] for m in metas) == len(records)
    statuses = {r["status"] for r in records}
    assert statuses <= {"ok", "incomplete_at_stop"}
    assert sum(r["status"] == "incomplete_at_stop" for r in records) >= 1


def kill_at_first_ok(raw_dir: Path, server, done: threading.Event, killed: threading.Event) -> None:
    """Kill the server's process group once a raw file holds an ``ok`` record (records are
    line-buffered), i.e. after the client has seen one complete request, however slow the machine."""
    while not done.is_set():
        for part in raw_dir.glob("raw.*.jsonl"):
            for line in part.read_text().splitlines():
                try:
                    ok = json.loads(line)["status"] == "ok"
                except (ValueError, KeyError):  # a line still being written
                    continue
                if ok:
                    os.killpg(server.pid, signal.SIGKILL)
                    killed.set()
                    return
        done.wait(0.05)


@pytest.mark.slow
def test_server_killed_mid_run_is_recorded_and_locust_exits(tmp_path, tmp_path_factory):
    from pipeline.serve.server import start_server

    repo = tmp_path_factory.mktemp("fake_repo_kill") / "repo"
    (repo / "fake_stream" / "1").mkdir(parents=True)
    (repo / "fake_stream" / "config.pbtxt").write_text(CONFIG)
    (repo / "fake_stream" / "1" / "model.py").write_text(MODEL)
    server = start_server(repo, startup_timeout_s=120)
    done, killed = threading.Event(), threading.Event()
    killer = threading.Thread(target=kill_at_first_ok, args=(tmp_path, server, done, killed), daemon=True)
    killer.start()
    try:  # Locust must end on its own (run_grpc_locust's timeout would fail the test otherwise)
        records, metas = run_grpc_locust(tmp_path, server, users=4, duration_s=5, stop_timeout_s=3)
    finally:
        done.set()
        killer.join(timeout=30)
        server.stop()
    assert killed.is_set(), "no ok record before the run ended: the server was never killed"
    assert not server.alive()
    assert sum(m["sent"] for m in metas) == len(records)
    assert any(r["status"] == "ok" for r in records)
    errors = [r for r in records if r["status"] == "error"]
    assert errors and all("UNAVAILABLE" in (r["error"] or "") for r in errors)
