"""Our Prometheus counters (outside ``nv_*``, contract §8.1): draft tokens offered, draft tokens
accepted and verify steps, cancelled requests, and speculation fallbacks (requests that went on
target-only after a draft failure, label ``reason`` = error | timeout), labelled ``model`` and
``version``, published through the Python backend's ``pb_utils.MetricFamily`` on Triton's
metrics port and updated once per request."""

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
CANCELLED = "specdeploy_requests_cancelled_total"
FALLBACKS = "specdeploy_spec_decode_fallbacks_total"
FALLBACK_REASONS = ("error", "timeout")


class SpecDecodeCounters:
    def __init__(self, model_name: str, model_version: str):
        labels = {"model": model_name, "version": str(model_version)}
        self._families = [
            pb_utils.MetricFamily(DRAFT_TOKENS, "Draft tokens offered for verification", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(ACCEPTED_TOKENS, "Draft tokens accepted by the target", pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(VERIFY_STEPS, "Target passes that verified draft tokens", pb_utils.MetricFamily.COUNTER),
        ]
        self._draft, self._accepted, self._verify = (f.Metric(labels=labels) for f in self._families)
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

    def add(self, draft_tokens: int, accepted_tokens: int, verify_steps: int) -> None:
        with _METRICS_LOCK:
            if draft_tokens:
                self._draft.increment(float(draft_tokens))
            if accepted_tokens:
                self._accepted.increment(float(accepted_tokens))
            if verify_steps:
                self._verify.increment(float(verify_steps))
