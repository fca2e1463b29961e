"""The BLS draft-target flow when the client or the draft misbehaves, on a real tritonserver:
``num_draft_tokens`` above the target's ``max_draft_len`` is refused before any model runs, and a
draft that fails for real — it answers later than the request's ``draft_timeout_ms``, or its
engine refuses the context (a draft built with a shorter ``max_seq_len`` than the target) — makes
the request continue target-only: the output equals the greedy target-only reference, the perf
outputs say ``draft_fallbacks`` 1, ``/metrics`` counts it by reason and the server log names it."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from server_stops import stop_later
from tritonclient.utils import InferenceServerException

import tiny_deploy
from conftest import MAX_TOKENS, PROMPTS
from tests.polling import wait_until
from triton_clients import grpc_stream, http_generate, text_inputs

pytestmark = [pytest.mark.triton, pytest.mark.slow]

FALLBACKS = "specdeploy_spec_decode_fallbacks_total"
SHORT_DRAFT_SEQ_LEN = 20  # prompt + 24 new tokens outgrow it after a few rounds; the target's is 256


def _scrape(metrics_url: str) -> str:
    return urllib.request.urlopen(metrics_url, timeout=10).read().decode()  # noqa: S310 - a loopback http URL


def fallbacks(metrics_url: str, reason: str) -> float:
    pattern = re.compile(r'^' + FALLBACKS + r'\{([^}]*)\} (\S+)$')
    total = 0.0
    for line in _scrape(metrics_url).splitlines():
        match = pattern.match(line)
        if match and 'model="tensorrt_llm_bls"' in match.group(1) and f'reason="{reason}"' in match.group(1):
            total += float(match.group(2))
    return total


def requests_to(metrics_url: str, model: str) -> float:
    pattern = re.compile(r'^nv_inference_request_success\{model="' + re.escape(model) + r'",version="1"\} (\S+)$')
    return sum(float(m.group(1)) for line in _scrape(metrics_url).splitlines() if (m := pattern.match(line)))


def wait_for(condition, what: str, timeout_s: float = 60.0):
    return wait_until(condition, what, timeout_s, interval=0.1)


def speculative(prompt: str, **extra) -> dict:
    return {"text_input": prompt, "max_tokens": MAX_TOKENS, "num_draft_tokens": 3, "stream": False,
            "top_k": 1, "return_perf_metrics": True, **extra}


# -- num_draft_tokens above max_draft_len ---------------------------------------------------------


def test_num_draft_tokens_above_max_draft_len_is_refused_before_any_model(dt_server):
    url = dt_server.metrics_url
    before = {m: requests_to(url, m) for m in ("preprocessing", "tensorrt_llm_draft", "tensorrt_llm")}
    status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", speculative("hi", num_draft_tokens=9))
    assert status == 400, body
    assert "num_draft_tokens 9 refused" in body["error"]
    assert "max_draft_len of tensorrt_llm" in body["error"] and "send num_draft_tokens <= 3" in body["error"]
    # the next request works, and shows the counters move when models do run
    status, ok = http_generate(dt_server.http_url, "tensorrt_llm_bls", speculative("hi", num_draft_tokens=3))
    assert status == 200 and ok["text_output"].startswith("hi")
    wait_for(lambda: requests_to(url, "tensorrt_llm_draft") > before["tensorrt_llm_draft"], "the draft's counter")
    after = {m: requests_to(url, m) for m in before}
    assert after["preprocessing"] == before["preprocessing"] + 1  # only the good request was preprocessed


# -- draft timeout ------------------------------------------------------------------------------


def test_draft_timeout_falls_back_to_target_only(dt_server, reference_outputs):
    prompt = PROMPTS[0]
    before = fallbacks(dt_server.metrics_url, "timeout")
    # any real draft call takes longer than a microsecond: the first answer is late
    status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", speculative(prompt, draft_timeout_ms=0.001))
    assert status == 200, body
    assert body["text_output"] == reference_outputs[prompt]["text"]  # the target decided every token
    assert body["draft_fallbacks"] == 1
    assert body["total_draft_tokens"] == 0  # the late drafts were not used
    wait_for(lambda: fallbacks(dt_server.metrics_url, "timeout") == before + 1, "the timeout fallback counter")
    wait_for(lambda: "speculation fallback" in dt_server.log_tail(400), "the fallback in the server log")


def test_draft_timeout_while_streaming(dt_server, reference_outputs):
    prompt = PROMPTS[2]
    responses = grpc_stream(dt_server.grpc_url, "tensorrt_llm_bls", text_inputs(
        prompt, MAX_TOKENS, stream=True, num_draft_tokens=3, top_k=1, return_perf_metrics=True, draft_timeout_ms=0.001))
    assert "".join(r["text_output"][0].decode() for r in responses) == reference_outputs[prompt]["completion"]
    assert int(responses[-1]["draft_fallbacks"][0][0]) == 1


def test_generous_timeout_keeps_speculating(dt_server, reference_outputs):
    prompt = PROMPTS[1]
    status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", speculative(prompt, draft_timeout_ms=600000.0))
    assert status == 200 and body["text_output"] == reference_outputs[prompt]["text"]
    assert body["draft_fallbacks"] == 0 and body["total_draft_tokens"] > 0


def test_negative_timeout_is_refused(dt_server):
    status, body = http_generate(dt_server.http_url, "tensorrt_llm_bls", speculative("hi", draft_timeout_ms=-1.0))
    assert status == 400 and "draft_timeout_ms must be >= 0, got -1.0" in body["error"]


# -- draft error: a draft engine whose max_seq_len the context outgrows ---------------------------


@pytest.fixture(scope="module")
def short_draft_server(serving_workdir, tiny_models):
    from pipeline.config import load_config
    from pipeline.render.renderer import render
    from pipeline.serve.server import start_deployment

    name = "tiny-dt-short-draft"
    # one BLS instance, not one per batch slot: its tests send one request at a time
    cfg_path = tiny_deploy.make_deployment(serving_workdir, tiny_models, "draft_target", name=name,
                                           triton={"bls_instance_count": 1})
    descriptor = serving_workdir / "engines" / name / "engine" / "draft" / "engine.json"
    data = json.loads(descriptor.read_text())
    data["max_seq_len"] = SHORT_DRAFT_SEQ_LEN  # built for shorter contexts than the target
    descriptor.write_text(json.dumps(data, indent=2))
    cfg = load_config(cfg_path, serving_workdir)
    render(cfg)
    server = start_deployment(cfg, "speculative")
    yield server
    stop_later(server)


def test_draft_error_falls_back_to_target_only(short_draft_server, reference_outputs):
    server = short_draft_server
    before = fallbacks(server.metrics_url, "error")
    for prompt in PROMPTS:
        status, body = http_generate(server.http_url, "tensorrt_llm_bls", speculative(prompt))
        assert status == 200, body
        assert body["text_output"] == reference_outputs[prompt]["text"]
        assert body["draft_fallbacks"] == 1
        assert 0 < body["total_draft_tokens"]  # it speculated until the draft failed
    wait_for(lambda: fallbacks(server.metrics_url, "error") == before + len(PROMPTS), "the error fallback counter")
    def fallback_log() -> str:
        log = server.log_tail(2000)
        return log if "speculation fallback" in log else ""

    log = wait_for(fallback_log, "the fallback in the server log")
    assert "tensorrt_llm_draft failed (error:" in log and "maximum sequence length" in log


def test_draft_error_short_request_needs_no_fallback(short_draft_server):
    """A request that fits the draft's limit speculates as usual."""
    status, body = http_generate(short_draft_server.http_url, "tensorrt_llm_bls", speculative("hi", max_tokens=4))
    assert status == 200 and body["draft_fallbacks"] == 0


def test_target_failure_is_an_error_not_a_fallback(short_draft_server):
    """end_id outside the vocabulary: the draft refuses it (a fallback would follow) and so does the
    target, so the request fails with the target's message and no fallback is counted."""
    before = fallbacks(short_draft_server.metrics_url, "error")
    with pytest.raises(InferenceServerException, match=r"end_id \(100000\) is not within acceptable range"):
        grpc_stream(short_draft_server.grpc_url, "tensorrt_llm_bls", text_inputs(
            "hi", 4, stream=False, num_draft_tokens=3, end_id=100000))
    status, body = http_generate(short_draft_server.http_url, "tensorrt_llm_bls", speculative("hi", max_tokens=4))
    assert status == 200
    assert fallbacks(short_draft_server.metrics_url, "error") == before


# -- the load tester records it per request -------------------------------------------------------


def _locust_records(tmp_path, server, extra_inputs: dict) -> list[dict]:
    """A short closed-loop gRPC streaming Locust run (locustfiles/locustfile.py) against the BLS."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    settings = {"run_id": "fb", "arm": "speculative", "repeat": 0, "endpoint": server.grpc_url,
                "model_name": "tensorrt_llm_bls", "transport": "grpc", "concurrency": 2, "max_tokens": 8,
                "prompts": [{"id": f"p{i}", "category": "c", "prompt": p} for i, p in enumerate(PROMPTS)],
                "sampling": {"top_k": 1}, "extra_inputs": extra_inputs, "output_prefix": str(tmp_path / "raw"),
                "warmup_s": 0.0, "duration_s": 2, "stop_timeout_s": 30}
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    argv = [sys.executable, "-m", "locust", "-f", str(root / "locustfiles" / "locustfile.py"), "--headless",
            "-u", "2", "-r", "2", "-t", "2s", "--stop-timeout", "30", "--only-summary", "--loglevel", "WARNING",
            "--exit-code-on-error", "0", "GrpcStreamUser"]
    env = {**os.environ, "SPECDEPLOY_LOADTEST_CONFIG": str(tmp_path / "settings.json")}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for f in tmp_path.glob("raw.*.jsonl") for line in f.read_text().splitlines()]


@pytest.mark.parametrize("timeout_ms,expected", [(0.001, 1), (600000.0, 0)], ids=["late-draft", "in-time"])
def test_load_tester_records_fallbacks(tmp_path, dt_server, timeout_ms, expected):
    records = _locust_records(tmp_path, dt_server, {"num_draft_tokens": 3, "draft_timeout_ms": timeout_ms})
    ok = [r for r in records if r["status"] == "ok"]
    assert ok, [r.get("error") for r in records][:3]
    assert all(r["draft_fallbacks"] == expected for r in ok)
