"""The Locust users on the llmapi contract against the rendered llmapi repository in a REAL
tritonserver, with the stand-in model (tests/fixtures/llmapi_standin/model.py: upstream's
tensors and response semantics, since TensorRT-LLM's model.py needs a GPU).

- gRPC streaming and HTTP generate_stream: every record ok, TTFT measured, the cumulative
  text_output turned into deltas, tokens re-tokenized with the deployment's tokenizer, the perf
  outputs (sent as strings, as upstream does) read as the drafted/accepted counts;
- ``run_loadtest`` on both arms with a speculative arm whose LLM returns no perf metrics: the
  records carry no acceptance figures and the report says "not reported" instead of a number.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from server_stops import stop_later

from pipeline.serve.server import start_server
from tiny_deploy import render_llmapi_standin

pytestmark = [pytest.mark.triton, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "fixtures" / "llmapi_standin" / "model.py"
TOKENIZER = ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target"
MAX_TOKENS, STANDIN_DRAFT_LEN = 7, 3


def _render(tmp_path: Path, **triton):
    return render_llmapi_standin(tmp_path, name="api-load", triton=triton, loadtest={
        "concurrency": [2], "duration_s": 3, "warmup_s": 0, "repeats": 1, "max_tokens": MAX_TOKENS, "stop_timeout_s": 5})


def _locust(tmp: Path, server, transport: str) -> list[dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    endpoint = f"{server.host}:{server.ports.grpc}" if transport == "grpc" else server.http_url
    settings = {"run_id": "l", "arm": "speculative", "repeat": 0, "endpoint": endpoint, "model_name": "tensorrt_llm",
                "contract": "llmapi", "transport": transport, "concurrency": 2, "max_tokens": MAX_TOKENS,
                "prompts": [{"id": f"p{i}", "category": "c", "prompt": f"prompt number {i}"} for i in range(4)],
                "sampling": {"top_k": 1, "seed": 0}, "output_prefix": str(tmp / "raw"), "warmup_s": 0,
                "duration_s": 2, "stop_timeout_s": 5, "tokenizer_dir": str(TOKENIZER)}
    (tmp / "s.json").write_text(json.dumps(settings))
    user = "GrpcStreamUser" if transport == "grpc" else "HttpStreamUser"
    argv = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "locustfile.py"), "--headless",
            "-u", "2", "-r", "2", "-t", "2s", "--stop-timeout", "5", "--only-summary", "--loglevel", "WARNING",
            "--exit-code-on-error", "0", user]
    proc = subprocess.run(argv, env={**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(tmp / "s.json")},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for f in tmp.glob("raw.*.jsonl") for line in f.read_text().splitlines()]


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_locust_llmapi_contract_records(tmp_path, llmapi_standin_server, transport):
    from tokenizers import Tokenizer

    from pipeline.loadtest.endpoints import probe_generate

    server = llmapi_standin_server  # the layout _render writes, shared with test_llmapi_repo_triton
    assert probe_generate(server.http_url, "tensorrt_llm", {}, contract="llmapi")  # the liveness probe speaks it
    records = _locust(tmp_path / "lt", server, transport)
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and len(ok) >= len(records) - 2, [r["error"] for r in records if r["status"] != "ok"][:3]
    steps = math.ceil(MAX_TOKENS / STANDIN_DRAFT_LEN)
    for r in ok:
        assert r["t_first_token"] is not None and r["t_first_token"] > r["t_sent"]
        assert len(r["output_text"].split()) == MAX_TOKENS  # deltas joined, not the cumulative texts summed
        assert r["n_chunks"] == steps and r["osl_source"] == "retokenized"
        assert r["osl"] == len(tok.encode(r["output_text"], add_special_tokens=False).ids) == sum(r["tokens_per_chunk"])
        assert (r["draft_tokens"], r["accepted_tokens"]) == (STANDIN_DRAFT_LEN * steps, MAX_TOKENS - steps)
        assert set(r["server_times_ns"]) == {"arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                             "last_token_time_ns"}


def test_model_errors_are_recorded_as_errors(tmp_path):
    """Upstream answers a streaming request to a model that is not decoupled with one error
    response; every record says so."""
    _, repos = _render(tmp_path, decoupled=False)
    server = start_server(repos["speculative"], startup_timeout_s=120)
    try:
        records = _locust(tmp_path / "lt", server, "grpc")
    finally:
        stop_later(server)
    done = [r for r in records if r["status"] != "incomplete_at_stop"]
    assert done and all(r["status"] == "error" and "only supported in decoupled mode" in r["error"] for r in done)


@pytest.mark.e2e  # a whole run_loadtest on two servers: the end-to-end tier (docs/testing.md)
def test_llmapi_loadtest_report_marks_missing_acceptance(tmp_path):
    from pipeline.loadtest.endpoints import remote_endpoint
    from pipeline.loadtest.runner import run_loadtest

    cfg, repos = _render(tmp_path)
    model_yaml = repos["speculative"] / "tensorrt_llm" / "1" / "model.yaml"
    model_yaml.write_text(model_yaml.read_text().replace("return_perf_metrics: true", "return_perf_metrics: false"))
    servers = {arm: start_server(repo, startup_timeout_s=120) for arm, repo in repos.items()}
    try:
        endpoints = {arm: remote_endpoint(cfg, arm, f"{s.host}:{s.ports.grpc}", s.metrics_url) for arm, s in servers.items()}
        run_dir = run_loadtest(cfg, out_dir=tmp_path / "run", progress=False, given_endpoints=endpoints,
                               tokenizer_dir=str(TOKENIZER))
    finally:
        for server in servers.values():
            server.stop()
    settings = json.loads(next((run_dir / "settings").glob("speculative-*.json")).read_text())
    assert settings["contract"] == "llmapi" and settings["model_name"] == "tensorrt_llm"
    records = [json.loads(line) for f in (run_dir / "raw").glob("speculative-*.jsonl") for line in f.read_text().splitlines()]
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all(r["t_first_token"] and r["osl"] > 0 and r["osl_source"] == "retokenized" for r in ok)
    assert all(r["draft_tokens"] is None and r["acceptance_rate"] is None for r in ok)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["acceptance_reported"]["speculative"]["per_request"] == "not reported"
    md = (run_dir / "report.md").read_text()
    assert "not reported" in md and "acceptance" in md
