"""Our Prometheus counters (outside ``nv_*``; docs/operations.md): draft tokens offered, draft tokens
accepted (in total, and both per draft position, label ``position`` from 0, like vLLM's
``spec_decode_num_accepted_tokens_per_pos``; only an engine model counts positions) and verify
steps, cancelled requests, and speculation fallbacks (requests that went on target-only after a
draft failure, label ``reason`` = error | timeout), labelled ``model`` and ``version``, published
through the Python backend's ``pb_utils.MetricFamily`` on Triton's metrics port and updated once per
request; and, per request that produced tokens, its latency as histograms (time to first token, time
per output token after the first, end to end, in seconds) and its output tokens
(:class:`RequestLatency`), which the alerting rules and the dashboard ``render`` writes read
(:mod:`pipeline.render.monitoring`)."""

from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

# Metric updates are IPC calls into the Python backend. Made concurrently from several threads
# of one stub (each streaming request is drained by its own thread) they crashed tritonserver
# 2.51 within seconds at 8 concurrent streams (SIGSEGV / boost lock_exception in
# libtriton_python.so); serialised, 8 streams ran clean. One lock per process.
_METRICS_LOCK = threading.Lock()

DRAFT_TOKENS = "specdeploy_spec_decode_draft_tokens_total"
ACCEPTED_TOKENS = "specdeploy_spec_decode_accepted_tokens_total"
VERIFY_STEPS = "specdeploy_spec_decode_verify_steps_total"
ACCEPTED_PER_POSITION = "specdeploy_spec_decode_accepted_tokens_per_pos_total"
DRAFTED_PER_POSITION = "specdeploy_spec_decode_draft_tokens_per_pos_total"
CANCELLED = "specdeploy_requests_cancelled_total"
FALLBACKS = "specdeploy_spec_decode_fallbacks_total"
FALLBACK_REASONS = ("error", "timeout")
TTFT = "specdeploy_request_ttft_seconds"
TPOT = "specdeploy_request_tpot_seconds"
E2E = "specdeploy_request_e2e_seconds"
OUTPUT_TOKENS = "specdeploy_output_tokens_total"
# Bucket edges include the gate's default SLOs (TTFT 1 s, TPOT 0.1 s), so a p95 near the SLO is
# interpolated between close edges.
TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0]
E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]


class SpecDecodeCounters:
    def __init__(self, model_name: str, model_version: str):
        labels = {"model": model_name, "version": str(model_version)}
        self._families = [
            pb_utils.MetricFamily(DRAFT_TOKENS, "Draft tokens offered for verification", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(ACCEPTED_TOKENS, "Draft tokens accepted by the target", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(VERIFY_STEPS, "Target passes that verified draft tokens", pb_utils.MetricFamily.COUNTER),
        ]
        self._draft, self._accepted, self._verify = (f.Metric(labels=labels) for f in self._families)
        self._labels = labels
        self._position_families = {
            "accepted": pb_utils.MetricFamily(ACCEPTED_PER_POSITION, "Draft tokens accepted at each draft position "
                                              "(0: the first)", pb_utils.MetricFamily.COUNTER),
            "drafted": pb_utils.MetricFamily(DRAFTED_PER_POSITION, "Draft tokens offered at each draft position "
                                             "(0: the first)", pb_utils.MetricFamily.COUNTER)}
        self._per_position: dict[tuple[str, int], object] = {}  # made at a position's first count: K is the engine's
        self._cancelled_family = pb_utils.MetricFamily(CANCELLED, "Requests that ended by cancellation", pb_utils.MetricFamily.COUNTER)
        self._cancelled = self._cancelled_family.Metric(labels=labels)
        self._fallback_family = pb_utils.MetricFamily(
            FALLBACKS, "Speculative requests that continued target-only after a draft failure", pb_utils.MetricFamily.COUNTER)
        self._fallbacks = {reason: self._fallback_family.Metric(labels={**labels, "reason": reason})
                           for reason in FALLBACK_REASONS}

    def fallback(self, reason: str) -> None:
        with _METRICS_LOCK:
            self._fallbacks[reason].increment(1.0)

    def cancelled(self) -> None:
        with _METRICS_LOCK:
            self._cancelled.increment(1.0)

    def add(self, draft_tokens: int, accepted_tokens: int, verify_steps: int,
            accepted_per_position: list[int] | tuple[int, ...] = (),
            drafted_per_position: list[int] | tuple[int, ...] = ()) -> None:
        with _METRICS_LOCK:
            if draft_tokens:
                self._draft.increment(float(draft_tokens))
            if accepted_tokens:
                self._accepted.increment(float(accepted_tokens))
            if verify_steps:
                self._verify.increment(float(verify_steps))
            for kind, counts in (("accepted", accepted_per_position), ("drafted", drafted_per_position)):
                for position, count in enumerate(counts):
                    if count:
                        key = (kind, position)
                        if key not in self._per_position:
                            self._per_position[key] = self._position_families[kind].Metric(
                                labels={**self._labels, "position": str(position)})
                        self._per_position[key].increment(float(count))


class RequestLatency:
    """Latency histograms and the output-token counter of the model a client request enters with
    its whole lifetime (the ``tensorrt_llm`` model of an ensemble, the BLS of a draft-target
    deployment). Times are ``time.monotonic_ns()`` values (CLOCK_MONOTONIC, shared by the
    processes of one host)."""

    def __init__(self, model_name: str, model_version: str):
        labels = {"model": model_name, "version": str(model_version)}
        histogram = pb_utils.MetricFamily.HISTOGRAM
        self._families = [
            pb_utils.MetricFamily(TTFT, "Time from request arrival to its first output token (s)", histogram),
            pb_utils.MetricFamily(TPOT, "Mean time per output token after the first, per request (s)", histogram),
            pb_utils.MetricFamily(E2E, "Time from request arrival to its last output token (s)", histogram),
        ]
        self._ttft, self._tpot, self._e2e = (
            family.Metric(labels=labels, buckets=buckets)
            for family, buckets in zip(self._families, (TTFT_BUCKETS, TPOT_BUCKETS, E2E_BUCKETS)))
        self._tokens_family = pb_utils.MetricFamily(OUTPUT_TOKENS, "Output tokens generated", pb_utils.MetricFamily.COUNTER)
        self._tokens = self._tokens_family.Metric(labels=labels)

    def observe(self, arrival_ns: int, first_token_ns: int, last_token_ns: int, output_tokens: int) -> None:
        """One finished request; nothing when it produced no token or the times are missing."""
        if output_tokens <= 0 or not arrival_ns or first_token_ns < arrival_ns or last_token_ns < first_token_ns:
            return
        with _METRICS_LOCK:
            self._ttft.observe((first_token_ns - arrival_ns) / 1e9)
            self._e2e.observe((last_token_ns - arrival_ns) / 1e9)
            if output_tokens > 1:
                self._tpot.observe((last_token_ns - first_token_ns) / 1e9 / (output_tokens - 1))
            self._tokens.increment(float(output_tokens))
