"""The ``openai`` transport: request mapping, and real Locust runs against the fake server's OpenAI mode.

The fake server (locustfiles/fake_server.py, its own process) answers ``/v1/completions`` and
``/v1/chat/completions`` with the same known timing as its Triton mode (headers at once, the first
token after D, chunks of k tokens every k·t, then a ``usage`` chunk and ``[DONE]``). The Locust
run is a real ``locust --headless`` subprocess with the project's locustfile.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "locustfiles"))

from openai_user import chunk_text, openai_body  # noqa: E402 - after the sys.path set-up above
from test_loadtest_fake_server import PROMPTS, FakeServer, close_to  # noqa: E402 - after the sys.path set-up above

from lt_common import RunSettings, request_inputs  # noqa: E402 - after the sys.path set-up above

TOKENIZER = ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target"


def _settings(**kw) -> RunSettings:
    base = {"run_id": "t", "arm": "baseline", "repeat": 0, "endpoint": "http://x", "model_name": "m",
            "prompts": PROMPTS, "transport": "openai"}
    return RunSettings(**{**base, **kw})


def test_body_maps_sampling_for_completions_and_chat():
    settings = _settings(max_tokens=32, sampling={"top_k": 1, "top_p": 0.0, "temperature": 0.7, "seed": 10})
    inputs = request_inputs(settings, "hello", prompt_index=3)
    body = openai_body(inputs, "tiny", "completions", send_top_k=True)
    assert body == {"model": "tiny", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 32,
                    "prompt": "hello", "temperature": pytest.approx(0.7), "top_k": 1, "seed": 13}
    greedy = openai_body(inputs, "tiny", "completions")  # the default: greedy as the OpenAI API spells it
    assert greedy["temperature"] == 0.0 and "top_k" not in greedy
    chat = openai_body(inputs, "tiny", "chat", send_top_k=False)
    assert chat["messages"] == [{"role": "user", "content": "hello"}] and "prompt" not in chat
    assert "top_k" not in chat and "top_p" not in chat  # OpenAI proper takes no top_k; top_p 0 = off
    assert openai_body({**inputs, "top_p": 0.9}, "tiny", "completions")["top_p"] == pytest.approx(0.9)


def test_extra_inputs_pass_through_but_triton_fields_do_not():
    settings = _settings(extra_inputs={"min_tokens": 4})
    body = openai_body(request_inputs(settings, "p", 0), "m", "completions")
    assert body["min_tokens"] == 4
    assert not {"text_input", "exclude_input_in_output", "return_perf_metrics", "return_num_output_tokens"} & set(body)


def test_chunk_text_reads_both_shapes():
    assert chunk_text({"choices": [{"text": "a", "finish_reason": None}]}, "completions") == ("a", None)
    assert chunk_text({"choices": [{"delta": {"content": "b"}, "finish_reason": "stop"}]}, "chat") == ("b", "stop")
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}, "chat") == (None, None)


def run_openai_locust(tmp: Path, port: int, *, users: int, duration_s: float, api: str = "completions",
                      rate: float | None = None, tokenizer: Path | None = None, stop_timeout_s: float = 10.0,
                      warmup_s: float = 0.0, max_tokens: int = 16) -> tuple[list[dict], list[dict]]:
    settings = {
        "run_id": "t", "arm": "baseline", "repeat": 0, "endpoint": f"http://127.0.0.1:{port}", "model_name": "fake",
        "transport": "openai", "openai_api": api, "mode": "open" if rate else "closed", "concurrency": users,
        "target_rate": rate, "arrival": "fixed", "prompts": PROMPTS, "max_tokens": max_tokens,
        "sampling": {"top_k": 1, "seed": 0}, "output_prefix": str(tmp / "raw" / "cell"), "warmup_s": warmup_s,
        "duration_s": duration_s, "stop_timeout_s": stop_timeout_s, "request_timeout_s": 60,
        "tokenizer_dir": str(tokenizer) if tokenizer else None,
    }
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "settings.json"
    path.write_text(json.dumps(settings))
    user_class = "OpenAIOpenLoopUser" if rate else "OpenAIStreamUser"
    argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "locustfile.py"), "--headless",
            "-u", str(1 if rate else users), "-r", str(users), "-t", f"{int(duration_s)}s",
            "--stop-timeout", f"{stop_timeout_s:g}", "--only-summary", "--loglevel", "WARNING",
            "--exit-code-on-error", "0", user_class]
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(path)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=duration_s + stop_timeout_s + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for f in sorted((tmp / "raw").glob("cell.*.jsonl")) for line in f.read_text().splitlines()]
    metas = [json.loads(f.read_text()) for f in sorted((tmp / "raw").glob("cell.*.meta.json"))]
    return records, metas


@pytest.fixture(scope="module")
def timed_server():
    # as the Triton-mode timing test: D = 500 ms, 3 tokens per chunk at t = 50 ms/token
    server = FakeServer("--ttft-ms", "500", "--tpot-ms", "50", "--tokens-per-chunk", "3", "--max-tokens-cap", "16")
    yield server
    server.close()


@pytest.mark.slow
@pytest.mark.parametrize(("users", "api"), [(1, "completions"), (64, "chat")])
def test_measured_timing_matches_the_server(tmp_path, timed_server, users, api):
    records, metas = run_openai_locust(tmp_path, timed_server.port, users=users, duration_s=5.0, api=api,
                                       warmup_s=0.5)
    ok = [r for r in records if r["status"] == "ok" and r["stage"] == "measure"]
    assert len(ok) >= (1 if users == 1 else 120)
    assert all(r["osl"] == 16 and r["osl_source"] == "server" and r["transport"] == "openai" for r in ok)
    assert all(r["n_chunks"] == 6 and r["output_text"] == " tok" * 16 for r in ok)  # usage chunk is not content
    ttft = np.median([(r["t_first_token"] - r["t_sent"]) / 1e6 for r in ok])
    tpot = np.median([(r["t_last"] - r["t_first_token"]) / 1e6 / (r["osl"] - 1) for r in ok])
    gaps = np.median([(b - a) / 1e6 for r in ok for a, b in zip(r["chunk_times"], r["chunk_times"][1:])])
    assert close_to(ttft, 500.0), ttft  # not the header time (≈ 0)
    assert close_to(tpot, 50.0, early=0.1), tpot  # per token, from the server's usage count
    assert close_to(gaps, 150.0, early=0.1), gaps  # per chunk = k·t
    assert sum(m["sent"] for m in metas) == len(records)


@pytest.mark.slow
def test_without_usage_output_is_retokenized_or_counted_by_chunks(tmp_path):
    server = FakeServer("--ttft-ms", "20", "--tpot-ms", "5", "--tokens-per-chunk", "2", "--max-tokens-cap", "8",
                        "--no-usage")
    try:
        # both runs at once against the one server: no assertion here is about timing
        with ThreadPoolExecutor(2) as pool:
            retok_run = pool.submit(run_openai_locust, tmp_path / "retok", server.port, users=2, duration_s=2.0,
                                    tokenizer=TOKENIZER)
            chunks_run = pool.submit(run_openai_locust, tmp_path / "chunks", server.port, users=2, duration_s=2.0)
            (retok, _), (chunks, _) = retok_run.result(), chunks_run.result()
    finally:
        server.close()
    ok_retok = [r for r in retok if r["status"] == "ok"]
    ok_chunks = [r for r in chunks if r["status"] == "ok"]
    assert ok_retok and ok_chunks
    assert all(r["osl_source"] == "retokenized" and r["osl"] == r["osl_retok"] > 0 for r in ok_retok)
    assert all(r["osl_source"] == "chunks" and r["osl"] == r["n_chunks"] == 5 for r in ok_chunks)  # 1 + 2+2+2+1


@pytest.mark.slow
def test_open_loop_and_in_flight_at_stop(tmp_path):
    server = FakeServer("--ttft-ms", "100", "--tpot-ms", "400", "--max-tokens-cap", "16")  # ≈ 6 s per request
    try:
        # 2 s at 4 req/s: several arrivals, none of which can finish a ≈ 6 s request by the stop
        records, metas = run_openai_locust(tmp_path, server.port, users=1, duration_s=2.0, rate=4.0, stop_timeout_s=0)
    finally:
        server.close()
    assert records and all(r["t_scheduled"] is not None and r["mode"] == "open" for r in records)
    assert {r["status"] for r in records} == {"incomplete_at_stop"}  # none finishes, none dropped
    assert sum(m["sent"] for m in metas) == len(records) == sum(m["written"] for m in metas)


@pytest.mark.slow
def test_connection_refused_is_a_recorded_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    records, metas = run_openai_locust(tmp_path, port, users=2, duration_s=2.0)
    # every finished request is an error with its text; the fail-fast stop (every request failing) may
    # catch one request still connecting, which is kept as incomplete, never dropped
    statuses = [r["status"] for r in records]
    assert "error" in statuses and set(statuses) <= {"error", "incomplete_at_stop"}, statuses
    assert all(r["error"] for r in records if r["status"] == "error")
    assert sum(m["sent"] for m in metas) == len(records)
