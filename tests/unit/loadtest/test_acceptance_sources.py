"""Acceptance read from each server's metrics (pipeline.loadtest.acceptance_sources), per run.

The exposition texts are written by prometheus_client itself from metric definitions with the
names, types and label names upstream declares, so the text has upstream's shape (``_total``
suffixes, ``_created`` samples, HELP/TYPE lines) without being copied:

- vLLM: vllm/v1/spec_decode/metrics.py (``SpecDecodingProm``: counters, ``position`` label for
  the per-position one) with the label names of vllm/v1/metrics/loggers.py (model_name, engine);
- trtllm-serve: tensorrt_llm/metrics/collector.py (``MetricsCollector``: per-request counters with
  ``token_position``, iteration counters, ``trtllm_spec_decode_acceptance_length`` gauge), labels
  model_name and engine_type as tensorrt_llm/serve/openai_server.py sets them;
- SGLang: python/sglang/srt/metrics/collector.py (``SchedulerMetricsCollector``: gauges
  ``sglang:spec_accept_length`` / ``sglang:spec_accept_rate``);
- trtllm-serve's JSON ``/metrics``: a list of iteration stats with ``specDecodingStats`` fields as
  cpp/include/tensorrt_llm/executor/types.h names them.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from pipeline.loadtest import acceptance_sources as acc
from pipeline.report.per_request import acceptance_by_position


def vllm_text(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float]) -> str:
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=reg) \
        .labels("tiny", "0").inc(drafts)
    Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=reg) \
        .labels("tiny", "0").inc(draft_tokens)
    Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels, registry=reg) \
        .labels("tiny", "0").inc(accepted)
    pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                  labels + ["position"], registry=reg)
    for i, value in enumerate(per_pos):
        pos.labels("tiny", "0", str(i)).inc(value)
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
          registry=reg).labels("tiny", "0").set(3)
    return generate_latest(reg).decode()


def trtllm_text(per_request: dict[int, tuple[float, float]] | None, iteration: tuple[float, float],
                acceptance_length: float) -> str:
    reg = CollectorRegistry()
    labels = {"model_name": "undefined", "engine_type": "undefined"}
    if per_request is not None:
        drafted = Counter("trtllm_spec_decode_drafted_tokens_total", "Total drafted tokens per speculative decoding "
                          "position.", [*labels, "token_position"], registry=reg)
        accepted = Counter("trtllm_spec_decode_accepted_tokens_total", "Total accepted tokens per speculative "
                           "decoding position.", [*labels, "token_position"], registry=reg)
        for pos, (d, a) in per_request.items():
            drafted.labels(**labels, token_position=pos).inc(d)
            accepted.labels(**labels, token_position=pos).inc(a)
    Counter("trtllm_spec_decode_num_draft_tokens_total", "Total number of draft tokens in speculative decoding",
            list(labels), registry=reg).labels(**labels).inc(iteration[0])
    Counter("trtllm_spec_decode_num_accepted_tokens_total", "Total number of accepted tokens in speculative "
            "decoding", list(labels), registry=reg).labels(**labels).inc(iteration[1])
    Gauge("trtllm_spec_decode_acceptance_length", "Acceptance length in speculative decoding", list(labels),
          registry=reg).labels(**labels).set(acceptance_length)
    Gauge("trtllm_kv_cache_utilization", "KV cache utilization", list(labels), registry=reg).labels(**labels).set(0.2)
    return generate_latest(reg).decode()


def sglang_text(length: float, rate: float) -> str:
    reg = CollectorRegistry()
    labels = {"model_name": "tiny", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    Gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", list(labels),
          registry=reg).labels(**labels).set(length)
    Gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding (`accepted tokens / "
          "total draft tokens` in batch).", list(labels), registry=reg).labels(**labels).set(rate)
    Gauge("sglang:num_running_reqs", "The number of running requests.", list(labels), registry=reg) \
        .labels(**labels).set(2)
    return generate_latest(reg).decode()


def specdeploy_text(draft: float, accepted: float, steps: float) -> str:
    reg = CollectorRegistry()
    for name, value in (("specdeploy_spec_decode_draft_tokens", draft), ("specdeploy_spec_decode_accepted_tokens",
                        accepted), ("specdeploy_spec_decode_verify_steps", steps)):
        Counter(name, "x", ["model", "version"], registry=reg).labels("llm", "1").inc(value)
    return generate_latest(reg).decode()


def specdeploy_positions_text(accepted: list[float], drafted: list[float]) -> str:
    """Ours with the per-position counters pipeline/triton_models/metrics.py declares (two engine
    models, as a draft-target deployment has: summed over them)."""
    reg = CollectorRegistry()
    Counter("specdeploy_spec_decode_verify_steps", "x", ["model", "version"], registry=reg).labels("llm", "1").inc(10)
    for name, values in (("specdeploy_spec_decode_accepted_tokens_per_pos", accepted),
                         ("specdeploy_spec_decode_draft_tokens_per_pos", drafted)):
        family = Counter(name, "x", ["model", "version", "position"], registry=reg)
        for i, value in enumerate(values):
            family.labels("tensorrt_llm", "1", str(i)).inc(value / 2)
            family.labels("tensorrt_llm_draft", "1", str(i)).inc(value / 2)
    return generate_latest(reg).decode()


def iteration_stats(rows: list[tuple[int, int, int]]) -> str:
    """Iteration stats as trtllm-serve's JSON /metrics returns them: (drafted, accepted, requests)."""
    return json.dumps([{"iter": i, "iterLatencyMS": 12.5, "numActiveRequests": n,
                        "specDecodingStats": {"numDraftTokens": d, "numAcceptedTokens": a,
                                              "numRequestsWithDraftTokens": n,
                                              "acceptanceLength": 1 + a / n if n else 0.0,
                                              "iterLatencyMS": 3.0, "draftOverhead": 0.2}}
                       for i, (d, a, n) in enumerate(rows)])


# ------------------------------------------------------------------------------------------------
# One format each


def test_vllm_counters_give_a_counter_delta_with_rate_tau_and_positions():
    before = acc.parse(vllm_text(10, 40, 20, [8, 7, 5, 0]))
    after = acc.parse(vllm_text(30, 120, 80, [28, 25, 20, 7]))
    assert before["source"] == after["source"] == "vllm"
    delta = acc.run_delta(before, after)
    assert delta["kind"] == acc.COUNTER_DELTA
    assert (delta["draft_tokens"], delta["accepted_tokens"], delta["verify_steps"]) == (80, 60, 20)
    assert delta["acceptance_rate"] == pytest.approx(0.75)
    assert delta["mean_acceptance_length"] == pytest.approx(1 + 60 / 20)  # vLLM's convention: bonus token counted
    assert delta["accepted_per_position"] == {"0": 20, "1": 18, "2": 15, "3": 7}


def test_specdeploy_per_position_counters_give_accepted_and_drafted_per_position():
    before = acc.parse(specdeploy_positions_text([2, 1, 0], [4, 4, 2]))
    after = acc.parse(specdeploy_positions_text([12, 8, 3], [14, 14, 10]))
    delta = acc.run_delta(before, after)
    assert delta["source"] == "specdeploy"
    assert delta["accepted_per_position"] == {"0": 10, "1": 7, "2": 3}
    assert delta["drafted_per_position"] == {"0": 10, "1": 10, "2": 8}
    by_pos = acceptance_by_position([delta])
    assert [(p["position"], p["rate"]) for p in by_pos["positions"]] == [(1, 1.0), (2, 0.7), (3, 3 / 8)]


def test_specdeploy_counters_are_ours():
    delta = acc.run_delta(acc.parse(specdeploy_text(0, 0, 0)), acc.parse(specdeploy_text(42, 30, 10)))
    assert delta["source"] == "specdeploy" and delta["kind"] == acc.COUNTER_DELTA
    assert delta["acceptance_rate"] == pytest.approx(30 / 42)
    assert delta["mean_acceptance_length"] == pytest.approx(4.0)


def test_trtllm_prometheus_prefers_per_request_counters_and_keeps_the_gauge_window():
    before = acc.parse(trtllm_text({0: (10, 8), 1: (10, 5)}, (5, 3), 2.1))
    after = acc.parse(trtllm_text({0: (30, 24), 1: (30, 15)}, (7, 4), 2.4))
    assert after["source"] == acc.TRTLLM_PROM
    delta = acc.run_delta(before, after)
    # per-request counters (every finished request), not the iteration ones (latest iteration per drain)
    assert (delta["draft_tokens"], delta["accepted_tokens"]) == (40, 26)
    assert delta["acceptance_rate"] == pytest.approx(26 / 40)
    assert delta["verify_steps"] is None
    assert delta["gauge_window"] == {"mean_acceptance_length": {"before": 2.1, "after": 2.4}}
    assert delta["mean_acceptance_length"] == pytest.approx(2.4)  # the gauge: no step count to divide by


def test_trtllm_prometheus_without_per_request_counters_falls_back_to_the_iteration_ones():
    delta = acc.run_delta(acc.parse(trtllm_text(None, (5, 3), 2.0)), acc.parse(trtllm_text(None, (25, 13), 2.0)))
    assert delta["source"] == acc.TRTLLM_PROM
    assert (delta["draft_tokens"], delta["accepted_tokens"]) == (20, 10)


def test_trtllm_iteration_stats_are_a_drained_window_read_after_the_run():
    before = acc.parse(iteration_stats([(100, 90, 25)]))  # what queued before the run: drained, not subtracted
    after = acc.parse(iteration_stats([(12, 6, 3), (8, 4, 2), (0, 0, 0)]))
    assert after["source"] == acc.TRTLLM_ITER
    delta = acc.run_delta(before, after)
    assert delta["kind"] == acc.DRAINED_WINDOW and delta["iterations"] == 3
    assert (delta["draft_tokens"], delta["accepted_tokens"], delta["verify_steps"]) == (20, 10, 5)
    assert delta["acceptance_rate"] == pytest.approx(0.5)
    assert delta["mean_acceptance_length"] == pytest.approx(1 + 10 / 5)


def test_trtllm_iteration_stats_without_spec_decoding_are_not_reported():
    text = json.dumps([{"iter": 0, "iterLatencyMS": 10.0, "numActiveRequests": 1}])
    delta = acc.run_delta(acc.parse("[]"), acc.parse(text))
    assert delta["source"] == acc.NOT_REPORTED and delta["acceptance_rate"] is None


def test_sglang_gauges_are_a_window_not_a_count():
    delta = acc.run_delta(acc.parse(sglang_text(1.5, 0.2)), acc.parse(sglang_text(2.6, 0.55)))
    assert delta["source"] == "sglang" and delta["kind"] == acc.GAUGE_WINDOW
    assert delta["draft_tokens"] is None
    assert delta["acceptance_rate"] == pytest.approx(0.55)
    assert delta["mean_acceptance_length"] == pytest.approx(2.6)
    assert delta["gauge_window"]["acceptance_rate"] == {"before": 0.2, "after": 0.55}


def test_gauges_without_type_lines_are_still_read():
    text = 'sglang:spec_accept_length{model_name="tiny"} 2.25\nsglang:spec_accept_rate{model_name="tiny"} 0.4\n'
    delta = acc.run_delta(acc.parse(text), acc.parse(text))
    assert delta["source"] == "sglang" and delta["acceptance_rate"] == pytest.approx(0.4)


def test_a_server_without_acceptance_metrics_is_not_reported_never_zero():
    triton = ('# HELP nv_inference_count Number of inferences performed\n# TYPE nv_inference_count counter\n'
              'nv_inference_count{model="llm",version="1"} 12\n')
    delta = acc.run_delta(acc.parse(triton), acc.parse(triton))
    assert delta["source"] == "not reported"
    assert delta["acceptance_rate"] is None and delta["mean_acceptance_length"] is None
    assert acc.legacy_delta(delta)["source"] == "not reported"


def test_a_missing_scrape_gives_no_delta():
    assert acc.run_delta(None, acc.parse(vllm_text(1, 4, 2, [1]))) is None
    assert acc.run_delta(acc.parse(vllm_text(1, 4, 2, [1])), None) is None


def test_legacy_delta_keeps_runs_json_metrics_delta_shape():
    delta = acc.run_delta(acc.parse(vllm_text(0, 0, 0, [0])), acc.parse(vllm_text(10, 40, 30, [9])))
    assert acc.legacy_delta(delta) == {"draft_tokens": 40.0, "accepted_tokens": 30.0, "verify_steps": 10.0,
                                       "source": "vllm"}
    gauge_only = acc.run_delta(acc.parse(sglang_text(2, 0.5)), acc.parse(sglang_text(2, 0.5)))
    assert acc.legacy_delta(gauge_only) is None


def test_scrape_reads_a_live_metrics_endpoint():
    body = vllm_text(5, 20, 10, [4, 3]).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        got = acc.scrape(f"http://127.0.0.1:{server.server_address[1]}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert got["source"] == "vllm" and got["counters"]["draft_tokens"] == 20
    assert acc.scrape(None) is None
