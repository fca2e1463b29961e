"""The ``openai`` transport against servers as users meet them (issue 31): reasoning streams, temperature 0,
strict servers that refuse every request or half of them, one model name per arm, SGLang's per-rank gauges,
broken streams.

Stream shapes are upstream's: vLLM's ``DeltaMessage`` (``vllm/entrypoints/openai/engine/protocol.py``:
``reasoning``, the older ``reasoning_content`` deprecated), SGLang's (``python/sglang/srt/entrypoints/openai/
protocol.py``: ``reasoning_content``), trtllm-serve's (``tensorrt_llm/serve/openai_protocol.py``: both
fields, ``reasoning`` for GPT-OSS). The fake server (locustfiles/fake_server.py, its own process) streams
them with known timing; Locust runs are real ``locust --headless`` subprocesses.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "locustfiles"))

from openai_user import chunk_parts, openai_body  # noqa: E402 - after the sys.path set-up above
from test_loadtest_fake_server import PROMPTS, FakeServer  # noqa: E402 - after the sys.path set-up above
from test_loadtest_openai import run_openai_locust  # noqa: E402 - after the sys.path set-up above

from lt_common import RequestState, RunSettings, build_record, request_inputs  # noqa: E402 - after the sys.path set-up above


def _settings(**kw) -> RunSettings:
    base = {"run_id": "t", "arm": "baseline", "repeat": 0, "endpoint": "http://x", "model_name": "m",
            "prompts": PROMPTS, "transport": "openai"}
    return RunSettings(**{**base, **kw})


# ------------------------------------------------------------------------------------------------
# 1. reasoning streams


@pytest.mark.parametrize(("delta", "expected"), [
    ({"reasoning": "hm", "content": None}, (None, "hm")),  # vLLM now
    ({"reasoning_content": "hm", "content": None}, (None, "hm")),  # SGLang, vLLM before the rename
    ({"content": None, "reasoning_content": "hm", "reasoning": None}, (None, "hm")),  # trtllm-serve
    ({"content": None, "reasoning_content": None, "reasoning": "hm"}, (None, "hm")),  # trtllm-serve GPT-OSS
    ({"content": "a", "reasoning_content": None}, ("a", None)),
    ({"role": "assistant", "content": ""}, ("", None)),  # the role-only first chunk
])
def test_chat_deltas_of_each_server(delta, expected):
    assert chunk_parts({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}, "chat") == (*expected, None)


def test_completions_text_and_reasoning_on_the_choice():
    assert chunk_parts({"choices": [{"text": "a", "finish_reason": "stop"}]}, "completions") == ("a", None, "stop")
    assert chunk_parts({"choices": [{"text": "", "reasoning_content": "r"}]}, "completions") == ("", "r", None)
    assert chunk_parts({"choices": [], "usage": {"completion_tokens": 3}}, "chat") == (None, None, None)


def test_reasoning_counts_as_output_and_stays_apart():
    state = RequestState("r", "p", "c", 0, "prompt", t_scheduled=None, t_sent=0)
    state.add_chunk(100, None, None, "think")
    state.add_chunk(200, "", None, "more")
    state.add_chunk(300, "answer", None)
    state.add_chunk(400, " done", None)
    state.osl_server, state.status = 9, "ok"
    record = build_record(_settings(max_tokens=64), state, worker_pid=1, retokenize=lambda text: len(text.split()))
    assert record["t_first_token"] == 100 and record["t_first_answer"] == 300  # TTFT on the first token of any kind
    assert record["output_text"] == "answer done" and record["reasoning_text"] == "thinkmore"
    assert record["n_chunks"] == 4 and record["osl"] == 9
    assert record["osl_retok"] == 2 + 1  # both parts re-tokenized
    plain = RequestState("q", "p", "c", 0, "prompt", t_scheduled=None, t_sent=0)
    plain.add_chunk(50, "answer", None)
    plain.status = "ok"
    other = build_record(_settings(), plain, worker_pid=1)
    assert other["t_first_answer"] == other["t_first_token"] == 50 and other["reasoning_text"] is None
    assert other["output_sha256"] != record["output_sha256"]


def test_first_answer_statistic_beside_ttft():
    from pipeline.report.stats import first_answer_ms, ttft_ms

    rec = {"t_sent": 0, "t_first_token": 2_000_000, "t_first_answer": 9_000_000, "reasoning_text": "r"}
    assert ttft_ms(rec) == 2.0 and first_answer_ms(rec) == 9.0
    assert first_answer_ms({"t_sent": 0, "t_first_token": 2_000_000}) == 2.0  # older records: no reasoning
    assert first_answer_ms({"t_sent": 0, "t_first_token": 2_000_000, "t_first_answer": None,
                            "reasoning_text": "all thinking"}) is None


@pytest.mark.slow
@pytest.mark.parametrize("style", ["reasoning", "reasoning_content", "both"])
def test_reasoning_stream_times_ttft_on_the_first_thought(tmp_path, style):
    # one run at a time: side by side (tried), a loaded client read the first thought late and the
    # later chunks in a burst, which shortened the measured thinking time below its floor (seen in CI)
    # D = 300 ms to the first token, then one token every 40 ms; 5 reasoning tokens, then 11 answer tokens
    server = FakeServer("--ttft-ms", "300", "--tpot-ms", "40", "--max-tokens-cap", "16",
                        "--reasoning-tokens", "5", "--reasoning-style", style)
    try:
        records, _ = run_openai_locust(tmp_path, server.port, users=2, duration_s=3.0, api="chat",
                                       tokenizer=ROOT / "pipeline" / "demo" / "artifacts" / "tiny-target")
    finally:
        server.close()
    ok = [r for r in records if r["status"] == "ok"]
    assert ok
    for r in ok:
        assert r["reasoning_text"] == "think" * 5 and r["output_text"] == " tok" * 11
        assert r["osl"] == 16 and r["osl_source"] == "server"  # usage counts the reasoning tokens
        assert r["osl_retok"] is not None and r["osl_retok"] > 11  # the cross-check counts both texts
        assert r["n_chunks"] == 16 and r["t_first_token"] == r["chunk_times"][0]  # the first thought
        assert r["t_first_answer"] == r["chunk_times"][5]  # the first answer token, after 5 thoughts
    # a sleep-timed server is only ever late: lower bounds tell the definitions apart on a loaded machine
    thinking = np.median([(r["t_first_answer"] - r["t_first_token"]) / 1e6 for r in ok])
    tpot = np.median([(r["t_last"] - r["t_first_token"]) / 1e6 / (r["osl"] - 1) for r in ok])
    assert thinking >= 5 * 40.0 * 0.8, thinking
    assert tpot >= 40.0 * 0.8, tpot  # from the first answer instead: 10 gaps / 15 tokens ≈ 27 ms


# ------------------------------------------------------------------------------------------------
# 2. temperature 0


def test_temperature_zero_is_greedy_on_every_transport():
    from pipeline.config import Sampling

    assert Sampling(temperature=0, top_k=40, top_p=0.9).greedy and not Sampling(temperature=0.7, top_k=40).greedy
    with pytest.raises(ValueError):
        Sampling(temperature=-0.1)
    for transport in ("grpc", "http"):
        inputs = request_inputs(_settings(transport=transport, sampling={"temperature": 0.0, "top_k": 0}), "p", 0)
        assert inputs["top_k"] == 1 and "temperature" not in inputs  # TensorRT-LLM's greedy
    from llmapi_contract import llmapi_inputs

    llm = llmapi_inputs(_settings(transport="grpc", contract="llmapi", sampling={"temperature": 0.0}), "p", 0)
    assert llm["sampling_param_top_k"] == 1 and "sampling_param_temperature" not in llm
    body = openai_body(request_inputs(_settings(sampling={"temperature": 0.0, "top_k": 0}), "p", 0), "m", "chat")
    assert body["temperature"] == 0.0 and "top_k" not in body


@pytest.mark.parametrize(("top_k", "send", "expect_top_k", "expect_temperature"), [
    (1, None, None, 0.0),  # greedy, spelled the OpenAI way: no field a strict server refuses
    (1, False, None, 0.0),
    (1, True, 1, 0.7),  # a server known to take top_k
    (40, None, 40, 0.7),  # set on purpose in the config
    (40, False, None, 0.7),
])
def test_top_k_is_sent_only_when_asked_for(top_k, send, expect_top_k, expect_temperature):
    inputs = request_inputs(_settings(sampling={"temperature": 0.7, "top_k": top_k}), "p", 0)
    body = openai_body(inputs, "m", "completions", send_top_k=send)
    assert body.get("top_k") == expect_top_k and body["temperature"] == pytest.approx(expect_temperature)


# ------------------------------------------------------------------------------------------------
# 3. fail fast with the server's words


@pytest.mark.parametrize(("error", "status", "fix"), [
    ("HTTP 422: {\"detail\":\"Unexpected fields in the request: {'top_k'}\"}", 422, "openai_top_k: false"),
    ('HTTP 404: {"message":"The model `x` does not exist."}', 404, "wrong model name"),
    ('HTTP 400: {"detail":"Server is pinned to \'/tmp/m\'; requested \'wrong\'."}', 400, "wrong model name"),
    ('HTTP 400: {"detail":"Cannot use chat template functions because tokenizer.chat_template is not set"}', 400,
     "openai_api: completions"),
    ("HTTP 404: {\"detail\":\"Not Found\"}", 404, "wrong path"),
    ("ConnectionRefusedError: [Errno 111] Connection refused", None, "not up"),
    ("HTTP 500: boom", 500, "its log"),
    ("something else", 418, "read the server's message"),
])
def test_likely_fix_names_the_cause(error, status, fix):
    from pipeline.loadtest.fail_fast import likely_fix

    assert fix in likely_fix(error, status)


def write_lt_file(tmp: Path, **loadtest) -> Path:
    (tmp / "prompts").mkdir(parents=True, exist_ok=True)
    (tmp / "prompts" / "chat.jsonl").write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"p {i}"}) + "\n"
                                                        for i in range(6)))
    data = {"name": "strict", "loadtest": {"prompts": "prompts", "concurrency": [1, 2], "duration_s": 4,
                                           "warmup_s": 0.5, "repeats": 1, "max_tokens": 8, **loadtest}}
    (tmp / "lt.yaml").write_text(yaml.safe_dump(data))
    return tmp / "lt.yaml"


@pytest.mark.slow
def test_a_server_that_refuses_every_request_stops_the_run_with_its_words(tmp_path):
    server = FakeServer("--ttft-ms", "20", "--tpot-ms", "5", "--refuse-every", "1")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline", "loadtest", "--loadtest-file", str(write_lt_file(tmp_path)),
             "--endpoint-baseline", f"127.0.0.1:{server.port}", "--endpoint-speculative", f"127.0.0.1:{server.port}",
             "--model", "fake", "--out", str(tmp_path / "run"), "--no-progress"],
            capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    finally:
        server.close()
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # not a verdict's code
    err = proc.stderr
    assert "stopped early" in err and "(HTTP 422)" in err
    assert "Unexpected fields in the request: {'top_k'}" in err  # verbatim
    assert "openai_top_k: false" in err  # the likely fix
    runs = json.loads((tmp_path / "run" / "runs.json").read_text())["runs"]
    assert [r["key"] for r in runs] == ["baseline-c1-r0"]  # the sweep never went on
    stopped = runs[0]["stopped_early"]
    assert stopped["errors"] == stopped["finished"] >= 4 and not runs[0]["valid"]
    records = [json.loads(line) for line in (tmp_path / "run" / runs[0]["raw"]).read_text().splitlines()]
    finished = [r for r in records if r["status"] != "incomplete_at_stop"]  # in flight at the stop: kept too
    assert len(finished) == stopped["finished"] and all(r["status"] == "error" and r["http_status"] == 422
                                                        for r in finished)
    assert sum(json.loads(m.read_text())["sent"] for m in (tmp_path / "run" / "raw" / "parts").glob("*.meta.json")) \
        == len(records)  # nothing lost
    assert json.loads((tmp_path / "run" / "run.json").read_text())["stopped_early"]["arm"] == "baseline"
    assert not (tmp_path / "run" / "report.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("bound", "stops"), [(0.2, True), (0.9, False)])
def test_a_server_that_refuses_half_stops_past_the_bound(tmp_path, bound, stops):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest
    from pipeline.loadtest.fail_fast import LoadTestStopped

    server = FakeServer("--ttft-ms", "20", "--tpot-ms", "5", "--refuse-every", "2")
    lt = write_lt_file(tmp_path, concurrency=[1], duration_s=3, fail_fast_error_rate=bound)
    try:
        if stops:
            with pytest.raises(LoadTestStopped) as caught:
                run_endpoint_loadtest(lt, endpoint_baseline=f"127.0.0.1:{server.port}", endpoint_speculative=None,
                                      model="fake", arm="baseline", out_dir=tmp_path / "run", progress=False)
            assert caught.value.exit_code == 4
            assert 0.2 < caught.value.abort["errors"] / caught.value.abort["finished"] < 0.9
        else:
            run_dir, _ = run_endpoint_loadtest(lt, endpoint_baseline=f"127.0.0.1:{server.port}",
                                               endpoint_speculative=None, model="fake", arm="baseline",
                                               out_dir=tmp_path / "run", progress=False)
            runs = json.loads((run_dir / "runs.json").read_text())["runs"]
            assert runs and all(r["stopped_early"] is None for r in runs)
    finally:
        server.close()


@pytest.mark.slow
@pytest.mark.parametrize(("bad", "message"), [("malformed", "malformed SSE line"),
                                              ("no-finish", "without a finish_reason")])
def test_broken_streams_are_recorded_errors_with_the_server_text(tmp_path, bad, message):
    server = FakeServer("--ttft-ms", "10", "--tpot-ms", "5", "--max-tokens-cap", "4", "--bad-stream", bad)
    try:
        records, metas = run_openai_locust(tmp_path, server.port, users=1, duration_s=2.0)
    finally:
        server.close()
    # a request in flight when the run stops (its window, or fail-fast on these errors) is kept as
    # incomplete_at_stop; every one that finished is an error carrying the server's text
    finished = [r for r in records if r["status"] != "incomplete_at_stop"]
    seen = [(r["status"], r.get("error")) for r in records]
    assert finished and all(r["status"] == "error" and message in r["error"] for r in finished), seen
    assert len(records) - len(finished) <= 1, seen  # one user: at most one request in flight
    if bad == "malformed":
        assert all("{not json" in r["error"] for r in finished)  # the server's text
    assert sum(m["sent"] for m in metas) == len(records)  # nothing lost


# ------------------------------------------------------------------------------------------------
# 4. a model name per arm, checked against GET /v1/models


def test_model_names_per_arm_are_checked_before_any_load(tmp_path):
    from pipeline.errors import SpecdeployError
    from pipeline.loadtest.endpoints_only import arm_models, run_endpoint_loadtest

    urls = {"baseline": "b", "speculative": "s"}
    assert arm_models("m", None, "/models/tiny", urls) == {"baseline": "m", "speculative": "/models/tiny"}
    with pytest.raises(SpecdeployError, match="--model-speculative"):
        arm_models(None, "m", None, urls)
    base = FakeServer("--served-model", "tiny")
    spec = FakeServer("--served-model", "/models/tiny")
    try:
        with pytest.raises(SpecdeployError) as err:
            run_endpoint_loadtest(write_lt_file(tmp_path), endpoint_baseline=f"127.0.0.1:{base.port}",
                                  endpoint_speculative=f"127.0.0.1:{spec.port}", model="tiny",
                                  out_dir=tmp_path / "run", progress=False)
        assert "speculative" in str(err.value) and "'/models/tiny'" in str(err.value)  # the names it lists
        assert base.proc.poll() is None
    finally:
        base.close()
        spec.close()
    assert not (tmp_path / "run").exists()  # refused before any load
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SpecdeployError, match="is the server up"):
        run_endpoint_loadtest(write_lt_file(tmp_path), endpoint_baseline=f"127.0.0.1:{port}",
                              endpoint_speculative=None, model="m", arm="baseline", out_dir=tmp_path / "run2",
                              progress=False)


@pytest.mark.slow
def test_each_arm_sends_its_own_model_name(tmp_path):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest

    base = FakeServer("--served-model", "tiny", "--ttft-ms", "10", "--tpot-ms", "5")
    spec = FakeServer("--served-model", "/models/tiny", "--ttft-ms", "10", "--tpot-ms", "5")
    try:
        run_dir, _ = run_endpoint_loadtest(
            # the claim is the name each arm's run carries, not its numbers or its report: the shortest
            # window will do, and no report is built
            write_lt_file(tmp_path, concurrency=[1], duration_s=1, warmup_s=0.2),
            endpoint_baseline=f"127.0.0.1:{base.port}",
            endpoint_speculative=f"127.0.0.1:{spec.port}", model=None, model_baseline="tiny",
            model_speculative="/models/tiny", out_dir=tmp_path / "run", progress=False, report=False)
    finally:
        base.close()
        spec.close()
    settings = {p.stem.split("-")[0]: json.loads(p.read_text())["model_name"] for p in (run_dir / "settings").glob("*")}
    assert settings == {"baseline": "tiny", "speculative": "/models/tiny"}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["models_listed"] == {"baseline": ["tiny"], "speculative": ["/models/tiny"]}


# ------------------------------------------------------------------------------------------------
# 5. SGLang's gauges across ranks

SGLANG_TWO_RANKS = """# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{dp_rank="0",model_name="m",tp_rank="0"} 3.0
sglang:spec_accept_length{dp_rank="1",model_name="m",tp_rank="0"} 2.0
# TYPE sglang:spec_accept_rate gauge
sglang:spec_accept_rate{dp_rank="0",model_name="m",tp_rank="0"} 0.6
sglang:spec_accept_rate{dp_rank="1",model_name="m",tp_rank="0"} 0.3
"""
SGLANG_WEIGHTS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",model_name="m",tp_rank="0"} 30.0
sglang:num_running_reqs{dp_rank="1",model_name="m",tp_rank="0"} 10.0
"""


def test_sglang_ranks_are_weighted_by_running_requests_and_kept():
    from pipeline.loadtest.acceptance_sources import parse, run_delta

    parsed = parse(SGLANG_TWO_RANKS + SGLANG_WEIGHTS)
    assert parsed["source"] == "sglang"
    assert parsed["gauges"]["mean_acceptance_length"] == pytest.approx((3.0 * 30 + 2.0 * 10) / 40)
    assert parsed["gauges"]["acceptance_rate"] == pytest.approx((0.6 * 30 + 0.3 * 10) / 40)
    assert parsed["rank_aggregation"] == "weighted by sglang:num_running_reqs"
    assert sorted(r["labels"]["dp_rank"] for r in parsed["per_rank"]) == ["0", "1"]
    delta = run_delta(parse(""), parsed)
    assert delta["kind"] == "gauge window" and delta["mean_acceptance_length"] == pytest.approx(2.75)
    assert len(delta["per_rank"]) == 2 and delta["rank_aggregation"].startswith("weighted")


def test_sglang_ranks_without_a_weight_are_averaged_and_one_rank_is_itself():
    from pipeline.loadtest.acceptance_sources import parse

    plain = parse(SGLANG_TWO_RANKS)
    assert plain["gauges"]["mean_acceptance_length"] == pytest.approx(2.5)  # not the last label set read (2.0)
    assert plain["rank_aggregation"].startswith("mean over ranks")
    one = parse('sglang:spec_accept_length{model_name="m"} 3.5\n')
    assert one["gauges"]["mean_acceptance_length"] == 3.5 and one["rank_aggregation"] == "one label set"


@pytest.mark.slow  # a whole report (bootstrap, plots)
def test_report_shows_first_answer_beside_ttft_for_reasoning_runs(tmp_path):
    import shutil

    from pipeline.report.builder import make_report, validate_report_json

    run_dir = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "run_small", run_dir)
    for path in (run_dir / "raw").glob("speculative-*.jsonl"):  # the same records, as a reasoning model's
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            if r.get("t_first_token") is not None:
                r["reasoning_text"], r["t_first_answer"] = "thinking", r["t_first_token"] + 7_000_000
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    make_report(run_dir)
    data = json.loads((run_dir / "report.json").read_text())
    assert validate_report_json(data) == []
    spec = next(c for c in data["cells"] if c["arm"] == "speculative" and c["concurrency"] == 1)
    base = next(c for c in data["cells"] if c["arm"] == "baseline" and c["concurrency"] == 1)
    assert spec["reasoning_requests"] == spec["n_ok"] and base["reasoning_requests"] == 0
    assert spec["first_answer_ms"]["p50"] == pytest.approx(spec["ttft_ms"]["p50"] + 7.0, abs=0.5)
    assert base["first_answer_ms"]["p50"] == pytest.approx(base["ttft_ms"]["p50"])
    assert "first answer p50 (ms)" in (run_dir / "report.md").read_text()
