"""/metrics gauges of what a ``tensorrt_llm`` model's CPU engine holds right now: KV slots in use
(``pool`` = target | draft), prefix-cache entries and their bound, and open requests at each
layer (``where`` = model: the Triton model's in-flight streams, proxy: the worker proxy's, engine:
the engine's). Labelled ``model`` and ``version`` like our other metrics
(:mod:`pipeline.triton_models.metrics`), published through the Python backend's
``pb_utils.MetricFamily`` on Triton's metrics port. A thread of the model reads
``engine.stats()`` (:data:`pipeline.reference.api.ENGINE_STATS`) every
``SPECDEPLOY_ENGINE_STATS_PERIOD_S`` seconds: Prometheus scrapes cannot call into the stub, and
one small read a second costs the engine nothing it would notice. After the load drains, a
healthy engine shows 0 slots and 0 open requests and at most the bound of prefix entries —
which is how the soak benchmark proves nothing leaked.

The KV capacity is also exported under TensorRT-LLM's own name, so the load test reads and checks
it the same way on both backends (pipeline/serve/kv_capacity.py):
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"|"used"|"free"|"tokens_per"}``
(tensorrtllm_backend@r25.05 ``inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc``), one CPU-engine slot standing for one block of ``max_seq_len`` tokens."""

from __future__ import annotations

import os
import threading
from typing import Callable

import triton_python_backend_utils as pb_utils

from pipeline.triton_models.metrics import _METRICS_LOCK  # one lock for every metric update of a stub

KV_SLOTS_IN_USE = "specdeploy_engine_kv_slots_in_use"
KV_SLOTS = "specdeploy_engine_kv_slots"
PREFIX_ENTRIES = "specdeploy_engine_prefix_cache_entries"
PREFIX_CAPACITY = "specdeploy_engine_prefix_cache_capacity"
OPEN_REQUESTS = "specdeploy_engine_open_requests"
TRTLLM_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"  # the TensorRT-LLM backend's family and label
TRTLLM_KV_LABEL = "kv_cache_block_type"
PERIOD_ENV = "SPECDEPLOY_ENGINE_STATS_PERIOD_S"
DEFAULT_PERIOD_S = 1.0


class EngineGauges:
    def __init__(self, model_name: str, model_version: str):
        labels = {"model": model_name, "version": str(model_version)}

        def family(name: str, text: str):
            return pb_utils.MetricFamily(name, text, pb_utils.MetricFamily.GAUGE)

        self._families = [
            family(KV_SLOTS_IN_USE, "KV-cache slots allocated to sequences now"),
            family(KV_SLOTS, "KV-cache slots of the engine (max_batch_size)"),
            family(PREFIX_ENTRIES, "Prompt prefixes held in the engine's prefix cache"),
            family(PREFIX_CAPACITY, "The prefix cache's bound (prefix_cache_entries)"),
            family(OPEN_REQUESTS, "Requests whose stream has not ended yet"),
        ]
        in_use, slots, entries, capacity, open_requests = self._families
        self._metrics = {
            "kv_slots_in_use": in_use.Metric(labels={**labels, "pool": "target"}),
            "draft_kv_slots_in_use": in_use.Metric(labels={**labels, "pool": "draft"}),
            "kv_slots": slots.Metric(labels=labels),
            "prefix_cache_entries": entries.Metric(labels=labels),
            "prefix_cache_capacity": capacity.Metric(labels=labels),
            "open_requests": open_requests.Metric(labels={**labels, "where": "engine"}),
            "proxy_open_requests": open_requests.Metric(labels={**labels, "where": "proxy"}),
            "model_open_requests": open_requests.Metric(labels={**labels, "where": "model"}),
        }
        blocks = family(TRTLLM_KV_BLOCKS, "KV cache blocks (TensorRT-LLM's metric; a CPU-engine slot is one block)")
        self._families.append(blocks)
        self._blocks = {kind: blocks.Metric(labels={**labels, TRTLLM_KV_LABEL: kind})
                        for kind in ("max", "used", "free", "tokens_per")}

    def update(self, stats: dict) -> None:
        with _METRICS_LOCK:
            for key, metric in self._metrics.items():
                if key in stats:
                    metric.set(float(stats[key]))
            if "kv_slots" in stats and "kv_tokens_per_slot" in stats:
                used = float(stats.get("kv_slots_in_use", 0))
                for kind, value in (("max", stats["kv_slots"]), ("used", used), ("free", stats["kv_slots"] - used),
                                    ("tokens_per", stats["kv_tokens_per_slot"])):
                    self._blocks[kind].set(float(value))


def period_from_env(env=None) -> float:
    env = os.environ if env is None else env
    return float(env.get(PERIOD_ENV) or DEFAULT_PERIOD_S)


def start_publisher(gauges: EngineGauges, read: Callable[[], dict | None], stop: threading.Event,
                    period_s: float) -> threading.Thread:
    """Publish ``read()`` every ``period_s`` until ``stop`` is set (a None read is skipped: the
    worker is down, its health gauges say so)."""

    def run() -> None:
        while True:
            try:
                stats = read()  # may wait for the engine worker: the server may have died meanwhile
                if stats is not None and not stop.is_set():
                    gauges.update(stats)
            except Exception:  # noqa: BLE001 - a gauge must never take the model down
                pass
            if stop.wait(period_s):
                return

    thread = threading.Thread(target=run, name="engine-gauges", daemon=True)
    thread.start()
    return thread
