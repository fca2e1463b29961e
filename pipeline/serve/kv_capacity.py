"""Each arm's KV-cache capacity: what the plan gave it and what the backend reports at start.

Planned: the ``max_tokens_in_paged_kv_cache`` that ``pipeline.plan.gpu_layout`` placed on each
TensorRT-LLM model (every model of both arms gets the same), recorded in the rendered arm's
placement; on the CPU reference engine, which has no KV budget to plan, the capacity its build
settings give (``max_batch_size`` sequences of ``max_seq_len`` tokens). Reported: the backend's
``nv_trt_llm_kv_cache_block_metrics`` gauges, max blocks × tokens per block, per model (the
TensorRT-LLM backend sets them when the model loads; the CPU engine exports the same names,
pipeline/triton_models/engine_gauges.py). The load test records both per arm in ``run.json``
(``endpoints.<arm>.kv_cache_tokens_planned`` / ``kv_cache_tokens_reported``) and the report checks
them (pipeline/report/kv_capacity_check.py). Reads a server's /metrics; writes nothing."""

from __future__ import annotations

import time
from typing import Any, Callable

from pipeline.methods import get_method

# the CPU engine publishes its gauges from a thread that starts with the model; its first reading
# may land just after the server reports ready, so the start-up read waits for it (bounded)
REPORTED_WAIT_S = 30.0
POLL_S = 0.25


def planned_kv_tokens(cfg, placement: dict[str, Any] | None, engine_models: tuple[str, ...]) -> dict[str, int] | None:
    """Per TensorRT-LLM model of one arm, the KV capacity in tokens the plan expects it to get;
    None when nothing was planned (a GPU model left to its KV fraction alone)."""
    planned = {m["model_name"]: m["max_tokens_in_paged_kv_cache"] for m in (placement or {}).get("models", [])
               if m.get("max_tokens_in_paged_kv_cache")}
    if planned:
        return planned
    if cfg.backend == "reference":
        return {name: cfg.build.max_batch_size * cfg.build.max_seq_len for name in engine_models}
    return None


def arm_engine_models(method: str, drafts: str) -> tuple[str, ...]:
    """The models of one arm that hold a KV cache: ``tensorrt_llm``, and ``tensorrt_llm_draft``
    where a BLS calls a draft model (draft-target; ``drafts`` as the rendered arm records it)."""
    two_models = drafts == "bls" and get_method(method).draft_model  # a BLS calling a draft model
    return ("tensorrt_llm", "tensorrt_llm_draft") if two_models else ("tensorrt_llm",)


def await_reported(read: Callable[[], dict[str, int] | None], wait_s: float = REPORTED_WAIT_S) -> dict[str, int] | None:
    """``read()`` (model → reported tokens) once every model reports a capacity above 0, or the last
    reading when ``wait_s`` runs out (None: the server exports no such metric at all)."""
    deadline = time.monotonic() + wait_s
    while True:
        reported = read()
        if reported is None or all(tokens > 0 for tokens in reported.values()) or time.monotonic() >= deadline:
            return reported
        time.sleep(POLL_S)
