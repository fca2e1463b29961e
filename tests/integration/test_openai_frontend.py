"""``serve --frontend openai`` for real: the tiny Medusa deployment's two arms on real tritonservers,
each behind the OpenAI-compatible frontend (its own process under the keeper), driven by plain
HTTP and by the Locust ``openai`` transport through ``loadtest --loadtest-file``: an A/B between
the two CPU endpoints that ends in a report with a verdict."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from server_stops import stop_later

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@pytest.fixture(scope="module")
def frontends(serving_workdir, medusa_cfg, medusa_server):
    from pipeline.serve.openai_serve import start_frontend
    from pipeline.serve.server import start_deployment

    baseline = start_deployment(medusa_cfg, "baseline")
    started = {}
    try:
        started["baseline"] = start_frontend(medusa_cfg, "baseline", baseline.grpc_url)
        started["speculative"] = start_frontend(medusa_cfg, "speculative", medusa_server.grpc_url)
        yield started
    finally:
        for frontend in started.values():
            frontend.stop()
        stop_later(baseline)


def post(url: str, body: dict, timeout: float = 120.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",  # noqa: S310 - loopback http URL of the server under test
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310 - loopback http URL of the server under test
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def sse_events(raw: bytes) -> list:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_cli_serve_frontend_openai_answers_and_stops_with_nothing_left(serving_workdir, medusa_cfg):
    """The real `specdeploy serve --frontend openai --foreground` as a user starts it: tritonserver
    and the frontend come up, /v1/completions answers, Ctrl-C stops both and frees every port."""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    import psutil
    from test_serve_lifecycle import _alive, wait_gone

    from pipeline.infra.processes import free_ports

    ports = free_ports(4)
    http, grpc, metrics, openai = ports
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", str(serving_workdir / f"{medusa_cfg.name}.yaml"), "--variant",
         "speculative", "--frontend", "openai", "--foreground", "--http-port", str(http), "--grpc-port", str(grpc),
         "--metrics-port", str(metrics), "--openai-port", str(openai), "--workdir", str(serving_workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    text, family = "", []

    def wait_for(needle: str, timeout: float = 300.0) -> None:
        nonlocal text
        deadline = time.monotonic() + timeout
        while needle not in text:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"no {needle!r} from `specdeploy serve --frontend openai`:\n{text}")
            text += line

    try:
        wait_for(f"http://127.0.0.1:{openai}/v1")
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        cmdlines = [" ".join(psutil.Process(p).cmdline()) for p in _alive(family)]
        assert any("tritonserver" in c for c in cmdlines) and any("openai_frontend" in c for c in cmdlines), cmdlines
        status, raw = post(f"http://127.0.0.1:{openai}/v1/completions",
                           {"model": medusa_cfg.name, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0})
        assert status == 200, raw
        body = json.loads(raw)
        assert body["choices"][0]["text"] and body["usage"]["completion_tokens"] > 0
        proc.send_signal(signal.SIGINT)
        wait_for("stopped", timeout=120)
        assert proc.wait(timeout=120) == 0, text
        wait_gone(family, ports)
        assert "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        from pipeline.infra.processes import stop_processes

        stop_processes([psutil.Process(p) for p in _alive(family)], 5)


def test_completions_streaming_and_whole_agree_with_usage(frontends, medusa_cfg):
    url = frontends["speculative"].url
    body = {"model": medusa_cfg.name, "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0}
    status, raw = post(url + "/v1/completions", body)
    assert status == 200, raw
    whole = json.loads(raw)
    assert whole["object"] == "text_completion" and whole["usage"]["completion_tokens"] > 0
    assert whole["usage"]["prompt_tokens"] > 0
    status, raw = post(url + "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    streamed = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert streamed == whole["choices"][0]["text"]  # greedy: the same tokens either way
    assert events[-2]["usage"] == whole["usage"]
    assert events[-3]["choices"][0]["finish_reason"] in ("length", "stop")


def test_chat_and_both_arms_give_the_same_greedy_text(frontends, medusa_cfg):
    texts = {}
    for arm, frontend in frontends.items():
        status, raw = post(frontend.url + "/v1/chat/completions",
                           {"model": medusa_cfg.name, "messages": [{"role": "user", "content": "The quick brown"}],
                            "max_tokens": 10, "temperature": 0})
        assert status == 200, raw
        reply = json.loads(raw)
        assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
        texts[arm] = reply["choices"][0]["message"]["content"]
    assert texts["baseline"] == texts["speculative"]  # speculation is exact on the CPU engine


def test_bad_requests_name_the_field_and_the_frontend_stays_up(frontends, medusa_cfg):
    url = frontends["baseline"].url
    status, raw = post(url + "/v1/completions", {"model": medusa_cfg.name, "prompt": "x", "max_tokens": 0})
    assert status == 400 and "max_tokens" in json.loads(raw)["error"]["message"]
    status, raw = post(url + "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and "other" in json.loads(raw)["error"]["message"]
    status, raw = post(url + "/v1/chat/completions", {"model": medusa_cfg.name, "messages": []})
    assert status == 400 and "messages" in json.loads(raw)["error"]["message"]
    with urllib.request.urlopen(url + "/health", timeout=30) as resp:  # noqa: S310 - loopback http URL of the server under test
        assert resp.status == 200
    assert frontends["baseline"].alive()


@pytest.mark.e2e  # a whole A/B load-test run: the end-to-end tier (docs/testing.md)
def test_ab_through_the_frontends_gives_a_report_with_a_verdict(frontends, medusa_cfg, medusa_server, serving_workdir,
                                                                tmp_path):
    from pipeline.loadtest.endpoints_only import run_endpoint_loadtest
    from pipeline.loadtest.provenance import served_tokenizer_dir

    prompts = Path(__file__).resolve().parents[2] / "prompts" / "tiny"
    lt = tmp_path / "lt.yaml"
    lt.write_text(yaml.safe_dump({"name": "tiny-openai-ab", "loadtest": {
        "prompts": str(prompts), "concurrency": [1, 2], "duration_s": 5, "warmup_s": 1, "repeats": 1,
        "max_tokens": 16, "sampling": {"top_k": 1}, "openai_api": "chat"},
        "metrics_speculative": medusa_server.metrics_url}))  # our Triton's counters behind the frontend
    tokenizer = served_tokenizer_dir(medusa_cfg)
    run_dir, _ = run_endpoint_loadtest(lt, endpoint_baseline=frontends["baseline"].url,
                                       endpoint_speculative=frontends["speculative"].url, model=medusa_cfg.name,
                                       tokenizer=tokenizer, out_dir=tmp_path / "run", progress=False)
    runs = json.loads((run_dir / "runs.json").read_text())["runs"]
    assert len(runs) == 4
    for run in runs:
        assert run["valid"], run["invalid_reasons"]
        records = [json.loads(line) for line in (run_dir / run["raw"]).read_text().splitlines()]
        assert len(records) == run["sent"] > 0
        ok = [r for r in records if r["status"] == "ok"]
        assert ok, [r["error"] for r in records][:3]
        assert all(r["osl_source"] == "server" and 0 < r["osl"] <= 16 for r in ok)
        assert all(r["osl_retok"] for r in ok)  # the cross-check ran (a re-tokenized count need not match)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] in ("NO-GO", "INCONCLUSIVE")  # one repeat: never GO
    assert all(c["equivalence"]["equivalent"] for c in report["comparisons"])  # same greedy text in both arms
    # no per-request acceptance on the OpenAI transport: it comes from our counters, named (the tiny
    # untrained heads may accept nothing: a reported 0 is a figure, unlike "not reported")
    spec = [r["server_acceptance"] for r in runs if r["arm"] == "speculative"]
    assert all(d["source"] == "specdeploy" and d["kind"] == "counter delta" and d["draft_tokens"] > 0
               for d in spec), spec
    assert report["acceptance_source"] == "specdeploy" and 0 <= report["acceptance_rate"] <= 1
