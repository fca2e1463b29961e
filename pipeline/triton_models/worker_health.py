"""/metrics for the engine worker behind a ``tensorrt_llm`` model (:mod:`pipeline.reference.worker`):
whether it is up, how many times it crashed, whether its restarts ran out. Labelled ``model`` and
``version`` like our other counters (:mod:`pipeline.triton_models.metrics`), published through the
Python backend's ``pb_utils.MetricFamily`` on Triton's metrics port, updated by the worker proxy's
supervising thread after every change (:class:`pipeline.reference.worker.WorkerHealth`)."""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from pipeline.triton_models.metrics import _METRICS_LOCK  # one lock for every metric update of a stub

UP = "specdeploy_engine_worker_up"
CRASHES = "specdeploy_engine_worker_crashes_total"
RESTARTS_EXHAUSTED = "specdeploy_engine_worker_restarts_exhausted"


class WorkerHealthMetrics:
    def __init__(self, model_name: str, model_version: str):
        labels = {"model": model_name, "version": str(model_version)}
        self._families = [
            pb_utils.MetricFamily(UP, "1 while the engine worker serves, 0 while it is down", pb_utils.MetricFamily.GAUGE),
            pb_utils.MetricFamily(CRASHES, "Engine worker exits nobody asked for (failed restarts included)",
                                  pb_utils.MetricFamily.COUNTER),
            pb_utils.MetricFamily(RESTARTS_EXHAUSTED, "1 once the engine worker crashed too often in a row to be restarted",
                                  pb_utils.MetricFamily.GAUGE),
        ]
        self._up, self._crashes, self._exhausted = (f.Metric(labels=labels) for f in self._families)
        self._counted = 0
        with _METRICS_LOCK:
            self._up.set(1.0)
            self._exhausted.set(0.0)

    def __call__(self, health) -> None:
        with _METRICS_LOCK:
            self._up.set(1.0 if health.up else 0.0)
            self._exhausted.set(1.0 if health.given_up else 0.0)
            if health.crashes > self._counted:
                self._crashes.increment(float(health.crashes - self._counted))
                self._counted = health.crashes
