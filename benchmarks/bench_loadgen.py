"""Load-generator self-test: can ONE Locust process stream ≥ 500 chunks/s and still measure right?

Starts ``locustfiles/fake_server.py`` (known TTFT D and per-token delay t, one token per chunk) and
runs the project's locustfile headless in a single process (closed loop: ``HttpStreamUser`` for
``--transport http``, ``OpenAIStreamUser`` against the fake server's OpenAI SSE mode for
``--transport openai``) at a few user counts. From the raw records it reports sustained streamed chunks/s, the error of median
and p95 TTFT and TPOT against the configured values, the bound (2 % or 1 ms, whichever is larger),
achieved concurrency and the Locust process's CPU use. Writes ``benchmarks/results/loadgen.json``
(``loadgen-openai.json`` for the openai transport).
Run: ``.venv/bin/python benchmarks/bench_loadgen.py [--transport http|openai] [--duration 8] [--users 16,48]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.infra.provenance import result_provenance  # noqa: E402 - after the path set-up above
from pipeline.report.stats import achieved_concurrency, measured_window  # noqa: E402 - after the sys.path set-up above

TTFT_MS, TPOT_MS, MAX_TOKENS = 200.0, 10.0, 32
PROMPTS = [{"id": f"p{i}", "category": "bench", "prompt": f"benchmark prompt {i}"} for i in range(16)]


def bound(expected: float) -> float:
    return max(0.02 * expected, 1.0)


def start_server() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(ROOT / "locustfiles" / "fake_server.py"), "--port", "0",
                             "--ttft-ms", str(TTFT_MS), "--tpot-ms", str(TPOT_MS), "--tokens-per-chunk", "1",
                             "--max-tokens-cap", str(MAX_TOKENS)], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline().split()[1])


USER_CLASS = {"http": "HttpStreamUser", "openai": "OpenAIStreamUser"}


def run_point(port: int, users: int, duration_s: int, workdir: Path, transport: str = "http") -> dict:
    import psutil

    settings = {"run_id": "bench", "arm": "baseline", "repeat": 0, "endpoint": f"http://127.0.0.1:{port}",
                "model_name": "ensemble", "transport": transport, "mode": "closed", "concurrency": users,
                "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "sampling": {"top_k": 1, "seed": 0},
                "output_prefix": str(workdir / f"u{users}"), "warmup_s": 1.0, "duration_s": duration_s,
                "stop_timeout_s": 10}
    settings_path = workdir / f"u{users}.json"
    settings_path.write_text(json.dumps(settings))
    argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "locustfile.py"), "--headless",
            "-u", str(users), "-r", str(users), "-t", f"{duration_s}s", "--stop-timeout", "10", "--only-summary",
            "--loglevel", "WARNING", "--exit-code-on-error", "0", USER_CLASS[transport]]
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(settings_path)}
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            times = ps.cpu_times()
            cpu = times.user + times.system
        except psutil.Error:
            pass
        time.sleep(0.2)
    wall = time.monotonic() - started
    records = [json.loads(line) for f in workdir.glob(f"u{users}.*.jsonl") for line in f.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok" and r["stage"] == "measure"]
    metas = [json.loads(f.read_text()) for f in workdir.glob(f"u{users}.*.meta.json")]
    stop_signals = {m["pid"]: m.get("t_stop_signal") for m in metas}
    duration, _ = measured_window(ok)
    ttft = np.array([(r["t_first_token"] - r["t_sent"]) / 1e6 for r in ok])
    tpot = np.array([(r["t_last"] - r["t_first_token"]) / 1e6 / (r["osl"] - 1) for r in ok if r["osl"] > 1])
    chunks = sum(r["n_chunks"] for r in ok)
    point = {
        "users": users, "requests_ok": len(ok), "requests_warmup": sum(r["stage"] == "warmup" for r in records),
        "requests_failed": sum(r["status"] not in ("ok", "incomplete_at_stop") for r in records),
        "requests_incomplete_at_stop": sum(r["status"] == "incomplete_at_stop" for r in records),
        "chunks_per_s": chunks / duration if duration else 0.0,
        "achieved_concurrency": achieved_concurrency(ok, stop_signals),
        "ttft_ms": {"expected": TTFT_MS, "p50": float(np.median(ttft)), "p95": float(np.percentile(ttft, 95))},
        "tpot_ms": {"expected": TPOT_MS, "p50": float(np.median(tpot)), "p95": float(np.percentile(tpot, 95))},
        "locust_cpu_s": cpu, "locust_wall_s": wall, "locust_cpu_fraction": cpu / wall if wall else None,
    }
    point["ttft_error_ms"] = point["ttft_ms"]["p50"] - TTFT_MS
    point["tpot_error_ms"] = point["tpot_ms"]["p50"] - TPOT_MS
    point["within_bound"] = abs(point["ttft_error_ms"]) <= bound(TTFT_MS) and abs(point["tpot_error_ms"]) <= bound(TPOT_MS)
    point["meets_target"] = point["within_bound"] and point["chunks_per_s"] >= 500
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--users", default="16,48")
    parser.add_argument("--transport", choices=sorted(USER_CLASS), default="http")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    default_name = "loadgen.json" if args.transport == "http" else f"loadgen-{args.transport}.json"
    args.out = args.out or str(ROOT / "benchmarks" / "results" / default_name)
    server, port = start_server()
    points = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for users in [int(u) for u in args.users.split(",")]:
                points.append(run_point(port, users, args.duration, Path(tmp), args.transport))
                print(json.dumps(points[-1]), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    result = {
        "benchmark": "loadgen", "transport": args.transport, "created_unix": time.time(), "host": platform.node(), "cpu_count": os.cpu_count(),
        "note": "2 shared CPU cores, other jobs running; fake server and Locust share them",
        "server": {"ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS, "tokens_per_chunk": 1, "max_tokens": MAX_TOKENS},
        "bound": "|median error| <= max(2% of expected, 1 ms) for TTFT and TPOT", "target_chunks_per_s": 500,
        "points": points, "pass": any(p["meets_target"] for p in points),
        "provenance": result_provenance(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}: pass={result['pass']}")


if __name__ == "__main__":
    main()
